"""The gate and beta activations FLA's KDA layer asks the op to apply, and their backward.

FLA's ``KimiDeltaAttention`` hands ``chunk_kda`` the raw projections and lets the op activate them
(``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``). Per value head h and channel c, with
x = g_raw + dt_bias[h, c] (dt_bias optional):

* the softplus gate (no ``lower_bound``):   g = -exp(A_log[h]) softplus(x), unbounded below;
* the sigmoid gate (``lower_bound`` = L):    g = L sigmoid(a x), a = exp(A_log[h]) or 1 when
  ``A_log`` is None, so g lies in (L, 0) (in fp32, [L, 0]);
* beta = s sigmoid(beta_raw), s = 2 with ``allow_neg_eigval``, else 1.

The backward turns the gradients with respect to the activated gate and beta (what the KDA
backward returns) into the gradients FLA's layer needs: with respect to g_raw, A_log [HV] and
dt_bias [HV * K] (summed over every token), and beta_raw. The math is fp32, as FLA's; the sums
over tokens are fp32 torch reductions.

``gate`` and ``beta`` run the forward in torch for the references and tests; the op itself takes
its forward from FLA (``fla.ops.kda.gate.kda_gate_chunk_cumsum``) so that its output stays FLA's
to the bit.
"""
from __future__ import annotations

from typing import Any

__all__ = ["gate", "gate_backward", "beta", "beta_backward"]


def _biased(g_raw, dt_bias, dtype=None):
    x = g_raw.float() if dtype is None else g_raw.to(dtype)
    if dt_bias is not None:
        x = x + dt_bias.to(x.dtype).view(x.shape[-2:])
    return x


def gate(g_raw, A_log, dt_bias=None, lower_bound: float | None = None, dtype: Any = None):
    """The activated per-token gate (natural log) from the raw projection [.., HV, K]; fp32, or
    ``dtype`` (float64 for a reference)."""
    import torch

    dtype = dtype or torch.float32
    x = _biased(g_raw, dt_bias, dtype)
    HV = x.shape[-2]
    if lower_bound is None:
        return -A_log.to(dtype).view(HV, 1).exp() * torch.nn.functional.softplus(x)
    a = A_log.to(dtype).view(HV, 1).exp() if A_log is not None else 1.0
    return lower_bound * torch.sigmoid(a * x)


def gate_backward(dg, g_raw, A_log, dt_bias=None, lower_bound: float | None = None):
    """(dg_raw in g_raw's dtype, dA_log [HV] in A_log's dtype or None, ddt_bias [HV * K] in dt_bias's
    dtype or None) from dg, the gradient with respect to the activated gate [.., HV, K]."""
    import torch

    x = _biased(g_raw, dt_bias)
    dy = dg.float()
    HV, K = x.shape[-2:]
    if lower_bound is None:
        amp = -A_log.float().view(HV, 1).exp()
        dx = dy * amp * torch.sigmoid(x)
        # d g / d A_log = g itself
        dA = (dy * amp * torch.nn.functional.softplus(x)).reshape(-1, HV, K).sum((0, 2))
    else:
        a = A_log.float().view(HV, 1).exp() if A_log is not None else None
        s = torch.sigmoid(x if a is None else a * x)
        d_inner = dy * (lower_bound * s * (1.0 - s))
        dx = d_inner if a is None else d_inner * a
        dA = (dx * x).reshape(-1, HV, K).sum((0, 2)) if A_log is not None else None
    dA = dA.to(A_log.dtype) if A_log is not None else None
    ddt = dx.reshape(-1, HV * K).sum(0).to(dt_bias.dtype) if dt_bias is not None else None
    return dx.to(g_raw.dtype), dA, ddt


def beta(beta_raw, allow_neg_eigval: bool = False, dtype: Any = None):
    """s sigmoid(beta_raw), fp32 (or ``dtype``)."""
    import torch

    s = 2.0 if allow_neg_eigval else 1.0
    return s * torch.sigmoid(beta_raw.to(dtype or torch.float32))


def beta_backward(dbeta, beta_raw, allow_neg_eigval: bool = False):
    """The gradient with respect to beta_raw, in its dtype, from dbeta (w.r.t. the activated beta)."""
    import torch

    s = torch.sigmoid(beta_raw.float())
    scale = 2.0 if allow_neg_eigval else 1.0
    return (dbeta.float() * scale * s * (1.0 - s)).to(beta_raw.dtype)
