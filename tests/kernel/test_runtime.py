"""kernel.runtime and kernel.shapes on the CPU: the bf16 bits, the scale rule, the offsets, the registry."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel import registry, shapes
from kernel.runtime.arrays import bf16_bits, bf16_bits_rne, bits_to_f32, check_scale


def test_the_vocabulary():
    assert (shapes.TILE_TOKENS, shapes.CHUNK_TOKENS, shapes.TILES_PER_CHUNK, shapes.HEAD_DIM) == (16, 64, 4, 128)


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


def test_snapshot_offsets_count_tiles_per_sequence():
    assert shapes.snapshot_offsets(np.array([1, 16, 17, 64, 65]), 16, 4).tolist() == [0, 1, 2, 3, 4, 6]
    assert shapes.snapshot_offsets(np.array([1, 16, 17]), 16, 1).tolist() == [0, 1, 2, 4]


@pytest.mark.parametrize("cu, match", [([0, 3, 3, 8], "strictly increasing"), ([2, 8], "start at 0"),
                                       ([0, 7], "end at the total length 8"), ([0], "at least 2 offsets"),
                                       (np.array([[0, 8]]), "1-D"), ([0, 2.5, 8], "must hold integers"),
                                       ([0, True, 8], "must hold integers")])
def test_cu_seqlens_is_checked_by_name(cu, match):
    with pytest.raises((ValueError, TypeError), match=f"cu_seqlens.*{match}"):
        shapes.check_cu_seqlens(cu, 1, 8)


def test_cu_seqlens_needs_a_packed_batch():
    with pytest.raises(ValueError, match="packed batch of size 1"):
        shapes.check_cu_seqlens([0, 8], 2, 8)


def test_the_registry_names_every_kernel_once():
    labels = [k.label(v) for k in registry.KERNELS for v in k.variants()]
    assert len(labels) == len(set(labels))
    assert len({k.entry for k in registry.KERNELS}) == len(registry.KERNELS)
    for k in registry.KERNELS:
        assert k.entry.is_file(), k.entry
        assert k.label(k.default()), k.title
        assert set(k.required_sass(k.default())) >= {"HMMA", "LDSM", "LDGSTS"}
        assert k.source().startswith(f"// headers sha256 {k.header_digest()}\n")
