"""The one check of a ``chunk_kda`` call, where the user's arguments arrive.

FLA's own rules for the arguments its layer passes (the gate and beta activations, ``state_v_first``,
grouped value heads), and a refusal that names every argument our backward does not cover. Only
shapes, dtypes, flags and the offsets are read: nothing here touches the GPU, and CPU tensors are
fine. The result is a :class:`Call`, whose settings the ops (:mod:`.library`) take as arguments,
its mode among them (:func:`training_mode`: whether the forward keeps what a backward reads).
Under torch.compile the offsets' values are not read here (a trace cannot), only their shape; the
grad mode and each input's ``requires_grad`` are constants of the trace, guarded.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Iterable

import numpy as np
import torch

from ..runtime.arrays import check_scale
from ..shapes import CHUNK_TOKENS, HEAD_DIM, check_cu_seqlens
from .setting import check_forward

FLA_CALL = "fla.ops.kda.chunk_kda"

__all__ = ["Call", "check_arguments", "training_mode", "FLA_CALL", "BOOL_ARGUMENTS", "NOT_COVERED"]

# (argument, FLA's default, what to do instead) for every argument we do not cover
NOT_COVERED = (
    ("return_intermediate_states", False, f"call {FLA_CALL} (it returns h in inference mode)"),
    ("cp_context", None, f"call {FLA_CALL} (context parallelism is not covered)"),
    ("use_graph", False, f"call {FLA_CALL} (CUDA-graph varlen mode is not covered)"),
    ("max_num_seqs", None, f"leave it unset (it belongs to use_graph) or call {FLA_CALL}"),
)

# chunk_kda's switches: each must be a real bool ('yes' or 1 would be read as True)
BOOL_ARGUMENTS = ("output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                  "allow_neg_eigval", "safe_gate", "disable_recompute", "state_v_first")


@dataclasses.dataclass(frozen=True)
class Call:
    """A checked call: the sizes and every setting the forward and backward need besides the tensors.
    ``offsets`` is the host copy of cu_seqlens (None without it, and under torch.compile, whose
    trace cannot read values), made once at the boundary."""
    B: int
    T: int
    H: int                      # query / key heads
    HV: int                     # value heads: a multiple of H (grouped value attention when larger)
    N: int                      # sequences
    offsets: np.ndarray | None
    scale: float
    output_final_state: bool
    use_qk_l2norm_in_kernel: bool
    use_gate_in_kernel: bool
    use_beta_sigmoid_in_kernel: bool
    allow_neg_eigval: bool
    safe_gate: bool
    lower_bound: float | None
    disable_recompute: bool
    state_v_first: bool
    forward: str                # whose forward runs: "ours" or "fla" (.setting); the backward is ours
    training: bool              # whether a gradient can be asked for (training_mode); else o, final state alone
    raw_qk_rows: bool           # whether our kernels may read raw q and k with each row's rstd (.setting)

    @property
    def groups(self) -> int:
        """Value heads per query head (1 without grouped value attention)."""
        return self.HV // self.H

    @property
    def beta_scale(self) -> float:
        return 2.0 if self.allow_neg_eigval else 1.0


def training_mode(grad_enabled: bool, inputs: Iterable[torch.Tensor | None]) -> bool:
    """Whether autograd can ask a call with these differentiable ``inputs`` (None: not given) for a
    gradient: grad mode on (``torch.is_grad_enabled()``, off under ``torch.no_grad`` and
    ``torch.inference_mode``) and some input requiring grad. Only then does the forward keep what the
    backward reads (the states, Aqk's and Akk's blocks, the gate's cumsum, q and k normalised)."""
    # a list, not a generator: torch.compile (2.13) traces it as is
    return grad_enabled and any([x is not None and x.requires_grad for x in inputs])


def _is_default(got: Any, default: Any) -> bool:
    if default is None:
        return got is None
    return isinstance(got, (bool, int)) and got == default


def _refuse(name: str, got: Any, instead: str) -> ValueError:
    shown = f"a tensor of shape {list(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)
    return ValueError(f"kernel.chunk_kda does not cover {name}={shown}; {instead}")


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def _lower_bound(lower_bound: Any) -> float | None:
    if lower_bound is None:
        return None
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float, np.integer, np.floating)):
        raise TypeError(f"lower_bound must be a real number or None, got {lower_bound!r}")
    if not -math.inf < lower_bound < 0:   # NaN fails too
        raise ValueError(f"lower_bound must be finite and < 0 (the gate's floor in log space), got {lower_bound!r}")
    return float(lower_bound)


def _gate_parameters(kwargs: dict[str, Any], *, use_gate_in_kernel: bool, lower_bound: float | None,
                     safe_gate: bool, HV: int) -> None:
    """FLA's rules for A_log and dt_bias (read only with use_gate_in_kernel) and the safe-gate range."""
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    if not use_gate_in_kernel:
        return
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: it must be given with use_gate_in_kernel=True unless lower_bound is set "
                         "(then the gate is lower_bound * sigmoid(g + dt_bias))")
    for name, x, count in (("A_log", A_log, HV), ("dt_bias", dt_bias, HV * HEAD_DIM)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor or None, got {type(x).__module__}.{type(x).__name__}")
        if x.numel() != count or not x.dtype.is_floating_point:
            raise ValueError(f"{name}: expected {count} floating values ([{'HV' if name == 'A_log' else 'HV * K'}] = "
                             f"[{count}]), got shape {_shape(x)} of {x.dtype}")
    if safe_gate:
        if lower_bound is None:
            raise ValueError("lower_bound: it must be set with safe_gate=True and use_gate_in_kernel=True (FLA's rule)")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"lower_bound must be in FLA's safe range [-5, 0) with safe_gate=True and "
                             f"use_gate_in_kernel=True, got {lower_bound}")


def check_arguments(q, k, v, g, beta, *, initial_state, cu_seqlens, flags: dict[str, Any],
                    kwargs: dict[str, Any], switches: dict[str, Any], forward: str, grad_enabled: bool,
                    raw_qk_rows: bool, scale: Any = None, lower_bound: Any = None, cu_seqlens_cpu=None) -> Call:
    """Every refusal, on shapes, dtypes, flags and the offsets alone; returns the checked :class:`Call`.

    ``flags``: the arguments of :data:`NOT_COVERED` as passed; ``switches``: those of
    :data:`BOOL_ARGUMENTS`; ``kwargs``: what FLA's chunk_kda reads from its ``**kwargs`` (A_log,
    dt_bias, chunk_size, the deprecated transpose_state_layout). ``switches`` is updated in place
    where transpose_state_layout gives state_v_first, as FLA does (with FLA's DeprecationWarning).
    ``forward``: whose forward runs ("ours" or "fla", :mod:`.setting`); ours covers every call this
    check admits (kernel.forward.plan_forward's rules are these, or are met by the drop-in's
    preprocessing: the gate's fp32 cumsum, beta in fp32, a copy of an input not 16-byte aligned), so
    no call falls back to FLA's forward: one asking for ours gets ours or this refusal.
    ``grad_enabled``: torch's grad mode at the call; with the inputs' ``requires_grad`` it decides
    the call's ``training`` (:func:`training_mode`). ``raw_qk_rows``: the process's choice of how our
    kernels read q and k under the l2norm (:data:`.setting.RAW_QK_ROWS`), fixed for the call's forward and
    backward alike.
    """
    forward = check_forward(forward)
    if not isinstance(grad_enabled, bool):
        raise TypeError(f"grad_enabled must be True or False (torch.is_grad_enabled() at the call), "
                        f"got {grad_enabled!r}")
    if not isinstance(raw_qk_rows, bool):
        raise TypeError(f"raw_qk_rows must be True or False (kernel.fla_dropin.setting.RAW_QK_ROWS), "
                        f"got {raw_qk_rows!r}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__module__}.{type(x).__name__}")
    for name, x in (("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor (a torch.LongTensor of offsets for cu_seqlens) or None, "
                            f"got {type(x).__module__}.{type(x).__name__}")
    rest = dict(kwargs)
    if "transpose_state_layout" in rest:
        old = rest.pop("transpose_state_layout")
        if not isinstance(old, bool):
            raise TypeError(f"transpose_state_layout must be True or False, got {old!r}")
        if switches["state_v_first"] and old:
            raise ValueError("state_v_first and the deprecated transpose_state_layout are both given; pass state_v_first")
        warnings.warn("transpose_state_layout is deprecated and renamed to state_v_first (as in FLA)",
                      DeprecationWarning, stacklevel=4)
        switches["state_v_first"] = switches["state_v_first"] or old
    for name, got in switches.items():
        if not isinstance(got, bool):
            raise TypeError(f"{name} must be True or False, got {got!r}")
    check_scale(scale)
    lower_bound = _lower_bound(lower_bound)
    for name, default, instead in NOT_COVERED:
        got = flags[name]
        if not _is_default(got, default):
            raise _refuse(name, got, instead)
    if "chunk_size" in rest:
        got = rest.pop("chunk_size")
        if not _is_default(got, CHUNK_TOKENS):
            raise _refuse("chunk_size", got, f"leave it at {CHUNK_TOKENS} (our backward's chunk) or call {FLA_CALL}")
    gate_kwargs = {name: rest.pop(name) for name in ("A_log", "dt_bias") if name in rest}
    if rest:
        raise TypeError(f"kernel.chunk_kda got keyword arguments FLA's chunk_kda does not know: {sorted(rest)}")
    if switches["allow_neg_eigval"] and not switches["use_beta_sigmoid_in_kernel"]:
        raise ValueError("allow_neg_eigval=True needs use_beta_sigmoid_in_kernel=True (beta = 2 sigmoid(beta)), "
                         "as in FLA")

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
    if HV < H or HV % H:
        raise ValueError(f"v.shape[2]: the value heads ({HV}) must be a multiple of q's heads ({H}) "
                         f"(grouped value attention)")
    if _shape(v)[:2] != (B, T):
        raise ValueError(f"v: expected [{B}, {T}, HV, {V}] like q, got {_shape(v)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != torch.bfloat16:
            raise _refuse(f"{name}.dtype", x.dtype, f"cast {name} to torch.bfloat16 (as autocast does) "
                          f"or call {FLA_CALL}")
    if _shape(g) != (B, T, HV, K):
        raise ValueError(f"g: expected [B, T, HV, K] = {[B, T, HV, K]}, got {list(_shape(g))}")
    if not g.dtype.is_floating_point:
        raise ValueError(f"g: expected a floating dtype, got {g.dtype}")
    if _shape(beta) != (B, T, HV):
        raise ValueError(f"beta: expected [B, T, HV] = {[B, T, HV]}, got {list(_shape(beta))}")
    if not beta.dtype.is_floating_point:
        raise ValueError(f"beta: expected a floating dtype, got {beta.dtype}")
    if not switches["use_beta_sigmoid_in_kernel"] and beta.dtype not in (torch.float32, torch.bfloat16):
        # the backward reads beta as fp32 or bf16 (after the op's own sigmoid it is fp32)
        raise _refuse("beta.dtype", beta.dtype, f"cast beta to torch.float32 or call {FLA_CALL}")
    _gate_parameters(gate_kwargs, use_gate_in_kernel=switches["use_gate_in_kernel"], lower_bound=lower_bound,
                     safe_gate=switches["safe_gate"], HV=HV)

    N, offsets = B, None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens: the batch size must be 1 (flattened [1, total, H, K]), got q of "
                             f"shape {_shape(q)}")
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens: expected N+1 >= 2 offsets, got shape {_shape(cu_seqlens)}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens: expected an integer dtype (torch.long), got {cu_seqlens.dtype}")
        # its values: 0 first, strictly increasing, T last (from cu_seqlens_cpu where the caller has it,
        # else a copy of N + 1 integers to the host, once per tensor: kernel.shapes.host_offsets); the backward
        # reuses this host copy. torch.compile traces no reading of values: there the forward op
        # checks them when it runs
        if not torch.compiler.is_compiling():
            offsets = check_cu_seqlens(cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens, B, T)
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        layout = "[N, HV, V, K]" if switches["state_v_first"] else "[N, HV, K, V]"
        if _shape(initial_state) != (N, HV, K, V):
            raise ValueError(f"initial_state: expected {layout} = {[N, HV, K, V]}, got {list(_shape(initial_state))}")
        if initial_state.dtype != torch.float32:
            raise ValueError(f"initial_state: expected torch.float32 (as FLA), got {initial_state.dtype}")
    # A_log and dt_bias are the op's inputs only where it activates the gate (FLA ignores them otherwise)
    gate = (gate_kwargs.get("A_log"), gate_kwargs.get("dt_bias")) if switches["use_gate_in_kernel"] else ()
    training = training_mode(grad_enabled, (q, k, v, g, beta, *gate, initial_state))
    return Call(B=B, T=T, H=H, HV=HV, N=N, offsets=offsets, scale=HEAD_DIM ** -0.5 if scale is None else float(scale),
                lower_bound=lower_bound, forward=forward, training=training, raw_qk_rows=raw_qk_rows,
                **switches)
