"""experiments.bank_presets: the layouts of Kernel A's design, and the bank-conflict
figures the design predicted for them, against closed forms (a gcd of the word
stride with 32), never against the code under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import bank_presets
from experiments.bank_presets import PRESETS
from ptx_lab.banks import cp_async_wavefronts, wavefronts
from ptx_lab.layouts import gmma_mn

LANES = np.arange(32)


def test_transpose_dual_ds_views_name_the_same_bytes():
    b, c = PRESETS["ds_b"], PRESETS["ds_c"]
    assert b.shape == (bank_presets.DV, bank_presets.D) and c.shape == (bank_presets.D, bank_presets.DV)
    assert np.array_equal(c.addresses(), b.addresses().T)
    # ds_c is MN_INTER atoms, laid out along the columns first
    assert np.array_equal(c.addresses(),
                          gmma_mn("INTER", bank_presets.D, bank_presets.DV, order="row").addresses())


# ------------------------------------------------------------------ the figures Kernel A's design assumed

@pytest.mark.parametrize("name, stride, elem, predicted_ways", [
    ("qk_stride128", 128, 2, 32),   # "32 tokens all hit one bank"
    ("qk_stride136", 136, 2, 4),    # "stuck at 4-way"
    ("qk_stride130", 130, 2, 1),    # "65 coprime with 32: all 32 banks"
    ("gc_stride128", 128, 4, 32),
    ("gc_stride132", 132, 4, 4),
])
def test_token_strided_column_read(name, stride, elem, predicted_ways):
    # 32 lanes read one feature column of 32 consecutive token rows:
    # word stride s = stride * elem / 4, cost gcd(s, 32)
    lay = PRESETS[name]
    for feature in (0, 7, 64):
        addrs = lay.address(LANES, np.full(32, feature))
        assert wavefronts(addrs, elem) == math.gcd(stride * elem // 4, 32) == predicted_ways


def test_16_byte_writes_force_a_stride_multiple_of_8():
    # a 16-B cp.async per lane into stride-130 rows is misaligned for odd rows
    lay = PRESETS["qk_stride130"]
    dst = lay.address(LANES // 16, 8 * (LANES % 16))
    with pytest.raises(ValueError, match="dst_addresses"):
        cp_async_wavefronts(dst, 16)
    # 4-B copies into the same rows are fine: no phase conflicts, but the 8-lane phases
    # make 128 contiguous B cost 4 wavefronts
    assert cp_async_wavefronts(lay.address(np.zeros(32, int), 2 * LANES), 4) == 4
