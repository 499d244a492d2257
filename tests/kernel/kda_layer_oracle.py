"""A float64 oracle of FLA's ``KimiDeltaAttention`` layer as it trains, for every parameter's gradient.

With autograd enabled the layer always runs chunk mode (its fused_recurrent mode is taken only
without a graph, for <= 64 tokens outside training), and that computes, from the hidden states
x [B, T, D] (or [1, total, D] with ``cu_seqlens``)::

    q, k = l2norm(silu(causal_conv(x W_q^T))), l2norm(silu(causal_conv(x W_k^T)))   [.., H, K]
    v    = silu(causal_conv(x W_v^T))                                                  [.., HV, V]
    g    = gate(x F_0^T F_1^T, A_log, dt_bias, lower_bound)                             [.., HV, K]
    beta = s sigmoid(x W_b^T), s = 2 with allow_neg_eigval else 1                       [.., HV]
    o    = KDA(q, k, v, g, beta), scale K^-1/2, no initial state                        [.., HV, V]
    out  = (rmsnorm(o) w sigmoid(x G_0^T G_1^T + b_G)) W_o^T                           [.., D]

(``causal_conv`` the depthwise causal convolution of ``conv_size`` taps, restarted at every
sequence; ``rmsnorm`` over each head's V channels, the layer's ``norm_eps``). Here all of it is
plain float64 torch on the CPU, written from the math and sharing nothing with FLA's Triton code:
the gate and beta activations are :mod:`kernel.activations`' float64 forms, and the KDA recurrence
is a token-by-token loop per sequence, every value head at once::

    S <- diag(exp(g_t)) S                  S [HV, K, V], value head j reads query head j // (HV/H)
    S <- S + beta_t k_t (v_t - S^T k_t)^T
    o_t = scale S^T q_t

Autograd through it gives every parameter's float64 gradient, read back by the layer's own
parameter names. The token loop is for T of a few hundred, not for benchmarks.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from kernel import activations

__all__ = ["L2NORM_EPS", "LayerSettings", "settings", "parameter_names", "parameters", "sequence_bounds",
           "causal_conv", "l2norm", "kda_recurrence", "gated_rms_norm", "layer_forward", "layer_gradients",
           "gate_term_magnitudes"]

L2NORM_EPS = 1e-6   # FLA's l2norm_fwd default, which chunk_kda's use_qk_l2norm_in_kernel runs
F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class LayerSettings:
    """What the layer's forward reads besides its parameters."""
    H: int                      # query / key heads
    HV: int                     # value heads (a multiple of H: grouped value attention when larger)
    K: int                      # key head dim (and the gate's channels per value head)
    V: int                      # value head dim
    conv_size: int              # taps of the short convolutions; 0 without them
    conv_bias: bool
    allow_neg_eigval: bool
    lower_bound: float | None   # None: the softplus gate; else the sigmoid gate with this floor
    norm_eps: float


def settings(layer: Any) -> LayerSettings:
    """The settings of a ``fla.layers.kda.KimiDeltaAttention``; refuses a gated norm other than the
    sigmoid one the layer builds."""
    norm = layer.o_norm
    if getattr(norm, "activation", None) != "sigmoid" or norm.weight is None or norm.bias is not None:
        raise ValueError(f"layer.o_norm: expected FusedRMSNormGated with a weight, no bias and activation='sigmoid', "
                         f"got {norm!r}")
    return LayerSettings(H=layer.num_heads, HV=layer.num_v_heads, K=layer.head_k_dim, V=layer.head_v_dim,
                         conv_size=layer.conv_size if layer.use_short_conv else 0,
                         conv_bias=bool(layer.use_short_conv and layer.conv_bias),
                         allow_neg_eigval=bool(layer.allow_neg_eigval), lower_bound=layer.lower_bound,
                         norm_eps=float(norm.eps))


def parameter_names(cfg: LayerSettings) -> set[str]:
    """Every parameter the layer has with these settings (the oracle reads each one)."""
    names = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "f_proj.0.weight", "f_proj.1.weight",
             "b_proj.weight", "A_log", "dt_bias", "g_proj.0.weight", "g_proj.1.weight", "g_proj.1.bias",
             "o_norm.weight", "o_proj.weight"}
    if cfg.conv_size:
        names |= {f"{x}_conv1d.weight" for x in "qkv"}
        if cfg.conv_bias:
            names |= {f"{x}_conv1d.bias" for x in "qkv"}
    return names


def parameters(layer: Any) -> dict[str, torch.Tensor]:
    """Float64 CPU copies of the layer's parameters by name, leaves that require grad; refuses a layer
    whose parameters are not the ones the oracle computes with (a new parameter would go unchecked)."""
    got = dict(layer.named_parameters())
    want = parameter_names(settings(layer))
    if set(got) != want:
        raise ValueError(f"layer: expected the parameters {sorted(want)}, got extra {sorted(set(got) - want)} "
                         f"and missing {sorted(want - set(got))}")
    return {name: p.detach().to("cpu", F64).requires_grad_() for name, p in got.items()}


def sequence_bounds(B: int, T: int, cu_seqlens: Any = None) -> list[tuple[int, int]]:
    """(start, end) of every sequence in the flattened B * T tokens."""
    if cu_seqlens is None:
        return [(b * T, (b + 1) * T) for b in range(B)]
    cu = [int(c) for c in torch.as_tensor(cu_seqlens).cpu()]
    if B != 1 or cu[0] != 0 or cu[-1] != T or any(b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: expected strictly increasing offsets from 0 to T = {T} with B = 1, "
                         f"got {cu} with B = {B}")
    return list(zip(cu, cu[1:]))


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                bounds: list[tuple[int, int]]) -> torch.Tensor:
    """silu of the depthwise causal convolution: y[t, d] = sum_i weight[d, i] x[t - (W-1) + i, d]
    within each sequence (zeros before its start). x [n, D] flattened tokens; weight [D, 1, W] (nn.Conv1d's
    layout, as ShortConvolution stores it)."""
    W = weight.shape[-1]
    w = weight.reshape(weight.shape[0], W)
    out = []
    for start, end in bounds:
        seq = x[start:end]
        padded = torch.cat([seq.new_zeros(W - 1, seq.shape[1]), seq])
        y = sum(w[:, i] * padded[i:i + end - start] for i in range(W))
        out.append(y if bias is None else y + bias)
    return F.silu(torch.cat(out))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis, as FLA's l2norm."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def kda_recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                   scale: float | None = None, initial_state: torch.Tensor | None = None, cu_seqlens: Any = None,
                   state_v_first: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA token by token, in the inputs' dtype (float64 for the oracle), with chunk_kda's layouts.

    q, k [B, T, H, K] (already normalised: no l2norm here), v [B, T, HV, V], g [B, T, HV, K] (the
    activated natural-log gate), beta [B, T, HV] (after its sigmoid); B = 1 with cu_seqlens.
    initial_state [N, HV, V, K] with ``state_v_first`` (as FLA's layer passes), else [N, HV, K, V].
    Returns (o [B, T, HV, V], the final states [N, HV, ..] in the same layout as initial_state).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or HV % H:
        raise ValueError(f"k, v: expected k like q {tuple(q.shape)} and v [B, T, HV, V] with HV a multiple of H, "
                         f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if g.shape != (B, T, HV, K) or beta.shape != (B, T, HV):
        raise ValueError(f"g, beta: expected {[B, T, HV, K]} and {[B, T, HV]}, got {list(g.shape)} and "
                         f"{list(beta.shape)}")
    bounds = sequence_bounds(B, T, cu_seqlens)
    state_shape = (len(bounds), HV, V, K) if state_v_first else (len(bounds), HV, K, V)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(f"initial_state: expected {list(state_shape)}, got {list(initial_state.shape)}")
    G = HV // H
    s = K ** -0.5 if scale is None else float(scale)

    def tokens(x, grouped=False):
        x = x.reshape(B * T, *x.shape[2:])
        return x.repeat_interleave(G, dim=1) if grouped else x   # value head j reads query head j // G

    q, k, v, g, beta = tokens(q, True), tokens(k, True), tokens(v), tokens(g), tokens(beta)
    outs, finals = [], []
    for n, (start, end) in enumerate(bounds):
        if initial_state is None:
            S = q.new_zeros(HV, K, V)
        else:
            S = initial_state[n].transpose(-1, -2) if state_v_first else initial_state[n]
        for t in range(start, end):
            S = S * g[t].exp()[..., None]
            residual = v[t] - torch.einsum("hk,hkv->hv", k[t], S)
            S = S + (beta[t][:, None] * k[t])[..., None] * residual[:, None, :]
            outs.append(s * torch.einsum("hk,hkv->hv", q[t], S))
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return torch.stack(outs).reshape(B, T, HV, V), torch.stack(finals)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """FusedRMSNormGated with activation='sigmoid': x / sqrt(mean(x^2) + eps) * weight * sigmoid(gate)."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight * torch.sigmoid(gate)


def layer_forward(params: dict[str, torch.Tensor], cfg: LayerSettings, hidden_states: torch.Tensor,
                  cu_seqlens: Any = None, taps: dict | None = None) -> torch.Tensor:
    """The layer's output [B, T, D] from ``params`` (by the layer's names) and hidden_states [B, T, D],
    in the dtype of the inputs (float64 for the oracle). ``taps``, where given, receives the raw gate
    projection and the activated gate [B, T, HV, K] ("g_raw", "g")."""
    if hidden_states.ndim != 3:
        raise ValueError(f"hidden_states: expected [B, T, D], got shape {tuple(hidden_states.shape)}")
    B, T, D = hidden_states.shape
    bounds = sequence_bounds(B, T, cu_seqlens)
    x = hidden_states.reshape(B * T, D)
    p = params

    def short_conv(name: str) -> torch.Tensor:
        y = F.linear(x, p[f"{name}_proj.weight"])
        if not cfg.conv_size:
            return F.silu(y)
        return causal_conv(y, p[f"{name}_conv1d.weight"], p.get(f"{name}_conv1d.bias"), bounds)

    q = l2norm(short_conv("q").reshape(B, T, cfg.H, cfg.K))
    k = l2norm(short_conv("k").reshape(B, T, cfg.H, cfg.K))
    v = short_conv("v").reshape(B, T, cfg.HV, cfg.V)
    g_raw = F.linear(F.linear(x, p["f_proj.0.weight"]), p["f_proj.1.weight"]).reshape(B, T, cfg.HV, cfg.K)
    g = activations.gate(g_raw, p["A_log"], p["dt_bias"], cfg.lower_bound, dtype=F64)
    if taps is not None:
        taps.update(g_raw=g_raw, g=g)
    beta = activations.beta(F.linear(x, p["b_proj.weight"]).reshape(B, T, cfg.HV), cfg.allow_neg_eigval, dtype=F64)
    o, _ = kda_recurrence(q, k, v, g, beta, cu_seqlens=cu_seqlens)
    gate = F.linear(F.linear(x, p["g_proj.0.weight"]), p["g_proj.1.weight"], p["g_proj.1.bias"])
    o = gated_rms_norm(o, gate.reshape(B, T, cfg.HV, cfg.V), p["o_norm.weight"], cfg.norm_eps)
    return F.linear(o.reshape(B, T, cfg.HV * cfg.V), p["o_proj.weight"])


def layer_gradients(layer: Any, hidden_states: torch.Tensor, do: torch.Tensor,
                    cu_seqlens: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the layer's output, float64, and the float64 gradients of sum(output * do)) with respect to every
    parameter by the layer's name and to the hidden states (key ``"hidden_states"``); all on the CPU.
    The layer's parameters are read as they are (a bf16 layer's bf16 values, exactly)."""
    params = parameters(layer)
    x = hidden_states.detach().to("cpu", F64).requires_grad_()
    out = layer_forward(params, settings(layer), x, cu_seqlens)
    if out.shape != do.shape:
        raise ValueError(f"do: expected the output's shape {tuple(out.shape)}, got {tuple(do.shape)}")
    names = [*params, "hidden_states"]
    grads = torch.autograd.grad((out * do.detach().to("cpu", F64)).sum(), [*params.values(), x])
    return out.detach(), dict(zip(names, grads))


def gate_term_magnitudes(layer: Any, hidden_states: torch.Tensor, do: torch.Tensor,
                         cu_seqlens: Any = None) -> dict[str, torch.Tensor]:
    """For A_log [HV] and dt_bias [HV * K]: the sum of the magnitudes of the terms whose sum is the
    parameter's float64 gradient, |dL/dg dg/dp| over every token (and, for A_log, every channel), in the
    parameter's shape.

    Each gradient is one sum over all tokens of the activated gate's gradient times the gate's slope,
    and the terms cancel: A_log's sum is 10 to 2000 times smaller than the sum of its terms' magnitudes
    in the layer test's cases, dt_bias's about 3 times. A computed gate gradient's rounding reaches the
    sum term by term, so an error floor for these gradients is a fraction of this magnitude, not of the
    cancelled sum."""
    params = parameters(layer)
    cfg = settings(layer)
    x = hidden_states.detach().to("cpu", F64)
    taps: dict = {}
    out = layer_forward(params, cfg, x, cu_seqlens, taps)
    dg, = torch.autograd.grad((out * do.detach().to("cpu", F64)).sum(), taps["g"])
    g_raw = taps["g_raw"].detach()
    fixed = {name: params[name].detach() for name in ("A_log", "dt_bias")}
    magnitudes = {}
    for name, p in fixed.items():
        def gate_of(value, name=name):
            args = {**fixed, name: value}
            return activations.gate(g_raw, args["A_log"], args["dt_bias"], cfg.lower_bound, dtype=F64)

        # the gate is elementwise in each parameter entry: one forward-mode derivative along ones
        # gives every element's slope with respect to its own entry
        _, slope = torch.func.jvp(gate_of, (p,), (torch.ones_like(p),))
        terms = (dg * slope).abs().reshape(-1, cfg.HV, cfg.K).sum(0)
        magnitudes[name] = (terms.sum(1) if name == "A_log" else terms).reshape(p.shape)
    return magnitudes
