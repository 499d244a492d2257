"""kernel.fla_dropin.preprocess on the CPU: the op's preprocessing in torch (where fla-core is not installed)
against float64 and loops written out, and the op's choice between it and FLA's."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernel.activations import gate  # noqa: E402
from kernel.fla_dropin import function, preprocess  # noqa: E402


def test_the_l2norm_is_floats_in_xs_dtype_with_its_rstd():
    x = torch.randn(3, 50, 2, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    y, rstd = preprocess.l2norm_fwd(x)
    x64 = x.double()
    r64 = 1.0 / torch.sqrt(x64.square().sum(-1) + preprocess.L2NORM_EPS)
    assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    assert torch.allclose(rstd.double(), r64, rtol=1e-6, atol=0)
    # one rounding to bf16 of the fp32 quotient: within half a bf16 step (2^-9 relative) of float64's
    assert torch.all((y.double() - x64 * r64[..., None]).abs() <= 2.0 ** -8 * (x64 * r64[..., None]).abs() + 1e-30)


def _loop_cumsum(g: np.ndarray, lengths) -> np.ndarray:
    """The chunk-local cumsum written out: every sequence from its start, every 64 tokens afresh."""
    out, t0 = np.zeros_like(g, dtype=np.float64), 0
    for n in lengths:
        for c0 in range(0, n, 64):
            rows = slice(t0 + c0, t0 + min(c0 + 64, n))
            out[rows] = np.cumsum(g[rows].astype(np.float64), axis=0)
        t0 += n
    return out


@pytest.mark.parametrize("lengths", [[130, 130], [1, 63, 64, 65, 200], [300]], ids=["B 2 x T 130", "ragged", "one"])
def test_the_chunk_local_cumsum_restarts_every_64_tokens_of_every_sequence(lengths):
    gen = torch.Generator().manual_seed(1)
    batch = len(set(lengths)) == 1 and len(lengths) > 1          # B sequences of T, no cu_seqlens
    T = lengths[0] if batch else sum(lengths)
    g = -torch.rand(len(lengths) if batch else 1, T, 3, 128, generator=gen)
    cu = None if batch else torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    got = preprocess.chunk_local_cumsum(g, 64, scale=2.0, cu_seqlens=cu)
    want = 2.0 * _loop_cumsum(g.reshape(-1, 3, 128).numpy(), lengths)
    assert got.dtype == torch.float32 and got.shape == g.shape
    np.testing.assert_allclose(got.reshape(-1, 3, 128).numpy(), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "sigmoid"])
def test_the_gate_cumsum_is_the_activated_gates_in_log2(lower_bound):
    gen = torch.Generator().manual_seed(2)
    g_raw = torch.randn(1, 200, 2, 128, generator=gen).bfloat16()
    A_log = torch.log(torch.empty(2).uniform_(1, 16, generator=gen))
    dt_bias = 0.1 * torch.randn(2 * 128, generator=gen)
    cu = torch.tensor([0, 17, 200])
    got = preprocess.gate_cumsum(g=g_raw, A_log=A_log, dt_bias=dt_bias, scale=preprocess.RCP_LN2, chunk_size=64,
                                 cu_seqlens=cu, chunk_indices=None, lower_bound=lower_bound)
    want = _loop_cumsum(gate(g_raw, A_log, dt_bias, lower_bound).reshape(-1, 2, 128).numpy(), [17, 183]) / math.log(2)
    np.testing.assert_allclose(got.reshape(-1, 2, 128).numpy(), want, rtol=2e-6, atol=1e-5)


def test_beta_is_the_scaled_sigmoid():
    b = torch.randn(2, 10, 3).bfloat16()
    assert torch.equal(preprocess.beta_sigmoid(b, scale=2.0), 2.0 * torch.sigmoid(b.float()))


def test_the_op_takes_flas_preprocessing_where_it_imports_and_torchs_where_not(monkeypatch):
    def no_fla():
        raise ImportError("No module named 'fla'")

    monkeypatch.setattr(function, "_fla", no_fla)
    torch_side = function.around_our_kernels()
    assert torch_side["l2norm_fwd"] is preprocess.l2norm_fwd and torch_side["chunk_indices"]() is None
    fla = pytest.importorskip("fla", reason="fla-core is not installed")
    monkeypatch.undo()
    assert set(function.around_our_kernels()) == set(torch_side) | {"chunk_kda_fwd"} and fla
