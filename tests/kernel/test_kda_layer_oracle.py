"""The float64 oracle of FLA's KimiDeltaAttention layer (tests/kernel/kda_layer_oracle.py), on the CPU.

Its KDA recurrence against FLA's own naive references (``fla.ops.kda.naive``, run in float64: they
cast their inputs with ``.to(torch.float)``, read here as float64) and against the project's float64
forward (kernel.reference), with grouped value heads, varlen and the V-first state layout the layer
passes; its convolution, l2norm, gated norm and gates against torch and FLA's torch references;
the whole forward against the same layer rebuilt from FLA's own modules (its Linears, its
ShortConvolutions run as the nn.Conv1d they are) and references; the gradients against finite
differences. The GPU half (the layer's gradients, FLA's path and ours) is
tests/kernel/test_fla_layer_module_gpu.py.
"""
from __future__ import annotations

import inspect
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="fla-core needs triton")
pytest.importorskip("transformers", reason="fla.layers imports transformers, which is not installed")
pytest.importorskip("fla.layers.kda", reason="flash-linear-attention 0.6.0 (fla.layers) is not installed")

import torch.nn.functional as F  # noqa: E402
from fla.layers.kda import KimiDeltaAttention  # noqa: E402
from fla.ops.kda import naive  # noqa: E402

from kernel import activations  # noqa: E402
from kernel.reference import kda_forward_reference  # noqa: E402
from kernel.reference import l2norm as reference_l2norm  # noqa: E402

from . import kda_layer_oracle as oracle  # noqa: E402

F64 = torch.float64
EXACT = 1e-12          # float64 against float64: the same math in another order
FP32 = 2e-6            # float64 against FLA's fp32 torch references
LENGTHS = [1, 15, 16, 17, 40]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)   # the draws that take no generator repeat from run to run


class _Float64Torch:
    """torch as FLA's naive references see it, with torch.float read as float64."""
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _in_float64(fn):
    return types.FunctionType(fn.__code__, {**fn.__globals__, "torch": _Float64Torch()}, fn.__name__,
                              fn.__defaults__, fn.__closure__)


naive_recurrent_f64 = _in_float64(naive.naive_recurrent_kda)
naive_chunk_f64 = _in_float64(naive.naive_chunk_kda)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the largest magnitude of b."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def _kda_inputs(B, T, H, HV, K, V, *, seed, N=None):
    gen = torch.Generator().manual_seed(seed)
    n = lambda *s: torch.randn(*s, generator=gen, dtype=F64)   # noqa: E731
    q, k = oracle.l2norm(n(B, T, H, K)), oracle.l2norm(n(B, T, H, K))
    return dict(q=q, k=k, v=n(B, T, HV, V), g=-2.0 * torch.rand(B, T, HV, K, generator=gen, dtype=F64),
                beta=torch.rand(B, T, HV, generator=gen, dtype=F64), h0=0.5 * n(N or B, HV, V, K))


def _cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# the KDA recurrence
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4), (1, 3)])
def test_recurrence_equals_flas_naive_recurrent_in_float64(H, HV):
    x = _kda_inputs(2, 37, H, HV, 8, 6, seed=H * 10 + HV)
    o, final = oracle.kda_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"])
    o_ref, S_ref = naive_recurrent_f64(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       initial_state=x["h0"].transpose(-1, -2), output_final_state=True)
    assert o.dtype == o_ref.dtype == F64
    assert _rel(o, o_ref) < EXACT
    assert _rel(final, S_ref.transpose(-1, -2)) < EXACT


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])
def test_varlen_recurrence_equals_flas_naive_per_sequence(H, HV):
    cu = _cu(LENGTHS)
    x = _kda_inputs(1, int(cu[-1]), H, HV, 8, 6, seed=3, N=len(LENGTHS))
    o, final = oracle.kda_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                     cu_seqlens=cu)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        piece = {name: x[name][:, s:e] for name in ("q", "k", "v", "g", "beta")}
        o_ref, S_ref = naive_recurrent_f64(**piece, initial_state=x["h0"][n:n + 1].transpose(-1, -2),
                                           output_final_state=True)
        assert _rel(o[:, s:e], o_ref) < EXACT, n
        assert _rel(final[n], S_ref[0].transpose(-1, -2)) < EXACT, n


def test_recurrence_equals_flas_naive_chunked_form_in_float64():
    x = _kda_inputs(2, 48, 2, 4, 8, 6, seed=5)
    o, final = oracle.kda_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"])
    o_ref, S_ref = naive_chunk_f64(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["h0"].transpose(-1, -2), output_final_state=True, chunk_size=16)
    assert _rel(o, o_ref) < EXACT
    assert _rel(final, S_ref.transpose(-1, -2)) < EXACT


def test_flas_naive_runs_in_float64_here_and_not_in_fp32():
    # without the float64 reading FLA's naive rounds to fp32: the comparisons above would need 1e-6
    x = _kda_inputs(1, 37, 2, 4, 8, 6, seed=7)
    o, _ = oracle.kda_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert _rel(o, naive_recurrent_f64(*args)[0]) < EXACT
    assert _rel(o, naive.naive_recurrent_kda(*args)[0]) > 1e3 * EXACT


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])
def test_recurrence_equals_kernel_reference_forward(H, HV):
    # kernel.reference has no grouped value heads: q and k repeated per value head, as the op does
    # for its backward; its states are [K, V]
    cu = _cu(LENGTHS)
    x = _kda_inputs(1, int(cu[-1]), H, HV, 8, 6, seed=11, N=len(LENGTHS))
    raw_q, raw_k = x["q"] * 3.0, x["k"] * 0.5          # the reference normalises them itself
    o, final = oracle.kda_recurrence(oracle.l2norm(raw_q), oracle.l2norm(raw_k), x["v"], x["g"], x["beta"],
                                     initial_state=x["h0"], cu_seqlens=cu)
    rep = lambda t: t.repeat_interleave(HV // H, dim=2).numpy()   # noqa: E731
    o_ref, final_ref, _ = kda_forward_reference(rep(raw_q), rep(raw_k), x["v"].numpy(), x["g"].numpy(),
                                                x["beta"].numpy(), initial_state=x["h0"].transpose(-1, -2).numpy(),
                                                cu_seqlens=cu.numpy(), qk_l2norm=True)
    assert _rel(o, torch.from_numpy(o_ref)) < EXACT
    assert _rel(final, torch.from_numpy(final_ref).transpose(-1, -2)) < EXACT


def test_state_layouts_are_each_others_transpose():
    x = _kda_inputs(2, 20, 2, 4, 8, 6, seed=13)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o_vk, final_vk = oracle.kda_recurrence(*args, initial_state=x["h0"], state_v_first=True)
    o_kv, final_kv = oracle.kda_recurrence(*args, initial_state=x["h0"].transpose(-1, -2).contiguous(),
                                           state_v_first=False)
    assert final_vk.shape == (2, 4, 6, 8) and final_kv.shape == (2, 4, 8, 6)
    assert torch.equal(o_vk, o_kv) and torch.equal(final_vk, final_kv.transpose(-1, -2))


def test_recurrence_refuses_a_state_in_the_other_layout():
    x = _kda_inputs(1, 5, 1, 1, 8, 6, seed=0)
    with pytest.raises(ValueError, match=r"initial_state: expected \[1, 1, 6, 8\]"):
        oracle.kda_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"],
                              initial_state=x["h0"].transpose(-1, -2))


# ---------------------------------------------------------------------------------------------
# the layer's other pieces
# ---------------------------------------------------------------------------------------------

def _short_conv(D, W, bias):
    from fla.modules import ShortConvolution

    torch.manual_seed(W)
    conv = ShortConvolution(hidden_size=D, kernel_size=W, bias=bias, activation="silu").double()
    if bias:
        torch.nn.init.normal_(conv.bias)
    return conv


@pytest.mark.parametrize("W,bias", [(4, False), (3, True)])
def test_causal_conv_is_flas_short_convolution_as_torchs_conv1d(W, bias):
    # ShortConvolution is an nn.Conv1d with padding W - 1 and one group per channel: its first T outputs
    # are the causal convolution
    D, T = 6, 11
    conv = _short_conv(D, W, bias)
    x = torch.randn(2, T, D, dtype=F64)
    want = F.silu(torch.nn.Conv1d.forward(conv, x.transpose(1, 2))[..., :T]).transpose(1, 2)
    got = oracle.causal_conv(x.reshape(-1, D), conv.weight, conv.bias, oracle.sequence_bounds(2, T))
    assert _rel(got.reshape(2, T, D), want) < EXACT


def test_causal_conv_restarts_at_every_sequence():
    D = 5
    conv = _short_conv(D, 4, True)
    cu = _cu(LENGTHS)
    x = torch.randn(int(cu[-1]), D, dtype=F64)
    got = oracle.causal_conv(x, conv.weight, conv.bias, oracle.sequence_bounds(1, int(cu[-1]), cu))
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        want = F.silu(torch.nn.Conv1d.forward(conv, x[s:e].T[None])[..., :e - s])[0].T
        assert _rel(got[s:e], want) < EXACT, (s, e)


def test_l2norm_is_flas_with_its_eps():
    from fla.modules.norm.l2norm import l2norm_fwd

    assert oracle.L2NORM_EPS == inspect.signature(l2norm_fwd).parameters["eps"].default
    x = torch.randn(7, 3, 16, dtype=F64)
    x[0, 0] *= 1e-4     # where eps matters
    assert _rel(oracle.l2norm(x), torch.from_numpy(reference_l2norm(np, x.numpy()))) < EXACT


def test_gated_rms_norm_equals_torchs_rms_norm_and_flas_reference():
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    V, eps = 16, 1e-5
    x, gate = torch.randn(3, 5, 2, V, dtype=F64), torch.randn(3, 5, 2, V, dtype=F64)
    weight = torch.randn(V).to(F64)       # fp32 values: FLA's reference reads the weight as fp32
    got = oracle.gated_rms_norm(x, gate, weight, eps)
    assert _rel(got, F.rms_norm(x, (V,), weight, eps) * torch.sigmoid(gate)) < EXACT
    # FLA's reference gates with silu: its ungated norm, times the sigmoid gate
    ref = rms_norm_ref(x, weight, None, z=None, eps=eps, upcast=False) * torch.sigmoid(gate)
    assert _rel(got, ref) < EXACT


@pytest.mark.parametrize("lower_bound", [None, -5.0, -3.0])
def test_the_gate_is_flas(lower_bound):
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate

    HV, K = 3, 8
    g_raw = torch.randn(2, 9, HV, K)
    A_log = torch.log(torch.empty(HV).uniform_(1, 16)) if lower_bound is None else torch.randn(HV)
    dt_bias = torch.randn(HV * K) - 3.0
    got = activations.gate(g_raw, A_log, dt_bias, lower_bound, dtype=F64)
    if lower_bound is None:
        want = naive_kda_gate(g_raw, A_log, dt_bias)
    else:
        want = naive_kda_lowerbound_gate(g_raw, A_log, dt_bias, lower_bound=lower_bound)
    assert got.dtype == F64 and _rel(got, want.double()) < FP32


# ---------------------------------------------------------------------------------------------
# the whole layer
# ---------------------------------------------------------------------------------------------

LAYERS = [
    # id, KimiDeltaAttention's arguments besides the sizes, lengths (None: a batch of 2 x 23)
    ("defaults", dict(), None),
    ("defaults-gva-varlen", dict(num_v_heads=4), LENGTHS),
    ("safe-gate", dict(safe_gate=True, lower_bound=-5.0), None),
    ("safe-gate-gva-varlen", dict(safe_gate=True, lower_bound=-5.0, num_v_heads=4), LENGTHS),
    ("neg-eigval-conv-bias", dict(allow_neg_eigval=True, conv_bias=True, conv_size=3), LENGTHS),
    ("no-short-conv", dict(use_short_conv=False, num_v_heads=4), None),
]


def _layer(kw, *, seed=0, hidden=32, head_dim=8):
    torch.manual_seed(seed)
    layer = KimiDeltaAttention(hidden_size=hidden, num_heads=2, head_dim=head_dim, **kw)
    with torch.no_grad():   # parameters the layer initialises to constants, drawn (fp32 values)
        layer.o_norm.weight.normal_(1.0, 0.3)
        layer.A_log.add_(0.3 * torch.randn_like(layer.A_log))
    return layer


def _hidden(layer, lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    if lengths is None:
        return torch.randn(2, 23, layer.hidden_size, generator=gen, dtype=F64), None
    cu = _cu(lengths)
    return torch.randn(1, int(cu[-1]), layer.hidden_size, generator=gen, dtype=F64), cu


def _rebuilt(layer, x, cu):
    """The layer's forward from its own modules (float64) and FLA's torch references, per sequence."""
    B, T, _ = x.shape
    bounds = oracle.sequence_bounds(B, T, cu)
    H, HV, K, V = layer.num_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim

    def short_conv(proj, conv):
        y = proj(x)
        if not layer.use_short_conv:
            return F.silu(y)
        flat = y.reshape(B * T, -1)
        return torch.cat([F.silu(torch.nn.Conv1d.forward(conv, flat[s:e].T[None])[..., :e - s])[0].T
                          for s, e in bounds]).reshape(B, T, -1)

    q = short_conv(layer.q_proj, getattr(layer, "q_conv1d", None)).reshape(B, T, H, K)
    k = short_conv(layer.k_proj, getattr(layer, "k_conv1d", None)).reshape(B, T, H, K)
    v = short_conv(layer.v_proj, getattr(layer, "v_conv1d", None)).reshape(B, T, HV, V)
    q, k = (torch.from_numpy(reference_l2norm(np, t.detach().numpy())) for t in (q, k))
    g = activations.gate(layer.f_proj(x).reshape(B, T, HV, K), layer.A_log, layer.dt_bias, layer.lower_bound,
                         dtype=F64)
    beta = (2.0 if layer.allow_neg_eigval else 1.0) * torch.sigmoid(layer.b_proj(x))
    flat = lambda t: t.reshape(B * T, 1, *t.shape[2:])   # noqa: E731  (one token row per batch entry)
    o = torch.cat([naive_recurrent_f64(*(flat(t)[s:e].transpose(0, 1) for t in (q, k, v, g, beta)))[0]
                   for s, e in bounds], dim=1).reshape(B, T, HV, V)
    from fla.modules.norm.layernorm_gated import rms_norm_ref

    gate = layer.g_proj(x).reshape(B, T, HV, V)
    o = rms_norm_ref(o, layer.o_norm.weight, None, eps=layer.o_norm.eps, upcast=False) * torch.sigmoid(gate)
    return layer.o_proj(o.reshape(B, T, HV * V))


@pytest.mark.parametrize("case", LAYERS, ids=[c[0] for c in LAYERS])
def test_the_oracles_forward_is_the_layer_rebuilt_from_flas_own_modules(case):
    _, kw, lengths = case
    layer = _layer(kw)
    x, cu = _hidden(layer, lengths)
    params = oracle.parameters(layer)
    assert all(p.dtype == F64 and p.requires_grad for p in params.values())
    got = oracle.layer_forward(params, oracle.settings(layer), x, cu)
    with torch.no_grad():
        want = _rebuilt(layer.double(), x, cu)
    assert got.shape == x.shape
    assert _rel(got, want) < EXACT


@pytest.mark.parametrize("case", [LAYERS[1], LAYERS[2]], ids=[LAYERS[1][0], LAYERS[2][0]])
def test_the_gradients_are_the_forwards_derivatives(case):
    _, kw, lengths = case
    layer = _layer(kw, hidden=6, head_dim=3)
    lengths = None if lengths is None else [1, 4, 2]
    x, cu = _hidden(layer, lengths)
    x = x[:, :5] if cu is None else x
    do = torch.randn(x.shape, dtype=F64)
    out, grads = oracle.layer_gradients(layer, x, do, cu)
    assert set(grads) == {name for name, _ in layer.named_parameters()} | {"hidden_states"}
    params = oracle.parameters(layer)
    cfg = oracle.settings(layer)
    names = list(params)

    def loss(*tensors):
        return (oracle.layer_forward(dict(zip(names, tensors[:-1])), cfg, tensors[-1], cu) * do).sum()

    inputs = [*params.values(), x.clone().requires_grad_()]
    with torch.no_grad():
        assert torch.equal(oracle.layer_forward(params, cfg, x, cu), out)
    for i, name in enumerate([*names, "hidden_states"]):   # central differences, element by element
        flat = inputs[i].detach().reshape(-1)
        want = torch.empty_like(flat)
        for j in range(flat.numel()):
            plus, minus = flat.clone(), flat.clone()
            plus[j] += 1e-6
            minus[j] -= 1e-6
            with torch.no_grad():
                f = lambda e: loss(*inputs[:i], e.view_as(inputs[i]), *inputs[i + 1:])   # noqa: E731
                want[j] = (f(plus) - f(minus)) / 2e-6
        torch.testing.assert_close(grads[name].reshape(-1), want, rtol=1e-6, atol=1e-8, msg=name)


def test_parameters_refuse_a_parameter_the_oracle_does_not_compute_with():
    layer = _layer({})
    layer.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ValueError, match=r"extra \['extra'\]"):
        oracle.parameters(layer)


def test_settings_refuse_a_norm_gated_otherwise_than_by_sigmoid():
    layer = _layer({})
    layer.o_norm.activation = "swish"
    with pytest.raises(ValueError, match="activation='sigmoid'"):
        oracle.settings(layer)


def test_settings_are_read_off_the_layer():
    layer = _layer(dict(num_v_heads=4, safe_gate=True, lower_bound=-5.0, allow_neg_eigval=True, conv_size=3,
                        norm_eps=1e-6))
    assert oracle.settings(layer) == oracle.LayerSettings(H=2, HV=4, K=8, V=8, conv_size=3, conv_bias=False,
                                                          allow_neg_eigval=True, lower_bound=-5.0, norm_eps=1e-6)


@pytest.mark.parametrize("case", [LAYERS[1], LAYERS[2]], ids=[LAYERS[1][0], LAYERS[2][0]])
def test_gate_term_magnitudes_bound_the_gradients_they_sum(case):
    _, kw, lengths = case
    layer = _layer(kw, hidden=6, head_dim=3)
    lengths = None if lengths is None else [1, 4, 2]
    x, cu = _hidden(layer, lengths)
    x = x[:, :5] if cu is None else x
    do = torch.randn(x.shape, dtype=F64)
    _, grads = oracle.layer_gradients(layer, x, do, cu)
    got = oracle.gate_term_magnitudes(layer, x, do, cu)
    assert set(got) == {"A_log", "dt_bias"}
    for name, m in got.items():
        # the magnitudes bound the sum they make, and A_log's is dt_bias's channels' sum weighted
        # differently: neither may be zero where the gradient is not
        assert m.shape == grads[name].shape and m.dtype == F64
        assert torch.all(grads[name].abs() <= m * (1 + 1e-12)), name
        assert torch.all((m > 0) | (grads[name] == 0)), name
    if layer.lower_bound is None:   # the softplus gate g = -exp(A_log) softplus(.): dg/dA_log = g itself
        params = oracle.parameters(layer)
        taps = {}
        out = oracle.layer_forward(params, oracle.settings(layer), x, cu, taps)
        dg, = torch.autograd.grad((out * do).sum(), taps["g"])
        assert torch.allclose(got["A_log"], (dg * taps["g"]).abs().sum((0, 1, 3)), rtol=1e-12, atol=0)
