"""flash-linear-attention's whole KDA backward (fla-core 0.6.0) as its autograd function calls it.

What and why
------------
The whole backward of ours (``kernel.kda_backward``) is compared with FLA's
``fla.ops.kda.chunk_bwd.chunk_kda_bwd``, fed the forward tensors FLA's own
``chunk_kda_fwd`` leaves. This module makes both calls the way
``ChunkKDAFunction`` (``fla/ops/kda/chunk.py``) makes them, with its defaults:

* forward: q and k through ``l2norm_fwd`` (``use_qk_l2norm_in_kernel``), chunk
  indices from ``prepare_chunk_indices`` for a packed batch, ``chunk_offsets``
  None (the autograd function computes them only for CUDA graphs; FLA's kernels
  derive them), the gate given as a per-token natural-log gate (no gate fused
  in the kernel), ``disable_recompute=False``, chunk size 64;
* backward: ``chunk_kda_bwd`` with w, u, qg, kg, v_new, h left None, so that it
  recomputes them (``recompute_w_u_fwd`` and ``chunk_gated_delta_rule_fwd_h``)
  as FLA's default does. The l2norm's own backward (``l2norm_bwd``, run after
  ``chunk_kda_bwd`` by the autograd function) is not part of it: our
  ``kda_backward`` returns the gradients with respect to the normalised q, k too.

fla is imported after :func:`kernel.tools.fla_adapter.set_import_env`: every call is the
Triton path, and every process tunes FLA for its own shape.
Importing this module needs neither torch nor fla.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.reference import GATE_LOWER_BOUND
from kernel.shapes import CHUNK_TOKENS

from .fla_adapter import set_import_env

__all__ = ["import_fla", "FlaForward", "forward", "backward", "chunk_kda_step_inputs", "step_forward", "l2norm_backward"]


def import_fla() -> dict:
    """The FLA functions used here, imported with backend dispatch disabled (ImportError if fla or
    triton is missing)."""
    set_import_env()
    import fla
    from fla.modules.norm.l2norm import l2norm_bwd, l2norm_fwd
    from fla.ops.kda import chunk_kda
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd
    from fla.ops.kda.chunk_fwd import chunk_kda_fwd
    from fla.ops.utils.index import prepare_chunk_indices
    return {"version": getattr(fla, "__version__", "?"), "l2norm_fwd": l2norm_fwd, "l2norm_bwd": l2norm_bwd,
            "chunk_kda": chunk_kda, "chunk_kda_fwd": chunk_kda_fwd, "chunk_kda_bwd": chunk_kda_bwd,
            "prepare_chunk_indices": prepare_chunk_indices}


@dataclass
class FlaForward:
    """What FLA's forward saved for its backward (torch tensors on the GPU), [..] = [B, T] or [1, total].

      q, k        bf16 [.., H, K]  l2-normalised;  q_rstd, k_rstd their reciprocal norms (for l2norm_bwd)
      v           bf16 [.., H, V]
      beta        [.., H]          as given (after its sigmoid)
      g           fp32 [.., H, K]  g_cumsum: the 64-chunk-local cumsum of the gate times 1/ln 2
      Aqk, Akk    bf16 [.., H, 64]
      h0          fp32 [N, H, K, V] the initial state (zeros here, so that dh0 is returned)
    """
    q: Any
    k: Any
    q_rstd: Any
    k_rstd: Any
    v: Any
    beta: Any
    g: Any
    Aqk: Any
    Akk: Any
    h0: Any
    scale: float
    cu_seqlens: Any          # int64 [N+1] on the GPU, or None
    chunk_indices: Any
    safe_gate: bool
    lower_bound: float | None
    fns: dict


def forward(q, k, v, g, beta, *, h0, cu_seqlens=None, safe_gate: bool, scale: float | None = None,
            lower_bound: float | None = GATE_LOWER_BOUND) -> FlaForward:
    """ChunkKDAFunction.forward's work up to save_for_backward, with use_qk_l2norm_in_kernel.

    q, k raw bf16 [.., H, K]; g the per-token natural-log gate fp32; beta after its sigmoid;
    h0 fp32 [N, H, K, V]; cu_seqlens int64 torch tensor on the GPU or None."""
    fns = import_fla()
    if scale is None:
        scale = q.shape[-1] ** -0.5
    qn, q_rstd = fns["l2norm_fwd"](q)
    kn, k_rstd = fns["l2norm_fwd"](k)
    chunk_indices = None if cu_seqlens is None else fns["prepare_chunk_indices"](cu_seqlens, CHUNK_TOKENS)
    (o, _final, g_cumsum, Aqk, Akk, _w, _u, _qg, _kg, _v_new, _h, _h0) = fns["chunk_kda_fwd"](
        q=qn, k=kn, v=v, g=g, beta=beta, scale=scale, initial_state=h0, output_final_state=False,
        state_v_first=False, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=CHUNK_TOKENS,
        safe_gate=safe_gate, lower_bound=lower_bound, use_gate_in_kernel=False, disable_recompute=False,
        chunk_offsets=None)
    del o
    return FlaForward(q=qn, k=kn, q_rstd=q_rstd, k_rstd=k_rstd, v=v, beta=beta, g=g_cumsum, Aqk=Aqk, Akk=Akk,
                      h0=h0, scale=float(scale), cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                      safe_gate=safe_gate, lower_bound=lower_bound, fns=fns)


def backward(f: FlaForward, do, dht, *, safe_gate: bool | None = None) -> dict:
    """chunk_kda_bwd as ChunkKDAFunction.backward calls it (recompute on) -> {dq, dk, dv, dbeta, dg, dh0},
    dq, dk with respect to the normalised q, k. `safe_gate` defaults to the forward's."""
    sg = f.safe_gate if safe_gate is None else safe_gate
    dq, dk, dv, db, dg, dh0, _dA, _dbias = f.fns["chunk_kda_bwd"](
        q=f.q, k=f.k, v=f.v, beta=f.beta, Aqk=f.Aqk, Akk=f.Akk, scale=f.scale, initial_state=f.h0,
        do=do, dht=dht, g=f.g, g_org=None, state_v_first=False, cu_seqlens=f.cu_seqlens,
        chunk_indices=f.chunk_indices, chunk_size=CHUNK_TOKENS, safe_gate=sg, lower_bound=f.lower_bound,
        use_gate_in_kernel=False, A_log=None, dt_bias=None, disable_recompute=False, cp_context=None,
        w=None, u=None, qg=None, kg=None, v_new=None, h=None, use_graph=False, chunk_offsets=None)
    return {"dq": dq, "dk": dk, "dv": dv, "dbeta": db, "dg": dg, "dh0": dh0}


def l2norm_backward(f: FlaForward, dq, dk) -> tuple[Any, Any]:
    """The gradients with respect to the raw q, k from those w.r.t. the normalised ones (FLA's l2norm_bwd,
    as ChunkKDAFunction.backward applies it)."""
    return f.fns["l2norm_bwd"](f.q, f.q_rstd, dq), f.fns["l2norm_bwd"](f.k, f.k_rstd, dk)


def chunk_kda_step_inputs(raw: dict, *, h0, cu_seqlens, safe_gate: bool = True) -> dict:
    """Leaf tensors (requires_grad) and the keyword arguments of one chunk_kda training step, FLA's or
    kernel.chunk_kda's (the same signature): q, k, v, g, beta, h0 from `raw`. safe_gate True passes
    FLA's lower bound with it (gates in [-5, 0]); False passes neither (gates of any size)."""
    leaves = {name: raw[name].detach().clone().requires_grad_() for name in ("q", "k", "v", "g", "beta")}
    leaves["initial_state"] = h0.detach().clone().requires_grad_()
    kwargs = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, safe_gate=safe_gate,
                  lower_bound=GATE_LOWER_BOUND if safe_gate else None, cu_seqlens=cu_seqlens)
    return {"leaves": leaves, "kwargs": kwargs}


def step_forward(chunk_kda, inp: dict):
    """A zero-argument call of ``chunk_kda`` (FLA's or kernel.chunk_kda) on :func:`chunk_kda_step_inputs`'s
    leaves and keyword arguments: the step's forward, (o, final state)."""
    leaves, kwargs = inp["leaves"], inp["kwargs"]
    return lambda: chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                             initial_state=leaves["initial_state"], **kwargs)
