"""
ldmatrix: which lane gets which element, for x1 / x2 / x4 and .trans
=====================================================================

What and why
------------
``ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`` loads up to four
8x8 matrices of 16-bit elements from shared memory straight into mma
fragments. The protocol runs backwards from an ordinary load: every lane hands
in the address of one 16-byte *row*, and the hardware deals the elements out
to the lanes. Two things must be right, the address side (lanes 8i..8i+7 name
rows 0..7 of matrix i; x1 uses lanes 0-7, x2 lanes 0-15, the rest are
ignored) and the deal (g = lane // 4, t = lane % 4):

    plain   register i = { M_i[g][2t],  M_i[g][2t+1] }   (low half first)
    .trans  register i = { M_i[2t][g],  M_i[2t+1][g] }

Idea
----
Give every element a value that spells its own coordinates in hex:

    M_i[r][c] = 0x0irc          e.g. matrix 1, row 3, column 5 = 0x0135

so a wrong register reads as the coordinate it came from. The rows are not
contiguous: the 32 rows sit in a shuffled order among 40 row slots of shared
memory, and the 8 slots no row uses hold the sentinel 0xdead. A lane that
reads the wrong row, or an "ignored" lane whose address is used after all
(those lanes point at a sentinel slot), shows up as a wrong coordinate or
as 0xdead.

Kernel
------
::

    smem[40 slots x 16 B] <- image;  __syncwarp
    addr = smem + addrs[lane]          # slot of row (lane % 8) of matrix lane / 8
    r[0..num-1] = ldmatrix.x{num}[.trans](addr)
    dump r of every lane

Check
-----
Register i, half h of lane l must be M_m[row][col] = 0x0{m}{row}{col} for
(m, row, col) = ptx_lab.fragments.ldmatrix_map(num, trans)[l, i, h], i.e.
m = i and (row, col) = (g, 2t + h), or (2t + h, g) with .trans.

A whole 16x16 tile
------------------
The kernels load mma operands as one x4 of a 16x16 tile, with the lane addresses of
ldmatrix.cuh's X4Lane: lane l names row l % 8 of matrix l / 8, the matrices' corners in
"rows first" order (0, 0), (8, 0), (0, 8), (8, 8) or "cols first" (0, 0), (0, 8), (8, 0),
(8, 8). The second kernel takes its addresses from X4Lane (the CPU model from its twin,
ptx_lab.fragments.x4_lane_row_col) on a tile T[r][c] = 0x7rc in rows padded to 48 bytes,
and each of the four loads must give the mma fragment ldmatrix.cuh names: rows first, the
A fragment of T (plain) or the B fragments of T's two 8-column halves (.trans); cols
first, the B fragments of T^T (plain) or the A fragment of T^T (.trans).
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import X4_ORDERS, ldmatrix_map, x4_lane_row_col

from . import _common
from ._common import HALF, WARP, Checker, hex16

NAME = "ldmatrix"
SUMMARY = "ldmatrix x1/x2/x4 [.trans] with shuffled row addresses: every lane and register"

ROW_BYTES = 16            # 8 elements x 2 bytes
SLOTS = 40                # row slots in shared memory; 32 hold matrix rows, 8 the sentinel
SMEM_BYTES = SLOTS * ROW_BYTES
SENTINEL = 0xDEAD
VARIANTS = [(num, trans) for trans in (False, True) for num in (1, 2, 4)]

# Row r of matrix i lives in slot SLOT_OF[8i + r]; the shuffle is fixed so the
# GPU and the model see the same image.
SLOT_OF = np.random.default_rng(20240601).permutation(SLOTS)[:WARP]
SPARE_SLOT = int(np.setdiff1d(np.arange(SLOTS), SLOT_OF)[0])  # a sentinel row
assert len(set(SLOT_OF.tolist())) == WARP and SPARE_SLOT not in SLOT_OF


def value(m, r, c):
    """The element at row r, column c of matrix m: its coordinates in hex, 0x0mrc."""
    return (m << 8) | (r << 4) | c


def smem_image() -> np.ndarray:
    """uint8 (SMEM_BYTES,): the four matrices' rows in their slots, sentinels elsewhere."""
    elems = np.full((SLOTS, 8), SENTINEL, dtype=np.uint16)
    for m in range(4):
        for r in range(8):
            elems[SLOT_OF[8 * m + r]] = [value(m, r, c) for c in range(8)]
    return elems.astype("<u2").view(np.uint8).ravel()


def row_addresses(num: int) -> np.ndarray:
    """Byte offset each lane hands in: its row's slot, or a sentinel row if its address is unused."""
    addrs = SLOT_OF * ROW_BYTES
    addrs[8 * num:] = SPARE_SLOT * ROW_BYTES
    return addrs.astype(np.uint32)


def variant_name(num: int, trans: bool) -> str:
    return f"x{num}" + (".trans" if trans else "")


TILE_STRIDE = 16 + 8      # b16 elements between tile rows: 48 bytes (a 32-byte row would be 2-way)
TILE_VARIANTS = [(order, trans) for order in X4_ORDERS for trans in (False, True)]


def tile_value(r, c):
    """T[r][c] of the 16x16 tile: 0x7rc."""
    return 0x7000 | (r << 4) | c


def tile_image() -> np.ndarray:
    """uint8: T in rows of TILE_STRIDE elements, the padding holding the sentinel."""
    rows = np.full((16, TILE_STRIDE), SENTINEL, dtype=np.uint16)
    r, c = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    rows[:, :16] = tile_value(r, c)
    return rows.astype("<u2").view(np.uint8).ravel()


def tile_variant_name(order: str, trans: bool) -> str:
    return f"tile x4{'.trans' if trans else ''} {order.replace('_', ' ')}"


def tile_expected(order: str, trans: bool) -> np.ndarray:
    """uint16 (32, 4, 2): the mma fragment ldmatrix.cuh says this load gives."""
    from ._common import lane_values

    T, T_t = tile_value, (lambda r, c: tile_value(c, r))   # T and its transpose as value(row, col)
    if trans == (order == "cols_first"):                     # rows first plain, cols first .trans: an A fragment
        return lane_values("mma.a", T if order == "rows_first" else T_t).astype(np.uint16)
    M = T if order == "rows_first" else T_t                  # B[k][n] = M[k][n], n-tiles 0-7 and 8-15
    return np.concatenate([lane_values("mma.b", M), lane_values("mma.b", lambda k, n: M(k, n + 8))],
                          axis=1).astype(np.uint16)


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "ldmatrix.cuh"
using namespace ptx_lab;

constexpr int WARP = 32;
constexpr int SMEM_BYTES = 640;            // 40 row slots x 16 B (SMEM_BYTES in ldmatrix.py)
constexpr int SMEM_WORDS = SMEM_BYTES / 4;

// image: (SMEM_BYTES,) bytes as u32 words; addrs: (32,) byte offsets into it;
// variant: 0..2 = x1, x2, x4; 3..5 = the same with .trans. out: (32, 4) u32.
extern "C" __global__ void ldmatrix_probe(const u32* image, const u32* addrs, int variant, u32* out) {
    __shared__ __align__(16) u32 smem[SMEM_WORDS];
    const int lane = threadIdx.x;
    for (int i = lane; i < SMEM_WORDS; i += WARP) smem[i] = image[i];
    __syncwarp();  // all rows written before any lane's row is read

    const u32 addr = smem_addr(smem) + addrs[lane];
    u32 r[4] = {0, 0, 0, 0};
    switch (variant) {  // uniform across the warp, as .aligned requires
        case 0: ldmatrix_x1(r[0], addr); break;
        case 1: ldmatrix_x2(r[0], r[1], addr); break;
        case 2: ldmatrix_x4(r[0], r[1], r[2], r[3], addr); break;
        case 3: ldmatrix_x1_trans(r[0], addr); break;
        case 4: ldmatrix_x2_trans(r[0], r[1], addr); break;
        case 5: ldmatrix_x4_trans(r[0], r[1], r[2], r[3], addr); break;
    }
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

constexpr int TILE_STRIDE = 24;            // b16 per tile row (TILE_STRIDE in ldmatrix.py)
constexpr int TILE_WORDS = 16 * TILE_STRIDE / 2;

// image: the 16x16 tile in rows of TILE_STRIDE elements; order 0 = rows first, 1 = cols first;
// trans 0 / 1. The lane addresses come from ldmatrix.cuh's X4Lane. out: (32, 4) u32.
extern "C" __global__ void ldmatrix_tile_probe(const u32* image, int order, int trans, u32* out) {
    __shared__ __align__(16) u32 tile[TILE_WORDS];
    const int lane = threadIdx.x;
    for (int i = lane; i < TILE_WORDS; i += WARP) tile[i] = image[i];
    __syncwarp();

    const X4Lane x = x4_lane(lane);
    const int row = x.row + (order == 0 ? x.rows_first_mat_row() : x.cols_first_mat_row());
    const int col = order == 0 ? x.rows_first_mat_col() : x.cols_first_mat_col();
    const u32 addr = smem_addr(tile) + (row * TILE_STRIDE + col) * 2;
    u32 r[4] = {0, 0, 0, 0};
    if (trans) ldmatrix_x4_trans(r, addr);   // uniform across the warp
    else ldmatrix_x4(r, addr);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}
"""
assert f"SMEM_BYTES = {SMEM_BYTES};" in SOURCE and f"TILE_STRIDE = {TILE_STRIDE};" in SOURCE


def _variant_index(num: int, trans: bool) -> int:
    return {1: 0, 2: 1, 4: 2}[num] + (3 if trans else 0)


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    """variant name -> uint32 (32, num): every lane's registers."""
    _common.check_backend(backend)
    image = smem_image()
    obs = {}
    for num, trans in VARIANTS:
        addrs = row_addresses(num)
        if backend == "gpu":
            (regs,) = _common.run_warp(
                SOURCE, "ldmatrix_probe",
                [image.view(np.uint32), addrs, np.int32(_variant_index(num, trans))],
                [((WARP, 4), np.uint32)])
            regs = regs[:, :num]
        else:
            regs = model.ldmatrix(image, addrs, num, trans)
        obs[variant_name(num, trans)] = regs
    tile = tile_image()
    for order, trans in TILE_VARIANTS:
        if backend == "gpu":
            (regs,) = _common.run_warp(
                SOURCE, "ldmatrix_tile_probe",
                [tile.view(np.uint32), np.int32(list(X4_ORDERS).index(order)), np.int32(trans)],
                [((WARP, 4), np.uint32)])
        else:
            rc = x4_lane_row_col(order)
            regs = model.ldmatrix(tile, (2 * (rc[:, 0] * TILE_STRIDE + rc[:, 1])).astype(np.uint32), 4, trans)
        obs[tile_variant_name(order, trans)] = regs
    return obs


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    for num, trans in VARIANTS:
        lmap = ldmatrix_map(num, trans)  # (32, num, 2, 3): (matrix, row, col)
        want = value(lmap[..., 0], lmap[..., 1], lmap[..., 2]).astype(np.uint16)
        chk.compare(variant_name(num, trans), _common.unpack(obs[variant_name(num, trans)]), want,
                    lambda l, i, h, lm=lmap: f"lane {l} r{i}.{HALF[h]} M{i}[{lm[l, i, h, 1]}][{lm[l, i, h, 2]}]",
                    hex16)
    for order, trans in TILE_VARIANTS:
        name = tile_variant_name(order, trans)
        chk.compare(name, _common.unpack(obs[name]), tile_expected(order, trans),
                    lambda l, i, h: f"lane {l} r{i}.{HALF[h]}", hex16)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
