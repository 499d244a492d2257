"""kernel.activations: the gate and beta backward against torch autograd of the forward formulas
in float64 (an independent oracle: autograd differentiates the formula, the module writes the
derivative out), on every form FLA's layer uses."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from kernel import activations  # noqa: E402

CPU = settings(max_examples=40, deadline=None)
FORMS = [  # (lower_bound, with A_log, with dt_bias)
    (None, True, True), (None, True, False), (-5.0, True, True), (-5.0, False, True), (-3.0, False, False),
    (-5.0, True, False),
]


def _oracle(g_raw, A_log, dt_bias, lower_bound, dg):
    """Gradients of sum(dg * gate) by autograd, float64."""
    g_raw = g_raw.double().requires_grad_()
    A = A_log.double().requires_grad_() if A_log is not None else None
    b = dt_bias.double().requires_grad_() if dt_bias is not None else None
    x = g_raw + (b.view(g_raw.shape[-2:]) if b is not None else 0.0)
    HV = g_raw.shape[-2]
    if lower_bound is None:
        y = -A.view(HV, 1).exp() * torch.log1p(x.exp())
    else:
        y = lower_bound * torch.sigmoid((A.view(HV, 1).exp() if A is not None else 1.0) * x)
    (y * dg.double()).sum().backward()
    return y.detach(), g_raw.grad, (A.grad if A is not None else None), (b.grad if b is not None else None)


def _close(got, want, rel):
    """fp32 math against float64: the largest error within rel of the largest value."""
    return (got.double() - want).abs().max() <= rel * want.abs().max() + 1e-30


def _layer_inputs(seed, B=2, T=37, HV=3, K=8):
    rs = np.random.default_rng(seed)
    g_raw = torch.from_numpy(rs.standard_normal((B, T, HV, K)) * 2).float()
    A_log = torch.from_numpy(np.log(rs.uniform(1, 16, HV))).float()            # FLA's init
    dt = np.exp(rs.uniform(math.log(1e-3), math.log(1e-1), HV * K))
    dt_bias = torch.from_numpy(dt + np.log(-np.expm1(-dt))).float()             # softplus^-1(dt)
    dg = torch.from_numpy(rs.standard_normal((B, T, HV, K))).float()
    return g_raw, A_log, dt_bias, dg


@CPU
@given(seed=st.integers(0, 2**32 - 1), form=st.sampled_from(FORMS))
def test_the_gate_and_its_backward_are_autograds(seed, form):
    lower_bound, with_a, with_bias = form
    g_raw, A_log, dt_bias, dg = _layer_inputs(seed)
    A_log = A_log if with_a else None
    dt_bias = dt_bias if with_bias else None
    y, dx_want, dA_want, db_want = _oracle(g_raw, A_log, dt_bias, lower_bound, dg)
    assert torch.allclose(activations.gate(g_raw, A_log, dt_bias, lower_bound, dtype=torch.float64), y,
                          rtol=1e-12, atol=1e-12)
    dx, dA, db = activations.gate_backward(dg, g_raw, A_log, dt_bias, lower_bound)
    assert dx.dtype == g_raw.dtype and dx.shape == g_raw.shape
    assert _close(dx, dx_want, 4e-6)
    if with_a:
        assert dA.shape == A_log.shape and dA.dtype == A_log.dtype
        assert _close(dA, dA_want, 2e-4)
    else:
        assert dA is None
    if with_bias:
        assert db.shape == dt_bias.shape and db.dtype == dt_bias.dtype
        assert _close(db, db_want, 1e-5)
    else:
        assert db is None


def test_the_softplus_gate_is_unbounded_below_and_the_sigmoid_gate_is_not():
    x = torch.tensor([[[[-30.0, 0.0, 30.0]]]])
    A_log = torch.zeros(1)
    assert activations.gate(x, A_log)[..., 2] < -29
    assert activations.gate(x, A_log, lower_bound=-5.0).min() >= -5   # fp32 sigmoid(30) rounds to 1


@CPU
@given(seed=st.integers(0, 2**32 - 1), neg=st.booleans())
def test_the_beta_backward_is_autograds(seed, neg):
    rs = np.random.default_rng(seed)
    raw = torch.from_numpy(rs.standard_normal((2, 9, 3)) * 3).double().requires_grad_()
    db = torch.from_numpy(rs.standard_normal((2, 9, 3)))
    y = (2.0 if neg else 1.0) * torch.sigmoid(raw)
    (y * db).sum().backward()
    assert torch.allclose(activations.beta(raw.detach(), neg, dtype=torch.float64), y.detach())
    got = activations.beta_backward(db.float(), raw.detach().float(), neg)
    assert got.dtype == torch.float32
    assert _close(got, raw.grad, 1e-6)


def test_a_bf16_input_gets_a_bf16_gradient():
    g_raw, A_log, dt_bias, dg = _layer_inputs(0)
    dx, dA, db = activations.gate_backward(dg, g_raw.bfloat16(), A_log, dt_bias)
    assert dx.dtype == torch.bfloat16 and dA.dtype == torch.float32 and db.dtype == torch.float32
    assert activations.beta_backward(dg[..., 0], g_raw[..., 0].bfloat16()).dtype == torch.bfloat16
