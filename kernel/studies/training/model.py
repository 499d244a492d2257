"""A small KDA language model and the synthetic task it learns.

The model
---------
Token embedding, ``layers`` blocks, RMSNorm, a linear head. Each block is

    x = x + KDAMixer(RMSNorm(x));   x = x + MLP(RMSNorm(x))

and the mixer is a KDA token mixer as FLA's KDA layer builds one: q, k, v
projections, each through a depthwise causal convolution of 4 taps and SiLU;
the per-channel gate g = -softplus(W_g x + dt_bias), clamped to [-5, 0] (so
FLA's safe_gate with lower_bound -5 holds, and with it our backward's range);
beta = sigmoid(W_b x); the KDA layer itself (``kda``, a function with
``fla.ops.kda.chunk_kda``'s signature) with ``use_qk_l2norm_in_kernel``; a
per-head RMSNorm of its output and an output projection. ``dt_bias`` starts at
softplus^-1 of a per-channel rate log-uniform in [1e-3, 1e-1], so each channel
starts remembering 10 to 1,000 tokens.

The task: repeated segments
---------------------------
Each row is a random segment of L tokens (L uniform in [min_period,
max_period], drawn per row) repeated to fill T tokens. The first L tokens are
noise (loss ln(vocab) each); every later token is the one that followed the
same position one period earlier, so the model must find its place in the
segment from context: induction, which a delta-rule state does well. The loss
is the next-token cross entropy over all positions, so it falls from
ln(vocab) towards (mean L / T) ln(vocab).

:func:`naive_kda` is a token-by-token KDA recurrence in float32 (the same
signature, a few arguments), slow, for CPU tests of the model.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

GATE_LOWER_BOUND = -5.0   # FLA's recommended safe_gate bound; within our backward's range
CONV_TAPS = 4
DT_RANGE = (1e-3, 1e-1)   # per-channel forgetting rate at start: memories of 10..1,000 tokens

KDA = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


# ----------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------

def repeated_segments(batch: int, T: int, vocab: int, min_period: int, max_period: int,
                      generator: torch.Generator) -> torch.Tensor:
    """[batch, T + 1] int64 token rows (inputs are [:, :-1], targets [:, 1:]), on the CPU."""
    if not 1 <= min_period <= max_period:
        raise ValueError(f"need 1 <= min_period <= max_period, got {min_period}, {max_period}")
    period = torch.randint(min_period, max_period + 1, (batch, 1), generator=generator)
    segment = torch.randint(0, vocab, (batch, max_period), generator=generator)
    position = torch.arange(T + 1)[None, :] % period
    return segment.gather(1, position)


# ----------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------

class CausalConv(nn.Module):
    """Depthwise causal convolution over time, then SiLU: [B, T, C] -> [B, T, C]."""

    def __init__(self, channels: int, taps: int = CONV_TAPS):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, taps, groups=channels, padding=taps - 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2))


class KDAMixer(nn.Module):
    def __init__(self, d_model: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=False)
        self.k_proj = nn.Linear(d_model, inner, bias=False)
        self.v_proj = nn.Linear(d_model, inner, bias=False)
        self.q_conv, self.k_conv, self.v_conv = CausalConv(inner), CausalConv(inner), CausalConv(inner)
        self.g_proj = nn.Linear(d_model, inner, bias=False)
        self.b_proj = nn.Linear(d_model, heads, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(inner))
        self.o_norm = nn.RMSNorm(head_dim)
        self.o_proj = nn.Linear(inner, d_model, bias=False)
        self.reset_gate()

    @torch.no_grad()
    def reset_gate(self) -> None:
        lo, hi = DT_RANGE
        dt = torch.exp(torch.rand(self.dt_bias.shape) * (math.log(hi) - math.log(lo)) + math.log(lo))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))     # softplus(dt_bias) = dt

    def forward(self, x: torch.Tensor, kda: KDA) -> torch.Tensor:
        B, T, _ = x.shape
        heads = lambda t: t.reshape(B, T, self.heads, -1)
        q = heads(self.q_conv(self.q_proj(x)))
        k = heads(self.k_conv(self.k_proj(x)))
        v = heads(self.v_conv(self.v_proj(x)))
        g = heads((-F.softplus(self.g_proj(x).float() + self.dt_bias)).clamp(min=GATE_LOWER_BOUND))
        beta = torch.sigmoid(self.b_proj(x).float())
        o, _ = kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, safe_gate=True,
                   lower_bound=GATE_LOWER_BOUND)
        return self.o_proj(self.o_norm(o).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, head_dim: int, mlp_ratio: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.mixer = KDAMixer(d_model, heads, head_dim)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model, bias=False), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model, bias=False))

    def forward(self, x: torch.Tensor, kda: KDA) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x), kda)
        return x + self.mlp(self.norm2(x))


class KDALanguageModel(nn.Module):
    def __init__(self, vocab: int, layers: int, heads: int, head_dim: int = 128):
        super().__init__()
        d_model = heads * head_dim
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, head_dim) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, kda: KDA) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, kda)
        return self.head(self.norm(x))

    def loss(self, rows: torch.Tensor, kda: KDA) -> torch.Tensor:
        logits = self(rows[:, :-1], kda)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))


# ----------------------------------------------------------------------------
# a slow KDA for CPU tests
# ----------------------------------------------------------------------------

def naive_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, **_ignored):
    """KDA token by token in float32: per token t and head,
    S <- diag(exp g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = scale S^T q_t."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float()
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1), (S if output_final_state else None)
