"""ptx_lab.banks against closed forms: conflict-free, 32-way, broadcast, phases,
ldmatrix rows, swizzles, layouts and the row strides Kernel A's design predicted.

Every expected value is computed here from arithmetic on the addresses (a gcd,
a count of 16-byte chunks, a bit-by-bit XOR), never from the code under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import banks
from ptx_lab.banks import (cp_async_access, PRESETS, bank_map, conflict_degree, cp_async_wavefronts, gmma_k, gmma_mn,
                           ldmatrix_access, ldmatrix_wavefronts, row_major, shared_access, stmatrix_wavefronts,
                           swizzle, wavefronts)

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
    (lambda: swizzle(3, 4, 2), "shift"),
    (lambda: swizzle(-1, 4, 3), "bits"),
    (lambda: row_major(4, 8, 6), "row_stride"),
    (lambda: PRESETS["qk_stride130"].address(32, 0), "row"),
    (lambda: gmma_k("SW16", 8, 8), "kind"),
    (lambda: gmma_k("INTER", 8, 8, order="diag"), "order"),
    (lambda: bank_map(PRESETS["ds_b"], rows=0), "rows"),
])
def test_errors_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")):
        call()


# ------------------------------------------------------------------ swizzles

swizzle_params = st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 6)).filter(
    lambda p: p[2] >= p[0])


def xor_bitwise(offset: int, B: int, M: int, S: int) -> int:
    """The definition, one bit at a time: bit M+i ^= bit M+S+i for i < B."""
    out = offset
    for i in range(B):
        out ^= ((offset >> (M + S + i)) & 1) << (M + i)
    return out


@given(params=swizzle_params, offset=st.integers(0, 1 << 20))
def test_swizzle_matches_the_bitwise_definition(params, offset):
    assert swizzle(*params)(offset) == xor_bitwise(offset, *params)


@given(params=swizzle_params, block=st.integers(0, 50))
def test_swizzle_is_a_bijection_on_its_atom_and_an_involution(params, block):
    B, M, S = params
    swz = swizzle(B, M, S)
    atom = 1 << (M + S + B)
    offsets = block * atom + np.arange(atom)
    out = swz(offsets)
    assert sorted(out.tolist()) == offsets.tolist()          # permutes the atom
    assert np.array_equal(swz(out), offsets)                 # its own inverse
    low = (1 << M) - 1
    assert np.array_equal(out & low, offsets & low)          # 2**M units move whole


def test_inter_is_the_identity_and_sw128_is_the_128_byte_pattern():
    inter, sw128 = banks.GMMA_SWIZZLES["INTER"], banks.GMMA_SWIZZLES["SW128"]
    assert all(inter(o) == o for o in range(4096))
    for row in range(8):
        for chunk in range(8):
            # 128-B rows: 16-B chunk j of row r moves to chunk j ^ (r mod 8)
            assert sw128(128 * row + 16 * chunk) == 128 * row + 16 * (chunk ^ row)


@pytest.mark.parametrize("kind", ["SW32", "SW64", "SW128"])
def test_swizzled_k_atoms_make_ldmatrix_columns_conflict_free(kind):
    run = (16 << banks.GMMA_SWIZZLES[kind].bits) // 2        # bf16 elements per atom row
    lay = gmma_k(kind, 8, run)
    plain = row_major(8, run, run)
    for chunk in range(run // 8):
        rows = [lay.address(r, 8 * chunk) for r in range(8)] + [None] * 24
        flat = [plain.address(r, 8 * chunk) for r in range(8)] + [None] * 24
        assert ldmatrix_wavefronts(rows, 1) == 1
        # unswizzled rows of 16 << B bytes put the 8 rows on 8 / (row bytes / 16) chunks
        assert ldmatrix_wavefronts(flat, 1) == math.gcd((16 << banks.GMMA_SWIZZLES[kind].bits) // 16, 8)


# ------------------------------------------------------------------ layouts

@given(rows=st.integers(1, 40), cols=st.integers(1, 40), pad=st.integers(0, 9),
       eb=st.sampled_from((1, 2, 4, 8)), data=st.data())
def test_row_major_address_is_the_closed_form(rows, cols, pad, eb, data):
    lay = row_major(rows, cols, cols + pad, eb)
    r, c = data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, cols - 1))
    assert lay.address(r, c) == (r * (cols + pad) + c) * eb
    assert lay.transpose().address(c, r) == lay.address(r, c)


@pytest.mark.parametrize("make", [gmma_k, gmma_mn])
@pytest.mark.parametrize("kind", ["INTER", "SW32", "SW64", "SW128"])
def test_gmma_layouts_are_bijections_without_padding(make, kind):
    lay = make(kind, 64, 64)
    addrs = lay.addresses().ravel()
    assert sorted(addrs.tolist()) == list(range(0, 64 * 64 * 2, 2))
    assert lay.cosize_bytes == 64 * 64 * 2


@pytest.mark.parametrize("rows, cols", [(16, 128), (128, 16), (64, 64)])
def test_inter_core_matrices_are_128_contiguous_bytes(rows, cols):
    lay = gmma_k("INTER", rows, cols)
    for r0 in range(0, rows, 8):
        for c0 in range(0, cols, 8):
            block = np.array([[lay.address(r0 + i, c0 + j) for j in range(8)] for i in range(8)])
            assert block.max() - block.min() == 128 - 2
            assert block.min() % 128 == 0


def test_transpose_dual_ds_views_name_the_same_bytes():
    b, c = PRESETS["ds_b"], PRESETS["ds_c"]
    assert b.shape == (banks.DV, banks.D) and c.shape == (banks.D, banks.DV)
    assert np.array_equal(c.addresses(), b.addresses().T)
    # ds_c is MN_INTER atoms, laid out along the columns first
    assert np.array_equal(c.addresses(), gmma_mn("INTER", banks.D, banks.DV, order="row").addresses())


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


# ------------------------------------------------------------------ bank maps

def test_bank_map_of_a_row_major_tile():
    lay = row_major(4, 70, 70, 2)
    m = bank_map(lay)
    r, c = np.meshgrid(np.arange(4), np.arange(70), indexing="ij")
    assert np.array_equal(m.banks, ((r * 70 + c) * 2 // 4) % 32)
    assert m.conflicts is None and m.lanes is None and "70" in m.title


def test_bank_map_marks_exactly_the_conflicting_cells():
    lay = PRESETS["qk_stride128"]
    feature = 6
    acc = shared_access(lay.address(LANES, np.full(32, feature)), 2)
    m = bank_map(lay, access=acc)
    assert m.conflicts.sum() == 32 and m.conflicts[:, feature].all()
    assert np.array_equal(m.lanes[:, feature], LANES)
    assert (m.lanes[:, feature + 1] == -1).all()   # same word, but no lane asked for it
    assert "32-way" in m.title
    clean = PRESETS["qk_stride130"]
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
