"""ptx_lab.layouts against closed forms: CuTe's swizzles bit by bit, the GMMA atoms,
row-major tiles with padding, and what the swizzles are for (conflict-free ldmatrix
columns, through ptx_lab.banks).

Every expected value is computed here from arithmetic on the offsets (a bit-by-bit
XOR, a row times a stride), never from the code under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptx_lab import layouts
from ptx_lab.banks import ldmatrix_wavefronts
from ptx_lab.layouts import gmma_k, gmma_mn, row_major, swizzle


# ------------------------------------------------------------------ validation names the argument

@pytest.mark.parametrize("call, name", [
    (lambda: swizzle(3, 4, 2), "shift"),
    (lambda: swizzle(-1, 4, 3), "bits"),
    (lambda: row_major(4, 8, 6), "row_stride"),
    (lambda: row_major(32, 128, 130, 2).address(32, 0), "row"),
    (lambda: gmma_k("SW16", 8, 8), "kind"),
    (lambda: gmma_k("INTER", 8, 8, order="diag"), "order"),
])
def test_errors_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
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
    inter, sw128 = layouts.GMMA_SWIZZLES["INTER"], layouts.GMMA_SWIZZLES["SW128"]
    assert all(inter(o) == o for o in range(4096))
    for row in range(8):
        for chunk in range(8):
            # 128-B rows: 16-B chunk j of row r moves to chunk j ^ (r mod 8)
            assert sw128(128 * row + 16 * chunk) == 128 * row + 16 * (chunk ^ row)


@pytest.mark.parametrize("kind", ["SW32", "SW64", "SW128"])
def test_swizzled_k_atoms_make_ldmatrix_columns_conflict_free(kind):
    run = (16 << layouts.GMMA_SWIZZLES[kind].bits) // 2        # bf16 elements per atom row
    lay = gmma_k(kind, 8, run)
    plain = row_major(8, run, run)
    for chunk in range(run // 8):
        rows = [lay.address(r, 8 * chunk) for r in range(8)] + [None] * 24
        flat = [plain.address(r, 8 * chunk) for r in range(8)] + [None] * 24
        assert ldmatrix_wavefronts(rows, 1) == 1
        # unswizzled rows of 16 << B bytes put the 8 rows on 8 / (row bytes / 16) chunks
        assert ldmatrix_wavefronts(flat, 1) == math.gcd((16 << layouts.GMMA_SWIZZLES[kind].bits) // 16, 8)


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
