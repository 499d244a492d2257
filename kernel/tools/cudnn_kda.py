"""NVIDIA cuDNN frontend's KDA op (``cudnn.linear_attention.kimi_delta_attention``), called the way its
Hopper engine serves a training step, for the benchmarks' comparison.

cuDNN frontend 1.32 (``pip install nvidia-cudnn-frontend``, an optional extra; it uses the cuDNN
library torch ships) registers KDA as a torch.library op with autograd. On Hopper its engine
``kda_hopper_cuda`` (NVRTC-compiled CUDA) serves the backward only when q and k come already
l2-normalised, beta is fp32 after its sigmoid, g is the fp32 log gate, there is no safe_gate, A_log
or dt_bias, q and v have the same head count, and the scale is the default 1/sqrt(K). So a step
here is: q and k normalised in torch (FLA's l2norm, eps 1e-6; inside the timed call and through
autograd, as a user of this op would write it), the token layout flattened to cuDNN's
[tokens, H, 128] with cu_seqlens for every batch (dense batches as equal lengths), states in its
[N, H, V, K] layout (transposed to and from ours inside the call).

Imported inside the functions: nothing here needs cuDNN until a call is made.
"""
from __future__ import annotations

from typing import Any, Callable

from kernel.reference import L2NORM_EPS   # FLA's l2norm eps, so that the normalised q, k are FLA's

__all__ = ["missing_requirement", "import_kda", "step_inputs"]


def import_kda() -> Callable:
    """cuDNN frontend's ``kimi_delta_attention``; ImportError (with the reason) where it is not installed."""
    try:
        from cudnn.linear_attention import kimi_delta_attention
    except Exception as exc:   # an absent package, or a cuDNN library it cannot load
        raise ImportError(f"cuDNN frontend's kimi_delta_attention is missing ({exc.__class__.__name__}: {exc}); "
                          f"pip install nvidia-cudnn-frontend") from exc
    return kimi_delta_attention


def missing_requirement() -> str | None:
    """None when cuDNN's KDA op can be imported here, else why not (one line)."""
    try:
        import_kda()
    except ImportError as exc:
        return str(exc)
    return None


def _l2norm(x):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def step_inputs(raw: dict, *, h0, cu_seqlens) -> dict:
    """Leaves (requires_grad) and a forward for cuDNN's op on the bench's raw inputs: q, k, v bf16
    [B, T, H, 128] (raw, normalised in the forward), g the fp32 log gate, beta fp32 in (0, 1), h0
    fp32 [N, H, K, V]; cu_seqlens int64 on the device or None (a dense batch).

    Returns {"leaves": {q, k, v, g, beta, initial_state}, "forward": f(leaves) -> (o [B, T, H, V],
    final state [N, H, K, V])}, the outputs in FLA's layouts, so that the same do and dht apply."""
    import torch

    B, T, H, K = raw["q"].shape
    V = raw["v"].shape[-1]
    if cu_seqlens is None:
        cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=raw["q"].device)
    else:
        cu = cu_seqlens.to(torch.int32)
    leaves = {name: raw[name].detach().clone().requires_grad_() for name in ("q", "k", "v")}
    leaves["g"] = raw["g"].detach().float().clone().requires_grad_()
    leaves["beta"] = raw["beta"].detach().float().clone().requires_grad_()
    leaves["initial_state"] = h0.detach().float().clone().requires_grad_()
    kda = import_kda()

    def forward(x: dict) -> tuple[Any, Any]:
        flat = lambda t, d: t.reshape(B * T, H, d)   # noqa: E731  (a view of the contiguous [B, T, H, d])
        o, ht = kda(flat(_l2norm(x["q"]), K), flat(_l2norm(x["k"]), K), flat(x["v"], V), flat(x["g"], K),
                    x["beta"].reshape(B * T, H), cu, initial_state=x["initial_state"].transpose(-1, -2).contiguous(),
                    output_final_state=True)
        return o.reshape(B, T, H, V), ht.transpose(-1, -2)

    return {"leaves": leaves, "forward": forward}
