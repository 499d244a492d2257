"""The rstd pass's numpy statements on the CPU (tests/kernel/row_rstd/model.py): the float64 reference against an
independent computation of the formula, the kernel's fp32 order against a lane-by-lane replay of the kernel, and
that order within the derived bound of float64 on rows of every size (zero, tiny, huge), where a wrong eps or a
lost column is not."""
from __future__ import annotations

import numpy as np
import pytest

from . import model
from .model import BOUND, D, DERIVED, EPS, U, kernel_order, reference, relative_error


def test_the_reference_is_one_over_the_norm_with_eps():
    x = model.rows((5, 33, 2, D), seed=1, zero_every=7)
    norm = np.linalg.norm(x.astype(np.float64), axis=-1)   # numpy's own sum of squares, in its own order
    np.testing.assert_allclose(reference(x), 1.0 / np.sqrt(norm ** 2 + 1e-6), rtol=1e-14)
    assert reference(np.zeros((3, D))) == pytest.approx(1000.0, rel=1e-15)   # 1 / sqrt(1e-6)
    assert reference(np.full(D, 2.0)) == pytest.approx(1.0 / np.sqrt(4 * D + 1e-6), rel=1e-15)


def _replay(row) -> np.float32:
    """One row through the kernel's steps one lane at a time, in fp32 scalars: each lane's 8 columns in order
    (an fma of an exact square: its add), then for each distance every lane's sum plus its partner's."""
    f = np.float32
    sums = []
    for lane in range(16):
        s = f(0)
        for c in range(8 * lane, 8 * lane + 8):
            s = f(s + f(row[c]) * f(row[c]))
        sums.append(s)
    for distance in (8, 4, 2, 1):
        sums = [f(sums[lane] + sums[lane ^ distance]) for lane in range(16)]
    assert len(set(sums)) == 1            # every lane ends with lane 0's sum (fp32 addition commutes)
    return f(f(1) / np.sqrt(f(sums[0] + f(EPS))))


def test_the_kernel_order_is_the_kernels_lane_by_lane_arithmetic():
    x = model.rows((24, D), seed=2, zero_every=11)
    got = kernel_order(x)
    assert got.dtype == np.float32 and got.shape == (24,)
    np.testing.assert_array_equal(got, [_replay(row) for row in x])


def test_the_bound_is_its_derivation_with_a_margin():
    # 12 roundings of the sum, eps's own, halved by the square root; the square root's and the reciprocal's
    assert DERIVED == 8.5 * U and 5.0e-7 < DERIVED < 5.1e-7
    assert 1.5 * DERIVED < BOUND < 2 * DERIVED


@pytest.mark.parametrize("span", [0.0, 20.0, 60.0])
def test_the_kernel_order_is_within_the_bound_of_float64(span):
    # norms from 2^-span to 2^span times a normal row's, every 13th row zero (rstd 1000)
    x = model.rows((3, 517, 3, D), seed=3, span=span, zero_every=13)
    err = relative_error(kernel_order(x), reference(x))
    assert err.max() <= BOUND, f"worst {err.max():.3e} ({err.max() / U:.2f} u)"
    assert err.max() <= DERIVED
    zero = np.all(x == 0, axis=-1)
    assert zero.any() and np.all(kernel_order(x)[zero] == np.float32(1) / np.sqrt(np.float32(EPS)))


def test_the_bound_catches_a_wrong_eps_and_a_lost_column():
    x = model.rows((400, D), seed=4, span=12.0)
    want = reference(x)
    wrong_eps = 1.0 / np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1) + 1e-5)
    lost_column = reference(x[:, 1:])
    for wrong in (wrong_eps, lost_column):
        assert relative_error(wrong, want).max() > 100 * BOUND


def test_a_row_past_fp32s_range_gets_zero():
    x = np.full((2, D), 1e19, dtype=np.float32)     # squares 1e38, their sum past 3.4e38
    x[1] = 1e18                                     # 128e36 = 1.28e38: within range
    got = kernel_order(x)
    assert got[0] == 0 and got[1] > 0
    assert relative_error(got[1:], reference(x[1:])).max() <= BOUND
    assert list(model.normal_squares(x)) == [False, True]


def test_the_rows_whose_squares_underflow_are_told_apart():
    x = np.ones((2, D), dtype=np.float32)
    x[1, 5] = 2.0 ** -70                            # its square 2^-140, a subnormal
    assert list(model.normal_squares(x)) == [True, False]


def test_ulps_apart_counts_fp32_values_between():
    one = np.float32(1)
    assert model.ulps_apart([one], [np.nextafter(one, np.float32(2))])[0] == 1
    assert model.ulps_apart([one], [one])[0] == 0
