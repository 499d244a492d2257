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

The models of ``ptx_lab/cuda/fragments.cuh`` (a warp's registers between two mmas) are built
from the same maps, not from the header's pairwise packing: :func:`acc_to_a` places two
accumulator n-tiles in their 16x16 matrix with the ``mma.c`` map and reads it back with the
``mma.a`` map, :func:`a_to_acc` goes the other way, and :func:`two_part` /
:func:`acc_to_a_two_parts` split fp32 values into their bf16 rounding and the rounding of what
it left. :func:`x4_lane_offsets` is the byte offset each lane's .x4 address names
(``ldmatrix.cuh``'s ``x4_addr_*`` and ``x4_lane_bytes_*``). ``ptx_lab.device`` runs the header's
code for the same functions.
"""
from __future__ import annotations

import functools

import ml_dtypes
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


def check_flag(x, name: str) -> bool:
    """A boolean argument: True/False (or a numpy bool). Anything else is refused rather
    than read for its truthiness, where "no", 0.0 or an array would pass for a choice."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False); got {x!r} ({type(x).__name__})")
    return bool(x)


def check_num(num: int) -> None:
    # bool and float pass `in (1, 2, 4)` (True == 1, 2.0 == 2): refused by type first
    if isinstance(num, (bool, np.bool_)) or not isinstance(num, (int, np.integer)) or num not in (1, 2, 4):
        raise ValueError(f"num must be 1, 2 or 4 (ldmatrix/stmatrix .x1/.x2/.x4); got {num!r}")


def ldmatrix_map(num: int, trans: bool) -> np.ndarray:
    """(matrix, row, col) of the memory matrices held by every (lane, reg, half).

    int64 (32, num, 2, 3). Register i always holds matrix i; (row, col) index
    the matrix as it lies in memory (row r is the 16 bytes at the address
    supplied by lane 8i + r). The same map describes stmatrix.
    """
    check_num(num)
    trans = check_flag(trans, "trans")
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
    check_num(num)
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


def _check_int(x, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {x!r} ({type(x).__name__})")
    return int(x)


def x4_lane_offsets(order: str, row_bytes: int, row0: int = 0, col0: int = 0) -> np.ndarray:
    """Byte offset, from a 16-bit tile's start, of the 8 elements each lane's .x4 address names
    in the 16x16 block at (row0, col0), rows `row_bytes` apart; int64 (32,):

        (row0 + row) * row_bytes + (col0 + col) * 2,   (row, col) = x4_lane_row_col(order)

    The model of ldmatrix.cuh's x4_addr_rows_first / _cols_first (minus the tile's address) and of
    x4_lane_bytes_rows_first / _cols_first plus the block's row0 * row_bytes + col0 * 2.
    """
    _check_order(order)
    row_bytes, row0, col0 = (_check_int(v, n) for v, n in ((row_bytes, "row_bytes"), (row0, "row0"), (col0, "col0")))
    if row_bytes < 0 or row0 < 0 or col0 < 0:
        raise ValueError(f"row_bytes, row0 and col0 must be >= 0; got {row_bytes}, {row0}, {col0}")
    rc = x4_lane_row_col(order)
    return (row0 + rc[:, 0]) * row_bytes + (col0 + rc[:, 1]) * 2


# ---------------------------------------------------------------- fragments.cuh's models

_HALF_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _half_dtype(dtype: str) -> type:
    aliases = {"bf16": "bfloat16", "f16": "float16"}
    name = aliases.get(dtype, dtype) if isinstance(dtype, str) else None
    if name not in _HALF_DTYPES:
        raise ValueError(f"dtype must be one of bfloat16, float16 (aliases bf16, f16); got {dtype!r}")
    return _HALF_DTYPES[name]


def _acc(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != (WARP, 4) or a.dtype != np.float32:
        raise ValueError(f"{name} must be float32 (32, 4) accumulators; got {a.dtype.name} {a.shape}")
    return a


def _a_regs(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != (WARP, 4) or a.dtype != np.uint32:
        raise ValueError(f"{name} must be uint32 (32, 4) A-fragment registers; got {a.dtype.name} {a.shape}")
    return a


def _round_bits(x: np.ndarray, half: type) -> np.ndarray:
    """fp32 values rounded to nearest even in `half`, as uint16 bit patterns."""
    return np.asarray(x, dtype=np.float32).astype(half).view(np.uint16)


def _pack_a(bits: np.ndarray) -> np.ndarray:
    """A 16x16 matrix of 16-bit patterns -> its A fragment, uint32 (32, 4), through the mma.a map."""
    fa = _fragment_map("mma.a")
    vals = bits[fa[..., 0], fa[..., 1]].astype(np.uint32)   # (32, 4, 2): element 0 in the low half
    return vals[..., 0] | (vals[..., 1] << np.uint32(16))


def _n_tiles_matrix(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """[left | right] (16x16, float32) from two n-tiles' accumulators, through the mma.c map."""
    fc = _fragment_map("mma.c")[:, :, 0]                    # (32, 4, 2)
    M = np.empty((16, 16), dtype=np.float32)
    M[fc[..., 0], fc[..., 1]] = left
    M[fc[..., 0], fc[..., 1] + 8] = right
    return M


def acc_to_a(left, right, dtype: str = "bfloat16") -> np.ndarray:
    """The A fragment of [left | right] from two adjacent n-tiles' accumulators (float32 (32, 4)
    each, the mma.c layout), rounded to `dtype` ("bfloat16" or "float16"): uint32 (32, 4).
    The model of fragments.cuh's acc_to_a (acc_to_a_f16), through the maps: no lane is assumed
    to hold what it needs."""
    half = _half_dtype(dtype)
    return _pack_a(_round_bits(_n_tiles_matrix(_acc(left, "left"), _acc(right, "right")), half))


def a_to_acc(a) -> tuple[np.ndarray, np.ndarray]:
    """A bf16 A fragment (uint32 (32, 4)) as the float32 accumulators (32, 4) of its two 8-column
    n-tiles (left, right): the model of fragments.cuh's a_to_acc. Exact."""
    a = _a_regs(a, "a")
    fa, fc = _fragment_map("mma.a"), _fragment_map("mma.c")[:, :, 0]
    bits = np.empty((16, 16), dtype=np.uint16)
    bits[fa[..., 0], fa[..., 1]] = np.stack([a & 0xFFFF, a >> 16], axis=-1).astype(np.uint16)
    M = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    return M[fc[..., 0], fc[..., 1]], M[fc[..., 0], fc[..., 1] + 8]


def two_part(x) -> tuple[np.ndarray, np.ndarray]:
    """fp32 values in two bf16 parts, element by element: (hi, lo) uint16 bit patterns of x's shape,
    hi = bf16(x), lo = bf16(x - hi) with x - hi computed in fp32 (the two-part operand of
    fragments.cuh, bf16_rest before its rounding). hi + lo holds about 16 significant bits of x.

    The subtraction is the GPU's: it flushes a subnormal operand or result to a zero of its sign
    (measured on the H200 through ptx_lab.device.two_part_bf16x2, docs/log/35), while the bf16
    rounding itself keeps subnormals. So below 2^-126 the rest is a zero, +0 where both operands
    flushed to zeros of one sign."""
    x = np.asarray(x, dtype=np.float32)
    hi = _round_bits(x, ml_dtypes.bfloat16)
    rest = flush_subnormal(flush_subnormal(x) - flush_subnormal(hi.view(ml_dtypes.bfloat16).astype(np.float32)))
    return hi, _round_bits(rest, ml_dtypes.bfloat16)


SMALLEST_NORMAL = np.float32(2.0 ** -126)


def flush_subnormal(v: np.ndarray) -> np.ndarray:
    """fp32 subnormals to a zero of their sign, as the GPU's fp32 add and subtract treat them."""
    v = np.asarray(v, dtype=np.float32)
    return np.where(np.abs(v) < SMALLEST_NORMAL, np.copysign(np.float32(0), v), v).astype(np.float32)


def two_part_bf16x2(x) -> tuple[np.ndarray, np.ndarray]:
    """fragments.cuh's two_part_bf16x2 over a warp: x float32 (32, 2n), pairs (x[:, 2r], x[:, 2r+1])
    -> (hi, lo) uint32 (32, n), the pair's elements in the low then the high half."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != WARP or x.shape[1] % 2 or x.dtype != np.float32:
        raise ValueError(f"x must be float32 (32, 2n); got {x.dtype.name} {x.shape}")
    hi, lo = (b.astype(np.uint32) for b in two_part(x))
    return hi[:, 0::2] | (hi[:, 1::2] << np.uint32(16)), lo[:, 0::2] | (lo[:, 1::2] << np.uint32(16))


def acc_to_a_two_parts(left, right) -> tuple[np.ndarray, np.ndarray]:
    """The A fragment of [left | right] in two bf16 parts (uint32 (32, 4) each): hi of the
    rounding, lo of the rounding of what it left (two_part), each element in the A layout of the
    element it belongs to. The model of fragments.cuh's acc_to_a_two_parts."""
    hi, lo = two_part(_n_tiles_matrix(_acc(left, "left"), _acc(right, "right")))
    return _pack_a(hi), _pack_a(lo)


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
           "address_lanes", "x4_lane_row_col", "x4_lane_offsets", "acc_to_a", "a_to_acc", "two_part",
           "two_part_bf16x2", "acc_to_a_two_parts", "show"]
