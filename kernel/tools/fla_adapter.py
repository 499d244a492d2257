"""flash-linear-attention (fla-core 0.6.0) as Kernel A's yardstick: the same work, FLA's way.

What and why
------------
Kernel A replaces two kernels of FLA's chunked KDA backward
(``fla.ops.kda.chunk_bwd.chunk_kda_bwd``, chunk size 64):

* ``chunk_kda_bwd_dAv``: dv = Aqk^T do inside each 64-chunk (our G1) and
  dAqk = do v_new^T (a by-product Kernel A does not compute);
* ``chunk_gated_delta_rule_bwd_dhu``: the serial scan over 64-chunks, which
  stores dh [B, NT, H, K, V] (bf16) -- the gradient w.r.t. the state after each
  64-chunk -- and dh0 [N, H, K, V] (fp32); our G2..G5 and the combine.

Both read tensors that FLA's backward first *recomputes* from the forward's
saved ones (``recompute_w_u_fwd`` -> w, u, qg, kg, then
``chunk_gated_delta_rule_fwd_h`` -> v_new), where Kernel A rebuilds qd, kd, kr
on chip from raw q, k and gc instead. So the bench times "dAv + dhu" against
Kernel A, and the recompute steps separately.

FLA's backward, as read from the 0.6.0 wheel (``chunk_kda_bwd``, default
``disable_recompute=False``, no gate fused in the kernel, no context parallel):

    w, u, qg, kg   = recompute_w_u_fwd(q=q, k=k, v=v, beta=beta, A=Akk, gk=g,
                                       cu_seqlens, chunk_indices)
    h, v_new, _    = chunk_gated_delta_rule_fwd_h(k=kg, w=w, u=u, gk=g,
                                       initial_state=h0, output_final_state=False,
                                       cu_seqlens, chunk_indices, chunk_offsets, chunk_size=64)
    dAqk, dv       = chunk_kda_bwd_dAv(q=q, k=k, v=v_new, do=do, A=Aqk, scale=scale,
                                       cu_seqlens, chunk_size=64, chunk_indices)
    dh, dh0, dv    = chunk_gated_delta_rule_bwd_dhu(q=qg, k=kg, w=w, gk=g, h0=h0, dht=dht,
                                       do=do, dv=dv, scale=scale, cu_seqlens, chunk_size=64,
                                       chunk_indices, chunk_offsets)
    ... chunk_kda_bwd_wy_dqkg_fused, chunk_kda_bwd_intra (not Kernel A's job)

where q, k are already l2-normalised (``ChunkKDAFunction.forward`` runs
``fla.modules.norm.l2norm.l2norm_fwd`` on them when
``use_qk_l2norm_in_kernel=True``: bf16 in, bf16 out, eps 1e-6), g is the
64-chunk local cumsum of the natural-log gate times 1/ln2 (fp32), and Aqk, Akk
(bf16 [B, T, H, 64]) come from the forward. ``dh0`` is only produced when an
initial state is given, so :func:`prepare` always passes zeros.

:func:`prepare` gets all of these once, outside any timing, by calling FLA's
own ``chunk_kda_fwd`` with ``disable_recompute=True`` (it then keeps w, u, qg,
kg, v_new -- the very tensors the backward would recompute with the same
functions and arguments) after the same l2norm. ``FLA_DISABLE_BACKEND_DISPATCH=1``
is set before fla is imported so every call is the plain Triton path (no
TileLang / FlashKDA / Ascend backends).

Everything here imports torch and fla lazily: importing this module needs
neither.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from kernel.shapes import CHUNK_TOKENS   # FLA's KDA chunk size (its default; 32 is the only other choice)

FLA_VERSION = "0.6.0"
DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
AUTOTUNE_DISK_CACHE_ENV = "FLA_CACHE_RESULTS"

__all__ = ["FLA_VERSION", "CHUNK_TOKENS", "available", "FlaState", "prepare", "dAv", "dhu",
           "dAv_dhu", "recompute_w_u", "fwd_h", "dh_dh0", "callables", "reset_autotune", "autotune_choices",
           "set_import_env"]


def reset_autotune() -> int:
    """Makes every Triton autotuner in the process tune again on its next call; returns how many
    had a choice to forget.

    FLA's autotune keys leave out B, T and the sequence count (chunk_gated_delta_rule_bwd_dhu:
    H, K, V, BT, BV, ...), so within one process the block sizes chosen for the first shape
    stick for every later one. On the H200 that made FLA's dAv+dhu at 1x131072 take 6.60 ms
    after tuning at 4x8192, against 4.60 ms when tuned at 1x131072 (docs/log/run-e.md, its
    correction). A benchmark calls this before each configuration.
    """
    reset = 0
    for _, cache in _autotuner_choices():
        cache.clear()
        reset += 1
    return reset


def autotune_choices() -> dict:
    """What every Triton autotuner in the process chose: {kernel name: {key: config}}, as
    text. A benchmark records it, so that two runs of the same shape whose FLA times differ
    can be told apart by the block sizes FLA picked."""
    out = {}
    for tuner, cache in _autotuner_choices():
        fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
        name = getattr(fn, "__name__", None) or repr(fn)
        out.setdefault(name, {}).update({str(k): str(v) for k, v in cache.items()})
    return out


def _autotuner_choices() -> list:
    """(autotuner, its choice cache) for every Triton autotuner in the process that has chosen."""
    import gc
    import warnings

    from triton.runtime.autotuner import Autotuner

    def is_tuner(obj) -> bool:
        try:
            return isinstance(obj, Autotuner)
        except ReferenceError:   # a weakref.proxy whose object is gone (torch.compile leaves such)
            return False

    with warnings.catch_warnings():   # isinstance() on every live object wakes torch's deprecated aliases
        warnings.simplefilter("ignore", FutureWarning)
        tuners = [obj for obj in gc.get_objects() if is_tuner(obj)]
    return [(t, t.cache) for t in tuners if isinstance(getattr(t, "cache", None), dict) and t.cache]


def set_import_env() -> None:
    """Sets what fla reads once, when it is first imported, for a measurement of its Triton path.

    * ``FLA_DISABLE_BACKEND_DISPATCH=1``: every call takes the Triton kernels, never another backend.
    * ``FLA_CACHE_RESULTS=0`` unless it is set already: no autotune choice is read from, or
      written to, Triton's disk cache. That cache is keyed by the autotune key, which holds no
      B, T or sequence count, so with it on, the first shape ever tuned on a machine fixes the
      block sizes of every later process there: a 1x131072 run after a 32x8192 one times FLA
      at 32x8192's choice. Off, each process tunes FLA for its own shape (the compiled kernels
      stay cached on disk either way).
    """
    os.environ[DISPATCH_ENV] = "1"
    os.environ.setdefault(AUTOTUNE_DISK_CACHE_ENV, "0")


def _import_fla():
    """The FLA functions used here, imported as :func:`set_import_env` says."""
    set_import_env()
    import fla
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import (chunk_gated_delta_rule_bwd_dhu,
                                              chunk_gated_delta_rule_fwd_h)
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv
    from fla.ops.kda.chunk_fwd import chunk_kda_fwd
    from fla.ops.kda.wy_fast import recompute_w_u_fwd
    from fla.ops.utils.index import prepare_chunk_indices, prepare_chunk_offsets
    return {
        "version": getattr(fla, "__version__", "?"),
        "l2norm_fwd": l2norm_fwd,
        "chunk_kda_fwd": chunk_kda_fwd,
        "chunk_kda_bwd_dAv": chunk_kda_bwd_dAv,
        "chunk_gated_delta_rule_bwd_dhu": chunk_gated_delta_rule_bwd_dhu,
        "chunk_gated_delta_rule_fwd_h": chunk_gated_delta_rule_fwd_h,
        "recompute_w_u_fwd": recompute_w_u_fwd,
        "prepare_chunk_indices": prepare_chunk_indices,
        "prepare_chunk_offsets": prepare_chunk_offsets,
    }


def available() -> tuple[bool, str]:
    """(True, description) when FLA's Triton KDA kernels can run here, else (False, why)."""
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not installed ({exc})"
    try:
        import triton
    except ImportError as exc:
        return False, f"triton is not installed ({exc})"
    try:
        fns = _import_fla()
    except ImportError as exc:
        return False, f"cannot import fla ({exc.__class__.__name__}: {exc})"
    except Exception as exc:  # fla's import-time hardware probes can raise anything
        return False, f"importing fla failed ({exc.__class__.__name__}: {exc})"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    import fla.backends
    dispatch = "dispatch off" if getattr(fla.backends, "_DISPATCH_DISABLED", False) \
        else "WARNING: backend dispatch ON (fla was imported before FLA_DISABLE_BACKEND_DISPATCH=1)"
    note = "" if fns["version"] == FLA_VERSION else f", expected {FLA_VERSION}"
    return True, f"fla-core {fns['version']}{note}, triton {triton.__version__}, {dispatch}"


@dataclass
class FlaState:
    """FLA's forward tensors that its backward reads (torch, on the GPU).

    Shapes with BT = [B, T] (or [1, total] varlen), C = 64:
      q, k        bf16 [BT, H, K]  l2-normalised (FLA's l2norm_fwd)
      v           bf16 [BT, H, V]
      beta        [BT, H]          as given (post-sigmoid)
      gk          fp32 [BT, H, K]  64-chunk local cumsum of g, times 1/ln2
      Aqk, Akk    bf16 [BT, H, C]  forward's intra-chunk matrices
      w, u, qg, kg, v_new          what recompute_w_u_fwd / fwd_h give the backward
      h0          fp32 [N, H, K, V] zeros (makes dhu return dh0)
    """
    q: Any
    k: Any
    v: Any
    beta: Any
    gk: Any
    Aqk: Any
    Akk: Any
    w: Any
    u: Any
    qg: Any
    kg: Any
    v_new: Any
    h0: Any
    scale: float
    cu_seqlens: Any            # int64 [N+1] on the GPU or None
    chunk_indices: Any
    chunk_offsets: Any
    fns: dict


def prepare(q, k, v, g, beta, *, scale: float | None = None, cu_seqlens=None,
            qk_l2norm: bool = True) -> FlaState:
    """Run FLA's forward pieces once (outside timing) for the backward's inputs.

    q, k, v: bf16 torch [B, T, H, D] (raw: l2norm is applied here as FLA does
    with ``use_qk_l2norm_in_kernel``); g: natural-log gate fp32 [B, T, H, K];
    beta: [B, T, H]; cu_seqlens: int tensor [N+1] (then B = 1) or None.
    """
    import torch

    fns = _import_fla()
    B, T, H, K = q.shape
    if scale is None:
        scale = K ** -0.5
    if qk_l2norm:
        q, _ = fns["l2norm_fwd"](q)
        k, _ = fns["l2norm_fwd"](k)
    chunk_indices = chunk_offsets = None
    if cu_seqlens is not None:
        cu_seqlens = torch.as_tensor(cu_seqlens, device=q.device).to(torch.long)
        chunk_indices = fns["prepare_chunk_indices"](cu_seqlens, CHUNK_TOKENS)
        chunk_offsets = fns["prepare_chunk_offsets"](cu_seqlens, CHUNK_TOKENS)
        N = cu_seqlens.numel() - 1
    else:
        N = B
    h0 = torch.zeros(N, H, K, v.shape[-1], dtype=torch.float32, device=q.device)
    (o, _final, gk, Aqk, Akk, w, u, qg, kg, v_new, h, _h0) = fns["chunk_kda_fwd"](
        q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=h0,
        output_final_state=False, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        chunk_size=CHUNK_TOKENS, safe_gate=False, disable_recompute=True,
        chunk_offsets=chunk_offsets)
    del o, h, _final
    return FlaState(q=q, k=k, v=v, beta=beta, gk=gk, Aqk=Aqk, Akk=Akk, w=w, u=u, qg=qg, kg=kg,
                    v_new=v_new, h0=h0, scale=float(scale), cu_seqlens=cu_seqlens,
                    chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, fns=fns)


def dAv(s: FlaState, do):
    """chunk_kda_bwd_dAv exactly as chunk_kda_bwd calls it -> (dAqk fp32, dv bf16)."""
    return s.fns["chunk_kda_bwd_dAv"](q=s.q, k=s.k, v=s.v_new, do=do, A=s.Aqk, scale=s.scale,
                                      cu_seqlens=s.cu_seqlens, chunk_size=CHUNK_TOKENS,
                                      chunk_indices=s.chunk_indices)


def dhu(s: FlaState, do, dv, dht):
    """chunk_gated_delta_rule_bwd_dhu as chunk_kda_bwd calls it -> (dh bf16, dh0 fp32, dv2)."""
    return s.fns["chunk_gated_delta_rule_bwd_dhu"](
        q=s.qg, k=s.kg, w=s.w, gk=s.gk, h0=s.h0, dht=dht, do=do, dv=dv, scale=s.scale,
        cu_seqlens=s.cu_seqlens, chunk_size=CHUNK_TOKENS, chunk_indices=s.chunk_indices,
        chunk_offsets=s.chunk_offsets)


def dAv_dhu(s: FlaState, do, dht):
    """The timed pair: dAv then dhu -> (dh [B, NT, H, K, V] bf16, dh0 [N, H, K, V] fp32)."""
    _dA, dv = dAv(s, do)
    dh, dh0, _dv2 = dhu(s, do, dv, dht)
    return dh, dh0


dh_dh0 = dAv_dhu  # the precision comparison reads the outputs of the very calls that are timed


def recompute_w_u(s: FlaState):
    """recompute_w_u_fwd as chunk_kda_bwd calls it -> (w, u, qg, kg)."""
    return s.fns["recompute_w_u_fwd"](q=s.q, k=s.k, v=s.v, beta=s.beta, A=s.Akk, gk=s.gk,
                                      cu_seqlens=s.cu_seqlens, chunk_indices=s.chunk_indices)


def fwd_h(s: FlaState):
    """chunk_gated_delta_rule_fwd_h as chunk_kda_bwd calls it (v_new recompute) -> (h, v_new, None)."""
    return s.fns["chunk_gated_delta_rule_fwd_h"](
        k=s.kg, w=s.w, u=s.u, gk=s.gk, initial_state=s.h0, output_final_state=False,
        cu_seqlens=s.cu_seqlens, chunk_indices=s.chunk_indices, chunk_offsets=s.chunk_offsets,
        chunk_size=CHUNK_TOKENS)


def callables(s: FlaState, do, dht) -> dict[str, Callable[[], Any]]:
    """Zero-argument calls for timing: 'dAv+dhu' (the one Kernel A is compared with),
    'dAv', 'dhu' (fed a dv computed here once), 'recompute_w_u', 'fwd_h'."""
    _dA, dv = dAv(s, do)
    del _dA
    return {
        "dAv+dhu": lambda: dAv_dhu(s, do, dht),
        "dAv": lambda: dAv(s, do),
        "dhu": lambda: dhu(s, do, dv, dht),
        "recompute_w_u": lambda: recompute_w_u(s),
        "fwd_h": lambda: fwd_h(s),
    }
