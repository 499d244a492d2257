"""Closed-form fragment maps: which lane and register holds which element.

Every warp-level primitive in ``ptx_lab/cuda`` distributes a small matrix over
the 32 lanes of a warp. The PTX ISA defines each distribution with the same
two lane coordinates, ``g = lane // 4`` (the "group", 0..7) and
``t = lane % 4`` (the thread in the group, 0..3)::

    operand       shape  regs x elems  register r, element h (0 = low 16 bits)
    mma.a         16x16     4 x 2      A[g + 8*(r & 1)][2t + h + 8*(r >> 1)]
    mma.b (B[k][n]) 16x8    2 x 2      B[2t + h + 8r][g]
    mma.c         16x8      4 x 1      C[g + 8*(r >> 1)][2t + (r & 1)]
    m8n8           8x8      1 x 2      M[g][2t + h]      (ldmatrix, stmatrix, movmatrix in)
    m8n8.trans     8x8      1 x 2      M[2t + h][g]      (.trans forms, movmatrix out)

For 16-bit operands a register is a b32 holding two elements; element 0 is in
bits 0..15. ldmatrix.x{1,2,4} loads matrices 0..num-1 whose row addresses come
from lanes 8i..8i+7 (row r of matrix i from lane 8i + r), and register i of
every lane receives its m8n8 (or m8n8.trans) pair of matrix i.

All maps here are built from those formulas alone; nothing is measured.
"""
from __future__ import annotations

import functools

import numpy as np

WARP = 32

# operand -> (rows, cols, registers per lane, elements per register)
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "mma.a": (16, 16, 4, 2),
    "mma.b": (16, 8, 2, 2),
    "mma.c": (16, 8, 4, 1),
    "m8n8": (8, 8, 1, 2),
    "m8n8.trans": (8, 8, 1, 2),
}
OPERANDS = tuple(SHAPES)


def _check_operand(operand: str) -> None:
    if operand not in SHAPES:
        raise ValueError(f"operand must be one of {', '.join(OPERANDS)}; got {operand!r}")


def _element(operand: str, lane: int, r: int, h: int) -> tuple[int, int]:
    """(row, col) of element h of register r of `lane`: the PTX ISA formulas verbatim."""
    g, t = divmod(lane, 4)
    if operand == "mma.a":
        return g + 8 * (r & 1), 2 * t + h + 8 * (r >> 1)
    if operand == "mma.b":
        return 2 * t + h + 8 * r, g
    if operand == "mma.c":
        return g + 8 * (r >> 1), 2 * t + (r & 1)
    if operand == "m8n8":
        return g, 2 * t + h
    if operand == "m8n8.trans":
        return 2 * t + h, g
    raise AssertionError(operand)


def fragment_map(operand: str) -> np.ndarray:
    """(row, col) held by every (lane, register, element); int64 (32, regs, elems, 2).

    `operand` is one of "mma.a", "mma.b", "mma.c", "m8n8", "m8n8.trans"
    (see the module docstring for the formulas).
    """
    _check_operand(operand)
    return _fragment_map(operand).copy()


@functools.lru_cache(maxsize=None)
def _fragment_map(operand: str) -> np.ndarray:
    _, _, nregs, per_reg = SHAPES[operand]
    out = np.empty((WARP, nregs, per_reg, 2), dtype=np.int64)
    for lane in range(WARP):
        for r in range(nregs):
            for h in range(per_reg):
                out[lane, r, h] = _element(operand, lane, r, h)
    return out


def inverse_map(operand: str) -> np.ndarray:
    """(lane, register, element) holding every matrix cell; int64 (rows, cols, 3)."""
    _check_operand(operand)
    rows, cols, _, _ = SHAPES[operand]
    fmap = fragment_map(operand)
    inv = np.full((rows, cols, 3), -1, dtype=np.int64)
    for (lane, r, h), (row, col) in zip(np.ndindex(fmap.shape[:3]), fmap.reshape(-1, 2)):
        if inv[row, col, 0] != -1:
            raise AssertionError(f"{operand}: cell [{row}][{col}] held twice")
        inv[row, col] = (lane, r, h)
    if (inv < 0).any():
        raise AssertionError(f"{operand}: some cell is held by no lane")
    return inv


def _check_flag(x, name: str) -> bool:
    """A boolean argument: True/False (or a numpy bool). Anything else is refused rather
    than read for its truthiness, where "no", 0.0 or an array would pass for a choice."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False); got {x!r} ({type(x).__name__})")
    return bool(x)


def _check_num(num: int) -> None:
    # bool and float pass `in (1, 2, 4)` (True == 1, 2.0 == 2): refused by type first
    if isinstance(num, (bool, np.bool_)) or not isinstance(num, (int, np.integer)) or num not in (1, 2, 4):
        raise ValueError(f"num must be 1, 2 or 4 (ldmatrix/stmatrix .x1/.x2/.x4); got {num!r}")


def ldmatrix_map(num: int, trans: bool) -> np.ndarray:
    """(matrix, row, col) of the memory matrices held by every (lane, reg, half).

    int64 (32, num, 2, 3). Register i always holds matrix i; (row, col) index
    the matrix as it lies in memory (row r is the 16 bytes at the address
    supplied by lane 8i + r). The same map describes stmatrix.
    """
    _check_num(num)
    trans = _check_flag(trans, "trans")
    base = fragment_map("m8n8.trans" if trans else "m8n8")[:, 0]  # (32, 2, 2)
    out = np.empty((WARP, num, 2, 3), dtype=np.int64)
    for i in range(num):
        out[:, i, :, 0] = i
        out[:, i, :, 1:] = base
    return out


def address_lanes(num: int) -> np.ndarray:
    """Lanes whose addresses ldmatrix/stmatrix .x{num} use: int64 (num, 8).

    Entry [i, r] is the lane supplying the address of row r of matrix i;
    the remaining lanes' addresses are ignored.
    """
    _check_num(num)
    return np.arange(8 * num, dtype=np.int64).reshape(num, 8)


# ldmatrix/stmatrix .x4 of a whole 16x16 tile: the corner (first row, first column) of
# matrix i in the two orders the kernels use (ptx_lab/cuda/ldmatrix.cuh, X4Lane).
X4_ORDERS: dict[str, tuple[tuple[int, int], ...]] = {
    "rows_first": ((0, 0), (8, 0), (0, 8), (8, 8)),
    "cols_first": ((0, 0), (0, 8), (8, 0), (8, 8)),
}


def _check_order(order: str) -> None:
    if order not in X4_ORDERS:
        raise ValueError(f"order must be one of {', '.join(X4_ORDERS)}; got {order!r}")


def x4_lane_row_col(order: str) -> np.ndarray:
    """(row, col) of the 16x16 tile whose 8 elements each lane's address names in an .x4
    ldmatrix / stmatrix; int64 (32, 2). Lane l names row l % 8 of matrix l / 8, and the
    matrices' corners are X4_ORDERS[order]. The closed form of ldmatrix.cuh's X4Lane:

        rows first: (l % 8 + 8 * ((l / 8) & 1), 8 * ((l / 8) >> 1))
        cols first: (l % 8 + 8 * ((l / 8) >> 1), 8 * ((l / 8) & 1))

    With register i receiving matrix i (ldmatrix_map), rows first loads the mma A fragment of
    the tile (plain) or the B fragments of its two 8-column halves (.trans); cols first the
    B fragments of the tile's transpose (plain) or its transpose's A fragment (.trans).
    """
    _check_order(order)
    lane = np.arange(WARP, dtype=np.int64)
    m, r = lane >> 3, lane & 7
    if order == "rows_first":
        return np.stack([r + 8 * (m & 1), 8 * (m >> 1)], axis=1)
    return np.stack([r + 8 * (m >> 1), 8 * (m & 1)], axis=1)


def _grid(title: str, values: np.ndarray, width: int) -> list[str]:
    rows, cols = values.shape
    lines = [title, "    " + "".join(f"{c:>{width}}" for c in range(cols))]
    for r in range(rows):
        lines.append(f"{r:>3} " + "".join(f"{v:>{width}}" for v in values[r]))
    return lines


def show(operand: str) -> str:
    """Text picture of `operand`'s map: each cell reads "lane:register".

    Fits in 100 columns. The element index within a register is not printed:
    the two elements of a register are neighbouring cells, the low half first
    (lower column for mma.a and m8n8, lower row for mma.b and m8n8.trans).
    """
    _check_operand(operand)
    rows, cols, nregs, per_reg = SHAPES[operand]
    inv = inverse_map(operand)
    cells = np.array([[f"{inv[r, c, 0]}:{inv[r, c, 1]}" for c in range(cols)] for r in range(rows)])
    if per_reg == 1:
        pairing = "one fp32 per register"
    elif operand in ("mma.b", "m8n8.trans"):
        pairing = "a register's halves are vertical neighbours, low half on the lower row"
    else:
        pairing = "a register's halves are horizontal neighbours, low half on the lower column"
    title = (f"{operand}: {rows}x{cols}, {nregs} register(s) x {per_reg} element(s) per lane, "
             f"g = lane // 4, t = lane % 4\ncell = lane:register; {pairing}")
    return "\n".join(_grid(title, cells, width=6))


__all__ = ["WARP", "SHAPES", "OPERANDS", "X4_ORDERS", "fragment_map", "inverse_map", "ldmatrix_map",
           "address_lanes", "x4_lane_row_col", "show"]
