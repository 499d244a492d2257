"""GPU twins of ``ptx_lab.model``: the same five functions, run on the instruction.

Each function here has the signature and the result of its namesake in
``ptx_lab.model`` (numpy arrays in, numpy arrays out) but launches a single-warp
probe kernel from ``ptx_lab/cuda/probes.cu`` through CuPy, so the hardware says
which lane gets which element. ``tests/ptx_lab/test_device_vs_model.py``
compares the two bit for bit. Beside them, :func:`x4_lane_row_col` runs the .x4
address recipe of ``ldmatrix.cuh`` (the twin of ``ptx_lab.fragments.x4_lane_row_col``;
``tests/ptx_lab/test_x4_lanes.py``). The register steps of ``fragments.cuh`` and the .x4
addresses run from ``operand_probes.cu`` (:func:`acc_to_a`, :func:`a_to_acc`,
:func:`acc_to_a_two_parts`, :func:`two_part_bf16x2`, :func:`bf16_scalars`,
:func:`x4_lane_offsets`: twins of ``ptx_lab.fragments``'; :func:`unpack_f16x2`, the f16 widening, twin
of ``ptx_lab.model``'s; ``tests/ptx_lab/test_operand_fragments.py``),
and ``ring.cuh`` from ``ring_probes.cu`` (:func:`ring_ids`, :func:`ring_walk`,
:func:`mbarrier_ring_parities`, :func:`mbarrier_ring_walk`: twins of
``ptx_lab.ring``; ``tests/ptx_lab/test_ring.py``).

Inputs whose device result the PTX ISA leaves undefined are refused with a
ValueError rather than run: misaligned or out-of-range addresses, and two
lanes storing to the same shared-memory bytes (stmatrix rows, cp.async
destinations), where which lane wins is unspecified. Arguments are checked
as ``ptx_lab.model`` checks them (dtypes by ``ptx_lab.dtypes`` names or their
PTX aliases, flags only as real bools, counts only as ints), and before the
GPU is looked for or CuPy imported; without a usable GPU every function
raises RuntimeError saying why (``ptx_lab.gpu.gpu_reason()``).
"""
from __future__ import annotations

import functools

import numpy as np

from . import CUDA_INCLUDE_DIR, dtypes, model
from .fragments import check_flag, check_num
from .gpu import gpu_reason, load_module

__all__ = ["ldmatrix", "stmatrix", "movmatrix_trans", "mma_m16n8k16", "cp_async", "wgmma_m64nNk16_rs",
           "x4_lane_row_col", "x4_lane_offsets", "acc_to_a", "a_to_acc", "acc_to_a_two_parts", "two_part_bf16x2",
           "bf16_scalars", "unpack_f16x2", "ring_ids", "ring_walk",
           "mbarrier_ring_parities", "mbarrier_ring_walk"]

WARP = 32
PROBES_CU = CUDA_INCLUDE_DIR / "probes.cu"
ROW_BYTES = 16                 # one ldmatrix/stmatrix row: 8 x 16-bit elements
CHUNK_BYTES = 16               # the probes copy images in uint4 chunks
MAX_IMAGE_BYTES = 48 * 1024    # dynamic shared memory a launch gets without opt-in
MMA_DTYPES = {"bfloat16": "bf16", "float16": "f16"}   # dtype -> the probe kernel's suffix (probes.cu)


# ----------------------------------------------------------------- plumbing

def _require_gpu() -> None:
    reason = gpu_reason()
    if reason is not None:
        raise RuntimeError(f"ptx_lab.device needs a CUDA GPU and found none: {reason} "
                           "(ptx_lab.model runs the same functions on the CPU)")


def _cupy():
    """CuPy, once a GPU is known to be usable."""
    _require_gpu()
    import cupy

    return cupy


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    """The probe kernel `name` from probes.cu (the module compiles once per process)."""
    _require_gpu()
    return load_module(PROBES_CU.read_text()).get_function(name)


def _launch(name: str, args: tuple, shared_mem: int = 0) -> None:
    _kernel(name)((1,), (WARP,), args, shared_mem=shared_mem)


def _dev(cupy, x: np.ndarray):
    """Host array -> device array in C order, the layout the probes index."""
    return cupy.asarray(np.ascontiguousarray(x))


def _array(name: str, x, shape: tuple[int, ...], dtype) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != shape or a.dtype != np.dtype(dtype):
        raise ValueError(f"{name} must be {np.dtype(dtype).name} {shape}; "
                         f"got {a.dtype.name} {a.shape}")
    return a


def _lane_ints(name: str, x) -> np.ndarray:
    """(32,) integer array -> int64 copy."""
    a = np.asarray(x)
    if a.shape != (WARP,) or a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array of shape ({WARP},); "
                         f"got {a.dtype.name} {a.shape}")
    return a.astype(np.int64)


def _bytes_1d(name: str, x, limit: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype != np.uint8:
        raise ValueError(f"{name} must be a 1-D uint8 array; got {a.dtype.name} {a.shape}")
    if limit is not None and a.size > limit:
        raise ValueError(f"{name} holds {a.size} bytes; the probes take at most {limit}")
    return a


def _padded(a: np.ndarray) -> np.ndarray:
    """Zero-pad a byte array to a non-empty multiple of CHUNK_BYTES."""
    n = max(CHUNK_BYTES, -(-a.size // CHUNK_BYTES) * CHUNK_BYTES)
    out = np.zeros(n, dtype=np.uint8)
    out[:a.size] = a
    return out


def _check_rows(addrs: np.ndarray, num: int, smem_size: int, *, distinct: bool) -> None:
    """Lanes 0..8*num-1 supply 16-byte row addresses that must lie inside smem."""
    used = addrs[:8 * num]
    bad = np.flatnonzero((used % ROW_BYTES != 0) | (used < 0) | (used + ROW_BYTES > smem_size))
    if bad.size:
        lane = int(bad[0])
        raise ValueError(f"addrs[{lane}] = {int(used[lane])}: row addresses of lanes "
                         f"0..{8 * num - 1} must be multiples of {ROW_BYTES} with the row "
                         f"inside smem ({smem_size} bytes)")
    if distinct and np.unique(used).size != used.size:
        raise ValueError("addrs: two lanes name the same row; which store wins is undefined")


def _used_addrs(addrs: np.ndarray, num: int) -> np.ndarray:
    """Row addresses as launched: the lanes the instruction ignores get 0, a valid operand."""
    out = np.zeros(WARP, dtype=np.uint32)
    out[:8 * num] = addrs[:8 * num]
    return out


# ------------------------------------------------------------------ the twins

def ldmatrix(smem, addrs, num: int, trans: bool) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 on the GPU.

    smem: uint8 (n,) shared-memory image, n <= 48 KiB. addrs: (32,) byte
    offsets; lanes 8i..8i+7 give rows 0..7 of matrix i (16-byte aligned).
    Returns uint32 (32, num): register i of every lane.
    """
    image = _bytes_1d("smem", smem, MAX_IMAGE_BYTES)
    check_num(num)
    trans = check_flag(trans, "trans")
    lanes = _lane_ints("addrs", addrs)
    _check_rows(lanes, num, image.size, distinct=False)
    cupy = _cupy()

    padded = _padded(image)
    out = cupy.zeros((WARP, num), dtype=cupy.uint32)
    name = f"probe_ldmatrix_x{num}" + ("_trans" if trans else "")
    _launch(name, (_dev(cupy, padded), np.uint32(padded.size // CHUNK_BYTES),
                   _dev(cupy, _used_addrs(lanes, num)), out), shared_mem=padded.size)
    return cupy.asnumpy(out)


def stmatrix(smem, addrs, regs, trans: bool) -> np.ndarray:
    """stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 on the GPU.

    regs: uint32 (32, num) with num = 1, 2 or 4; addrs as for ldmatrix, and the
    used rows must be distinct. Returns the new uint8 smem image (same length).
    """
    image = _bytes_1d("smem", smem, MAX_IMAGE_BYTES)
    regs = np.asarray(regs)
    if regs.ndim != 2 or regs.shape[0] != WARP or regs.dtype != np.uint32:
        raise ValueError(f"regs must be uint32 (32, num); got {regs.dtype.name} {regs.shape}")
    num = regs.shape[1]
    check_num(num)
    trans = check_flag(trans, "trans")
    lanes = _lane_ints("addrs", addrs)
    _check_rows(lanes, num, image.size, distinct=True)
    cupy = _cupy()

    padded = _padded(image)
    out = cupy.zeros(padded.size, dtype=cupy.uint8)
    name = f"probe_stmatrix_x{num}" + ("_trans" if trans else "")
    _launch(name, (_dev(cupy, padded), np.uint32(padded.size // CHUNK_BYTES),
                   _dev(cupy, _used_addrs(lanes, num)), _dev(cupy, regs), out),
            shared_mem=padded.size)
    return cupy.asnumpy(out)[:image.size]


def x4_lane_row_col(order: str) -> np.ndarray:
    """ldmatrix.cuh's X4Lane on the GPU: the twin of fragments.x4_lane_row_col.

    int64 (32, 2): the (row, col) of a 16x16 tile each lane's .x4 address names, in
    `order` "rows_first" or "cols_first" (the probe computes both; no instruction runs).
    """
    from .fragments import X4_ORDERS

    if order not in X4_ORDERS:
        raise ValueError(f"order must be one of {', '.join(X4_ORDERS)}; got {order!r}")
    cupy = _cupy()
    out = cupy.zeros((WARP, 4), dtype=cupy.int32)
    _launch("probe_x4_lanes", (out,))
    both = cupy.asnumpy(out).astype(np.int64)
    return both[:, 0:2] if order == "rows_first" else both[:, 2:4]


def movmatrix_trans(regs) -> np.ndarray:
    """movmatrix.sync.aligned.m8n8.trans.b16 on the GPU: uint32 (32,) -> uint32 (32,)."""
    regs = _array("regs", regs, (WARP,), np.uint32)
    cupy = _cupy()
    out = cupy.zeros(WARP, dtype=cupy.uint32)
    _launch("probe_movmatrix_trans", (_dev(cupy, regs), out))
    return cupy.asnumpy(out)


def mma_m16n8k16(a, b, c, dtype: str) -> np.ndarray:
    """mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32 on the GPU.

    a: uint32 (32, 4), b: uint32 (32, 2) fragments of bf16 or f16 pairs;
    c: float32 (32, 4). dtype: "bfloat16" or "float16" (or PTX's "bf16" / "f16",
    or the numpy dtype). Returns d = a @ b + c as float32 (32, 4) fragments.
    """
    suffix = MMA_DTYPES[dtypes.canonical(dtype, tuple(MMA_DTYPES))]
    a = _array("a", a, (WARP, 4), np.uint32)
    b = _array("b", b, (WARP, 2), np.uint32)
    c = _array("c", c, (WARP, 4), np.float32)
    cupy = _cupy()
    d = cupy.zeros((WARP, 4), dtype=cupy.float32)
    _launch(f"probe_mma_m16n8k16_{suffix}", (_dev(cupy, a), _dev(cupy, b), _dev(cupy, c), d))
    return cupy.asnumpy(d)


def cp_async(smem, gmem, dst, src, size: int, src_bytes=None, cache: str = "ca") -> np.ndarray:
    """cp.async.{cache}.shared.global of `size` bytes per lane on the GPU.

    Lane l copies gmem[src[l] : src[l] + size] to smem[dst[l] : dst[l] + size];
    with src_bytes ((32,) ints in 0..size) it copies src_bytes[l] bytes and
    zero-fills the rest. dst and src must be multiples of `size`, in range, and
    the destinations must not overlap. Returns the new uint8 smem image.
    """
    size = model.count_arg(size, "size")
    if size not in (4, 8, 16):
        raise ValueError(f"size must be 4, 8 or 16 bytes; got {size!r}")
    if cache not in ("ca", "cg"):
        raise ValueError(f"cache must be 'ca' or 'cg'; got {cache!r}")
    if cache == "cg" and size != 16:
        raise ValueError(f"cache='cg' copies only 16 bytes; got size={size}")
    image = _bytes_1d("smem", smem, MAX_IMAGE_BYTES)
    source = _bytes_1d("gmem", gmem)
    dst = _lane_ints("dst", dst)
    src = _lane_ints("src", src)
    zfill = src_bytes is not None
    nbytes = _lane_ints("src_bytes", src_bytes) if zfill else np.full(WARP, size, dtype=np.int64)
    for lane in range(WARP):
        if not 0 <= nbytes[lane] <= size:
            raise ValueError(f"src_bytes[{lane}] = {int(nbytes[lane])}; must lie in 0..{size}")
        if dst[lane] % size or not 0 <= dst[lane] <= image.size - size:
            raise ValueError(f"dst[{lane}] = {int(dst[lane])}: must be a multiple of {size} "
                             f"with the copy inside smem ({image.size} bytes)")
        if src[lane] % size or src[lane] < 0 or src[lane] + nbytes[lane] > source.size:
            raise ValueError(f"src[{lane}] = {int(src[lane])}: must be a multiple of {size} "
                             f"with the {int(nbytes[lane])} bytes read inside gmem "
                             f"({source.size} bytes)")
    if np.unique(dst).size != WARP:  # aligned equal-size copies overlap only when equal
        raise ValueError("dst: two lanes write the same bytes; which copy wins is undefined")
    cupy = _cupy()

    padded = _padded(image)
    out = cupy.zeros(padded.size, dtype=cupy.uint8)
    name = f"probe_cp_async_{cache}{size}" + ("_zfill" if zfill else "")
    _launch(name, (_dev(cupy, padded), np.uint32(padded.size // CHUNK_BYTES),
                   _dev(cupy, _padded(source)), _dev(cupy, dst.astype(np.uint32)),
                   _dev(cupy, src.astype(np.uint32)), _dev(cupy, nbytes.astype(np.uint32)),
                   out), shared_mem=padded.size)
    return cupy.asnumpy(out)[:image.size]


# ----------------------------------------------------------------- wgmma (wgmma_probes.cu)

WGMMA_PROBES_CU = CUDA_INCLUDE_DIR / "wgmma_probes.cu"


@functools.lru_cache(maxsize=None)
def _wgmma_kernel(name: str):
    _require_gpu()
    return load_module(WGMMA_PROBES_CU.read_text()).get_function(name)


def wgmma_m64nNk16_rs(a, smem, desc: int, c, n: int, scale_d: bool = True, major: str = "k") -> np.ndarray:
    """wgmma.mma_async.m64n{n}k16.f32.bf16.bf16 on the GPU, one warpgroup: the twin of
    model.wgmma_m64nNk16_rs. a: uint32 (128, 4) A registers; smem: the uint8 image the
    B operand lives in; desc: model.wgmma_desc(start, lbo, sbo) with `start` an offset into
    that image (the probe adds the image's shared address); c: float32 (128, n / 2);
    major: "k" (K-major B, TRANS_B 0) or "n" (N-major, TRANS_B 1); scale_d: a bool."""
    n = model.check_wgmma_n(n)
    scale_d = check_flag(scale_d, "scale_d")
    a = _array("a", a, (model.WGMMA_THREADS, 4), np.uint32)
    c = _array("c", c, (model.WGMMA_THREADS, n // 2), np.float32)
    image = _bytes_1d("smem", smem, MAX_IMAGE_BYTES)
    f = model.wgmma_desc_fields(desc)
    off = model.wgmma_b_offsets(n, desc, major)   # refuses swizzled descriptors and unknown majors
    if off.max() + 2 > image.size:
        raise ValueError(f"B's bytes reach {int(off.max()) + 1}, past the {image.size}-byte image")
    cupy = _cupy()
    padded = _padded(image)
    d = cupy.zeros((model.WGMMA_THREADS, n // 2), dtype=cupy.float32)
    _wgmma_kernel(f"probe_wgmma_m64n{n}k16_bf16_rs" + ("_nmajor" if major == "n" else ""))(
        (1,), (model.WGMMA_THREADS,),
        (_dev(cupy, padded), np.uint32(padded.size // CHUNK_BYTES), _dev(cupy, a), _dev(cupy, c),
         np.uint32(f["lbo"]), np.uint32(f["sbo"]), np.uint32(f["start"]), np.int32(1 if scale_d else 0), d),
        shared_mem=padded.size)
    return cupy.asnumpy(d)


# ----------------------------------------------------------------- fragments.cuh, .x4 addresses (operand_probes.cu)

OPERAND_PROBES_CU = CUDA_INCLUDE_DIR / "operand_probes.cu"
ACC_TO_A_DTYPES = {"bfloat16": "bf16", "float16": "f16"}   # dtype -> probe_acc_to_a_<suffix>


@functools.lru_cache(maxsize=None)
def _operand_kernel(name: str):
    _require_gpu()
    return load_module(OPERAND_PROBES_CU.read_text()).get_function(name)


def _run_operand_probe(name: str, inputs: tuple[np.ndarray, ...], outputs: tuple[tuple, ...]) -> list[np.ndarray]:
    """Launch probe `name` (one warp) on host arrays; outputs: (shape, dtype) of each result."""
    cupy = _cupy()
    outs = [cupy.zeros(shape, dtype=dtype) for shape, dtype in outputs]
    _operand_kernel(name)((1,), (WARP,), (*(_dev(cupy, x) for x in inputs), *outs))
    return [cupy.asnumpy(o) for o in outs]


def acc_to_a(left, right, dtype: str = "bfloat16") -> np.ndarray:
    """fragments.cuh's acc_to_a (acc_to_a_f16 for "float16") on the GPU: the twin of
    fragments.acc_to_a. left, right: float32 (32, 4) accumulators -> uint32 (32, 4)."""
    suffix = ACC_TO_A_DTYPES[dtypes.canonical(dtype, tuple(ACC_TO_A_DTYPES))]
    left = _array("left", left, (WARP, 4), np.float32)
    right = _array("right", right, (WARP, 4), np.float32)
    (a,) = _run_operand_probe(f"probe_acc_to_a_{suffix}", (left, right), (((WARP, 4), np.uint32),))
    return a


def a_to_acc(a) -> tuple[np.ndarray, np.ndarray]:
    """fragments.cuh's a_to_acc on the GPU: uint32 (32, 4) bf16 A fragment -> (left, right) float32 (32, 4)."""
    a = _array("a", a, (WARP, 4), np.uint32)
    left, right = _run_operand_probe("probe_a_to_acc", (a,), (((WARP, 4), np.float32),) * 2)
    return left, right


def acc_to_a_two_parts(left, right) -> tuple[np.ndarray, np.ndarray]:
    """fragments.cuh's acc_to_a_two_parts on the GPU: (hi, lo) uint32 (32, 4)."""
    left = _array("left", left, (WARP, 4), np.float32)
    right = _array("right", right, (WARP, 4), np.float32)
    hi, lo = _run_operand_probe("probe_acc_to_a_two_parts", (left, right), (((WARP, 4), np.uint32),) * 2)
    return hi, lo


def two_part_bf16x2(x) -> tuple[np.ndarray, np.ndarray]:
    """fragments.cuh's two_part_bf16x2 on the GPU, one call a pair: x float32 (32, 8) ->
    (hi, lo) uint32 (32, 4)."""
    x = _array("x", x, (WARP, 8), np.float32)
    hi, lo = _run_operand_probe("probe_two_part_bf16x2", (x,), (((WARP, 4), np.uint32),) * 2)
    return hi, lo


def bf16_scalars(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fragments.cuh's one-value conversions on the GPU, x float32 (32,) ->
    (f32_to_bf16(x) as uint16, bf16_to_f32 of those bits as float32, bf16_rest(x) as float32)."""
    x = _array("x", x, (WARP,), np.float32)
    bits, back, rest = _run_operand_probe("probe_bf16_scalars", (x,),
                                          (((WARP,), np.uint32), ((WARP,), np.float32), ((WARP,), np.float32)))
    return bits.astype(np.uint16), back, rest


def unpack_f16x2(pairs) -> tuple[np.ndarray, np.ndarray]:
    """fragments.cuh's f16_lo and f16_hi on the GPU, the twin of model.unpack_f16x2: pairs uint32 (32,),
    one b32 of two f16 a lane -> (lo, hi) float32 (32,), lo from bits 0..15."""
    pairs = _array("pairs", pairs, (WARP,), np.uint32)
    lo, hi = _run_operand_probe("probe_unpack_f16x2", (pairs,), (((WARP,), np.float32),) * 2)
    return lo, hi


def x4_lane_offsets(order: str, row_bytes: int, row0: int = 0, col0: int = 0) -> dict[str, np.ndarray]:
    """ldmatrix.cuh's .x4 addresses on the GPU, the twin of fragments.x4_lane_offsets: int64 (32,)
    byte offsets from the tile's start, {"addr": x4_addr_<order>, "lane_bytes": x4_lane_bytes_<order>
    plus the block's row0 * row_bytes + col0 * 2}. row_bytes must be even (a 16-bit tile's rows
    are whole elements apart)."""
    from .fragments import X4_ORDERS, x4_lane_offsets as model_offsets

    model_offsets(order, row_bytes, row0, col0)   # the model's argument checks
    if row_bytes % 2:
        raise ValueError(f"row_bytes must be even (whole 16-bit elements); got {row_bytes}")
    if (row0 + 16) * row_bytes + (col0 + 16) * 2 >= 2 ** 31:
        raise ValueError("row0, col0 and row_bytes must keep the block's offsets below 2^31 (the probe's int)")
    cupy = _cupy()
    out = cupy.zeros((WARP, 4), dtype=cupy.uint32)
    _operand_kernel("probe_x4_addresses")((1,), (WARP,), (np.int32(row0), np.int32(col0),
                                                          np.int32(row_bytes // 2), out))
    both = cupy.asnumpy(out).astype(np.int64)
    k = list(X4_ORDERS).index(order)
    return {"addr": both[:, k], "lane_bytes": both[:, 2 + k]}


# ----------------------------------------------------------------- ring.cuh (ring_probes.cu)

RING_PROBES_CU = CUDA_INCLUDE_DIR / "ring_probes.cu"
RING_STAGES = (1, 2, 3, 4, 6, 7)   # the rings ring_probes.cu instantiates
RING_THREADS = 2 * WARP            # its walk: one producer warp, one consumer warp


@functools.lru_cache(maxsize=None)
def _ring_kernel(name: str):
    _require_gpu()
    return load_module(RING_PROBES_CU.read_text()).get_function(name)


def _ring_args(nstage: int, ntiles: int) -> tuple[int, int]:
    from . import ring

    ring.barrier_ids(nstage)   # the model's checks of nstage
    if isinstance(ntiles, (bool, np.bool_)) or not isinstance(ntiles, (int, np.integer)) or ntiles < 0:
        raise ValueError(f"ntiles must be an int >= 0; got {ntiles!r}")
    nstage, ntiles = int(nstage), int(ntiles)
    if nstage not in RING_STAGES:
        raise ValueError(f"nstage must be one of {RING_STAGES} (the rings ring_probes.cu builds); got {nstage}")
    return nstage, ntiles


def ring_ids(nstage: int, ntiles: int) -> dict:
    """ring.cuh's ids and predicates on the GPU, the twin of ptx_lab.ring's closed forms:
    {"full", "empty": lists per stage, "end": int, "releases", "refill_waits": bool lists per tile}."""
    nstage, ntiles = _ring_args(nstage, ntiles)
    cupy = _cupy()
    out = cupy.zeros(2 * nstage + 1 + 2 * ntiles, dtype=cupy.uint32)
    _ring_kernel(f"probe_ring_ids_{nstage}")((1,), (WARP,), (np.int32(ntiles), out))
    got = cupy.asnumpy(out).astype(np.int64)
    flags = got[2 * nstage + 1:].reshape(ntiles, 2).astype(bool)
    return {"full": got[0:2 * nstage:2].tolist(), "empty": got[1:2 * nstage:2].tolist(),
            "end": int(got[2 * nstage]), "releases": flags[:, 0].tolist(), "refill_waits": flags[:, 1].tolist()}


def ring_walk(nstage: int, ntiles: int) -> np.ndarray:
    """ring.cuh's ring on the GPU, one producer warp and one consumer warp: uint32 (ntiles, 32),
    what the consumer's lane l read of tile i (the producer writes i * 32 + lane; the consumer
    reads its neighbour's word, lane (l + 1) % 32). A broken hand-off shows as wrong words, a
    hang as a launch that does not return."""
    nstage, ntiles = _ring_args(nstage, ntiles)
    cupy = _cupy()
    seen = cupy.zeros((max(ntiles, 1), WARP), dtype=cupy.uint32)
    _ring_kernel(f"probe_ring_walk_{nstage}")((1,), (RING_THREADS,), (np.int32(ntiles), seen))
    return cupy.asnumpy(seen)[:ntiles]


def mbarrier_ring_parities(nstage: int, ntiles: int) -> dict:
    """ring.cuh's MbarrierRing parities and predicates on the GPU, the twin of
    ptx_lab.ring.mbarrier_parities, releases and refill_waits: lists per tile."""
    nstage, ntiles = _ring_args(nstage, ntiles)
    cupy = _cupy()
    out = cupy.zeros((max(ntiles, 1), 4), dtype=cupy.uint32)
    _ring_kernel(f"probe_mring_parities_{nstage}")((1,), (WARP,), (np.int32(ntiles), out))
    got = cupy.asnumpy(out)[:ntiles].astype(np.int64)
    return {"full_parity": got[:, 0].tolist(), "refill_parity": got[:, 1].tolist(),
            "releases": got[:, 2].astype(bool).tolist(), "refill_waits": got[:, 3].astype(bool).tolist()}


def mbarrier_ring_walk(nstage: int, ntiles: int) -> np.ndarray:
    """ring.cuh's MbarrierRing on the GPU, as :func:`ring_walk` walks the named-barrier ring."""
    nstage, ntiles = _ring_args(nstage, ntiles)
    cupy = _cupy()
    seen = cupy.zeros((max(ntiles, 1), WARP), dtype=cupy.uint32)
    _ring_kernel(f"probe_mring_walk_{nstage}")((1,), (RING_THREADS,), (np.int32(ntiles), seen))
    return cupy.asnumpy(seen)[:ntiles]
