"""KDA's forward in three passes, for few long sequences: the one-pass forward's outputs, from three kernels.

    out = three_pass_forward(q, k, v, g, beta, scale=s, initial_state=h0, cu_seqlens=cu,
                             output_final_state=True, training=True)
    out.o, out.final_state, out.states, out.Aqk, out.Akk      # kernel.forward.ForwardOutputs
    out = three_pass_forward(..., token_gate=True, l2norm=True)   # each token's gate, q and k as they come
    out.q, out.k, out.q_rstd, out.k_rstd                      # ... and q, k normalised for the backward

What and why
------------
At one long sequence the one pass (``kernel.forward``) is a serial chain of 16-token tiles, each building
its own INV and products on the way: 8,192 tiles of 1.26 us at 1x131072. These three passes take the
products off the chain and walk 64-token steps (docs/kda_forward.md, the design "three passes (64-token
chain)"; docs/log/45):

1. ``kernel.forward_products``: every chunk's w, u (fp16, with a power-of-two scale a chunk), kg, qg, Aqk (in two
   bf16 parts) and decay at once, across all SMs, and Aqk's and INV's diagonal blocks for our backward;
2. ``kernel.forward_chain``: the chain, one step of two GEMMs a chunk: the states and v_new;
3. ``kernel.forward_output``: o from the states, v_new, qg and Aqk's two parts, across all SMs.

They move more bytes than the one pass (about 7.0 KB a token and head against 3.1), so they pay only where
the one pass's chain binds: :func:`three_passes_pay` is the rule ``kernel.chunk_kda`` follows.

The chain uses a few SMs (four CTAs a sequence and value head), so one long sequence runs in pieces of
chunks (:func:`piece_count`): the chain walks piece i on a stream of the highest priority while the
products pass builds piece i + 1 and the o pass finishes piece i - 1 on the caller's stream. The state
crosses from piece to piece in fp32, so any cut gives the same bits.

The arguments and outputs are :func:`kernel.forward.forward`'s, checked by its plan, with its two forms of
the inputs (``token_gate``, ``l2norm``: the products pass is the one pass that reads g, q and k); the outputs
come in its layouts: the states [B, NT, HV, K, V] (varlen [1, sum NT_n, ...]), Aqk's and INV's diagonal blocks as it writes
them (INV's the same bits; Aqk's from operands in two bf16 each, nearer float64 than the one pass's one bf16), o
and the final state within their roundings of the same values. The numpy statement of each pass is
tests/kernel/three_pass_model.py.
"""
from __future__ import annotations

import numpy as np

from .forward.launch import ForwardOutputs, plan_forward
from .shapes import CHUNK_TOKENS, HEAD_DIM, snapshot_offsets

__all__ = ["three_pass_forward", "three_passes_pay", "THREE_PASS_MAX_PAIRS", "piece_count", "piece_edges",
           "MIN_PIECE_CHUNKS", "MAX_PIECES"]

# The rule's one knob. Both forwards' times, per token of the longest sequence, on the H200 (log 46):
# - the one pass walks 16-token tiles at about 1.25 us a tile while its CTAs are fewer than the SMs,
#   78 ns a token;
# - the three passes take about 1.9 ns a token and value head for the products and o passes, which run
#   across all SMs, plus the chain's 0.92 us a 64-token step, 14 ns a token.
# With P = value heads x tokens / longest sequence's tokens ("pairs": sequences x value heads for equal
# lengths), the three passes take about (1.9 P + 14) ns a token against 78, and win while P is below
# about 33. At 1x131072 with 16 value heads (P = 16) they took 5.89 ms against 10.10 (0.58x); at 4x8192
# with 16 (P = 64), 1.29 against 0.89 ms.
THREE_PASS_MAX_PAIRS = 32

# One sequence runs in pieces, so that the chain of a piece runs beside the products of the next and the o
# pass of the one before (module docstring). At 1x131072 with 16 value heads (2,048 chunks, log 47) the
# passes in turn took 5.84 ms; in 2, 4, 8 and 16 pieces 5.64, 5.53, 5.43 and 5.59. The gain is small
# because each chain CTA fills an SM (180 KB of shared memory), so its 64 CTAs take half the SMs from the
# products pass while it runs; a build small enough to share an SM with a products CTA (115 KB: a ring of
# two stages) walks 20% slower and lost (log 48). The chain is the serial path, so its stream has the
# highest priority: its CTAs take the SMs that free up before the products pass's next ones (8 pieces:
# 5.27 ms against 5.46 at the default priority, log 48). Each piece costs about 0.2 ms of host time (8
# pieces: 2.5 ms a call against 0.9), so pieces stay long: 256 chunks at 1x131072.
MIN_PIECE_CHUNKS = 256
MAX_PIECES = 8


def three_passes_pay(HV: int, B: int, T: int, offsets: np.ndarray | None) -> bool:
    """Whether the three passes beat the one pass on a batch of B sequences of T tokens (``offsets``
    None) or on the sequences of the host offsets ``offsets`` ([N + 1] int): while the batch's pairs,
    HV x its tokens / its longest sequence's tokens, are at most :data:`THREE_PASS_MAX_PAIRS`."""
    if offsets is None:
        tokens, longest = B * T, T
    else:
        lengths = np.diff(np.asarray(offsets, dtype=np.int64))
        tokens, longest = int(lengths.sum()), int(lengths.max(initial=0))
    return longest > 0 and HV * tokens <= THREE_PASS_MAX_PAIRS * longest


def piece_count(chunks: int, N: int) -> int:
    """How many pieces the passes run a batch in (:func:`three_pass_forward`, module docstring): one sequence
    of ``chunks`` 64-token chunks in pieces of at least :data:`MIN_PIECE_CHUNKS`, at most :data:`MAX_PIECES`;
    a batch of several sequences in one."""
    if N != 1:
        return 1
    return max(1, min(MAX_PIECES, chunks // MIN_PIECE_CHUNKS))


def piece_edges(chunks: int, count: int) -> list[int]:
    """The chunks where ``count`` pieces of as near equal length start, and ``chunks`` last."""
    if not 1 <= count <= chunks:
        raise ValueError(f"pieces must be between 1 and the chunks ({chunks}), got {count}")
    return [(i * chunks) // count for i in range(count + 1)]


def three_pass_forward(q, k, v, g, beta, *, scale: float | None = None, initial_state=None, cu_seqlens=None,
                       output_final_state: bool = False, training: bool = False, token_gate: bool = False,
                       l2norm: bool = False, norm_copies: bool = True, pieces: int | None = None) -> ForwardOutputs:
    """:func:`kernel.forward.forward`'s call and outputs (its docstring), in three passes (module docstring).
    ``token_gate``, ``l2norm``: the forms of g and of q and k, as kernel.forward takes them (the products pass
    sums the gate over each chunk and normalises q and k); ``norm_copies`` False: with ``l2norm`` in training
    the rows' rstd alone come out (q and k None), for a backward that reads the raw rows. ``pieces``: how many
    pieces one sequence runs in (None: :func:`piece_count`; 1: each pass once, in turn); a batch of several
    sequences runs in one. The outputs are the same bits for any count."""
    from .forward_chain import forward_chain
    from .forward_output import forward_output
    from .forward_products import forward_products

    plan = plan_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        output_final_state=output_final_state, training=training, token_gate=token_gate,
                        l2norm=l2norm)
    forms = dict(token_gate=plan.config.token_gate, l2norm=plan.config.l2norm, norm_copies=norm_copies)
    keep = plan.states_shape is not None   # training: the states and the blocks our backward reads
    chunks = int(snapshot_offsets(np.diff(plan.cu_seqlens), CHUNK_TOKENS, 1)[-1])   # FLA's chunk offsets' last
    if pieces is None:
        count = piece_count(chunks, plan.N)
    elif isinstance(pieces, (bool, np.bool_)) or not isinstance(pieces, (int, np.integer)) or pieces < 1:
        raise ValueError(f"pieces must be None or an integer >= 1, got {pieces!r}")
    elif pieces > 1 and plan.N != 1:
        raise ValueError(f"pieces: only one sequence runs in pieces, this batch has {plan.N}: pass 1 or None")
    else:
        count = min(int(pieces), chunks)
    if count > 1:
        o, final_state, states, p = _in_pieces(plan, q, k, v, g, beta, initial_state, piece_edges(chunks, count),
                                               forms)
    else:
        # a batch of B > 1 is B sequences of T to every pass; the o pass takes the token offsets either way
        p = forward_products(q, k, v, g, beta, scale=plan.scale,
                             cu_seqlens=plan.cu_seqlens if plan.B == 1 else None, training=keep, **forms)
        walked = forward_chain(p.w, p.u, p.kg, p.decay, p.u_scale, cu_chunks=p.cu_chunks, initial_state=initial_state,
                               output_final_state=plan.final_shape is not None)
        o = forward_output(p.qg, walked.states, p.aqk, p.aqk_lo, walked.v_new, cu_seqlens=plan.cu_seqlens)
        final_state, states = walked.final_state, walked.states
    return ForwardOutputs(o=o.reshape(plan.o_shape), final_state=final_state,
                          states=states.reshape(plan.states_shape) if keep else None,
                          Aqk=p.Aqk if keep else None, Akk=p.Akk if keep else None, q=p.q, k=p.k, q_rstd=p.q_rstd,
                          k_rstd=p.k_rstd)


def _in_pieces(plan, q, k, v, g, beta, initial_state, edges: list[int], forms: dict):
    """The passes over one sequence in pieces (chunks edges[i] .. edges[i + 1] - 1): products and o on the
    caller's stream, the chain beside them on the device's serial stream (the highest priority), each
    piece's chain after its products and each piece's o after its chain. The state goes from piece to piece
    through two fp32 buffers in turn; the last piece writes the final state (or into one of them).
    Everything is allocated before the fork, on the caller's stream, which has waited for the last chain
    when this returns. ``forms``: the products pass's token_gate, l2norm and norm_copies.
    -> (o, final_state, states, the products pass's outputs)."""
    import cupy

    from .forward_chain import launch as chain
    from .forward_output import launch as output
    from .forward_products import launch as products
    from .runtime import builds
    from .runtime.arrays import beta_f32, empty_output, require_cupy, require_gpu, to_cupy

    require_cupy("kernel.three_pass_forward")
    require_gpu("kernel.three_pass_forward")
    keep = plan.states_shape is not None
    pp = products.plan_products(q, k, v, g, beta, scale=plan.scale, cu_seqlens=plan.cu_seqlens, training=keep,
                                **forms)
    device = q.device if plan.torch_out else None
    q_c, k_c, v_c = (to_cupy(n, x, "bf16") for n, x in (("q", q), ("k", k), ("v", v)))
    g_c, beta_c = to_cupy("g", g, "f32"), beta_f32(beta)
    h0 = to_cupy("initial_state", initial_state, "f32") if initial_state is not None else None
    p_t, p_c = products.allocate(pp, device)
    cp = chain.plan_chain(p_t["w"], p_t["u"], p_t["kg"], p_t["decay"], p_t["u_scale"], initial_state=initial_state,
                          output_final_state=plan.final_shape is not None)
    c_t, c_c = chain.allocate(cp, device)
    op = output.plan_output(p_t["qg"], c_t["states"], p_t["aqk"], p_t["aqk_lo"], c_t["v_new"],
                            cu_seqlens=plan.cu_seqlens)
    o_t, o_c = output.allocate(op, device)
    # torch's memory for a torch caller (the CuPy view keeps the tensor alive)
    carry = [empty_output((1, cp.HV, HEAD_DIM, HEAD_DIM), "f32", device)[1] for _ in range(2)]
    ranges = list(zip(edges[:-1], edges[1:]))
    plans = [chain.piece(cp, r) for r in ranges]
    for pl in plans:   # the chunk offsets' device copies, made on this stream before the fork
        chain.device_cu_chunks(pl.cu_chunks.tobytes())
    main = cupy.cuda.get_current_stream()
    serial = builds.serial_stream(cupy.cuda.Device().id)
    products.launch_planned(pp, q_c, k_c, v_c, g_c, beta_c, p_c, chunks=ranges[0])
    made = main.record()
    last = len(ranges) - 1
    for i, (c0, c1) in enumerate(ranges):
        serial.wait_event(made)
        src = h0 if i == 0 else carry[(i - 1) % 2]
        dst = c_c["final_state"] if i == last and c_c["final_state"] is not None else carry[i % 2]
        with serial:
            chain.launch_planned(plans[i], p_c["w"][c0:c1], p_c["u"][c0:c1], p_c["kg"][c0:c1], p_c["decay"][c0:c1],
                                 p_c["u_scale"][c0:c1], src, c_c["states"][c0:c1], c_c["v_new"][c0:c1], dst)
        walked = serial.record()
        if i < last:
            products.launch_planned(pp, q_c, k_c, v_c, g_c, beta_c, p_c, chunks=ranges[i + 1])
            made = main.record()
        main.wait_event(walked)
        output.launch_planned(op, p_c["qg"], c_c["states"], p_c["aqk"], p_c["aqk_lo"], c_c["v_new"], o_c,
                              chunks=(c0, c1))
    outputs = products.ProductsOutputs(**{n: p_t[n] for n in (*products.CHUNK_MAJOR, *products.TOKEN_MAJOR)},
                                       cu_chunks=pp.cu_chunks)
    return o_t, c_t["final_state"], c_t["states"], outputs
