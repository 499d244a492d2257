"""Exact CPU model of the warp-level primitives in ``ptx_lab/cuda``.

One stateless numpy function per instruction, with the same signature as its
GPU twin in ``ptx_lab.device``: a warp's registers are arrays whose first axis
is the lane (``uint32 (32, nregs)``; fp32 accumulators ``float32 (32, 4)``),
shared and global memory are flat ``uint8`` byte images, addresses are byte
offsets into them. Functions that write memory return a new image and leave
their input alone.

Which lane/register holds which matrix element comes from
:mod:`ptx_lab.fragments` (the PTX ISA formulas); this module only moves bytes
along those maps, so the model is exact for every layout question. The one
place it is not bit-exact with hardware is the arithmetic inside
:func:`mma_m16n8k16` (see there).

16-bit elements are little-endian in memory, and within a b32 register the
element with the lower index sits in bits 0..15.
"""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from .fragments import SHAPES, WARP, _check_num, fragment_map, ldmatrix_map

ROW_BYTES = 16  # one 8x8 b16 matrix row: 8 elements x 2 bytes

_FLOAT16 = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
DTYPES = ("bf16", "f16", "b16", "f32")  # b16 = raw 16-bit patterns, f32 = accumulator


# ---------------------------------------------------------------- validation

def _shape_error(name: str, expected: str, got: np.ndarray) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {got.dtype} array of shape {got.shape}")


def _bytes_image(x, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 1:
        got = x if isinstance(x, np.ndarray) else np.asarray(x)
        raise _shape_error(name, "a 1-D uint8 numpy array", got)
    return x


def _lane_ints(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.shape != (WARP,) or not np.issubdtype(arr.dtype, np.integer):
        raise _shape_error(name, f"{WARP} integers, shape ({WARP},)", arr)
    return arr.astype(np.int64)


def _regs(x, name: str, nregs: int | None, dtype=np.uint32) -> np.ndarray:
    arr = np.asarray(x)
    shape = (WARP,) if nregs is None else (WARP, nregs)
    if arr.shape != shape or arr.dtype != dtype:
        raise _shape_error(name, f"{np.dtype(dtype).name} array of shape {shape}", arr)
    return arr


def _check_dtype(dtype: str, allowed: Sequence[str]) -> None:
    if dtype not in allowed:
        raise ValueError(f"dtype must be one of {', '.join(allowed)}; got {dtype!r}")


def _check_row_addresses(addrs: np.ndarray, num: int, smem_len: int, what: str) -> None:
    """ldmatrix/stmatrix: the row addresses of lanes 0..8*num-1 must be 16-B aligned rows in smem."""
    for lane in range(8 * num):
        a = int(addrs[lane])
        if a % ROW_BYTES:
            raise ValueError(f"addrs[{lane}] = {a}: {what} row addresses must be {ROW_BYTES}-byte aligned")
        if a < 0 or a + ROW_BYTES > smem_len:
            raise ValueError(f"addrs[{lane}] = {a}: row [{a}, {a + ROW_BYTES}) is outside smem "
                             f"of {smem_len} bytes")


# ---------------------------------------------------------------- packing

def _pack_halves(lo_bits, hi_bits):
    lo = np.asarray(lo_bits, dtype=np.uint32)
    hi = np.asarray(hi_bits, dtype=np.uint32)
    return (lo | (hi << np.uint32(16)))[()]


def _unpack_halves(u32) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(u32)
    if not np.issubdtype(u.dtype, np.integer):
        raise ValueError(f"u32: expected an integer (uint32) array, got {u.dtype}")
    u = u.astype(np.uint32)
    return (u & np.uint32(0xFFFF)).astype(np.uint16), (u >> np.uint32(16)).astype(np.uint16)


def _to_bits(x, dtype: str) -> np.ndarray:
    """Round float values to bf16/f16 (nearest even) and return their uint16 bit patterns."""
    return np.asarray(x, dtype=np.float32).astype(_FLOAT16[dtype]).view(np.uint16)


def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(_FLOAT16[dtype]).astype(np.float32)


def pack_bf16x2(lo, hi):
    """Two floats -> one b32 of two bf16 (round to nearest even); `lo` in bits 0..15.

    Mirrors ``pack_bf16x2`` in common.cuh (cvt.rn.bf16x2.f32). Broadcasts.
    """
    return _pack_halves(_to_bits(lo, "bf16"), _to_bits(hi, "bf16"))


def unpack_bf16x2(u32) -> tuple[np.ndarray, np.ndarray]:
    """b32 -> (lo, hi) as float32, lo from bits 0..15."""
    lo, hi = _unpack_halves(u32)
    return _from_bits(lo, "bf16")[()], _from_bits(hi, "bf16")[()]


def pack_f16x2(lo, hi):
    """Two floats -> one b32 of two f16 (round to nearest even); `lo` in bits 0..15."""
    return _pack_halves(_to_bits(lo, "f16"), _to_bits(hi, "f16"))


def unpack_f16x2(u32) -> tuple[np.ndarray, np.ndarray]:
    """b32 -> (lo, hi) as float32, lo from bits 0..15."""
    lo, hi = _unpack_halves(u32)
    return _from_bits(lo, "f16")[()], _from_bits(hi, "f16")[()]


# ---------------------------------------------------------------- fragments <-> matrices

def _operand_dtypes(operand: str) -> tuple[str, ...]:
    if operand not in SHAPES:
        raise ValueError(f"operand must be one of {', '.join(SHAPES)}; got {operand!r}")
    return ("f32",) if SHAPES[operand][3] == 1 else ("bf16", "f16", "b16")


def fragments_to_matrix(operand: str, regs, dtype: str) -> np.ndarray:
    """Gather a warp's fragment registers into the matrix they hold.

    regs: uint32 (32, nregs) for 16-bit operands, float32 (32, 4) for "mma.c".
    dtype: "bf16" / "f16" (returns float32 values), "b16" (returns the uint16
    bit patterns) or "f32" (only for "mma.c").
    """
    allowed = _operand_dtypes(operand)
    _check_dtype(dtype, allowed)
    rows, cols, nregs, _ = SHAPES[operand]
    fmap = fragment_map(operand)
    if dtype == "f32":
        r = _regs(regs, "regs", nregs, np.float32)
        out = np.empty((rows, cols), dtype=np.float32)
        out[fmap[:, :, 0, 0], fmap[:, :, 0, 1]] = r
        return out
    r = _regs(regs, "regs", nregs)
    halves = np.stack(_unpack_halves(r), axis=-1)  # (32, nregs, 2) uint16
    bits = np.empty((rows, cols), dtype=np.uint16)
    bits[fmap[..., 0], fmap[..., 1]] = halves
    return bits if dtype == "b16" else _from_bits(bits, dtype)


def matrix_to_fragments(operand: str, M, dtype: str) -> np.ndarray:
    """Scatter a matrix into the warp's fragment registers (inverse of fragments_to_matrix).

    "bf16"/"f16": M is rounded to nearest even and packed, uint32 (32, nregs);
    "b16": M holds uint16 bit patterns; "f32" ("mma.c"): float32 (32, 4).
    """
    allowed = _operand_dtypes(operand)
    _check_dtype(dtype, allowed)
    rows, cols, nregs, _ = SHAPES[operand]
    M = np.asarray(M)
    if M.shape != (rows, cols):
        raise _shape_error("M", f"shape ({rows}, {cols}) for {operand}", M)
    fmap = fragment_map(operand)
    if dtype == "f32":
        return M.astype(np.float32)[fmap[:, :, 0, 0], fmap[:, :, 0, 1]]
    if dtype == "b16":
        if M.dtype != np.uint16:
            raise _shape_error("M", "uint16 bit patterns for dtype 'b16'", M)
        bits = M
    else:
        bits = _to_bits(M, dtype)
    vals = bits[fmap[..., 0], fmap[..., 1]]  # (32, nregs, 2)
    return _pack_halves(vals[..., 0], vals[..., 1])


def acc_to_a_fragment(c_left, c_right, dtype: str = "bf16") -> np.ndarray:
    """A fragment of [C_left | C_right] (16x16) from two 16x8 accumulator fragments.

    The identity Kernel A relies on instead of movmatrix: since c0,c1 = C[g][2t..2t+1]
    and c2,c3 = C[g+8][2t..2t+1], packing pairwise gives
        a0 = (l0, l1)  a1 = (l2, l3)  a2 = (r0, r1)  a3 = (r2, r3)
    which is exactly a0..a3 of the mma A layout. No lane exchanges data.
    Returns uint32 (32, 4); values rounded to `dtype` ("bf16" or "f16").
    """
    _check_dtype(dtype, ("bf16", "f16"))
    cl = _regs(c_left, "c_left", 4, np.float32)
    cr = _regs(c_right, "c_right", 4, np.float32)
    pack = pack_bf16x2 if dtype == "bf16" else pack_f16x2
    return np.stack([pack(cl[:, 0], cl[:, 1]), pack(cl[:, 2], cl[:, 3]),
                     pack(cr[:, 0], cr[:, 1]), pack(cr[:, 2], cr[:, 3])], axis=1).astype(np.uint32)


# ---------------------------------------------------------------- instructions

def ldmatrix(smem: np.ndarray, addrs, num: int, trans: bool) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 -> uint32 (32, num).

    Lane 8i + r supplies the byte address of row r of matrix i (16 bytes,
    16-byte aligned); lanes >= 8*num are ignored, as on hardware. Register i of
    lane l = {M_i[g][2t], M_i[g][2t+1]}, or {M_i[2t][g], M_i[2t+1][g]} with .trans.
    """
    smem = _bytes_image(smem, "smem")
    addrs = _lane_ints(addrs, "addrs")
    _check_num(num)
    _check_row_addresses(addrs, num, smem.size, "ldmatrix")
    mats = np.empty((num, 8, 8), dtype=np.uint16)  # mats[i, r, c] = matrix i as in memory
    for i in range(num):
        for r in range(8):
            a = int(addrs[8 * i + r])
            mats[i, r] = smem[a:a + ROW_BYTES].view("<u2")
    lmap = ldmatrix_map(num, bool(trans))  # (32, num, 2, 3)
    vals = mats[lmap[..., 0], lmap[..., 1], lmap[..., 2]]  # (32, num, 2)
    return _pack_halves(vals[..., 0], vals[..., 1]).reshape(WARP, num)


def stmatrix(smem: np.ndarray, addrs, regs, trans: bool) -> np.ndarray:
    """stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 -> new smem image.

    The exact inverse of :func:`ldmatrix` with the same addresses: num is
    regs.shape[1]. Two used lanes naming the same row are refused (ValueError):
    the ISA leaves open which store wins, and ``ptx_lab.device`` refuses them too.
    """
    smem = _bytes_image(smem, "smem")
    addrs = _lane_ints(addrs, "addrs")
    r = np.asarray(regs)
    if r.ndim != 2 or r.shape[0] != WARP or r.dtype != np.uint32:
        raise _shape_error("regs", "uint32 array of shape (32, num)", r)
    num = r.shape[1]
    _check_num(num)
    _check_row_addresses(addrs, num, smem.size, "stmatrix")
    if np.unique(addrs[:8 * num]).size != 8 * num:
        raise ValueError("addrs: two lanes name the same row; which store wins is undefined")
    lmap = ldmatrix_map(num, bool(trans))
    mats = np.empty((num, 8, 8), dtype=np.uint16)
    mats[lmap[..., 0], lmap[..., 1], lmap[..., 2]] = np.stack(_unpack_halves(r), axis=-1)
    out = smem.copy()
    for i in range(num):
        for row in range(8):
            a = int(addrs[8 * i + row])
            out[a:a + ROW_BYTES] = mats[i, row].astype("<u2").view(np.uint8)
    return out


def movmatrix_trans(regs) -> np.ndarray:
    """movmatrix.sync.aligned.m8n8.trans.b16: fragment of M -> fragment of M^T.

    Input lane l holds {M[g][2t], M[g][2t+1]}; output lane l holds {M[2t][g], M[2t+1][g]}.
    """
    r = _regs(regs, "regs", None)
    M = fragments_to_matrix("m8n8", r.reshape(WARP, 1), "b16")
    return matrix_to_fragments("m8n8.trans", M, "b16").reshape(WARP)


def mma_m16n8k16(a, b, c, dtype: str) -> np.ndarray:
    """mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32: D = A @ B + C.

    a: uint32 (32, 4), b: uint32 (32, 2), c: float32 (32, 4); returns D as
    float32 (32, 4) in the C layout. dtype: "bf16" or "f16".

    The model gathers A, B, C through the fragment maps, multiplies in float64
    and rounds once to float32. Products of two 16-bit floats are exact in
    float64, so for small integers (and anything whose sum is representable)
    this is exactly what the hardware returns. For general data the tensor core
    adds in a different order and with its own internal precision and rounding,
    so results differ in the last bits of fp32: compare with a tolerance there.
    """
    _check_dtype(dtype, ("bf16", "f16"))
    A = fragments_to_matrix("mma.a", _regs(a, "a", 4), dtype).astype(np.float64)
    B = fragments_to_matrix("mma.b", _regs(b, "b", 2), dtype).astype(np.float64)
    C = fragments_to_matrix("mma.c", _regs(c, "c", 4, np.float32), "f32").astype(np.float64)
    D = (A @ B + C).astype(np.float32)
    return matrix_to_fragments("mma.c", D, "f32")


def cp_async(smem: np.ndarray, gmem: np.ndarray, dst, src, size: int, src_bytes=None,
             cache: str = "ca") -> np.ndarray:
    """cp.async.{cache}.shared.global [dst], [src], size[, src_bytes] -> new smem image.

    Every lane copies src_bytes[lane] (default: size) bytes from gmem[src:] to
    smem[dst:] and writes zeros over the remaining size - src_bytes bytes;
    src_bytes = 0 reads nothing. The model applies the copies at once, i.e. as
    seen after cp.async.wait_group and a barrier.

    Refused with ValueError, as ptxas or the hardware would refuse them:
    size not 4/8/16, .cg with size != 16, dst or src not a multiple of size,
    src_bytes outside 0..size, and ranges outside the images. Two lanes writing
    the same bytes are refused too (the ISA does not say which copy wins; the
    GPU twin refuses them as well).
    """
    smem = _bytes_image(smem, "smem")
    gmem = _bytes_image(gmem, "gmem")
    dst = _lane_ints(dst, "dst")
    src = _lane_ints(src, "src")
    if size not in (4, 8, 16):
        raise ValueError(f"size must be 4, 8 or 16 bytes; got {size!r}")
    if cache not in ("ca", "cg"):
        raise ValueError(f"cache must be 'ca' or 'cg'; got {cache!r}")
    if cache == "cg" and size != 16:
        raise ValueError(f"cache='cg' copies only 16 bytes; got size={size}")
    nbytes = np.full(WARP, size, dtype=np.int64) if src_bytes is None else _lane_ints(src_bytes, "src_bytes")
    out = smem.copy()
    for lane in range(WARP):
        d, s, n = int(dst[lane]), int(src[lane]), int(nbytes[lane])
        if d % size:
            raise ValueError(f"dst[{lane}] = {d}: must be a multiple of size={size}")
        if s % size:
            raise ValueError(f"src[{lane}] = {s}: must be a multiple of size={size}")
        if not 0 <= n <= size:
            raise ValueError(f"src_bytes[{lane}] = {n}: must be in 0..{size}")
        if d < 0 or d + size > smem.size:
            raise ValueError(f"dst[{lane}] = {d}: [{d}, {d + size}) is outside smem of {smem.size} bytes")
        if s < 0 or s + n > gmem.size:
            raise ValueError(f"src[{lane}] = {s}: [{s}, {s + n}) is outside gmem of {gmem.size} bytes")
        out[d:d + n] = gmem[s:s + n]
        out[d + n:d + size] = 0
    if np.unique(dst).size != WARP:  # equal-size aligned copies overlap only when equal
        raise ValueError("dst: two lanes write the same bytes; which copy wins is undefined")
    return out


__all__ = ["ROW_BYTES", "DTYPES", "pack_bf16x2", "unpack_bf16x2", "pack_f16x2", "unpack_f16x2",
           "fragments_to_matrix", "matrix_to_fragments", "acc_to_a_fragment", "ldmatrix",
           "stmatrix", "movmatrix_trans", "mma_m16n8k16", "cp_async"]
