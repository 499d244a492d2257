"""kernel.runtime.arrays on the CPU: the bf16 bits, the scale rule and the value heads' rule."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel.runtime import arrays
from kernel.runtime.arrays import bf16_bits, bf16_bits_rne, bits_to_f32, check_scale


SPECIAL = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000, 0xFF800000,
                    0x7F7FFFFF, 0x00000000, 0x80000000, 0x3F808000, 0x3F818000, 0x00000001], dtype=np.uint32)


def test_a_nan_stays_a_nan_of_its_sign():
    bits = bf16_bits(SPECIAL.view(np.float32))
    assert [hex(b) for b in bits[:5]] == ["0x7fc0", "0xffc0", "0x7fc0", "0xffc0", "0x7fc0"]
    assert np.isnan(bits_to_f32(bits[:5])).all()
    assert [hex(b) for b in bits[5:8]] == ["0x7f80", "0xff80", "0x7f80"]   # inf stays inf; the largest finite rounds up


def test_the_device_formula_is_ml_dtypes_rounding():
    # bf16_bits_rne is what CuPy arrays get; numpy runs the same formula here
    assert (bf16_bits_rne(np, SPECIAL.view(np.float32)) == bf16_bits(SPECIAL.view(np.float32))).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_every_bit_pattern_rounds_as_ml_dtypes(words):
    x = np.array(words, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert (bf16_bits_rne(np, x) == want).all()
    assert (bf16_bits(x) == want).all()


@pytest.mark.parametrize("scale, error", [(0.0, ValueError), (-0.5, ValueError), (math.nan, ValueError),
                                          (math.inf, ValueError), ("x", TypeError), (True, TypeError)])
def test_a_bad_scale_is_refused_by_name(scale, error):
    with pytest.raises(error, match="scale must be"):
        check_scale(scale)


def test_a_good_scale_comes_back_as_a_float():
    assert check_scale(None) is None
    assert check_scale(np.float32(0.25)) == 0.25 and isinstance(check_scale(1), float)


# ----------------------------------------------------------------------------
# value_heads: FLA's grouped value heads
# ----------------------------------------------------------------------------

def _info(shape) -> arrays.ArrayInfo:
    return arrays.ArrayInfo(tuple(shape), "bfloat16", True, 0, 0, False)


@pytest.mark.parametrize("heads", [3, 6, 12])
def test_value_heads_are_q_s_or_a_multiple(heads):
    assert arrays.value_heads("v", _info((2, 9, heads, 128)), 2, 9, 3) == heads


@pytest.mark.parametrize("heads", [1, 2, 4, 7])
def test_other_value_heads_are_refused_naming_both_arrays(heads):
    with pytest.raises(ValueError, match=rf"^do has {heads} heads and k has 3: the value heads must be k's heads or "
                                         r"a multiple of them \(FLA's grouped value heads: value head hv reads q and "
                                         r"k at head hv // \(HV / H\)\)$"):
        arrays.value_heads("do", _info((2, 9, heads, 128)), 2, 9, 3, qk_name="k")


def test_another_rank_or_batch_is_left_to_expect():
    for shape in ((2, 9), (1, 9, 5, 128), (2, 8, 5, 128)):
        assert arrays.value_heads("v", _info(shape), 2, 9, 3) == 3
