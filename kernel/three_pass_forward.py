"""KDA's forward in three passes, for few long sequences: the one-pass forward's outputs, from three kernels.

    out = three_pass_forward(q, k, v, g, beta, scale=s, initial_state=h0, cu_seqlens=cu,
                             output_final_state=True, training=True)
    out.o, out.final_state, out.states, out.Aqk, out.Akk      # kernel.forward.ForwardOutputs

What and why
------------
At one long sequence the one pass (``kernel.forward``) is a serial chain of 16-token tiles, each building
its own INV and products on the way: 8,192 tiles of 1.26 us at 1x131072. These three passes take the
products off the chain and walk 64-token steps (docs/kda_forward.md, the design "three passes (64-token
chain)"; docs/log/45):

1. ``kernel.forward_products``: every chunk's w, u, kg, qg, Aqk and decay at once, across all SMs, and
   Aqk's and INV's diagonal blocks for our backward;
2. ``kernel.forward_chain``: the chain, one step of two GEMMs a chunk: the states and v_new;
3. ``kernel.forward_output``: o from the states, v_new, qg and Aqk, across all SMs.

They move more bytes than the one pass (about 6.7 KB a token and head against 3.1), so they pay only where
the one pass's chain binds: :func:`three_passes_pay` is the rule ``kernel.chunk_kda`` follows. The arguments and outputs are :func:`kernel.forward.forward`'s, checked by
its plan; the outputs come in its layouts: the states [B, NT, HV, K, V] (varlen [1, sum NT_n, ...]),
Aqk's and INV's diagonal blocks as it writes them (the same bits), o and the final state within their
roundings of the same values. The numpy statement of each pass is tests/kernel/three_pass_model.py.
"""
from __future__ import annotations

import numpy as np

from .forward.launch import ForwardOutputs, plan_forward

__all__ = ["three_pass_forward", "three_passes_pay", "THREE_PASS_MAX_PAIRS"]

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


def three_pass_forward(q, k, v, g, beta, *, scale: float | None = None, initial_state=None, cu_seqlens=None,
                       output_final_state: bool = False, training: bool = False) -> ForwardOutputs:
    """:func:`kernel.forward.forward`'s call and outputs (its docstring), in three passes (module docstring)."""
    from .forward_chain import forward_chain
    from .forward_output import forward_output
    from .forward_products import forward_products

    plan = plan_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        output_final_state=output_final_state, training=training)
    keep = plan.states_shape is not None   # training: the states and the blocks our backward reads
    # a batch of B > 1 is B sequences of T to every pass; the o pass takes the token offsets either way
    p = forward_products(q, k, v, g, beta, scale=plan.scale, cu_seqlens=plan.cu_seqlens if plan.B == 1 else None,
                         training=keep)
    walked = forward_chain(p.w, p.u, p.kg, p.decay, cu_chunks=p.cu_chunks, initial_state=initial_state,
                           output_final_state=plan.final_shape is not None)
    o = forward_output(p.qg, walked.states, p.aqk, walked.v_new, cu_seqlens=plan.cu_seqlens)
    return ForwardOutputs(o=o.reshape(plan.o_shape), final_state=walked.final_state,
                          states=walked.states.reshape(plan.states_shape) if keep else None,
                          Aqk=p.Aqk if keep else None, Akk=p.Akk if keep else None)
