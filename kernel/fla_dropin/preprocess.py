"""The op's preprocessing in torch, for where fla-core is not installed.

Before its kernels, FLA's ``chunk_kda`` l2-normalises q and k (keeping each row's rstd), applies beta's
sigmoid, and makes the 64-chunk-local cumsum of the gate in log2 units, of the activated gate where the op
activates it. ``kernel.chunk_kda`` does the same before our forward: with fla-core installed through FLA's
Triton kernels, so that its tensors stay FLA's to the bit; without it through these torch ops, so that
``kernel.chunk_kda`` on our forward and our backward needs no FLA at all (``kernel.use_forward('fla')``
and ``kernel.patch_fla()`` still do). The math is FLA's, in fp32:

* l2norm: y = x / sqrt(sum x^2 + 1e-6) in x's dtype, and rstd = 1 / sqrt(sum x^2 + 1e-6) in fp32;
* beta: s sigmoid(beta_raw) in fp32;
* the gate: kernel.activations.gate, then its cumsum within each 64-token chunk of each sequence (chunks
  counted from the sequence's start), times 1 / ln 2.

The cumsum needs no host sync: each token's place in a padded [chunks, 64] layout is computed on the
device from cu_seqlens (its size bounded by the tokens and sequences, both known from shapes), so it also
traces under torch.compile. Each function takes FLA's keyword arguments, as ``function._fla()``'s do.
"""
from __future__ import annotations

import math

import torch

from ..activations import gate, gate_backward
from ..shapes import CHUNK_TOKENS

__all__ = ["preprocessing", "l2norm_fwd", "beta_sigmoid", "chunk_local_cumsum", "gate_cumsum", "gate_bwd"]

L2NORM_EPS = 1e-6      # FLA's l2norm_fwd default
RCP_LN2 = 1.0 / math.log(2.0)


def l2norm_fwd(x: torch.Tensor, eps: float = L2NORM_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / sqrt(sum x^2 + eps) in x's dtype, rstd fp32 [..]) over the last axis."""
    xf = x.float()
    rstd = 1.0 / torch.sqrt(xf.square().sum(-1) + eps)
    return (xf * rstd.unsqueeze(-1)).to(x.dtype), rstd


def beta_sigmoid(beta: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """s sigmoid(beta) in fp32 (s = 2: FLA's allow_neg_eigval; kernel.activations.beta's math)."""
    return scale * torch.sigmoid(beta.float())


def chunk_local_cumsum(g: torch.Tensor, chunk_size: int = CHUNK_TOKENS, scale: float | None = None,
                       cu_seqlens: torch.Tensor | None = None, **_) -> torch.Tensor:
    """The cumsum of g [B, T, HV, K] along T within each chunk of ``chunk_size`` tokens of each sequence (B
    sequences of T, or cu_seqlens's with B = 1), times ``scale``; fp32."""
    if chunk_size != CHUNK_TOKENS:
        raise ValueError(f"chunk_size must be {CHUNK_TOKENS}, got {chunk_size}")
    B, T = g.shape[:2]
    rest = g.shape[2:]
    x = g.float().reshape(B * T, *rest)
    if cu_seqlens is None:
        cu = torch.arange(B + 1, device=g.device, dtype=torch.int64) * T
    else:
        cu = cu_seqlens.to(device=g.device, dtype=torch.int64)
    N = cu.numel() - 1
    lengths = cu[1:] - cu[:-1]
    padded = (lengths + chunk_size - 1) // chunk_size * chunk_size
    base = torch.cumsum(padded, 0) - padded                      # each sequence's first row, padded layout
    t = torch.arange(B * T, device=g.device, dtype=torch.int64)
    n = torch.searchsorted(cu[1:], t, right=True)                # each token's sequence
    dest = base[n] + (t - cu[n])
    rows = chunk_size * (-(-(B * T + (chunk_size - 1) * N) // chunk_size))   # a bound, from shapes alone
    buf = x.new_zeros((rows, *rest)).index_copy_(0, dest, x)
    out = buf.view(rows // chunk_size, chunk_size, *rest).cumsum(1).view(rows, *rest).index_select(0, dest)
    if scale is not None:
        out = out * scale
    return out.view(B, T, *rest)


def gate_cumsum(g: torch.Tensor, A_log: torch.Tensor | None, chunk_size: int = CHUNK_TOKENS,
                scale: float | None = None, dt_bias: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, lower_bound: float | None = None, **_) -> torch.Tensor:
    """The activated gate's chunk-local cumsum (kernel.activations.gate, then :func:`chunk_local_cumsum`)."""
    return chunk_local_cumsum(gate(g, A_log, dt_bias, lower_bound), chunk_size, scale=scale, cu_seqlens=cu_seqlens)


def gate_bwd(g: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, dyg: torch.Tensor,
             lower_bound: float | None = None, **_) -> tuple:
    """(dg_raw, dA_log, ddt_bias) from the activated gate's gradient: kernel.activations.gate_backward."""
    return gate_backward(dyg, g, A_log, dt_bias, lower_bound)


def _no_chunk_indices(cu_seqlens=None, chunk_size=CHUNK_TOKENS, cu_seqlens_cpu=None):
    """These functions lay chunks out from cu_seqlens themselves: no table."""
    return None


def preprocessing() -> dict:
    """function._fla()'s preprocessing entries (its chunk_kda_fwd excepted), in torch."""
    return dict(l2norm_fwd=l2norm_fwd, beta_sigmoid=beta_sigmoid, gate_cumsum=gate_cumsum,
                local_cumsum=chunk_local_cumsum, gate_bwd=gate_bwd, rcp_ln2=RCP_LN2, chunk_indices=_no_chunk_indices)
