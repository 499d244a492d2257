"""ptx_lab.banks against closed forms: conflict-free, 32-way, broadcast, phases,
ldmatrix rows, and the bank maps of a tile.

Every expected value is computed here from arithmetic on the addresses (a gcd,
a count of 16-byte chunks), never from the code under test. Swizzles and layouts
are tests/ptx_lab/test_layouts.py; the figures of Kernel A's design,
tests/experiments/test_bank_presets.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab.banks import (bank_map, conflict_degree, cp_async_access, cp_async_wavefronts, ldmatrix_access,
                           ldmatrix_wavefronts, shared_access, stmatrix_wavefronts, wavefronts)
from ptx_lab.layouts import gmma_k, row_major

LANES = np.arange(32)
WIDTHS = (1, 2, 4, 8, 16)
PHASE_LANES = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}   # lanes per phase, as the docstring states


# ------------------------------------------------------------------ strategies

@st.composite
def aligned_addresses(draw, width: int, span: int = 4096):
    """32 byte addresses, each a multiple of `width`, below `span`."""
    slots = draw(st.lists(st.integers(0, span // width - 1), min_size=32, max_size=32))
    return np.array(slots, dtype=np.int64) * width


@st.composite
def within_phase_permutation(draw, width: int):
    """A lane permutation that only moves lanes inside their own phase."""
    per = PHASE_LANES[width]
    perm = []
    for first in range(0, 32, per):
        perm += draw(st.permutations(list(range(first, first + per))))
    return np.array(perm)


# ------------------------------------------------------------------ the basic cases

@given(base_word=st.integers(0, 10_000), perm=st.permutations(list(range(32))))
def test_32_consecutive_words_are_conflict_free(base_word, perm):
    addrs = 4 * (base_word + np.array(perm))
    assert wavefronts(addrs, 4) == 1
    assert conflict_degree(addrs, 4) == 1


def test_stride_128_bytes_is_32_way():
    assert wavefronts(128 * LANES, 4) == 32
    assert shared_access(128 * LANES, 4).bank_conflicts == 31


@given(stride_words=st.integers(1, 400))
def test_word_stride_costs_gcd_with_32(stride_words):
    # lane l reads word l * s: banks l * s mod 32 take 32 / gcd(s, 32) values, gcd(s, 32) lanes each
    assert wavefronts(4 * stride_words * LANES, 4) == math.gcd(stride_words, 32)


@given(width=st.sampled_from(WIDTHS), word=st.integers(0, 1000))
def test_broadcast_costs_one_wavefront_per_phase(width, word):
    # every lane the same address: no bank holds two distinct words; the phase
    # rule still spends one wavefront per phase for 16 B (4), but 8-byte half-warps
    # merge when the whole warp fits one wavefront (measured on the H200: 1)
    addr = word * 16
    assert wavefronts([addr] * 32, width) == (1 if width == 8 else 32 // PHASE_LANES[width])
    assert conflict_degree([addr] * 32, width) == 1


@pytest.mark.parametrize("width", WIDTHS)
def test_consecutive_elements_need_bytes_over_128(width):
    expected = max(1, 32 * width // 128)
    assert wavefronts(width * LANES, width) == expected
    assert shared_access(width * LANES, width).bank_conflicts == 0


def test_two_byte_lanes_sharing_words_do_not_conflict():
    # lanes 2i and 2i+1 read the two halves of one word: 16 words, 16 banks
    assert wavefronts(2 * LANES, 2) == 1
    # the same two halves, but words 128 B apart for each pair: 16-way
    pairs = (LANES // 2) * 128 + (LANES % 2) * 2
    assert wavefronts(pairs, 2) == 16


def test_eight_byte_phases_are_half_warps():
    # lanes 0-15 cover banks 0..31 once; lanes 16-31 the same banks at other words:
    # conflict-free because they are in different phases
    addrs = 8 * (LANES % 16) + 1024 * (LANES // 16)
    assert wavefronts(addrs, 8) == 2
    # inside one half-warp two lanes 128 B apart collide
    clash = 8 * LANES
    clash[1] = 128
    assert wavefronts(clash, 8) == 3


# ------------------------------------------------------------------ properties

@settings(max_examples=60)
@given(data=st.data(), width=st.sampled_from(WIDTHS))
def test_invariant_under_lane_permutation_within_a_phase(data, width):
    addrs = data.draw(aligned_addresses(width))
    perm = data.draw(within_phase_permutation(width))
    assert wavefronts(addrs[perm], width) == wavefronts(addrs, width)


@settings(max_examples=60)
@given(data=st.data(), width=st.sampled_from(WIDTHS))
def test_bounds_from_distinct_words(data, width):
    addrs = data.draw(aligned_addresses(width))
    per = PHASE_LANES[width]
    lo = hi = 0
    for first in range(0, 32, per):
        words = {w for a in addrs[first:first + per] for w in range(a // 4, (a + width - 1) // 4 + 1)}
        lo += -(-len(words) // 32)   # one wavefront moves at most one word per bank
        hi += len(words)             # and at least one word
    if width == 8:                   # merged half-warps: one wavefront for the whole warp
        lo = min(lo, 1)
    assert lo <= wavefronts(addrs, width) <= hi


@settings(max_examples=60)
@given(data=st.data(), width=st.sampled_from(WIDTHS))
def test_inactive_lanes_never_add_wavefronts(data, width):
    addrs = data.draw(aligned_addresses(width))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=32, max_size=32)))
    masked = wavefronts(addrs, width, active=mask)
    assert masked <= wavefronts(addrs, width)
    # the three spellings of "inactive" agree
    as_none = [int(a) if m else None for a, m in zip(addrs, mask)]
    as_minus = np.where(mask, addrs, -1)
    assert wavefronts(as_none, width) == masked == wavefronts(as_minus, width)


def test_no_active_lane_costs_nothing():
    assert wavefronts([None] * 32, 4) == 0
    assert shared_access([-1] * 32, 16).ideal_wavefronts == 0


# ------------------------------------------------------------------ ldmatrix / stmatrix / cp.async

@given(row_stride_chunks=st.integers(1, 64), num=st.sampled_from((1, 2, 4)),
       base_chunk=st.integers(0, 64))
def test_ldmatrix_rows_cost_gcd_of_chunk_stride_with_8(row_stride_chunks, num, base_chunk):
    # 8 rows of 16 B, r chunks apart: they land on 16-B chunk (i * r) mod 8 of the
    # 128-B bank window, 8 / gcd(r, 8) distinct chunks, gcd(r, 8) rows on each
    rows = 16 * (base_chunk + row_stride_chunks * (LANES % 8) + 8 * row_stride_chunks * (LANES // 8))
    expected = num * math.gcd(row_stride_chunks, 8)
    assert ldmatrix_wavefronts(rows, num) == expected
    assert stmatrix_wavefronts(rows, num) == expected


def test_ldmatrix_ignores_unused_lanes_and_trans():
    rows = list(16 * LANES[:8]) + [None] * 24
    assert ldmatrix_wavefronts(rows, 1) == 1
    assert ldmatrix_access(16 * LANES, 4, trans=True).wavefronts == 4
    assert ldmatrix_access(256 * LANES, 4, trans=True).wavefronts == 32


@pytest.mark.parametrize("size", (4, 8, 16))
def test_cp_async_contiguous_destinations(size):
    # 8 lanes per wavefront whatever the size (measured on the H200 with ncu), so
    # 4 wavefronts; ncu's ideal, and so its conflict count, goes by bytes over 128.
    access = cp_async_access(size * LANES, size)
    assert access.wavefronts == 4
    assert access.bank_conflicts == 4 - 32 * size // 128


def test_cp_async_conflicts_within_a_quarter_warp():
    # lanes 0 and 1 of the first quarter-warp write the same bank, 128 B apart: 2 wavefronts there
    dst = 4 * LANES
    dst[1] = 128
    assert cp_async_wavefronts(dst, 4) == 5


# ------------------------------------------------------------------ validation names the argument

@pytest.mark.parametrize("call, name", [
    (lambda: wavefronts(4 * LANES, 3), "width"),
    (lambda: wavefronts(4 * LANES[:31], 4), "addresses"),
    (lambda: wavefronts(4 * LANES + np.where(LANES == 5, 2, 0), 4), "addresses[5]"),
    (lambda: wavefronts(4.0 * LANES, 4), "addresses"),
    (lambda: wavefronts(4 * LANES, 4, active=np.ones(31, bool)), "active"),
    (lambda: ldmatrix_wavefronts(16 * LANES, 3), "num"),
    (lambda: ldmatrix_wavefronts(8 * LANES, 4), "row_addresses[1]"),
    (lambda: ldmatrix_wavefronts([None] * 32, 1), "row_addresses[0]"),
    (lambda: cp_async_wavefronts(4 * LANES, 2), "size"),
    (lambda: cp_async_wavefronts(4 * LANES, 16), "dst_addresses[1]"),
    (lambda: bank_map(gmma_k("INTER", 128, 128), rows=0), "rows"),
])
def test_errors_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")):
        call()


# ------------------------------------------------------------------ bank maps

def test_bank_map_of_a_row_major_tile():
    lay = row_major(4, 70, 70, 2)
    m = bank_map(lay)
    r, c = np.meshgrid(np.arange(4), np.arange(70), indexing="ij")
    assert np.array_equal(m.banks, ((r * 70 + c) * 2 // 4) % 32)
    assert m.conflicts is None and m.lanes is None and "70" in m.title


def test_bank_map_marks_exactly_the_conflicting_cells():
    lay = row_major(32, 128, 128, 2)          # 32 token rows of 256 B
    feature = 6
    acc = shared_access(lay.address(LANES, np.full(32, feature)), 2)
    m = bank_map(lay, access=acc)
    assert m.conflicts.sum() == 32 and m.conflicts[:, feature].all()
    assert np.array_equal(m.lanes[:, feature], LANES)
    assert (m.lanes[:, feature + 1] == -1).all()   # same word, but no lane asked for it
    assert "32-way" in m.title
    clean = row_major(32, 128, 130, 2)        # 260 B rows: 65 words, odd
    m = bank_map(clean, access=shared_access(clean.address(LANES, np.full(32, feature)), 2))
    assert not m.conflicts.any() and (m.lanes >= 0).sum() == 32


def test_describe_names_the_colliding_lanes():
    text = shared_access(128 * LANES, 4).describe()
    assert "32 wavefronts" in text and "bank  0: 32 words" in text and "lanes 0-31" in text


def test_8_byte_half_warps_merge_when_the_warp_fits_one_wavefront():
    # measured on the H200 with ncu: every lane on the same 8 bytes is 1 wavefront
    assert wavefronts(np.zeros(32, int), 8) == 1
    # 32 consecutive 8-byte words (256 B) still take the two half-warp phases
    assert wavefronts(8 * LANES, 8) == 2

