"""fragments.cuh's register steps and their models in ptx_lab.fragments.

On the CPU: the models, built from the fragment maps, equal the header's pairwise formulas as
ptx_lab.model states them (acc_to_a_fragment, pack_bf16x2); the unpacking inverts the packing;
the two-part split carries x to about 16 bits and its two forms (per pair, per element) give the
same bits. On the GPU: every probe of operand_probes.cu, which runs the header's code, equals
the model bit for bit.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ptx_lab import fragments, model

WARP = 32
CPU = settings(max_examples=60, deadline=None)
DEVICE = settings(max_examples=30, deadline=None)   # the first example compiles operand_probes.cu

# finite fp32 values whose bf16 / f16 rounding stays finite (and NaN payloads out of the question)
finite = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-2.0 ** 120, max_value=2.0 ** 120)
accs = hnp.arrays(np.float32, (WARP, 4), elements=finite)
pairs = hnp.arrays(np.float32, (WARP, 8), elements=finite)
# bf16 bit patterns of finite values (exponent field not all ones)
bf16_finite = st.integers(0, 0xFFFF).filter(lambda b: (b >> 7) & 0xFF != 0xFF)
a_regs = hnp.arrays(np.uint32, (WARP, 4), elements=st.tuples(bf16_finite, bf16_finite).map(lambda p: p[0] | p[1] << 16))


def bf16(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def in_range(x: np.ndarray, dtype: str) -> np.ndarray:
    """x kept to float16's finite range where the packing is to float16 (it overflows to inf past 65504)."""
    return np.clip(x, -6e4, 6e4) if dtype == "float16" else x


def a_pairs(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The A fragment's fp32 elements in register order: (32, 8), pair r = elements of a_r."""
    return np.concatenate([left, right], axis=1)


# ----------------------------------------------------------------- the models (CPU)

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@CPU
@given(left=accs, right=accs)
def test_acc_to_a_through_the_maps_is_the_pairwise_packing(dtype, left, right):
    # the layout claim: the A fragment of [left | right] is each lane's own pairs, packed
    left, right = in_range(left, dtype), in_range(right, dtype)
    assert (fragments.acc_to_a(left, right, dtype) == model.acc_to_a_fragment(left, right, dtype)).all()


@CPU
@given(left=accs, right=accs)
def test_a_to_acc_inverts_acc_to_a(left, right):
    l2, r2 = fragments.a_to_acc(fragments.acc_to_a(left, right))
    for got, x in ((l2, left), (r2, right)):
        assert np.array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))


@CPU
@given(a=a_regs)
def test_acc_to_a_inverts_a_to_acc(a):
    assert (fragments.acc_to_a(*fragments.a_to_acc(a)) == a).all()


@CPU
@given(x=hnp.arrays(np.float32, 64, elements=st.floats(width=32, min_value=2.0 ** -100, max_value=2.0 ** 100)),
       sign=st.sampled_from([1.0, -1.0]))
def test_two_parts_carry_about_16_bits(x, sign):
    x = np.float32(sign) * x
    hi, lo = fragments.two_part(x)
    assert np.array_equal(bf16(hi), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    rest = x - bf16(hi)                                    # exact in fp32
    assert np.array_equal(bf16(lo), rest.astype(ml_dtypes.bfloat16).astype(np.float32))
    err = np.abs(x.astype(np.float64) - bf16(hi).astype(np.float64) - bf16(lo).astype(np.float64))
    assert (err <= 2.0 ** -16 * np.abs(x.astype(np.float64))).all()      # one part alone: up to 2^-9


def test_one_part_loses_what_the_second_keeps():
    # the test can fail: 1 + 2^-10 is not a bf16, so hi alone is off and hi + lo is exact
    x = np.float32(1 + 2.0 ** -10)
    hi, lo = fragments.two_part(x)
    assert bf16(hi) != x and bf16(hi) + bf16(lo) == x


@CPU
@given(left=accs, right=accs)
def test_the_two_forms_of_the_two_part_operand_agree(left, right):
    # per element (acc_to_a_two_parts: bf16_rest of each value) and per pair (two_part_bf16x2:
    # the rest read back from the packed pair) give the same registers; hi is acc_to_a's
    hi, lo = fragments.acc_to_a_two_parts(left, right)
    hi2, lo2 = fragments.two_part_bf16x2(a_pairs(left, right))
    assert (hi == hi2).all() and (lo == lo2).all()
    assert (hi == fragments.acc_to_a(left, right)).all()


@CPU
@given(x=pairs)
def test_two_part_bf16x2_is_pack_bf16x2_of_the_two_parts(x):
    hi, lo = fragments.two_part_bf16x2(x)
    assert (hi == model.pack_bf16x2(x[:, 0::2], x[:, 1::2])).all()
    lo_vals, hi_vals = model.unpack_bf16x2(hi)
    ftz = fragments.flush_subnormal   # the GPU's fp32 subtraction (test_the_model_gives_what_the_gpu_gave...)
    assert (lo == model.pack_bf16x2(ftz(ftz(x[:, 0::2]) - ftz(lo_vals)), ftz(ftz(x[:, 1::2]) - ftz(hi_vals)))).all()


def test_swapped_n_tiles_are_caught():
    # the layout test can fail: [right | left] is not the A fragment of [left | right]
    rng = np.random.default_rng(3)
    left, right = (rng.standard_normal((WARP, 4)).astype(np.float32) for _ in range(2))
    assert not (fragments.acc_to_a(right, left) == model.acc_to_a_fragment(left, right)).all()


def test_the_models_check_their_arguments():
    ok = np.zeros((WARP, 4), np.float32)
    with pytest.raises(ValueError, match=r"left must be float32 \(32, 4\) accumulators; got float64"):
        fragments.acc_to_a(ok.astype(np.float64), ok)
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16"):
        fragments.acc_to_a(ok, ok, "float32")
    with pytest.raises(ValueError, match=r"a must be uint32 \(32, 4\)"):
        fragments.a_to_acc(ok)
    with pytest.raises(ValueError, match=r"x must be float32 \(32, 2n\); got float32 \(32, 3\)"):
        fragments.two_part_bf16x2(np.zeros((WARP, 3), np.float32))


# What the H200 gave for these inputs (ptx_lab.device.two_part_bf16x2, docs/log/35): the bf16 rounding
# keeps subnormals, the fp32 subtraction of the rest flushes them to a zero of their sign.
MEASURED_TWO_PART = [   # x, hi bits, lo bits
    (-1e-45, 0x8000, 0x0000), (1e-45, 0x0000, 0x0000), (-1e-40, 0x8001, 0x0000), (1e-40, 0x0001, 0x0000),
    (-2.0 ** -127, 0x8040, 0x0000), (-2.0 ** -126, 0x8080, 0x0000), (-0.0, 0x8000, 0x0000),
    (-1.0 - 2 ** -20, 0xBF80, 0xB580), (3e-39, 0x0021, 0x0000), (-3e-39, 0x8021, 0x0000),
    (2.0 ** -133, 0x0001, 0x0000)]


def test_the_model_gives_what_the_gpu_gave_around_the_subnormals():
    x = np.array([m[0] for m in MEASURED_TWO_PART], np.float32)
    hi, lo = fragments.two_part(x)
    assert [int(h) for h in hi] == [m[1] for m in MEASURED_TWO_PART]
    assert [int(v) for v in lo] == [m[2] for m in MEASURED_TWO_PART]


@pytest.mark.gpu
def test_the_gpu_gives_the_measured_bits_around_the_subnormals():
    from ptx_lab import device

    x = np.zeros((WARP, 8), np.float32)
    vals = np.array([m[0] for m in MEASURED_TWO_PART], np.float32)
    x[:vals.size, 0] = vals                     # each value in the low half of its lane's first pair
    hi, lo = device.two_part_bf16x2(x)
    assert [int(h) & 0xFFFF for h in hi[:vals.size, 0]] == [m[1] for m in MEASURED_TWO_PART]
    assert [int(v) & 0xFFFF for v in lo[:vals.size, 0]] == [m[2] for m in MEASURED_TWO_PART]


def test_flush_subnormal_keeps_the_sign_and_the_normals():
    x = np.array([1e-45, -1e-45, 2.0 ** -126, -2.0 ** -126, 1.0, np.inf, np.nan], np.float32)
    got = fragments.flush_subnormal(x)
    assert np.array_equal(got[:6].view(np.uint32), np.array([0.0, -0.0, 2.0 ** -126, -2.0 ** -126, 1.0, np.inf],
                                                            np.float32).view(np.uint32))
    assert np.isnan(got[6])


# ----------------------------------------------------------------- the header on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@DEVICE
@given(left=accs, right=accs)
def test_device_acc_to_a(dtype, left, right):
    from ptx_lab import device

    left, right = in_range(left, dtype), in_range(right, dtype)
    assert (device.acc_to_a(left, right, dtype) == fragments.acc_to_a(left, right, dtype)).all()


@pytest.mark.gpu
@DEVICE
@given(a=a_regs)
def test_device_a_to_acc(a):
    from ptx_lab import device

    for got, want in zip(device.a_to_acc(a), fragments.a_to_acc(a)):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
@DEVICE
@given(left=accs, right=accs)
def test_device_acc_to_a_two_parts(left, right):
    from ptx_lab import device

    for got, want in zip(device.acc_to_a_two_parts(left, right), fragments.acc_to_a_two_parts(left, right)):
        assert (got == want).all()


@pytest.mark.gpu
@DEVICE
@given(x=pairs)
def test_device_two_part_bf16x2(x):
    from ptx_lab import device

    for got, want in zip(device.two_part_bf16x2(x), fragments.two_part_bf16x2(x)):
        assert (got == want).all()


@pytest.mark.gpu
@DEVICE
@given(x=hnp.arrays(np.float32, WARP, elements=finite))
def test_device_bf16_scalars(x):
    from ptx_lab import device

    bits, back, rest = device.bf16_scalars(x)
    hi, _ = fragments.two_part(x)
    assert (bits == hi).all()
    assert np.array_equal(back.view(np.uint32), bf16(hi).view(np.uint32))
    want = fragments.flush_subnormal(fragments.flush_subnormal(x) - fragments.flush_subnormal(bf16(hi)))
    assert np.array_equal(rest.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
@DEVICE
@given(pairs=hnp.arrays(np.uint32, WARP, elements=st.integers(0, 2**32 - 1)))
def test_device_unpack_f16x2(pairs):
    # every bit pattern: normals, subnormals (exact in fp32), zeros, infinities and NaNs (the ISA leaves a
    # NaN's payload to the hardware: only NaN-ness is compared there)
    from ptx_lab import device

    for got, want in zip(device.unpack_f16x2(pairs), model.unpack_f16x2(pairs)):
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all()
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.gpu
def test_device_unpack_f16x2_on_every_half():
    # all 65,536 f16 bit patterns in each half, 64 a launch (1,024 launches): subnormals are 3% of them
    from ptx_lab import device

    halves = np.arange(2**16, dtype=np.uint32)
    pairs = (halves | (halves[::-1] << 16)).reshape(-1, WARP)
    got = [np.concatenate(x) for x in zip(*(device.unpack_f16x2(p) for p in pairs))]
    for g, w in zip(got, model.unpack_f16x2(pairs.reshape(-1))):
        nan = np.isnan(w)
        assert (np.isnan(g) == nan).all() and np.array_equal(g[~nan].view(np.uint32), w[~nan].view(np.uint32))


def test_unpack_f16x2_widens_every_f16_exactly():
    # the model of f16_lo / f16_hi on all 65,536 halves: numpy's float16 widening, lo from bits 0..15
    halves = np.arange(2**16, dtype=np.uint32)
    lo, hi = model.unpack_f16x2(halves | (halves[::-1] << 16))
    want = halves.astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(want)
    assert np.array_equal(lo[finite], want[finite]) and np.array_equal(hi[::-1][finite], want[finite])
    assert np.array_equal(np.isnan(lo), np.isnan(want)) and lo[0x7C00] == np.inf and lo[1] == 2.0 ** -24


def test_the_device_twins_check_their_arguments_before_looking_for_a_gpu():
    from ptx_lab import device

    ok = np.zeros((WARP, 4), np.float32)
    with pytest.raises(ValueError, match=r"left must be float32 \(32, 4\); got float64"):
        device.acc_to_a(ok.astype(np.float64), ok)
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16"):
        device.acc_to_a(ok, ok, "float32")
    with pytest.raises(ValueError, match=r"x must be float32 \(32, 8\)"):
        device.two_part_bf16x2(np.zeros((WARP, 4), np.float32))
    with pytest.raises(ValueError, match=r"pairs must be uint32 \(32,\)"):
        device.unpack_f16x2(np.zeros((WARP, 2), np.uint32))
    with pytest.raises(ValueError, match="row_bytes must be even"):
        device.x4_lane_offsets("rows_first", 33)
