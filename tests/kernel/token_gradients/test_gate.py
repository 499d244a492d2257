"""Kernel B's gate epilogue (token_gradients_gate.cuh) on the CPU: a numpy model of what each CTA does
(fp32 per element; each channel's rows 0..7 and 8..15 of every 16-token tile summed apart, in token order, by
the two lanes that share the channel, ddt_bias's as the first plus the second, dA_log's over those 256 sums by
the kernel's shuffle tree and then warp by warp) and of the caller's sum over chunks
(kernel.kda_backward), checked against kernel.activations.gate_backward on random data, and against
the float64 math of the activation's derivatives; and the softplus form's one-exponential sigmoid and
softplus against float64 over the whole range of x."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kernel.activations' reference is torch's (an optional dependency)")

from kernel.activations import gate, gate_backward  # noqa: E402  (after the skip: it imports torch)
from kernel.ds_scan.launch import bf16_bits, bits_to_f32
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS
from kernel.token_gradients import tables

f32 = np.float32
WARPS, LANES = 8, 16   # the kernel's warps, and the channels of each (lanes l and l + 16 share channel l)
GATE_ROWS = TILE_TOKENS // 2   # the rows of a tile one lane applies the gate to


def _sigmoid_softplus(x):
    """(sigmoid(x), softplus(x)), fp32, as gate_grad's softplus form has them: from the one exponential
    e = exp(-|x|) in [0, 1], so that nothing overflows, and one reciprocal."""
    e = np.exp(-np.abs(x))
    r = f32(1) / (f32(1) + e)
    return np.where(x >= 0, r, e * r), np.maximum(x, f32(0)) + np.log1p(e)


def _grad(dy, x, a_log, lower_bound):
    """gate_grad, fp32 numpy, in the kernel's order: (dx, da)."""
    with np.errstate(over="ignore"):
        if lower_bound is None:
            amp = -np.exp(f32(a_log))
            sig, sp = _sigmoid_softplus(x)
            return dy * amp * sig, dy * amp * sp
        a = f32(1) if a_log is None else np.exp(f32(a_log))
        ax = x if a_log is None else a * x
        s = f32(1) / (f32(1) + np.exp(-ax))
        dx = dy * (f32(lower_bound) * s * (f32(1) - s))
        dx = dx if a_log is None else dx * a
        return dx, dx * x


def _cta_sum(lo: np.ndarray, hi: np.ndarray) -> np.float32:
    """The kernel's sum over 128 channels' two halves (lo: rows 0..7 of the tiles, on lanes 0..15; hi: rows
    8..15, on lanes 16..31): per warp a shuffle-xor tree over its 32 lanes, then the warps in order."""
    total = f32(0)
    for w in range(WARPS):
        lanes = np.concatenate([lo[LANES * w: LANES * (w + 1)], hi[LANES * w: LANES * (w + 1)]]).astype(f32)
        for m in (16, 8, 4, 2, 1):
            lanes = lanes + lanes[np.arange(32) ^ m]
        total = f32(total + lanes[0])
    return total


def epilogue_model(dg, g_bits, A_log, dt_bias, lower_bound, cu, run_chunks: int = 1):
    """(dg_raw bits, da_part [runs, HV] or None, ddt_part [runs, HV, K] or None) as Kernel B's gate
    build writes them, a CTA a run of ``run_chunks`` chunks; dg fp32 [tokens, HV, K], g_bits bf16 bits of g_raw."""
    HV = dg.shape[1]
    t = tables(cu, run_chunks)
    x = bits_to_f32(g_bits)
    if dt_bias is not None:
        x = (x + dt_bias.astype(f32).reshape(HV, HEAD_DIM)).astype(f32)
    dg_raw = np.zeros(dg.shape, np.uint16)
    da_part = np.zeros((t["runs"], HV), f32)
    ddt_part = np.zeros((t["runs"], HV, HEAD_DIM), f32)
    for c, chunk0 in enumerate(t["run_chunk0"]):
        n = t["chunk_seq"][chunk0]
        first = cu[n] + CHUNK_TOKENS * (chunk0 - t["chunk_offs"][n])
        last = min(first + CHUNK_TOKENS * run_chunks, cu[n + 1])
        for h in range(HV):
            dt_sum, da_sum = np.zeros((2, HEAD_DIM), f32), np.zeros((2, HEAD_DIM), f32)   # [half, channel]
            for i in range(first, last):   # token order, as the tiles and their rows go
                dx, da = _grad(dg[i, h], x[i, h], None if A_log is None else A_log[h], lower_bound)
                dg_raw[i, h] = bf16_bits(dx.astype(f32))
                half = (i - first) % TILE_TOKENS // GATE_ROWS
                dt_sum[half], da_sum[half] = (dt_sum[half] + dx).astype(f32), (da_sum[half] + da).astype(f32)
            ddt_part[c, h] = dt_sum[0] + dt_sum[1]
            da_part[c, h] = _cta_sum(da_sum[0], da_sum[1])
    return dg_raw, (None if A_log is None else da_part), (None if dt_bias is None else ddt_part)


def _case(seed: int, HV: int, cu, sigmoid: bool, with_a_log: bool = True, with_bias: bool = True):
    rng = np.random.default_rng(seed)
    tokens = int(cu[-1])
    g_bits = bf16_bits((3 * rng.standard_normal((tokens, HV, HEAD_DIM))).astype(f32))
    dg = rng.standard_normal((tokens, HV, HEAD_DIM)).astype(f32)
    A_log = rng.uniform(-1, 1, HV).astype(f32) if with_a_log else None
    dt_bias = rng.standard_normal(HV * HEAD_DIM).astype(f32) if with_bias else None
    return dg, g_bits, A_log, dt_bias, (-5.0 if sigmoid else None)


CASES = [(0, 2, [0, 200], False, True, True), (1, 3, [0, 64, 70, 199], True, True, True),
         (2, 1, [0, 130], True, False, True), (3, 2, [0, 17, 81], True, True, False),
         (4, 1, [0, 90], False, True, False)]


@pytest.mark.parametrize("run_chunks", [1, 2])
@pytest.mark.parametrize("seed, HV, cu, sigmoid, with_a_log, with_bias", CASES)
def test_the_epilogue_and_the_sum_over_runs_give_gate_backward(seed, HV, cu, sigmoid, with_a_log, with_bias,
                                                               run_chunks):
    cu = np.array(cu, np.int64)
    dg, g_bits, A_log, dt_bias, L = _case(seed, HV, cu, sigmoid, with_a_log, with_bias)
    dg_raw, da_part, ddt_part = epilogue_model(dg, g_bits, A_log, dt_bias, L, cu, run_chunks)
    g_raw = torch.from_numpy(bits_to_f32(g_bits)).to(torch.bfloat16)
    as_t = (lambda x: None if x is None else torch.from_numpy(x))
    want_raw, want_dA, want_ddt = gate_backward(torch.from_numpy(dg), g_raw, as_t(A_log), as_t(dt_bias), L)
    # per element: the same function in fp32 (a few ulps apart: exp and log1p, and the softplus form's one
    # exponential against torch's sigmoid and softplus), rounded to bf16: one bf16 step at most
    got_raw = bits_to_f32(dg_raw)
    np.testing.assert_allclose(got_raw, want_raw.float().numpy(), rtol=2 ** -7, atol=1e-30)
    # the sums: fp32 in another order, against the magnitude of what they add
    x = bits_to_f32(g_bits) + (0 if dt_bias is None else dt_bias.reshape(HV, HEAD_DIM))
    dx, da = _grad_abs(dg, x, A_log, L, HV)
    if with_bias:
        got = ddt_part.astype(np.float64).sum(0).reshape(-1)
        np.testing.assert_allclose(got, want_ddt.double().numpy(), rtol=0, atol=1e-5 * dx.sum(0).reshape(-1).max())
    else:
        assert ddt_part is None and want_ddt is None
    if with_a_log:
        got = da_part.astype(np.float64).sum(0)
        np.testing.assert_allclose(got, want_dA.double().numpy(), rtol=0, atol=1e-5 * da.sum((0, 2)).max())
    else:
        assert da_part is None and want_dA is None


def _grad_abs(dg, x, A_log, L, HV):
    """|dx|, |da| per element, float64: the scale of each sum's terms."""
    out = [_grad(dg[:, h], x[:, h].astype(f32), None if A_log is None else A_log[h], L) for h in range(HV)]
    return (np.abs(np.stack([o[j] for o in out], 1)).astype(np.float64) for j in (0, 1))


@pytest.mark.parametrize("sigmoid", [False, True])
def test_the_fp32_derivatives_are_the_float64_ones(sigmoid):
    """dx and da of the model's formulas against torch autograd of kernel.activations.gate in float64."""
    cu = np.array([0, 64], np.int64)
    dg, g_bits, A_log, dt_bias, L = _case(7, 2, cu, sigmoid)
    x = (bits_to_f32(g_bits) + dt_bias.reshape(2, HEAD_DIM)).astype(f32)
    dx, da = (np.stack([_grad(dg[:, h], x[:, h], A_log[h], L)[j] for h in range(2)], 1) for j in (0, 1))
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_(True)
    at = torch.from_numpy(A_log.astype(np.float64)).requires_grad_(True)
    y = gate(xt, at, None, L, dtype=torch.float64)
    y.backward(torch.from_numpy(dg.astype(np.float64)))
    # fp32's 1 - s loses its digits where s is near 1 (so do torch's and FLA's): an absolute error of
    # about 2^-24 |dg L a|
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(da.astype(np.float64).sum((0, 2)), at.grad.numpy(), rtol=1e-4)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the fp32 spacing at want (float64)."""
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(f32)).astype(np.float64)


def test_the_one_exponential_sigmoid_and_softplus_are_the_float64_ones_for_every_x():
    """x over [-100, 100] (past torch's softplus cutoff at 20 and fp32 exp's range at +-88), 0, +-tiny
    (the smallest subnormal and normal) and the neighbours of +-20: sigmoid and softplus within 5 fp32 ulps
    of float64 (exp's own error, up to about 2.5 ulps for numpy's fp32 exp and 2 for CUDA's expf, and three
    roundings), and dx, da finite everywhere."""
    ends = np.array([0, 1e-45, np.finfo(f32).tiny, 1e-30, 1e-8, 20, 87.3, 88.7, 89, 100], f32)
    near_20 = np.array([np.nextafter(f32(20), f32(0)), np.nextafter(f32(20), f32(30))], f32)
    x = np.concatenate([np.linspace(-100, 100, 400_001).astype(f32), ends, -ends, near_20, -near_20])
    sig, sp = _sigmoid_softplus(x)
    assert sig.dtype == sp.dtype == f32
    x64 = x.astype(np.float64)
    want_sig, want_sp = 1 / (1 + np.exp(-x64)), np.logaddexp(0, x64)
    assert _ulps(sig, want_sig).max() <= 5 and _ulps(sp, want_sp).max() <= 5
    assert (sig[x == 0] == 0.5).all() and (sp[x == 0] == f32(np.log(2))).all()
    assert (sp[x >= 20] == x[x >= 20]).all()   # the log1p term is under half an ulp of x there
    for a_log in (np.log(16), -2.0):
        dx, da = _grad(np.ones_like(x), x, f32(a_log), None)
        assert np.isfinite(dx).all() and np.isfinite(da).all()
        assert (dx <= 0).all() and (da <= 0).all()   # -a sigmoid(x), -a softplus(x)


def test_a_cta_s_partials_are_its_lanes_token_order_sums_over_half_tiles_in_a_fixed_order_the_same_bits_every_time():
    cu = np.array([0, 150], np.int64)
    args = _case(5, 2, cu, False)
    one, two = epilogue_model(*args, cu), epilogue_model(*args, cu)
    for a, b in zip(one, two):
        assert a.tobytes() == b.tobytes()
    dg, g_bits, A_log, dt_bias, L = args
    x = (bits_to_f32(g_bits) + dt_bias.reshape(2, HEAD_DIM)).astype(f32)
    dx, da = _grad(dg[:64, 0], x[:64, 0], A_log[0], L)
    dt_half, da_half = np.zeros((2, HEAD_DIM), f32), np.zeros((2, HEAD_DIM), f32)   # lanes 0..15, 16..31
    for i in range(64):
        half = int(i % TILE_TOKENS >= GATE_ROWS)
        dt_half[half] = (dt_half[half] + dx[i]).astype(f32)
        da_half[half] = (da_half[half] + da[i]).astype(f32)
    assert one[1][0, 0] == _cta_sum(da_half[0], da_half[1])
    assert one[2][0, 0].tobytes() == (dt_half[0] + dt_half[1]).astype(f32).tobytes()
