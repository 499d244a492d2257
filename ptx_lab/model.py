"""Exact CPU model of the warp-level primitives in ``ptx_lab/cuda``.

One stateless numpy function per instruction, with the same signature as its
GPU twin in ``ptx_lab.device``: a warp's registers are arrays whose first axis
is the lane (``uint32 (32, nregs)``; fp32 accumulators ``float32 (32, 4)``),
shared and global memory are flat ``uint8`` byte images, addresses are byte
offsets into them. Functions that write memory return a new image and leave
their input alone.

The exceptions are mbarrier.cuh and bulk.cuh: an mbarrier's state outlives the instructions
that change it, so :class:`MBarrier` is an object, and a bulk copy is issued by
one thread (not a warp), so :func:`cp_async_bulk_g2s` and
:func:`cp_async_bulk_s2g` take one address pair and one byte count. The tensor
copies of tma.cuh (:func:`cp_async_bulk_tensor_2d_g2s`,
:func:`cp_async_bulk_tensor_2d_s2g`) are issued by one thread too, and take the
tensor map as the :class:`ptx_lab.tensormap.TensorMap2D` it was encoded from,
with its address an offset into the global image.

Which lane/register holds which matrix element comes from
:mod:`ptx_lab.fragments` (the PTX ISA formulas); this module only moves bytes
along those maps, so the model is exact for every layout question. The one
place it is not bit-exact with hardware is the arithmetic inside
:func:`mma_m16n8k16` (see there).

16-bit elements are little-endian in memory, and within a b32 register the
element with the lower index sits in bits 0..15.

Element types are spelled as numpy / ml_dtypes name them (``'bfloat16'``,
``'float16'``, ``'uint16'`` for raw 16-bit patterns, ``'float32'``), the same
spelling as ``ptx_lab.tensormap``; PTX's ``'bf16'``, ``'f16'``, ``'b16'``,
``'f32'`` are accepted as aliases (``ptx_lab.dtypes``).
"""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from . import dtypes
from .layouts import GMMA_SWIZZLES, Swizzle
from .fragments import SHAPES, WARP, check_flag, check_num, fragment_map, ldmatrix_map
from .tensormap import TensorMap2D

ROW_BYTES = 16  # one 8x8 b16 matrix row: 8 elements x 2 bytes

_FLOAT16 = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DTYPES = ("bfloat16", "float16", "uint16", "float32")  # uint16 = raw 16-bit patterns, float32 = accumulator


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


def _check_dtype(dtype: str, allowed: Sequence[str]) -> str:
    """`dtype` by its numpy name (aliases such as 'bf16' resolved), which must be in `allowed`."""
    return dtypes.canonical(dtype, allowed)


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
    return _pack_halves(_to_bits(lo, "bfloat16"), _to_bits(hi, "bfloat16"))


def unpack_bf16x2(u32) -> tuple[np.ndarray, np.ndarray]:
    """b32 -> (lo, hi) as float32, lo from bits 0..15."""
    lo, hi = _unpack_halves(u32)
    return _from_bits(lo, "bfloat16")[()], _from_bits(hi, "bfloat16")[()]


def pack_f16x2(lo, hi):
    """Two floats -> one b32 of two f16 (round to nearest even); `lo` in bits 0..15."""
    return _pack_halves(_to_bits(lo, "float16"), _to_bits(hi, "float16"))


def unpack_f16x2(u32) -> tuple[np.ndarray, np.ndarray]:
    """b32 -> (lo, hi) as float32, lo from bits 0..15."""
    lo, hi = _unpack_halves(u32)
    return _from_bits(lo, "float16")[()], _from_bits(hi, "float16")[()]


# ---------------------------------------------------------------- fragments <-> matrices

def _operand_dtypes(operand: str) -> tuple[str, ...]:
    if operand not in SHAPES:
        raise ValueError(f"operand must be one of {', '.join(SHAPES)}; got {operand!r}")
    return ("float32",) if SHAPES[operand][3] == 1 else ("bfloat16", "float16", "uint16")


def fragments_to_matrix(operand: str, regs, dtype: str) -> np.ndarray:
    """Gather a warp's fragment registers into the matrix they hold.

    regs: uint32 (32, nregs) for 16-bit operands, float32 (32, 4) for "mma.c".
    dtype: "bfloat16" / "float16" (returns float32 values), "uint16" (returns the
    bit patterns) or "float32" (only for "mma.c"); aliases "bf16", "f16", "b16", "f32".
    """
    allowed = _operand_dtypes(operand)
    dtype = _check_dtype(dtype, allowed)
    rows, cols, nregs, _ = SHAPES[operand]
    fmap = fragment_map(operand)
    if dtype == "float32":
        r = _regs(regs, "regs", nregs, np.float32)
        out = np.empty((rows, cols), dtype=np.float32)
        out[fmap[:, :, 0, 0], fmap[:, :, 0, 1]] = r
        return out
    r = _regs(regs, "regs", nregs)
    halves = np.stack(_unpack_halves(r), axis=-1)  # (32, nregs, 2) uint16
    bits = np.empty((rows, cols), dtype=np.uint16)
    bits[fmap[..., 0], fmap[..., 1]] = halves
    return bits if dtype == "uint16" else _from_bits(bits, dtype)


def matrix_to_fragments(operand: str, M, dtype: str) -> np.ndarray:
    """Scatter a matrix into the warp's fragment registers (inverse of fragments_to_matrix).

    "bfloat16"/"float16": M is rounded to nearest even and packed, uint32 (32, nregs);
    "uint16": M holds the bit patterns; "float32" ("mma.c"): float32 (32, 4).
    Aliases "bf16", "f16", "b16", "f32".
    """
    allowed = _operand_dtypes(operand)
    dtype = _check_dtype(dtype, allowed)
    rows, cols, nregs, _ = SHAPES[operand]
    M = np.asarray(M)
    if M.shape != (rows, cols):
        raise _shape_error("M", f"shape ({rows}, {cols}) for {operand}", M)
    fmap = fragment_map(operand)
    if dtype == "float32":
        return M.astype(np.float32)[fmap[:, :, 0, 0], fmap[:, :, 0, 1]]
    if dtype == "uint16":
        if M.dtype != np.uint16:
            raise _shape_error("M", "uint16 bit patterns for dtype 'uint16'", M)
        bits = M
    else:
        bits = _to_bits(M, dtype)
    vals = bits[fmap[..., 0], fmap[..., 1]]  # (32, nregs, 2)
    return _pack_halves(vals[..., 0], vals[..., 1])


def acc_to_a_fragment(c_left, c_right, dtype: str = "bfloat16") -> np.ndarray:
    """A fragment of [C_left | C_right] (16x16) from two 16x8 accumulator fragments.

    The identity Kernel A relies on instead of movmatrix: since c0,c1 = C[g][2t..2t+1]
    and c2,c3 = C[g+8][2t..2t+1], packing pairwise gives
        a0 = (l0, l1)  a1 = (l2, l3)  a2 = (r0, r1)  a3 = (r2, r3)
    which is exactly a0..a3 of the mma A layout. No lane exchanges data.
    Returns uint32 (32, 4); values rounded to `dtype` ("bfloat16" or "float16").
    """
    dtype = _check_dtype(dtype, ("bfloat16", "float16"))
    cl = _regs(c_left, "c_left", 4, np.float32)
    cr = _regs(c_right, "c_right", 4, np.float32)
    pack = pack_bf16x2 if dtype == "bfloat16" else pack_f16x2
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
    check_num(num)
    trans = check_flag(trans, "trans")
    _check_row_addresses(addrs, num, smem.size, "ldmatrix")
    mats = np.empty((num, 8, 8), dtype=np.uint16)  # mats[i, r, c] = matrix i as in memory
    for i in range(num):
        for r in range(8):
            a = int(addrs[8 * i + r])
            mats[i, r] = smem[a:a + ROW_BYTES].view("<u2")
    lmap = ldmatrix_map(num, trans)  # (32, num, 2, 3)
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
    check_num(num)
    trans = check_flag(trans, "trans")
    _check_row_addresses(addrs, num, smem.size, "stmatrix")
    if np.unique(addrs[:8 * num]).size != 8 * num:
        raise ValueError("addrs: two lanes name the same row; which store wins is undefined")
    lmap = ldmatrix_map(num, trans)
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
    M = fragments_to_matrix("m8n8", r.reshape(WARP, 1), "uint16")
    return matrix_to_fragments("m8n8.trans", M, "uint16").reshape(WARP)


def mma_m16n8k16(a, b, c, dtype: str) -> np.ndarray:
    """mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32: D = A @ B + C.

    a: uint32 (32, 4), b: uint32 (32, 2), c: float32 (32, 4); returns D as
    float32 (32, 4) in the C layout. dtype: "bfloat16" or "float16" (PTX's .bf16
    / .f16, accepted as aliases).

    The model gathers A, B, C through the fragment maps, multiplies in float64
    and rounds once to float32. Products of two 16-bit floats are exact in
    float64, so for small integers (and anything whose sum is representable)
    this is exactly what the hardware returns. For general data the tensor core
    adds in a different order and with its own internal precision and rounding,
    so results differ in the last bits of fp32: compare with a tolerance there.
    """
    dtype = _check_dtype(dtype, ("bfloat16", "float16"))
    A = fragments_to_matrix("mma.a", _regs(a, "a", 4), dtype).astype(np.float64)
    B = fragments_to_matrix("mma.b", _regs(b, "b", 2), dtype).astype(np.float64)
    C = fragments_to_matrix("mma.c", _regs(c, "c", 4, np.float32), "float32").astype(np.float64)
    D = (A @ B + C).astype(np.float32)
    return matrix_to_fragments("mma.c", D, "float32")


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
    size = count_arg(size, "size")
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


# ---------------------------------------------------------------- mbarrier and bulk copies

MBARRIER_MAX_COUNT = 2**20 - 1  # PTX ISA "Contents of the mbarrier object": arrival counts in 1..2^20-1
MBARRIER_MAX_TX = 2**20 - 1     # ... and tx-count in -(2^20-1)..2^20-1
BULK_ALIGN = 16                 # cp.async.bulk: both addresses 16-byte aligned, size a multiple of 16


def count_arg(x, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name} must be an int; got {x!r}")
    return int(x)


class MBarrier:
    """One mbarrier object (mbarrier.cuh; bulk.cuh adds transaction bytes), as the PTX ISA defines it.

    State: the current phase (``phase``, counted from 0 here; the hardware
    keeps only its parity), the expected arrival count (``count``), the
    pending arrivals of the current phase (``pending``) and the phase's
    tx-count in bytes (``tx_count``). The current phase completes when
    pending == 0 and tx_count == 0; then, atomically, the phase advances (its
    parity flips), pending is reset to count and tx_count to 0.

    The operations are the ones mbarrier.cuh and bulk.cuh issue: ``init`` (mbarrier.init),
    ``arrive`` (mbarrier.arrive), ``arrive_expect_tx`` (mbarrier.arrive.expect_tx:
    tx_count += bytes, then one arrival, so the phase cannot complete between
    the two), ``complete_tx`` (what a cp.async.bulk does to its mbarrier when its
    bytes land) and ``try_wait_parity`` (mbarrier.try_wait.parity).

    Bytes may land before the arrival that expects them: tx_count then goes
    negative within the phase, which the ISA allows (down to -(2^20 - 1)).
    Which order the copies land in does not change when the phase completes
    (tests/ptx_lab/test_bulk.py draws the orders), so the copy model below
    lands each copy the moment it is issued.

    Refused with ValueError: a count outside 1..2^20-1, negative byte counts,
    a tx_count leaving -(2^20-1)..2^20-1, an arrival when none is pending, and
    any operation that would leave the phase with every arrival in but more
    bytes landed than expected: with the operations of bulk.cuh such a phase
    can never complete (on the GPU: a hang). A refused operation changes nothing.
    """

    def __init__(self, count: int) -> None:
        self.init(count)

    def init(self, count: int) -> None:
        """mbarrier.init: phase 0 (parity 0), `count` arrivals pending, tx-count 0."""
        count = count_arg(count, "count")
        if not 1 <= count <= MBARRIER_MAX_COUNT:
            raise ValueError(f"count = {count}: an mbarrier expects 1..{MBARRIER_MAX_COUNT} "
                             "arrivals per phase")
        self.count = count
        self.pending = count
        self.tx_count = 0
        self.phase = 0

    @property
    def parity(self) -> int:
        """Parity of the current phase: 0, 1, 0, ... (all the hardware can be asked about)."""
        return self.phase & 1

    def __repr__(self) -> str:
        return (f"MBarrier(count={self.count}, phase={self.phase}, parity={self.parity}, "
                f"pending={self.pending}, tx_count={self.tx_count})")

    def _bytes_arg(self, nbytes, what: str) -> int:
        n = count_arg(nbytes, f"{what}: nbytes")
        if n < 0:
            raise ValueError(f"{what}: nbytes = {n}; a byte count cannot be negative")
        return n

    def _update(self, arrivals: int, tx_delta: int, what: str) -> None:
        """Apply `arrivals` arrivals and tx-count += tx_delta, after checking the result is legal."""
        if arrivals > self.pending:
            raise ValueError(f"{what}: phase {self.phase} has no arrival pending (all {self.count} "
                             f"are in, {self.tx_count} bytes still to land); an arrival beyond the "
                             f"count is a bug ({self!r})")
        pending, tx = self.pending - arrivals, self.tx_count + tx_delta
        if not -MBARRIER_MAX_TX <= tx <= MBARRIER_MAX_TX:
            raise ValueError(f"{what}: tx-count would become {tx}, outside the "
                             f"-{MBARRIER_MAX_TX}..{MBARRIER_MAX_TX} an mbarrier holds ({self!r})")
        if pending == 0 and tx < 0:
            raise ValueError(f"{what}: every arrival of phase {self.phase} would be in with {-tx} "
                             f"more bytes landed than expected; the phase could never complete "
                             f"({self!r})")
        self.pending, self.tx_count = pending, tx
        if pending == 0 and tx == 0:  # phase complete: the next one starts, parity flips
            self.phase += 1
            self.pending = self.count

    def arrive(self) -> None:
        """mbarrier.arrive: one arrival on the current phase."""
        self._update(1, 0, "arrive")

    def arrive_expect_tx(self, nbytes: int) -> None:
        """mbarrier.arrive.expect_tx: tx-count += nbytes, then one arrival."""
        self._update(1, self._bytes_arg(nbytes, "arrive_expect_tx"), "arrive_expect_tx")

    def complete_tx(self, nbytes: int) -> None:
        """complete-tx: nbytes of a tracked copy have landed (tx-count -= nbytes)."""
        self._update(0, -self._bytes_arg(nbytes, "complete_tx"), "complete_tx")

    def try_wait_parity(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: True once the phase with this parity has completed.

        `parity` names the current phase or the one before it, so the answer is
        True exactly when the current phase's parity differs. A waiter two
        phases behind therefore blocks: parity cannot tell phase 0 from phase 2.
        """
        p = count_arg(parity, "parity")
        if p not in (0, 1):
            raise ValueError(f"parity must be 0 or 1; got {p}")
        return self.parity != p

    def wait_parity(self, parity: int) -> None:
        """mbarrier_wait_parity (mbarrier.cuh's try_wait loop), in a model that runs one thread at a time.

        Returns if try_wait_parity(parity) is True; otherwise nothing else can
        complete the phase, so the loop would spin forever: RuntimeError.
        """
        if not self.try_wait_parity(parity):
            raise RuntimeError(f"wait_parity({parity}) would never return: the phase with parity "
                               f"{parity} is the current one and still waits for {self.pending} "
                               f"arrival(s) and {self.tx_count} byte(s) ({self!r})")


def _check_bulk(dst: int, src: int, nbytes: int, dst_len: int, src_len: int,
                dst_name: str, src_name: str) -> tuple[int, int, int]:
    dst = count_arg(dst, "dst")
    src = count_arg(src, "src")
    nbytes = count_arg(nbytes, "nbytes")
    if nbytes <= 0 or nbytes % BULK_ALIGN:
        raise ValueError(f"nbytes = {nbytes}: a bulk copy moves a positive multiple of "
                         f"{BULK_ALIGN} bytes")
    for name, addr, length, space in (("dst", dst, dst_len, dst_name), ("src", src, src_len, src_name)):
        if addr % BULK_ALIGN:
            raise ValueError(f"{name} = {addr}: a bulk copy's addresses must be "
                             f"{BULK_ALIGN}-byte aligned")
        if addr < 0 or addr + nbytes > length:
            raise ValueError(f"{name} = {addr}: [{addr}, {addr + nbytes}) is outside {space} "
                             f"of {length} bytes")
    return dst, src, nbytes


def cp_async_bulk_g2s(smem: np.ndarray, gmem: np.ndarray, dst: int, src: int, nbytes: int,
                      bar: MBarrier) -> np.ndarray:
    """cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes -> new smem image.

    One thread's copy of gmem[src : src + nbytes] to smem[dst : dst + nbytes],
    which then performs complete-tx of nbytes on `bar` (mutated in place). The
    copy lands at once; see :class:`MBarrier` for why that loses nothing.
    nbytes must be a positive multiple of 16, dst and src 16-byte aligned, both
    ranges inside their images (ValueError otherwise, before anything moves).
    """
    smem = _bytes_image(smem, "smem")
    gmem = _bytes_image(gmem, "gmem")
    if not isinstance(bar, MBarrier):
        raise ValueError(f"bar: expected an MBarrier; got {type(bar).__name__}")
    dst, src, nbytes = _check_bulk(dst, src, nbytes, smem.size, gmem.size, "smem", "gmem")
    out = smem.copy()
    out[dst:dst + nbytes] = gmem[src:src + nbytes]
    bar.complete_tx(nbytes)
    return out


def cp_async_bulk_s2g(gmem: np.ndarray, smem: np.ndarray, dst: int, src: int,
                      nbytes: int) -> np.ndarray:
    """cp.async.bulk.global.shared::cta.bulk_group -> new gmem image.

    One thread's copy of smem[src : src + nbytes] to gmem[dst : dst + nbytes],
    as seen after cp.async.bulk.wait_group 0. The same checks as
    :func:`cp_async_bulk_g2s`. Shared memory written by ordinary stores must
    have been fenced (fence.proxy.async.shared::cta) first; the model cannot
    tell, the experiment bulk_copy shows the case.
    """
    gmem = _bytes_image(gmem, "gmem")
    smem = _bytes_image(smem, "smem")
    dst, src, nbytes = _check_bulk(dst, src, nbytes, gmem.size, smem.size, "gmem", "smem")
    out = gmem.copy()
    out[dst:dst + nbytes] = smem[src:src + nbytes]
    return out


# ---------------------------------------------------------------- 2-D tensor copies (tma.cuh)

TENSOR_COORD_MIN, TENSOR_COORD_MAX = -2**31, 2**31 - 1   # tensorCoords are .s32


def _tensor_args(tmap, c0, c1) -> tuple[TensorMap2D, int, int]:
    if not isinstance(tmap, TensorMap2D):
        raise ValueError(f"tmap: expected a ptx_lab.tensormap.TensorMap2D; got {type(tmap).__name__}")
    c0, c1 = count_arg(c0, "c0"), count_arg(c1, "c1")
    for name, c in (("c0", c0), ("c1", c1)):
        if not TENSOR_COORD_MIN <= c <= TENSOR_COORD_MAX:
            raise ValueError(f"{name} = {c}: a tensor coordinate is a signed 32-bit integer")
    return tmap, c0, c1


def tensor_tile_2d(tmap: TensorMap2D, c0: int, c1: int) -> np.ndarray:
    """Where each element of the box at (column c0, row c1) lives in global memory.

    int64 (box_rows, box_cols): box element [i][j] is tensor element (row c1 + i,
    column c0 + j), at byte ``tmap.address + row * row_stride + column * element size``
    of the global image; -1 where that element is outside the tensor (a row outside
    0..rows-1 or a column outside 0..cols-1). In shared memory, box element [i][j]
    sits at byte ``tensor_box_smem_offsets(tmap)[i, j]`` from the box's start:
    ``(i * box_cols + j) * element size`` for a dense box (tmap.swizzle = 0), with the
    16-byte chunk of that offset permuted within its row for a swizzled one.
    """
    tmap, c0, c1 = _tensor_args(tmap, c0, c1)
    rows, cols = tmap.shape
    i, j = np.indices(tmap.box, dtype=np.int64)
    row, col = c1 + i, c0 + j
    inside = (0 <= row) & (row < rows) & (0 <= col) & (col < cols)
    offset = tmap.address + row * tmap.row_stride + col * tmap.element_bytes
    return np.where(inside, offset, -1)


# swizzle span in bytes (TensorMap2D.swizzle, CU_TENSOR_MAP_SWIZZLE_{32,64,128}B) -> the same
# permutation of byte offsets as CuTe's GMMA atoms: Swizzle<B, 4, 3> with 2^B chunks of 16 bytes
# per span. ptx_lab.layouts is the one definition; the GPU run of experiments.tma_tile checks that
# the TMA unit places the box this way.
TENSOR_SWIZZLES: dict[int, Swizzle] = {32: GMMA_SWIZZLES["SW32"], 64: GMMA_SWIZZLES["SW64"],
                                       128: GMMA_SWIZZLES["SW128"]}


def tensor_box_smem_offsets(tmap: TensorMap2D) -> np.ndarray:
    """int64 (box_rows, box_cols): the byte of shared memory, from the box's start, where a
    tensor copy puts (load) or takes (store) box element [i][j].

    Dense box (tmap.swizzle = 0): ``(i * box_cols + j) * element size``, row after row.
    Swizzled (tmap.swizzle = S = 32, 64 or 128, box rows of exactly S bytes): that dense
    offset through ``TENSOR_SWIZZLES[S]`` (SW32/SW64/SW128 = Swizzle<1|2|3, 4, 3> of
    ptx_lab.layouts): bits 4.. (the 16-byte chunk within the row) XOR bits 7.. (the
    128-byte line), so chunk c of row i lands in chunk ``c ^ ((i * S // 128) % (S // 16))``
    of the same row: ``c ^ (i % 8)`` for S = 128, ``c ^ ((i // 2) % 4)`` for 64,
    ``c ^ ((i // 4) % 2)`` for 32. Elements move with their chunk, bytes inside a chunk
    keep their order, and the pattern repeats every 8 rows (8 * S bytes: the
    Swizzle's atom, hence ``tmap.smem_align``). The hardware is reported to take the
    pattern from the shared ADDRESS bits; with the box start aligned to tmap.smem_align
    (the copies refuse anything else) address bits and offset bits agree, and nothing
    here depends on which it is.
    """
    if not isinstance(tmap, TensorMap2D):
        raise ValueError(f"tmap: expected a ptx_lab.tensormap.TensorMap2D; got {type(tmap).__name__}")
    i, j = np.indices(tmap.box, dtype=np.int64)
    dense = i * tmap.box_row_bytes + j * tmap.element_bytes
    if tmap.swizzle == 0:
        return dense
    swz = TENSOR_SWIZZLES[tmap.swizzle]
    assert swz.atom_size == 8 * tmap.swizzle and tmap.smem_align % swz.atom_size == 0
    return swz(dense)


def _tensor_bytes(tmap: TensorMap2D, c0: int, c1: int, smem_addr: int, smem_len: int,
                  gmem_len: int, smem_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checks one tensor copy; returns (global byte index, inside, shared byte index) per box
    byte, in box order (element [0][0]'s bytes first)."""
    offsets = tensor_tile_2d(tmap, c0, c1)
    addr = count_arg(smem_addr, smem_name)
    if addr % tmap.smem_align:
        why = (f" (swizzle = {tmap.swizzle}: the pattern repeats every 8 rows of {tmap.swizzle} "
               "bytes and follows the address bits)" if tmap.swizzle else "")
        raise ValueError(f"{smem_name} = {addr}: a tensor copy's shared-memory address must be "
                         f"{tmap.smem_align}-byte aligned{why}")
    if addr < 0 or addr + tmap.box_bytes > smem_len:
        raise ValueError(f"{smem_name} = {addr}: the {tmap.box[0]} x {tmap.box[1]} box "
                         f"[{addr}, {addr + tmap.box_bytes}) is outside smem of {smem_len} bytes")
    inside = offsets >= 0
    if inside.any():
        last = int(offsets[inside].max()) + tmap.element_bytes
        if last > gmem_len:
            raise ValueError(f"tmap: the box at (c0={c0}, c1={c1}) reaches tensor bytes up to {last}, "
                             f"outside gmem of {gmem_len} bytes (the map describes more memory "
                             "than the image holds)")
    within = np.arange(tmap.element_bytes)
    byte_inside = np.repeat(inside.reshape(-1), tmap.element_bytes)
    index = (offsets[..., None] + within).reshape(-1)
    smem_index = (addr + tensor_box_smem_offsets(tmap)[..., None] + within).reshape(-1)
    return np.where(byte_inside, index, 0), byte_inside, smem_index


def cp_async_bulk_tensor_2d_g2s(smem: np.ndarray, gmem: np.ndarray, dst: int, tmap: TensorMap2D,
                                c0: int, c1: int, bar: MBarrier) -> np.ndarray:
    """cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes -> new smem.

    One thread's copy of the box at (column c0, row c1) of the tensor `tmap`
    describes to smem[dst : dst + tmap.box_bytes]: densely, row after row, or
    swizzled (:func:`tensor_tile_2d` says which tensor element is box element
    [i][j], :func:`tensor_box_smem_offsets` at which byte it lands). Box elements
    outside the tensor land as zeros, and the copy completes the WHOLE box,
    tmap.box_bytes, on `bar` (mutated in place): the mbarrier cannot tell a
    zero-filled row from a copied one. Lands at once, as :func:`cp_async_bulk_g2s`
    does.

    ValueError before anything moves: dst not aligned to tmap.smem_align (128
    bytes dense, 8 * swizzle swizzled), the box outside smem, a coordinate
    outside int32, or in-bounds elements outside gmem.
    """
    smem = _bytes_image(smem, "smem")
    gmem = _bytes_image(gmem, "gmem")
    if not isinstance(bar, MBarrier):
        raise ValueError(f"bar: expected an MBarrier; got {type(bar).__name__}")
    tmap, c0, c1 = _tensor_args(tmap, c0, c1)
    index, inside, smem_index = _tensor_bytes(tmap, c0, c1, dst, smem.size, gmem.size, "dst")
    out = smem.copy()
    out[smem_index] = np.where(inside, gmem[index], 0)
    bar.complete_tx(tmap.box_bytes)
    return out


def cp_async_bulk_tensor_2d_s2g(gmem: np.ndarray, smem: np.ndarray, src: int, tmap: TensorMap2D,
                                c0: int, c1: int) -> np.ndarray:
    """cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group -> new gmem image.

    One thread's store of the box at smem[src:] (laid out as a load with the
    same map leaves it: dense rows, or swizzled, :func:`tensor_box_smem_offsets`)
    to the tensor `tmap` describes, its first element at (column c0, row c1), as
    seen after cp.async.bulk.wait_group 0. Box elements outside the tensor are
    not written: the global bytes there keep what they held. The same checks as
    :func:`cp_async_bulk_tensor_2d_g2s` (src for dst).
    """
    gmem = _bytes_image(gmem, "gmem")
    smem = _bytes_image(smem, "smem")
    tmap, c0, c1 = _tensor_args(tmap, c0, c1)
    index, inside, smem_index = _tensor_bytes(tmap, c0, c1, src, smem.size, gmem.size, "src")
    out = gmem.copy()
    out[index[inside]] = smem[smem_index[inside]]
    return out


# ------------------------------------------------------------------ wgmma (sm_90a)
# wgmma.mma_async m64nNk16 bf16 -> f32 with A from registers and B from shared memory
# (wgmma.cuh); B K-major or N-major, unswizzled.

WGMMA_THREADS = 128          # one warpgroup
WGMMA_N = (16, 128)          # the shapes wgmma.cuh has
WGMMA_B_MAJORS = ("k", "n")  # TRANS_B 0 / 1
_DESC_FIELD_MASK = 0x3FFF    # 14-bit fields of address >> 4


def wgmma_desc(start: int, lbo: int, sbo: int, swizzle: int = 0) -> int:
    """The 64-bit shared-memory matrix descriptor (wgmma.cuh's wgmma_desc): bits 0-13 start
    >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4, 62-63 swizzle. The three byte values must be
    multiples of 16 below 2^18, as the 14-bit fields hold them."""
    start, lbo, sbo = (count_arg(v, f"wgmma_desc: {name}")
                       for name, v in (("start", start), ("lbo", lbo), ("sbo", sbo)))
    swizzle = count_arg(swizzle, "wgmma_desc: swizzle")   # True would pass for 1 (128B)
    for name, v in (("start", start), ("lbo", lbo), ("sbo", sbo)):
        if not (0 <= v < 1 << 18) or v % 16:
            raise ValueError(f"wgmma_desc: {name} = {v} must be a multiple of 16 in [0, 2^18)")
    if swizzle not in (0, 1, 2, 3):
        raise ValueError(f"wgmma_desc: swizzle = {swizzle} must be 0 (none), 1 (128B), 2 (64B) or 3 (32B)")
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62)


def wgmma_desc_fields(desc: int) -> dict:
    """wgmma_desc's inverse: {"start", "lbo", "sbo", "base_offset", "swizzle"} in bytes."""
    desc = count_arg(desc, "desc")
    if not 0 <= desc < 1 << 64:
        raise ValueError(f"desc = {desc:#x}: a matrix descriptor is a 64-bit unsigned integer")
    return {"start": (desc & _DESC_FIELD_MASK) << 4, "lbo": ((desc >> 16) & _DESC_FIELD_MASK) << 4,
            "sbo": ((desc >> 32) & _DESC_FIELD_MASK) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": (desc >> 62) & 3}


def check_wgmma_n(n) -> int:
    # a float 16.0 passes `in WGMMA_N` and then indexes with floats; True is not a shape
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n not in WGMMA_N:
        raise ValueError(f"n must be one of {WGMMA_N}, got {n!r}")
    return int(n)


def wgmma_b_offsets(n: int, desc: int, major: str = "k") -> np.ndarray:
    """Byte address of B[k][n'] (16 x n int64) in an unswizzled B: core matrices of 8 rows x
    16 bytes (128 B), lbo between the core matrices of k 0-7 and 8-15, sbo between blocks
    of 8 n. K-major ("k", TRANS_B 0): a core matrix's rows are n', its 16 bytes 8 k:
    start + (n' / 8) sbo + (k / 8) lbo + (n' % 8) 16 + (k % 8) 2. N-major ("n", TRANS_B 1):
    rows are k, the 16 bytes 8 n': start + (n' / 8) sbo + (k / 8) lbo + (k % 8) 16 + (n' % 8) 2."""
    f = wgmma_desc_fields(desc)
    if f["swizzle"] or f["base_offset"]:
        raise ValueError("wgmma_b_offsets models the unswizzled layout (swizzle 0, base offset 0) only")
    n = check_wgmma_n(n)
    if major not in WGMMA_B_MAJORS:
        raise ValueError(f"major must be one of {WGMMA_B_MAJORS} (K-major or N-major B), got {major!r}")
    k = np.arange(16)[:, None]
    j = np.arange(n)[None, :]
    blocks = f["start"] + (j // 8) * f["sbo"] + (k // 8) * f["lbo"]
    return blocks + ((j % 8) * 16 + (k % 8) * 2 if major == "k" else (k % 8) * 16 + (j % 8) * 2)


def wgmma_b_image(B, desc: int, size: int, major: str = "k") -> np.ndarray:
    """The inverse of what wgmma_m64nNk16_rs reads: a `size`-byte shared-memory image (uint8)
    holding B [16 x n] as bf16 (rounded to nearest even) where the descriptor puts it
    (wgmma_b_offsets), zeros elsewhere."""
    size = count_arg(size, "size")
    B = np.asarray(B, dtype=np.float32)
    if B.ndim != 2 or B.shape[0] != 16 or B.shape[1] not in WGMMA_N:
        raise _shape_error("B", f"(16, n) with n in {WGMMA_N}", B)
    off = wgmma_b_offsets(B.shape[1], desc, major)
    if off.max() + 2 > size:
        raise ValueError(f"B's bytes reach {int(off.max()) + 1}, past the {size}-byte image")
    bits = _to_bits(B, "bfloat16")
    img = np.zeros(size, dtype=np.uint8)
    img[off] = bits & 0xFF
    img[off + 1] = bits >> 8
    return img


def wgmma_a_to_matrix(a, dtype: str = "bfloat16") -> np.ndarray:
    """A [64 x 16] from the warpgroup's A registers (128, 4): warp w's are mma.sync's A
    fragment of rows 16 w .. 16 w + 15."""
    r = _regs_n(a, "a", WGMMA_THREADS, 4)
    return np.vstack([fragments_to_matrix("mma.a", r[32 * w:32 * w + 32], dtype) for w in range(4)])


def matrix_to_wgmma_a(A, dtype: str = "bfloat16") -> np.ndarray:
    A = np.asarray(A)
    if A.shape != (64, 16):
        raise _shape_error("A", "(64, 16)", A)
    return np.vstack([matrix_to_fragments("mma.a", A[16 * w:16 * w + 16], dtype) for w in range(4)])


def wgmma_d_to_matrix(d, n: int) -> np.ndarray:
    """D [64 x n] from the accumulators (128, n / 2): warp w holds rows 16 w ..; its floats
    4j .. 4j + 3 are mma.sync's C fragment of columns 8j .. 8j + 7."""
    n = check_wgmma_n(n)
    r = _regs_n(d, "d", WGMMA_THREADS, n // 2, np.float32)
    out = np.empty((64, n), dtype=np.float32)
    for w in range(4):
        for j in range(n // 8):
            out[16 * w:16 * w + 16, 8 * j:8 * j + 8] = fragments_to_matrix(
                "mma.c", r[32 * w:32 * w + 32, 4 * j:4 * j + 4], "float32")
    return out


def matrix_to_wgmma_d(D) -> np.ndarray:
    D = np.asarray(D, dtype=np.float32)
    if D.ndim != 2 or D.shape[0] != 64 or D.shape[1] not in WGMMA_N:
        raise _shape_error("D", f"(64, n) with n in {WGMMA_N}", D)
    n = D.shape[1]
    out = np.empty((WGMMA_THREADS, n // 2), dtype=np.float32)
    for w in range(4):
        for j in range(n // 8):
            out[32 * w:32 * w + 32, 4 * j:4 * j + 4] = matrix_to_fragments(
                "mma.c", D[16 * w:16 * w + 16, 8 * j:8 * j + 8], "float32")
    return out


def wgmma_m64nNk16_rs(a, smem: np.ndarray, desc: int, c, n: int, scale_d: bool = True,
                      major: str = "k") -> np.ndarray:
    """wgmma.mma_async.m64n{n}k16.f32.bf16.bf16 with A from registers, B in `smem` (bytes) at
    `desc` (no swizzle), K-major or N-major (`major`, wgmma_b_offsets): returns D = A @ B
    (+ C when scale_d) as the (128, n / 2) accumulators. Rounded once from float64, like
    mma_m16n8k16: exact for data whose partial sums fp32 holds, else compare with a tolerance."""
    smem = _bytes_image(smem, "smem")
    scale_d = check_flag(scale_d, "scale_d")
    off = wgmma_b_offsets(n, desc, major)
    if off.min() < 0 or off.max() + 2 > smem.size:
        raise ValueError(f"B's bytes {off.min()}..{off.max() + 1} fall outside the {smem.size}-byte image")
    bits = smem[off].astype(np.uint16) | (smem[off + 1].astype(np.uint16) << 8)
    B = _from_bits(bits, "bfloat16").astype(np.float64)
    A = wgmma_a_to_matrix(a).astype(np.float64)
    C = wgmma_d_to_matrix(c, n).astype(np.float64) if scale_d else 0.0
    return matrix_to_wgmma_d((A @ B + C).astype(np.float32))


def _regs_n(x, name: str, threads: int, nregs: int, dtype=np.uint32) -> np.ndarray:
    # Refused rather than cast: float accumulators read as uint32 registers (or the
    # reverse) would be converted by value, not reinterpreted, and come out wrong.
    r = np.asarray(x)
    if r.shape != (threads, nregs) or r.dtype != dtype:
        raise _shape_error(name, f"{np.dtype(dtype).name} array of shape ({threads}, {nregs})", r)
    return r


__all__ = ["ROW_BYTES", "DTYPES", "pack_bf16x2", "unpack_bf16x2", "pack_f16x2", "unpack_f16x2",
           "fragments_to_matrix", "matrix_to_fragments", "acc_to_a_fragment", "ldmatrix",
           "stmatrix", "movmatrix_trans", "mma_m16n8k16", "cp_async", "MBARRIER_MAX_COUNT",
           "MBARRIER_MAX_TX", "BULK_ALIGN", "MBarrier", "cp_async_bulk_g2s", "cp_async_bulk_s2g",
           "TENSOR_COORD_MIN", "TENSOR_COORD_MAX", "tensor_tile_2d", "TENSOR_SWIZZLES",
           "tensor_box_smem_offsets", "cp_async_bulk_tensor_2d_g2s", "cp_async_bulk_tensor_2d_s2g",
           "WGMMA_THREADS", "WGMMA_N", "WGMMA_B_MAJORS", "wgmma_desc", "wgmma_desc_fields", "wgmma_b_offsets",
           "wgmma_b_image",
           "wgmma_a_to_matrix", "matrix_to_wgmma_a", "wgmma_d_to_matrix", "matrix_to_wgmma_d",
           "wgmma_m64nNk16_rs"]
