"""The fragment maps against the PTX ISA formulas, written out register by register."""
from __future__ import annotations

import numpy as np
import pytest

from ptx_lab import fragments
from ptx_lab.fragments import SHAPES, address_lanes, fragment_map, inverse_map, ldmatrix_map, show


def g_t(lane: int) -> tuple[int, int]:
    return lane // 4, lane % 4


# The ISA tables, one line per register, as the blog and the headers state them.
def isa_a(lane):
    g, t = g_t(lane)
    return [[(g, 2 * t), (g, 2 * t + 1)],            # a0
            [(g + 8, 2 * t), (g + 8, 2 * t + 1)],    # a1
            [(g, 2 * t + 8), (g, 2 * t + 9)],        # a2
            [(g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]]  # a3


def isa_b(lane):
    g, t = g_t(lane)
    return [[(2 * t, g), (2 * t + 1, g)],            # b0
            [(2 * t + 8, g), (2 * t + 9, g)]]        # b1


def isa_c(lane):
    g, t = g_t(lane)
    return [[(g, 2 * t)], [(g, 2 * t + 1)], [(g + 8, 2 * t)], [(g + 8, 2 * t + 1)]]


def isa_m8n8(lane):
    g, t = g_t(lane)
    return [[(g, 2 * t), (g, 2 * t + 1)]]


def isa_m8n8_trans(lane):
    g, t = g_t(lane)
    return [[(2 * t, g), (2 * t + 1, g)]]


ISA = {"mma.a": isa_a, "mma.b": isa_b, "mma.c": isa_c, "m8n8": isa_m8n8, "m8n8.trans": isa_m8n8_trans}


@pytest.mark.parametrize("operand", fragments.OPERANDS)
def test_map_is_the_isa_table(operand):
    fmap = fragment_map(operand)
    rows, cols, nregs, per_reg = SHAPES[operand]
    assert fmap.shape == (32, nregs, per_reg, 2)
    for lane in range(32):
        assert fmap[lane].tolist() == [[list(rc) for rc in reg] for reg in ISA[operand](lane)], lane


@pytest.mark.parametrize("operand", fragments.OPERANDS)
def test_map_is_a_bijection_onto_the_matrix(operand):
    rows, cols, _, _ = SHAPES[operand]
    cells = fragment_map(operand).reshape(-1, 2)
    assert len(cells) == rows * cols
    assert sorted(map(tuple, cells.tolist())) == [(r, c) for r in range(rows) for c in range(cols)]


@pytest.mark.parametrize("operand", fragments.OPERANDS)
def test_inverse_map_inverts(operand):
    fmap, inv = fragment_map(operand), inverse_map(operand)
    rows, cols, _, _ = SHAPES[operand]
    assert inv.shape == (rows, cols, 3)
    for r in range(rows):
        for c in range(cols):
            lane, reg, h = inv[r, c]
            assert tuple(fmap[lane, reg, h]) == (r, c)


def test_blog_coordinates():
    # D[3][5] lives in g = 3 and column 5 = 2t + 1, so t = 2: lane 14, register c1.
    # (The blog names lane 13 for D[3][5]; lane 13 holds D[3][2], D[3][3], D[11][2], D[11][3].)
    assert tuple(inverse_map("mma.c")[3, 5]) == (14, 1, 0)
    assert fragment_map("mma.c")[13, :, 0].tolist() == [[3, 2], [3, 3], [11, 2], [11, 3]]
    assert tuple(inverse_map("mma.c")[15, 7]) == (31, 3, 0)


def test_trans_is_the_transpose_of_plain():
    assert (fragment_map("m8n8.trans") == fragment_map("m8n8")[..., ::-1]).all()


def test_ldmatrix_x4_tiles_give_the_a_fragment():
    # Matrices 0..3 = A[0:8,0:8], A[8:16,0:8], A[0:8,8:16], A[8:16,8:16] (the blog's tile order).
    lm = ldmatrix_map(4, trans=False)
    for lane in range(32):
        for i in range(4):
            for h in range(2):
                m, r, c = lm[lane, i, h]
                assert (r + 8 * (m & 1), c + 8 * (m >> 1)) == tuple(fragment_map("mma.a")[lane, i, h])


def test_ldmatrix_x2_trans_of_row_major_b_gives_the_b_fragment():
    # B[k][n] stored row-major, matrices 0, 1 = rows k 0..7, 8..15.
    lm = ldmatrix_map(2, trans=True)
    for lane in range(32):
        for i in range(2):
            for h in range(2):
                m, r, c = lm[lane, i, h]
                assert (r + 8 * m, c) == tuple(fragment_map("mma.b")[lane, i, h])


def test_c_pairs_are_a_pairs():
    # (c0, c1) of the left/right n-tile = a0 / a2; (c2, c3) = a1 / a3.
    c, a = fragment_map("mma.c")[:, :, 0], fragment_map("mma.a")
    for lane in range(32):
        for creg, areg in ((0, 0), (2, 1)):
            assert a[lane, areg].tolist() == [c[lane, creg].tolist(), c[lane, creg + 1].tolist()]
            right = a[lane, areg + 2] - [0, 8]
            assert right.tolist() == [c[lane, creg].tolist(), c[lane, creg + 1].tolist()]


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_map(num, trans):
    lm = ldmatrix_map(num, trans)
    assert lm.shape == (32, num, 2, 3)
    base = isa_m8n8_trans if trans else isa_m8n8
    for lane in range(32):
        for i in range(num):
            assert lm[lane, i].tolist() == [[i, r, c] for r, c in base(lane)[0]]
    assert address_lanes(num).tolist() == [list(range(8 * i, 8 * i + 8)) for i in range(num)]


@pytest.mark.parametrize("operand", fragments.OPERANDS)
def test_show_fits_and_names_every_cell(operand):
    text = show(operand)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    rows, cols, _, _ = SHAPES[operand]
    grid = [line.split()[1:] for line in lines[-rows:]]
    inv = inverse_map(operand)
    assert grid == [[f"{inv[r, c, 0]}:{inv[r, c, 1]}" for c in range(cols)] for r in range(rows)]


def test_show_mma_c_row_3():
    row3 = show("mma.c").splitlines()[-16 + 3].split()
    assert row3 == ["3", "12:0", "12:1", "13:0", "13:1", "14:0", "14:1", "15:0", "15:1"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="operand"):
        fragment_map("mma.d")
    with pytest.raises(ValueError, match="operand"):
        show("ldmatrix")
    with pytest.raises(ValueError, match="num"):
        ldmatrix_map(3, False)
    with pytest.raises(ValueError, match="num"):
        address_lanes(8)


def test_returned_maps_are_copies():
    m = fragment_map("mma.a")
    m[:] = 0
    assert fragment_map("mma.a")[31, 3, 1].tolist() == [15, 15]
