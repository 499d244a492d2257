"""``kernel.chunk_kda``: flash-linear-attention's KDA layer with FLA's forward and our backward.

    from kernel import chunk_kda          # instead of: from fla.ops.kda import chunk_kda
    o, final_state = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5)

What and why
------------
The same call as fla-core 0.6.0's ``fla.ops.kda.chunk_kda``, argument for
argument (names, order, defaults), so that switching is one import. The
forward *is* FLA's: the preprocessing FLA's own autograd function does (the
l2norm of q and k when ``use_qk_l2norm_in_kernel``, the chunk table for
``cu_seqlens``) and then ``fla.ops.kda.chunk_fwd.chunk_kda_fwd``, so o and the
final state are FLA's to the bit. The backward is ours:
:func:`kernel.kda_backward.kda_backward` on the tensors FLA's forward left
(q and k as normalised, the 64-chunk gate cumsum, Aqk, Akk, and FLA's states
``h`` when ``disable_recompute`` kept them), then FLA's l2norm backward and the
casts to the inputs' dtypes, as FLA's backward does.

What it covers, and what it refuses
-----------------------------------
Covered: q, k, v bf16 [B, T, H, 128] (or [1, total, H, 128] with
``cu_seqlens``), g the per-token natural-log gate [.., H, 128] computed
outside (any float dtype), beta after its sigmoid [.., H], ``scale``,
``initial_state`` (fp32 [N, H, 128, 128]), ``output_final_state``,
``use_qk_l2norm_in_kernel``, ``cu_seqlens`` / ``cu_seqlens_cpu``, ``safe_gate``
and ``lower_bound`` (passed to FLA's forward as they are), ``disable_recompute``.

Refused with a ValueError that names the argument and what to do instead,
before anything touches the GPU: the gate or beta activation inside the kernel
(``use_gate_in_kernel``, ``A_log``, ``dt_bias``, ``use_beta_sigmoid_in_kernel``,
``allow_neg_eigval``), grouped value heads (v with more heads than q),
``state_v_first`` (and its old name ``transpose_state_layout``), ``cp_context``,
``chunk_size`` other than 64, ``return_intermediate_states``, ``use_graph`` /
``max_num_seqs``, head dimensions other than 128, q, k, v not bf16, and, with
``safe_gate=False``, gates below :data:`GATE_FLOOR` (our backward needs every
16-token tile to decay by at most 2^-126 per channel; a gate clamped to [-5, 0]
always qualifies; with ``safe_gate=True`` the caller promises bounded gates, as
FLA's own safe-gate path needs, and nothing is read back). A keyword FLA does not know is a
TypeError (FLA ignores it).

torch is imported with this module; fla and :mod:`kernel.kda_backward` (CuPy)
only when the forward or the backward runs. ``import kernel`` needs none of
them: ``kernel.chunk_kda`` loads this module on first use.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .runtime.arrays import check_scale
from .shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS, check_cu_seqlens

# The backward's range: a 16-token tile may decay a channel by at most 2^-126 (fp32's
# smallest normal), i.e. the gates of 16 tokens may sum to no less than -126 ln 2.
# Every gate >= GATE_FLOOR is enough (-5.458...; FLA's recommended clamp is -5).
GATE_FLOOR = -126.0 * math.log(2.0) / TILE_TOKENS

FLA_CALL = "fla.ops.kda.chunk_kda"

__all__ = ["chunk_kda", "ChunkKDAFunction", "GATE_FLOOR"]


# ----------------------------------------------------------------------------
# the refusals: every one before the GPU is touched
# ----------------------------------------------------------------------------

# (argument, FLA's default, what to do instead) for every argument we do not cover
_NOT_COVERED = (
    ("use_gate_in_kernel", False,
     "compute the gate outside, e.g. g = -A_log.exp() * softplus(g_raw + dt_bias), clamped to "
     "[-5, 0], and pass it as g"),
    ("use_beta_sigmoid_in_kernel", False, "apply the sigmoid outside: beta = beta_logits.sigmoid()"),
    ("allow_neg_eigval", False, "scale beta outside: beta = 2 * beta_logits.sigmoid()"),
    ("return_intermediate_states", False, f"call {FLA_CALL} (it returns h in inference mode)"),
    ("state_v_first", False, f"keep the state [K, V] (transpose it outside) or call {FLA_CALL}"),
    ("cp_context", None, f"call {FLA_CALL} (context parallelism is not covered)"),
    ("use_graph", False, f"call {FLA_CALL} (CUDA-graph varlen mode is not covered)"),
    ("max_num_seqs", None, f"leave it unset (it belongs to use_graph) or call {FLA_CALL}"),
)
# FLA's chunk_kda reads these from **kwargs
_KWARGS_NOT_COVERED = (
    ("A_log", None, "it belongs to use_gate_in_kernel: compute the gate outside and pass it as g"),
    ("dt_bias", None, "it belongs to use_gate_in_kernel: compute the gate outside and pass it as g"),
    ("transpose_state_layout", False, f"keep the state [K, V] (transpose it outside) or call {FLA_CALL}"),
)


def _is_default(got: Any, default: Any) -> bool:
    if default is None:
        return got is None
    return isinstance(got, (bool, int)) and got == default


def _refuse(name: str, got: Any, instead: str) -> ValueError:
    shown = f"a tensor of shape {list(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)
    return ValueError(f"kernel.chunk_kda does not cover {name}={shown}; {instead}")


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


# chunk_kda's switches: each must be a real bool ('yes' or 1 would be read as True)
BOOL_ARGUMENTS = ("output_final_state", "use_qk_l2norm_in_kernel", "safe_gate", "disable_recompute")


def check_arguments(q, k, v, g, beta, *, initial_state, cu_seqlens, flags: dict[str, Any],
                    kwargs: dict[str, Any], switches: dict[str, Any] | None = None, scale: Any = None,
                    cu_seqlens_cpu=None) -> None:
    """Every refusal, on shapes, dtypes, flags and the offsets alone (CPU tensors are fine): the one
    check of a call, where the user's arguments arrive."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__module__}.{type(x).__name__}")
    for name, x in (("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor (a torch.LongTensor of offsets for cu_seqlens) or None, "
                            f"got {type(x).__module__}.{type(x).__name__}")
    for name, got in (switches or {}).items():
        if not isinstance(got, bool):
            raise TypeError(f"{name} must be True or False, got {got!r}")
    check_scale(scale)
    for name, default, instead in _NOT_COVERED:
        got = flags[name]
        if not _is_default(got, default):
            raise _refuse(name, got, instead)
    rest = dict(kwargs)
    for name, default, instead in _KWARGS_NOT_COVERED:
        if name in rest:
            got = rest.pop(name)
            if not _is_default(got, default):
                raise _refuse(name, got, instead)
    if "chunk_size" in rest:
        got = rest.pop("chunk_size")
        if not _is_default(got, CHUNK_TOKENS):
            raise _refuse("chunk_size", got, f"leave it at {CHUNK_TOKENS} (our backward's chunk) or call {FLA_CALL}")
    if rest:
        raise TypeError(f"kernel.chunk_kda got keyword arguments FLA's chunk_kda does not know: {sorted(rest)}")

    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name}: expected [B, T, H, {HEAD_DIM}], got shape {_shape(x)}")
    if _shape(q) != _shape(k):
        raise ValueError(f"q and k must have the same shape, got q {_shape(q)} and k {_shape(k)}")
    B, T, H, K = _shape(q)
    if min(B, T, H) < 1:
        raise ValueError(f"q must have B, T, H >= 1 (no empty batch, sequence or head axis), got shape {_shape(q)}")
    HV, V = v.shape[2], v.shape[3]
    if K != HEAD_DIM:
        raise _refuse("q.shape[-1] (the key head dim)", K, f"use {HEAD_DIM} or call {FLA_CALL}")
    if V != HEAD_DIM:
        raise _refuse("v.shape[-1] (the value head dim)", V, f"use {HEAD_DIM} or call {FLA_CALL}")
    if HV != H:
        raise _refuse("v.shape[2] (value heads; grouped value attention)", HV,
                      f"give v as many heads as q ({H}; repeat q and k per value head) or call {FLA_CALL}")
    if _shape(v)[:2] != (B, T):
        raise ValueError(f"v: expected [{B}, {T}, {H}, {V}] like q, got {_shape(v)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != torch.bfloat16:
            raise _refuse(f"{name}.dtype", x.dtype, f"cast {name} to torch.bfloat16 (as autocast does) "
                          f"or call {FLA_CALL}")
    if _shape(g) != (B, T, H, K):
        raise ValueError(f"g: expected [B, T, H, K] = {[B, T, H, K]}, got {list(_shape(g))}")
    if not g.dtype.is_floating_point:
        raise ValueError(f"g: expected a floating dtype, got {g.dtype}")
    if _shape(beta) != (B, T, H):
        raise ValueError(f"beta: expected [B, T, H] = {[B, T, H]}, got {list(_shape(beta))}")
    if not beta.dtype.is_floating_point:
        raise ValueError(f"beta: expected a floating dtype, got {beta.dtype}")

    N = B
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens: the batch size must be 1 (flattened [1, total, H, K]), got q of "
                             f"shape {_shape(q)}")
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens: expected N+1 >= 2 offsets, got shape {_shape(cu_seqlens)}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens: expected an integer dtype (torch.long), got {cu_seqlens.dtype}")
        # its values: 0 first, strictly increasing, T last (from cu_seqlens_cpu where the caller has it,
        # else a copy of N + 1 integers to the host, as FLA's own chunk index makes)
        check_cu_seqlens(cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens, B, T)
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        if _shape(initial_state) != (N, H, K, V):
            raise ValueError(f"initial_state: expected [N, H, K, V] = {[N, H, K, V]}, got "
                             f"{list(_shape(initial_state))}")
        if initial_state.dtype != torch.float32:
            raise ValueError(f"initial_state: expected torch.float32 (as FLA), got {initial_state.dtype}")


def check_gate_range(g: torch.Tensor) -> None:
    """The one data-dependent refusal: a reduction and a host sync, so it runs only with
    safe_gate=False. With safe_gate=True the caller promises bounded gates, as FLA's own
    M = 16 path needs them for the same reason (16-token diagonal blocks within fp32), and the
    training step stays free of host syncs (a sync per layer and step keeps the host from
    queueing the next step's work while the GPU runs this one)."""
    if g.numel() == 0:
        return
    low = float(g.detach().amin())
    if not low >= GATE_FLOOR:   # also catches NaN
        raise ValueError(f"g: every per-token gate must be >= {GATE_FLOOR:.4f} (the backward lets a 16-token "
                         f"tile decay by at most 2^-126), got min(g) = {low}; clamp the gate to [-5, 0] "
                         f"(FLA's safe_gate=True, lower_bound=-5) or call {FLA_CALL}")


# ----------------------------------------------------------------------------
# the autograd function
# ----------------------------------------------------------------------------

def _fla_forward():
    try:
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.kda.chunk_fwd import chunk_kda_fwd
        from fla.ops.utils.index import prepare_chunk_indices
    except ImportError as exc:
        raise ImportError(f"kernel.chunk_kda runs FLA's forward: it needs fla-core 0.6.0 and triton ({exc})") from exc
    return l2norm_fwd, chunk_kda_fwd, prepare_chunk_indices


class ChunkKDAFunction(torch.autograd.Function):
    """FLA's forward (``chunk_kda_fwd``), our backward (:func:`kernel.kda_backward.kda_backward`)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, q, k, v, g, beta, initial_state, scale: float, output_final_state: bool,
                use_qk_l2norm_in_kernel: bool, cu_seqlens, cu_seqlens_cpu, safe_gate: bool,
                lower_bound: float | None, disable_recompute: bool):
        l2norm_fwd, chunk_kda_fwd, prepare_chunk_indices = _fla_forward()
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        initial_state = None if initial_state is None else initial_state.contiguous()
        in_dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        with torch.cuda.device(q.device):
            q_rstd = k_rstd = None
            if use_qk_l2norm_in_kernel:
                q, q_rstd = l2norm_fwd(q)
                k, k_rstd = l2norm_fwd(k)
            chunk_indices = None
            if cu_seqlens is not None:
                chunk_indices = prepare_chunk_indices(cu_seqlens=cu_seqlens, chunk_size=CHUNK_TOKENS,
                                                      cu_seqlens_cpu=cu_seqlens_cpu)
            (o, final_state, g_cumsum, Aqk, Akk, _w, _u, _qg, _kg, _v_new, h, initial_state) = chunk_kda_fwd(
                q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                chunk_indices=chunk_indices, chunk_size=CHUNK_TOKENS, safe_gate=safe_gate,
                lower_bound=lower_bound, disable_recompute=disable_recompute)
        # FLA keeps w, u, qg, kg, v_new for its own backward; ours needs only h (the states)
        ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g_cumsum, beta, Aqk, Akk,
                              h if disable_recompute else None, initial_state, cu_seqlens)
        ctx.scale = scale
        ctx.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel
        ctx.in_dtypes = in_dtypes
        ctx.has_initial_state = initial_state is not None
        return o.type_as(q), final_state

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, do, dht):
        from .kda_backward import checked_batch, run

        q, q_rstd, k, k_rstd, v, g_cumsum, beta, Aqk, Akk, h, initial_state, cu_seqlens = ctx.saved_tensors
        # No argument here is the user's unchecked: chunk_kda checked the call where it arrived (v, beta,
        # initial_state, cu_seqlens, scale, q's shape and device, all on q's device); q, k, g_cumsum, Aqk,
        # Akk and h are FLA's forward's own outputs, made in the layout kda_backward reads (the GPU tests
        # compare every gradient with FLA's); and autograd hands do and dht the shape, dtype and device
        # of o and final_state. So the backward runs on the checked path (kda_backward.run), not through
        # kda_backward's entry point, which would check every tensor again.
        B, T, H, _ = q.shape
        batch = checked_batch(B, T, H, cu_seqlens, scale=ctx.scale, torch_out=True)
        with torch.cuda.device(q.device):
            grads = run(batch, q, k, v, g_cumsum, beta, Aqk, Akk, do.contiguous(), initial_state=initial_state,
                        dht=None if dht is None else dht.contiguous(), states=h)
            dq, dk = grads["dq"], grads["dk"]
            if ctx.use_qk_l2norm_in_kernel:
                from fla.modules.norm.l2norm import l2norm_bwd

                dq = l2norm_bwd(q, q_rstd, dq)
                dk = l2norm_bwd(k, k_rstd, dk)
        q_dt, k_dt, v_dt, g_dt, beta_dt = ctx.in_dtypes
        dh0 = grads["dh0"] if ctx.has_initial_state else None
        return (dq.to(q_dt), dk.to(k_dt), grads["dv"].to(v_dt), grads["dg"].to(g_dt), grads["dbeta"].to(beta_dt),
                dh0, None, None, None, None, None, None, None, None)


# ----------------------------------------------------------------------------
# the entry point: FLA's chunk_kda's signature
# ----------------------------------------------------------------------------

@torch.compiler.disable
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA's chunked layer: FLA's forward, our backward. Arguments as ``fla.ops.kda.chunk_kda``.

    q, k: bf16 [B, T, H, 128]; v: bf16 [B, T, H, 128]; g: the per-token
    natural-log gate [B, T, H, 128], every entry >= :data:`GATE_FLOOR` (clamp it
    to [-5, 0]); beta [B, T, H] after its sigmoid; with ``cu_seqlens`` (N+1
    offsets, int64) B = 1 and T = the total. ``initial_state``: fp32
    [N, H, 128, 128] or None. ``scale`` defaults to 128**-0.5.

    Returns (o [B, T, H, 128] in q's dtype, final_state fp32 [N, H, 128, 128]
    or None). Gradients flow to q, k, v, g, beta and initial_state.

    Raises ValueError naming the argument for everything outside the covered
    cases (the module docstring lists them), TypeError for a keyword FLA's
    chunk_kda does not know, ImportError without fla-core.
    """
    flags = dict(use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, return_intermediate_states=return_intermediate_states,
                 state_v_first=state_v_first, cp_context=cp_context, use_graph=use_graph,
                 max_num_seqs=max_num_seqs)
    switches = dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    safe_gate=safe_gate, disable_recompute=disable_recompute)
    check_arguments(q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens, flags=flags,
                    kwargs=kwargs, switches=switches, scale=scale, cu_seqlens_cpu=cu_seqlens_cpu)
    if not safe_gate:
        check_gate_range(g)
    if q.device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor (FLA's forward runs in Triton), got one on {q.device}")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state),
                    ("cu_seqlens", cu_seqlens)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on q's device {q.device}, got one on {x.device}")
    scale = HEAD_DIM ** -0.5 if scale is None else float(scale)
    return ChunkKDAFunction.apply(q, k, v, g, beta, initial_state, scale, output_final_state,
                                  use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu, safe_gate, lower_bound,
                                  disable_recompute)
