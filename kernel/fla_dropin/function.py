"""What ``kernel.chunk_kda``'s two ops run: our forward (or FLA's) and our backward, as plain functions.

:mod:`.library` registers them with torch.library (the forward and backward ops, their fake
implementations and the autograd formula that joins them); this module holds no autograd state.

Forward (:func:`forward`), whose the call's ``forward`` says (:mod:`.setting`):

* ``"ours"`` (:func:`our_forward`): FLA's beta sigmoid where the call asks for it, then
  :func:`kernel.forward.forward` in training mode on torch's current stream (for few long sequences,
  where its serial chain of tiles binds, the same outputs from
  :func:`kernel.three_pass_forward.three_pass_forward`). Both take the two passes FLA runs first into
  their kernels (docs/kda_forward.md, section 8): they read each token's own gate and sum it themselves
  (:func:`token_gate`; where the op activates the gate, FLA's ``kda_gate_chunk_cumsum`` still makes the
  activated gate's 64-chunk cumsum in log2 first). The l2norm of bf16 q and k: the three passes' products
  pass normalises them, writing them out with their rstd for the backward; the one pass reads FLA's
  ``l2norm_fwd`` copies (as for another dtype). With the call's ``raw_qk_rows`` (:func:`reads_raw_qk`) the kernels
  read the raw rows instead, each with its rstd from :func:`kernel.row_rstd.row_rstd` (a pass that writes the
  rstd alone) or from the products pass, no normalised copy is written, and the backward reads the same raw
  rows and rstd. Out come o, the final
  state, the states entering every 64-token chunk and Aqk's and Akk's 16 x 16 diagonal blocks (the rest
  of their rows unwritten: our backward reads nothing else); out of training mode (``call.training``
  False) o and the final state alone. Every call the boundary admits is within it: nothing falls back to
  FLA's forward.
* ``"fla"`` (:func:`fla_forward`): FLA's preprocessing as FLA's own autograd function runs it (the l2norm
  of q and k with their rstd, the beta sigmoid), then ``fla.ops.kda.chunk_fwd.chunk_kda_fwd``
  with every setting of the call, so that o and the final state are FLA's to the bit.

Either returns every tensor the backward reads (:data:`FORWARD_OUTPUTS`).

Backward (:func:`backward`): :func:`kernel.kda_backward.run` on the tensors the forward left, then
what lies between its gradients and the call's arguments:

* the states: our forward's ([K, V] whatever ``state_v_first``), or FLA's kept ``h`` in [K, V]
  (``disable_recompute`` without ``state_v_first``), skip the forward-state scan; otherwise it runs;
* the gate: the 64-chunk cumsum of the activated gate, recomputed by FLA's own
  ``kda_gate_chunk_cumsum`` where FLA's forward freed it (ours keeps it); the gate activation's
  backward to g_raw, A_log and dt_bias in Kernel B's epilogue, where it forms dg (a bf16 g_raw; FLA's
  fused ``kda_gate_bwd``, a pass of its own, for another dtype); :mod:`kernel.activations` holds the
  same math in torch, which the tests check in float64;
* beta: the sigmoid's backward;
* ``state_v_first``: the states enter and leave the backward as [K, V];
* grouped value heads: native in the kernels (each value head reads q and k at its query / key head,
  never repeated in memory), dq and dk summed over each group by :func:`kernel.kda_backward.run`, as
  FLA sums them;
* the l2norm's backward, in Kernel B's epilogue (from the forward's rstd), and the casts to the inputs' dtypes.

Every gate FLA accepts runs ours, forward and backward: a 16-token tile whose gates decay a channel
past fp32's range for the factorised tile products has them formed pairwise, decided on the device
with no host sync (docs/kda_forward.md, section 7; docs/kda_backward.md, "Gates of any size").
"""
from __future__ import annotations

import warnings

import torch

from ..shapes import CHUNK_TOKENS
from .arguments import Call

__all__ = ["forward", "forward_here", "our_forward", "fla_forward", "backward", "reads_raw_qk", "normalises_bf16_rows",
           "FORWARD_OUTPUTS", "GRADIENT_INPUTS", "FallbackWarning", "warn_once", "forget_warnings"]


class FallbackWarning(UserWarning):
    """A call ran FLA's own path instead of ours; the message says which argument or value is why."""


_warned: set[str] = set()


def forget_warnings() -> None:
    """Warn again about every reason, as if none had been given yet: for a tool that reports per case
    whether FLA's path ran."""
    _warned.clear()


def warn_once(message: str) -> None:
    """Warn about ``message`` once per process (a training loop would repeat it every step)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, FallbackWarning, stacklevel=3)


def _fla():
    try:
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.common.gate import fused_beta_sigmoid_fwd
        from fla.ops.kda.chunk_fwd import chunk_kda_fwd
        from fla.ops.kda.gate import kda_gate_bwd, kda_gate_chunk_cumsum
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
        from fla.ops.utils.index import prepare_chunk_indices
    except ImportError as exc:
        raise ImportError(f"FLA's forward (kernel.use_forward('fla')) needs fla-core 0.6.0 and triton ({exc}); "
                          f"our forward and backward do not") from exc
    return dict(l2norm_fwd=l2norm_fwd, beta_sigmoid=fused_beta_sigmoid_fwd,
                chunk_kda_fwd=chunk_kda_fwd, gate_cumsum=kda_gate_chunk_cumsum, local_cumsum=chunk_local_cumsum,
                gate_bwd=kda_gate_bwd, rcp_ln2=RCP_LN2, chunk_indices=prepare_chunk_indices)


def around_our_kernels() -> dict:
    """What the op runs around our kernels (l2norm, beta's sigmoid, the gate's chunk cumsum, the gate's
    backward where Kernel B's epilogue does not take it): FLA's Triton kernels where fla-core imports, so
    that its tensors stay FLA's to the bit, else the same math in torch (:mod:`.preprocess`), so that our
    forward and our backward need no FLA."""
    try:
        return _fla()
    except ImportError:
        from .preprocess import preprocessing

        return preprocessing()


def _v_first(x: torch.Tensor | None) -> torch.Tensor | None:
    """[.., K, V] <-> [.., V, K]"""
    return None if x is None else x.transpose(-1, -2).contiguous()


# forward's tensors, in the order the op returns them (each one the call does not make is absent):
# the output, the final state, and what the backward reads: q and k normalised where the kernels read
# them so (absent where they read the call's raw rows: reads_raw_qk) with their rstd, beta after the
# sigmoid, the 64-chunk cumsum of the gate in log2 (absent where FLA's forward frees it: the gate
# activated in the op, without disable_recompute; and from ours where the op does not activate the gate:
# our kernels then read the call's own, token_gate), Aqk, Akk, and the states entering every chunk h
# (our forward's always, FLA's kept with disable_recompute)
FORWARD_OUTPUTS = ("o", "final_state", "q", "q_rstd", "k", "k_rstd", "beta", "g_cumsum", "Aqk", "Akk", "h")
# the inputs that have a gradient, in the order the backward returns them
GRADIENT_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")
# the kernels copy every tensor by 16-byte cp.async (kernel.forward.launch.ALIGN)
KERNEL_ALIGN = 16


def reads_raw_qk(raw_qk_rows: bool, forward: str, use_qk_l2norm_in_kernel: bool, q_dtype: torch.dtype,
                 k_dtype: torch.dtype) -> bool:
    """Whether our kernels read the call's q and k as they came, with each row's rstd: where the call's
    ``raw_qk_rows`` (:data:`.setting.RAW_QK_ROWS` at its boundary) lets them and our forward normalises bf16 q
    and k (:func:`normalises_bf16_rows`). FLA's forward normalises them itself."""
    return raw_qk_rows and forward == "ours" and normalises_bf16_rows(use_qk_l2norm_in_kernel, q_dtype, k_dtype)


def normalises_bf16_rows(use_qk_l2norm_in_kernel: bool, q_dtype: torch.dtype, k_dtype: torch.dtype) -> bool:
    """Whether the call asks for the l2norm of bf16 q and k, which our kernels can form themselves (each row's
    rstd; FLA's l2norm pass for another dtype)."""
    return use_qk_l2norm_in_kernel and q_dtype == torch.bfloat16 and k_dtype == torch.bfloat16


def forward(call: Call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu) -> dict:
    """The call's forward on CUDA tensors: {name: tensor or None} for :data:`FORWARD_OUTPUTS` (o in
    q's dtype). ``cu_seqlens_cpu`` goes to FLA as the caller gave it."""
    if q.device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor (the op runs on the GPU: FLA's Triton kernels and ours), "
                         f"got one on {q.device}")
    with torch.cuda.device(q.device):
        return forward_here(call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)


def forward_here(call: Call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu) -> dict:
    """:func:`forward` on q's current device: :func:`our_forward` or :func:`fla_forward`, as ``call.forward`` says."""
    run = our_forward if call.forward == "ours" else fla_forward
    return run(call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)


def _preprocess(fla, call: Call, q, k, v, g, beta, initial_state, l2norm_here: bool = True):
    """What FLA's autograd function does before its kernels: (q, q_rstd, k, k_rstd, v, g, beta,
    beta_activated or None, initial_state), contiguous; q and k l2-normalised where the call asks (and
    ``l2norm_here``: not where our forward normalises them itself)."""
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    initial_state = None if initial_state is None else initial_state.contiguous()
    q_rstd = k_rstd = None
    if call.use_qk_l2norm_in_kernel and l2norm_here:
        q, q_rstd = fla["l2norm_fwd"](q)
        k, k_rstd = fla["l2norm_fwd"](k)
    beta_activated = None
    if call.use_beta_sigmoid_in_kernel:
        beta_activated = fla["beta_sigmoid"](beta, scale=call.beta_scale)
    return q, q_rstd, k, k_rstd, v, g, beta, beta_activated, initial_state


def fla_forward(call: Call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu) -> dict:
    """FLA's forward on q's current device: FLA's preprocessing and ``chunk_kda_fwd``."""
    fla = _fla()
    q, q_rstd, k, k_rstd, v, g, beta, beta_activated, initial_state = _preprocess(fla, call, q, k, v, g, beta,
                                                                                   initial_state)
    chunk_indices = _chunk_indices(fla, cu_seqlens, cu_seqlens_cpu)
    (o, final_state, g_cumsum, Aqk, Akk, _w, _u, _qg, _kg, _v_new, h, _h0) = fla["chunk_kda_fwd"](
        q=q, k=k, v=v, g=g, beta=beta if beta_activated is None else beta_activated, scale=call.scale,
        initial_state=initial_state, output_final_state=call.output_final_state, state_v_first=call.state_v_first,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_indices, chunk_size=CHUNK_TOKENS,
        safe_gate=call.safe_gate, lower_bound=call.lower_bound, use_gate_in_kernel=call.use_gate_in_kernel,
        A_log=A_log, dt_bias=dt_bias, disable_recompute=call.disable_recompute)
    # FLA keeps w, u, qg, kg, v_new for its own backward; ours needs only h (the states), and the raw
    # gate where the activation ran in the kernel (g_cumsum is then None unless disable_recompute)
    normed = call.use_qk_l2norm_in_kernel
    return dict(o=o.type_as(q), final_state=final_state, q=q if normed else None, q_rstd=q_rstd,
                k=k if normed else None, k_rstd=k_rstd, beta=beta_activated, g_cumsum=g_cumsum, Aqk=Aqk, Akk=Akk,
                h=h if call.disable_recompute else None)


def our_forward(call: Call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu) -> dict:
    """Our forward on q's current device: FLA's preprocessing and the gate's cumsum (kept for the
    backward) where our kernels do not take their place (:func:`token_gate`; the l2norm: :func:`reads_raw_qk`),
    then :func:`kernel.forward.forward`, or for few long sequences its three passes
    (:func:`kernel.three_pass_forward.three_passes_pay`), in the call's mode on torch's current
    stream, every output from torch's allocator. ``state_v_first``: the initial state goes in as
    [K, V] and the final state comes out as [V, K]; the states (h) stay [K, V], as our backward reads
    them."""
    from .. import forward as kernel_forward
    from .. import three_pass_forward as three_passes

    fla = around_our_kernels()
    o_dtype = q.dtype   # o in q's dtype, as FLA's
    pays = three_passes.three_passes_pay(call.HV, call.B, call.T, call.offsets)
    # the l2norm on bf16 q and k: in the three passes' products pass, which forms each row's rstd (and writes the
    # normalised rows too, unless the kernels read raw ones); raw rows in the one pass come with the rstd pass's
    # (its own l2norm build cost 6.5 ms at 32x8192, where a pass that writes the rstd alone moves half the bytes of
    # FLA's l2norm, which also writes the normalised copies: docs/log/57); else FLA's l2norm pass
    raw = reads_raw_qk(call.raw_qk_rows, call.forward, call.use_qk_l2norm_in_kernel, q.dtype, k.dtype)
    in_products = pays and normalises_bf16_rows(call.use_qk_l2norm_in_kernel, q.dtype, k.dtype)
    q, q_rstd, k, k_rstd, v, g, beta, beta_activated, initial_state = _preprocess(fla, call, q, k, v, g, beta,
                                                                                   initial_state,
                                                                                   not (raw or in_products))
    tokens = token_gate(call)
    if tokens:   # each token's gate as the call passed it, fp32 (a copy only where it is not)
        g_read = g.float()
    else:
        g_read = _gate_cumsum(fla, call, g, A_log, dt_bias, cu_seqlens, _chunk_indices(fla, cu_seqlens, cu_seqlens_cpu))
    kernels_beta = (beta if beta_activated is None else beta_activated).float()   # bf16 widened by torch, not CuPy
    h0 = _v_first(initial_state) if call.state_v_first else initial_state
    inputs = [_aligned(x) for x in (q, k, v, g_read, kernels_beta, h0)]
    common = dict(scale=call.scale, initial_state=inputs[5], cu_seqlens=call.offsets,
                  output_final_state=call.output_final_state, training=call.training, token_gate=tokens)
    q, k = inputs[0], inputs[1]   # as the kernels read them, aligned
    with _torch_stream():
        if pays:   # the one pass's call and outputs
            out = three_passes.three_pass_forward(*inputs[:5], **common, l2norm=in_products, norm_copies=not raw)
            if in_products:   # None out of training
                q_rstd, k_rstd = out.q_rstd, out.k_rstd
                if not raw:
                    q, k = out.q, out.k
        else:
            if raw:
                from ..row_rstd import row_rstd

                q_rstd, k_rstd = row_rstd(inputs[0], inputs[1])
            out = kernel_forward.forward(*inputs[:5], **common, rstd=(q_rstd, k_rstd) if raw else None)
    final_state = _v_first(out.final_state) if call.state_v_first else out.final_state
    normed = call.use_qk_l2norm_in_kernel and not raw   # raw: the backward reads the call's own q and k
    # the cumsum goes to the backward only where the op activated the gate (else it reads the call's own)
    return dict(o=out.o.to(o_dtype), final_state=final_state, q=q if normed else None, q_rstd=q_rstd,
                k=k if normed else None, k_rstd=k_rstd, beta=beta_activated,
                g_cumsum=None if tokens else g_read, Aqk=out.Aqk, Akk=out.Akk, h=out.states)


def token_gate(call: Call) -> bool:
    """Whether our kernels read the call's own gate, each token's, and sum it within each 16-token tile
    themselves (the chunk cumsum pass folded into its readers, docs/kda_forward.md section 8): our forward
    and our backward on a gate the call passes as is. Not with FLA's forward (it makes the cumsum itself),
    nor where the op activates the gate (the activation's pass would write as many bytes as the cumsum's).
    Either forward takes it: the one pass's R1 sums each tile, the three passes' products pass each chunk."""
    return call.forward == "ours" and not call.use_gate_in_kernel


def _gate_cumsum(fla, call: Call, g, A_log, dt_bias, cu_seqlens, chunk_indices):
    """The 64-chunk-local cumsum of the gate / ln 2, fp32, as FLA's chunk_kda_fwd makes it: of the gate
    the op activates (A_log, dt_bias, lower_bound), or of the call's log gate."""
    if call.use_gate_in_kernel:
        return fla["gate_cumsum"](g=g, A_log=A_log, dt_bias=dt_bias, scale=fla["rcp_ln2"], chunk_size=CHUNK_TOKENS,
                                  cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=call.lower_bound)
    return fla["local_cumsum"](g=g, scale=fla["rcp_ln2"], chunk_size=CHUNK_TOKENS, cu_seqlens=cu_seqlens,
                               chunk_indices=chunk_indices)


def _aligned(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` (contiguous), or a copy where its first byte is not 16-byte aligned (a contiguous slice of
    a larger tensor can start anywhere; the forward's plan refuses that)."""
    if x is None or x.data_ptr() % KERNEL_ALIGN == 0:
        return x
    return x.clone()


def _torch_stream():
    """CuPy on torch's current stream, so that our kernel is ordered with torch's work and a CUDA
    graph capture takes it in (as kernel.kda_backward.run does for a torch caller)."""
    from ..runtime.arrays import torch_stream_for_cupy

    return torch_stream_for_cupy("kernel.chunk_kda's forward (kernel.forward; kernel.use_forward('fla') runs FLA's)")


def _chunk_indices(fla, cu_seqlens, cu_seqlens_cpu):
    """FLA's chunk table for cu_seqlens, as FLA's own autograd function makes it (FLA caches it by the
    arguments' identity, so the backward's call with the same arguments reuses the forward's)."""
    if cu_seqlens is None:
        return None
    return fla["chunk_indices"](cu_seqlens=cu_seqlens, chunk_size=CHUNK_TOKENS, cu_seqlens_cpu=cu_seqlens_cpu)


def backward(call: Call, need: tuple[bool, ...], g_dtype: torch.dtype, do, dht, q, q_rstd, k, k_rstd, v, g_cumsum,
             g_raw, beta, beta_activated, A_log, dt_bias, Aqk, Akk, h, initial_state, cu_seqlens,
             cu_seqlens_cpu) -> tuple:
    """The gradients of :data:`GRADIENT_INPUTS` (None for one that ``need`` leaves out or the call has
    not), each in its input's dtype (g's is ``g_dtype``), from the forward's tensors: q and k as the
    kernels read them, ``beta`` the call's and ``beta_activated`` the sigmoid's (or None), ``g_raw`` the
    call's gate where the op activated it or our kernels read it as it came (:func:`token_gate`; then
    ``g_cumsum`` is None). ``do`` and ``dht`` may be None (no gradient reached them)."""
    fla = around_our_kernels()
    if do is None:
        do = torch.zeros(v.shape, dtype=q.dtype, device=v.device)
    kernels_beta = beta if beta_activated is None else beta_activated
    with torch.cuda.device(q.device):
        # contiguous and 16-byte aligned, as the kernels' copies read them (the forward's inputs likewise)
        q, k, v, do = (_aligned(x.contiguous()) for x in (q, k, v, do))
        initial_state = None if initial_state is None else initial_state.contiguous()
        chunk_indices = _chunk_indices(fla, cu_seqlens, cu_seqlens_cpu)
        tokens = token_gate(call)
        if tokens:   # our kernels sum each token's gate themselves
            g_cumsum = _aligned(g_raw.float().contiguous())
        elif g_cumsum is None:   # FLA's forward freed it (the gate activated in the op): recomputed as it made it
            g_cumsum = _gate_cumsum(fla, call, g_raw, A_log, dt_bias, cu_seqlens, chunk_indices)
        # with the l2norm in the op, Kernel B's epilogue applies its backward (q, k the normalised rows, or the
        # raw rows that the kernels scale by their rstd: reads_raw_qk)
        rstd = (q_rstd, k_rstd) if call.use_qk_l2norm_in_kernel else None
        raw = reads_raw_qk(call.raw_qk_rows, call.forward, call.use_qk_l2norm_in_kernel, q.dtype, k.dtype)
        # the gate's activation backward (Kernel B's gate build, or FLA's pass for a gate not in bf16):
        # skipped where no gradient of the raw gate, A_log or dt_bias is asked for (need: GRADIENT_INPUTS' order)
        gate_wanted = any(need[GRADIENT_INPUTS.index(name)] for name in ("g", "A_log", "dt_bias"))
        dq, dk, dv, dbeta, dg, dh0, dA, dbias = _ours(call, q, k, v, g_cumsum, g_raw, kernels_beta, A_log, dt_bias,
                                                      Aqk, Akk, h, initial_state, do, dht, rstd, gate_wanted, tokens,
                                                      raw)
    if beta_activated is not None and need[4]:
        from ..activations import beta_backward

        dbeta = beta_backward(dbeta, beta, call.allow_neg_eigval)
    dtypes = (q.dtype, k.dtype, v.dtype, g_dtype, beta.dtype,
              None if A_log is None else A_log.dtype, None if dt_bias is None else dt_bias.dtype, torch.float32)
    grads = (dq, dk, dv, dg, dbeta, dA, dbias, dh0 if initial_state is not None else None)
    return tuple(x.to(dt) if (x is not None and wanted) else None for x, dt, wanted in zip(grads, dtypes, need))


def _ours(call: Call, q, k, v, g_cumsum, g_raw, beta, A_log, dt_bias, Aqk, Akk, h, initial_state, do, dht, rstd,
          gate_wanted: bool = True, token_gate: bool = False, qk_raw: bool = False):
    """Our backward and the layouts around it; the gradients as FLA's chunk_kda_bwd returns them
    (dq, dk, dv, dbeta, dg with respect to the gate the call passed, dh0, dA_log, ddt_bias), dq and dk
    through the l2norm's backward where ``rstd`` (q's and k's) is given; the gate's activation backward
    only where ``gate_wanted`` (else dg stays the activated gate's, and dA_log, ddt_bias None).
    ``token_gate``: ``g_cumsum`` is each token's gate, which Kernels A and B sum within each tile. ``qk_raw``:
    q and k are the raw rows, which the kernels scale by ``rstd`` (:func:`reads_raw_qk`)."""
    from ..kda_backward import Gate, checked_batch, run

    if rstd is not None:   # Kernel B reads them at each value head's query / key head, as q and k
        rstd = tuple(x.float().contiguous() for x in rstd)
    batch = checked_batch(call.B, call.T, call.H, call.offsets, scale=call.scale, torch_out=True, HV=call.HV)
    # our forward's states are [K, V] in every layout; FLA's kept h is [V, K] with state_v_first, and
    # then the forward-state scan makes ours instead
    states = h if (call.forward == "ours" or not call.state_v_first) else None
    h0 = _v_first(initial_state) if call.state_v_first else initial_state
    dht = None if dht is None else (_v_first(dht) if call.state_v_first else dht.contiguous())
    # the gate activation's backward in Kernel B's epilogue, which writes g_raw's gradient in bf16 only
    in_kernel = call.use_gate_in_kernel and gate_wanted and g_raw.dtype == torch.bfloat16
    gate = Gate(g_raw.contiguous(), A_log, dt_bias, call.lower_bound) if in_kernel else None
    # bf16 dq, dk where the caller's are: rounded once (in Kernel B, or with GVA after the group sum)
    grads = run(batch, q, k, v, g_cumsum, beta, Aqk, Akk, do.contiguous(), initial_state=h0, dht=dht, states=states,
                rstd=rstd, dqk_bf16=q.dtype == torch.bfloat16 and k.dtype == torch.bfloat16, gate=gate,
                token_gate=token_gate, qk_raw=qk_raw)
    dq, dk = grads["dq"], grads["dk"]
    dh0 = grads["dh0"]
    if call.state_v_first and dh0 is not None:
        dh0 = _v_first(dh0)
    if in_kernel:
        dA, dbias = grads["dA_log"], grads["ddt_bias"]
        return (dq, dk, grads["dv"], grads["dbeta"], grads["dg_raw"], dh0,
                None if dA is None else dA.view(A_log.shape), None if dbias is None else dbias.view(dt_bias.shape))
    dg, dA, dbias = grads["dg"], None, None
    if call.use_gate_in_kernel and gate_wanted:
        # FLA's fused gate backward (one pass, dA_log and dt_bias summed per block of 32 tokens, then
        # over blocks): kernel.activations.gate_backward is the same math in torch, in float64 in the tests
        dg, dA, dbias = around_our_kernels()["gate_bwd"](g=g_raw.contiguous(), A_log=A_log, dt_bias=dt_bias, dyg=dg,
                                                     lower_bound=call.lower_bound)
    return dq, dk, grads["dv"], grads["dbeta"], dg, dh0, dA, dbias
