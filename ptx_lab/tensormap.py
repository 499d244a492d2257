"""Host side of the tensor copies in ``ptx_lab/cuda/tma.cuh``: the CUtensorMap.

A tensor copy (``cp.async.bulk.tensor``) is told everything about the tensor by
a 128-byte tensor map that the CUDA driver encodes on the host
(``cuTensorMapEncodeTiled``): where the tensor is, its element type, its
extent and row stride, and the box one copy moves. CuPy does not wrap that
call, so :func:`encode` reaches it through cuda-bindings
(``cuda.bindings.driver.cuTensorMapEncodeTiled``) where that package is
installed, and through ctypes in ``libcuda.so.1`` where it is not (the project
does not require cuda-bindings); both give the same 128 bytes.

Only the form ``tma.cuh`` uses is offered: a 2-D row-major tensor, no
interleave, out-of-bounds elements filled with zeros, element strides 1, and
the box in shared memory either dense (row after row) or swizzled: with
``swizzle`` = 32, 64 or 128 bytes, the 16-byte chunks of each box row are
permuted as CuTe's Swizzle<1|2|3, 4, 3> permutes byte offsets
(``ptx_lab.layouts.GMMA_SWIZZLES``: SW32/SW64/SW128), so that 8 consecutive box
rows of `swizzle` bytes fall in distinct bank groups. Within
that, :class:`TensorMap2D` checks every argument the driver would refuse, and
says which and why; the driver's own answer to a bad argument is only
``CUDA_ERROR_INVALID_VALUE``.

Shapes and boxes are written the way the tensor is indexed, ``(rows, cols)``;
the driver and the instruction want the innermost dimension first, so the
map is encoded as ``globalDim = {cols, rows}`` and a copy names its box by
``{c0, c1} = {column, row}``.

The encoded map is returned as a numpy array of shape ``(1,)`` and dtype
:data:`TENSOR_MAP_DTYPE` (128 bytes). CuPy passes a numpy array of size one
to a kernel BY VALUE, copying the parameter's size from its data pointer
(CuPy's user guide, "Kernel arguments" and "Custom user types"), which is
exactly a ``const __grid_constant__ ptx_lab::TensorMap`` parameter::

    tmap = tensormap.encode(tensormap.TensorMap2D(q.data.ptr, "bfloat16", (T, H * D),
                                                  H * D * 2, box=(16, 128)))
    kernel((1,), (32,), (tmap, ...))

Importing this module loads nothing; the driver is opened on the first
:func:`encode`.

On a GPU machine, ``python -m ptx_lab.tensormap --probe-driver`` hands the
driver every box of :data:`DRIVER_PROBES` and prints which it accepts: the
driver refuses some boxes its documentation allows, and that table is how
the rule it applies will be found (tests/ptx_lab/test_tensormap.py runs it
among the GPU tests).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import sys
from typing import Any

import numpy as np

from . import dtypes

TENSOR_MAP_BYTES = 128      # sizeof(CUtensorMap)
TENSOR_MAP_ALIGN = 64       # cuTensorMapEncodeTiled: "tensorMap address must be aligned to 64 bytes"
GLOBAL_ALIGN = 16           # the tensor's address, and every row stride, a multiple of 16 bytes
MAX_GLOBAL_DIM = 2**32      # globalDim: non-zero, <= 2^32
MAX_GLOBAL_STRIDE = 2**40   # globalStrides: < 2^40
MAX_BOX_DIM = 256           # boxDim: non-zero, <= 256
MAX_BOX_BYTES = 227 * 1024  # a box must fit one CTA's shared memory on sm_90 (227 KiB); the H200's
                            # driver refused 256 KiB boxes and took 128 KiB ones (--probe-driver)
BOX_INNER_ALIGN = 16        # interleave none: boxDim[0] * element size a multiple of 16 bytes
SMEM_ALIGN = 128            # a tensor copy's shared-memory address (ptx_lab.model checks it)

# One 128-byte opaque struct: 16 little-endian u64 words, as ptx_lab::TensorMap declares it.
TENSOR_MAP_DTYPE = np.dtype([("opaque", "<u8", (16,))])
assert TENSOR_MAP_DTYPE.itemsize == TENSOR_MAP_BYTES

# cuda.h enums (CUDA 12.0 .. 13.0 give them these values).
CU_TENSOR_MAP_DATA_TYPE = {"uint16": 1, "uint32": 2, "float32": 7, "bfloat16": 9}
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_NONE = 0
CU_TENSOR_MAP_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}   # bytes -> CU_TENSOR_MAP_SWIZZLE_{NONE, 32B, 64B, 128B}
CU_TENSOR_MAP_L2_PROMOTION = {0: 0, 128: 2}   # bytes -> CU_TENSOR_MAP_L2_PROMOTION_{NONE, L2_128B}
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0         # out-of-bounds elements read as zeros
CUDA_SUCCESS = 0

DTYPES = tuple(CU_TENSOR_MAP_DATA_TYPE)
ELEMENT_BYTES = {"uint16": 2, "bfloat16": 2, "uint32": 4, "float32": 4}


class CudaDriverError(RuntimeError):
    """The driver (libcuda.so.1) is missing, lacks cuTensorMapEncodeTiled, or refused the call."""


# ---------------------------------------------------------------- validation

def _int(x: Any, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name} must be an int; got {x!r}")
    return int(x)


def _pair(x: Any, name: str, what: str) -> tuple[int, int]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(f"{name} must be a pair {what}; got {x!r}")
    return _int(x[0], f"{name}[0]"), _int(x[1], f"{name}[1]")


def dtype_name(dtype: Any) -> str:
    """'uint16' | 'bfloat16' | 'uint32' | 'float32' from that name, its PTX alias ('bf16',
    'b16', 'f32', 'b32', ...: ptx_lab.dtypes, as ptx_lab.model accepts them) or the numpy dtype."""
    return dtypes.canonical(dtype, DTYPES)


@dataclasses.dataclass(frozen=True)
class TensorMap2D:
    """A 2-D row-major tensor and the box one tensor copy moves, checked as the driver would.

    address:      the tensor's first element (a device pointer for :func:`encode`; a byte
                  offset into a memory image for ``ptx_lab.model``), 16-byte aligned
    dtype:        'bfloat16', 'uint16', 'float32' or 'uint32' (or an alias of ptx_lab.dtypes
                  such as 'bf16', or that numpy dtype)
    shape:        (rows, cols) in elements, each 1..2^32
    row_stride:   bytes from one row to the next: a multiple of 16, below 2^40, and at
                  least cols * element size (rows may not overlap)
    box:          (box_rows, box_cols) in elements, each 1..256, box_cols * element size a
                  multiple of 16 bytes
    l2_promotion: 0 (none) or 128 (fetch L2 lines from DRAM 128 bytes at a time)
    swizzle:      0 (dense box) or 32, 64, 128: the shared-memory swizzle span in bytes;
                  a box row must then be exactly `swizzle` bytes, and the box's shared
                  address a multiple of 8 * swizzle (the pattern repeats every 8 rows,
                  and the TMA unit reads it from the address bits)

    ValueError names the first argument that breaks a rule, with the rule.
    """

    address: int
    dtype: str
    shape: tuple[int, int]
    row_stride: int
    box: tuple[int, int]
    l2_promotion: int = 0
    swizzle: int = 0

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("dtype", dtype_name(self.dtype))
        esize = ELEMENT_BYTES[self.dtype]

        address = _int(self.address, "address")
        if address < 0 or address % GLOBAL_ALIGN:
            raise ValueError(f"address = {address:#x}: the tensor must start {GLOBAL_ALIGN}-byte aligned")
        set_("address", address)

        rows, cols = _pair(self.shape, "shape", "(rows, cols)")
        for name, n in (("rows", rows), ("cols", cols)):
            if not 1 <= n <= MAX_GLOBAL_DIM:
                raise ValueError(f"shape: {name} = {n}; each dimension must be 1..2^32")
        set_("shape", (rows, cols))

        stride = _int(self.row_stride, "row_stride")
        if stride <= 0 or stride % GLOBAL_ALIGN:
            raise ValueError(f"row_stride = {stride}: must be a positive multiple of {GLOBAL_ALIGN} bytes")
        if stride >= MAX_GLOBAL_STRIDE:
            raise ValueError(f"row_stride = {stride}: must be below 2^40 bytes")
        if stride < cols * esize:
            raise ValueError(f"row_stride = {stride}: rows of {cols} {self.dtype} elements are "
                             f"{cols * esize} bytes long, so rows {stride} bytes apart would overlap")
        set_("row_stride", stride)

        box_rows, box_cols = _pair(self.box, "box", "(box_rows, box_cols)")
        for name, n in (("box_rows", box_rows), ("box_cols", box_cols)):
            if not 1 <= n <= MAX_BOX_DIM:
                raise ValueError(f"box: {name} = {n}; each box dimension must be 1..{MAX_BOX_DIM} elements")
        if (box_cols * esize) % BOX_INNER_ALIGN:
            raise ValueError(f"box: box_cols = {box_cols} {self.dtype} elements are {box_cols * esize} "
                             f"bytes; a box row must be a multiple of {BOX_INNER_ALIGN} bytes")
        if box_rows * box_cols * esize > MAX_BOX_BYTES:
            raise ValueError(f"box: {box_rows} x {box_cols} {self.dtype} elements are "
                             f"{box_rows * box_cols * esize} bytes; a box must fit one CTA's shared memory "
                             f"({MAX_BOX_BYTES} bytes on sm_90; the H200's driver refuses 256 KiB boxes)")
        set_("box", (box_rows, box_cols))

        l2 = _int(self.l2_promotion, "l2_promotion")
        if l2 not in CU_TENSOR_MAP_L2_PROMOTION:
            raise ValueError(f"l2_promotion = {l2}: must be 0 (none) or 128 (bytes)")
        set_("l2_promotion", l2)

        swz = _int(self.swizzle, "swizzle")
        if swz not in CU_TENSOR_MAP_SWIZZLE:
            raise ValueError(f"swizzle = {swz}: must be 0 (none), 32, 64 or 128 (bytes)")
        if swz and box_cols * esize != swz:
            raise ValueError(f"swizzle = {swz}: a box row of {box_cols} {self.dtype} elements is "
                             f"{box_cols * esize} bytes; ptx_lab swizzles only box rows of exactly "
                             f"{swz} bytes (the form its model and experiment check)")
        set_("swizzle", swz)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def box_bytes(self) -> int:
        """Bytes one copy moves, zero-filled elements included: what mbarrier.expect_tx expects."""
        return self.box[0] * self.box[1] * self.element_bytes

    @property
    def smem_align(self) -> int:
        """The alignment the box's shared-memory address needs: 128 bytes dense, 8 swizzle rows swizzled."""
        return max(SMEM_ALIGN, 8 * self.swizzle)

    @property
    def box_row_bytes(self) -> int:
        """Bytes of one box row in shared memory (rows follow each other densely)."""
        return self.box[1] * self.element_bytes

    def driver_args(self) -> dict[str, Any]:
        """The arguments of cuTensorMapEncodeTiled, innermost dimension first."""
        rows, cols = self.shape
        box_rows, box_cols = self.box
        return {
            "tensorDataType": CU_TENSOR_MAP_DATA_TYPE[self.dtype],
            "tensorRank": 2,
            "globalAddress": self.address,
            "globalDim": (cols, rows),
            "globalStrides": (self.row_stride,),   # rank - 1 strides: dimension 0's is the element
            "boxDim": (box_cols, box_rows),
            "elementStrides": (1, 1),
            "interleave": CU_TENSOR_MAP_INTERLEAVE_NONE,
            "swizzle": CU_TENSOR_MAP_SWIZZLE[self.swizzle],
            "l2Promotion": CU_TENSOR_MAP_L2_PROMOTION[self.l2_promotion],
            "oobFill": CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        }


# ---------------------------------------------------------------- the driver
# cuTensorMapEncodeTiled is called through cuda-bindings (cuda.bindings.driver, NVIDIA's
# Python bindings of the driver API) where that package is installed. The project does not
# require it (ptx-lab[cuda] installs CuPy only), so where it is missing the same call goes
# through hand-written ctypes into libcuda.so.1, and CuPy users without cuda-bindings still
# get tensor copies. Both paths hand the driver the same arguments (driver_args) and return
# the same 128 bytes: the GPU tests of tests/ptx_lab/test_tensormap.py compare them byte for
# byte on every map of DRIVER_PROBES.

BACKENDS = ("cuda-bindings", "ctypes")


@functools.lru_cache(maxsize=1)
def _bindings():
    """cuda.bindings.driver, or None where cuda-bindings is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


def backend() -> str:
    """Which path encode() takes by default: 'cuda-bindings' where installed, else 'ctypes'."""
    return BACKENDS[0] if _bindings() is not None else BACKENDS[1]


def _via(via: str | None) -> str:
    if via is None:
        return backend()
    if via not in BACKENDS:
        raise ValueError(f"via must be one of {', '.join(BACKENDS)} or None (the default); got {via!r}")
    if via == "cuda-bindings" and _bindings() is None:
        raise CudaDriverError("via='cuda-bindings': cuda-bindings is not installed "
                              "(pip install cuda-bindings; encode() falls back to ctypes without it)")
    return via


def _result(returned) -> Any:
    """cuda-bindings returns a tuple whose first item is the CUresult, even for one value."""
    return returned[0] if isinstance(returned, tuple) else returned


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    """libcuda.so.1 with cuInit and cuTensorMapEncodeTiled typed; CudaDriverError if unusable."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaDriverError(
            f"cannot load libcuda.so.1, the CUDA driver ({exc}); tensor maps are encoded by the "
            "driver, so encode() needs an NVIDIA GPU machine (ptx_lab.model needs none)") from exc
    try:
        encode_fn = lib.cuTensorMapEncodeTiled
    except AttributeError as exc:
        raise CudaDriverError("libcuda.so.1 has no cuTensorMapEncodeTiled: the driver predates "
                              "CUDA 12.0, which tensor maps need") from exc
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode_fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                          u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int]
    encode_fn.restype = ctypes.c_int
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuInit.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cuDriverGetVersion.restype = ctypes.c_int
    return lib


def _error_name(code: int, via: str | None = None) -> str:
    """CUDA_ERROR_... for a CUresult (cuGetErrorName), or 'CUresult' where that fails."""
    if _via(via) == "cuda-bindings":
        drv = _bindings()
        try:
            err, name = drv.cuGetErrorName(drv.CUresult(code))
        except ValueError:   # a code this cuda-bindings has no enum member for
            return "CUresult"
        return name.decode() if int(err) == CUDA_SUCCESS and name else "CUresult"
    lib = _driver()
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
        return name.value.decode()
    return "CUresult"


def driver_version(via: str | None = None) -> str:
    """The driver's CUDA version as cuDriverGetVersion gives it (13000 = 13.0), or why not."""
    via = _via(via)
    if via == "cuda-bindings":
        err, version = _bindings().cuDriverGetVersion()
        code, value = int(err), int(version)
    else:
        lib = _driver()
        out = ctypes.c_int()
        code, value = lib.cuDriverGetVersion(ctypes.byref(out)), out.value
    return str(value) if code == CUDA_SUCCESS else f"unknown ({_error_name(code, via)})"


def _encode_bindings(tmap: TensorMap2D) -> tuple[int, np.ndarray]:
    """cuTensorMapEncodeTiled through cuda.bindings.driver: (CUresult, the 128 bytes)."""
    drv = _bindings()
    code = int(_result(drv.cuInit(0)))   # a no-op once CuPy (or anyone) has initialised the driver
    if code != CUDA_SUCCESS:
        raise CudaDriverError(f"cuInit(0) returned {code} ({_error_name(code, 'cuda-bindings')})")
    args = tmap.driver_args()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, encoded = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(args["tensorDataType"]), args["tensorRank"], args["globalAddress"],
        [u64(v) for v in args["globalDim"]], [u64(v) for v in args["globalStrides"]],
        [u32(v) for v in args["boxDim"]], [u32(v) for v in args["elementStrides"]],
        drv.CUtensorMapInterleave(args["interleave"]), drv.CUtensorMapSwizzle(args["swizzle"]),
        drv.CUtensorMapL2promotion(args["l2Promotion"]), drv.CUtensorMapFloatOOBfill(args["oobFill"]))
    code = int(err)
    if code != CUDA_SUCCESS:
        return code, np.zeros(TENSOR_MAP_BYTES, dtype=np.uint8)
    # the CUtensorMap object owns its 128 bytes (the driver's 64-byte aligned struct)
    raw = ctypes.string_at(int(encoded.getPtr()), TENSOR_MAP_BYTES)
    return code, np.frombuffer(raw, dtype=np.uint8).copy()


def _encode_ctypes(tmap: TensorMap2D) -> tuple[int, np.ndarray]:
    """cuTensorMapEncodeTiled through ctypes into libcuda.so.1: (CUresult, the 128 bytes)."""
    lib = _driver()
    code = lib.cuInit(0)   # a no-op once CuPy (or anyone) has initialised the driver
    if code != CUDA_SUCCESS:
        raise CudaDriverError(f"cuInit(0) returned {code} ({_error_name(code, 'ctypes')})")
    args = tmap.driver_args()
    # The output must be 64-byte aligned: carve an aligned 128 bytes out of a larger buffer.
    raw = np.zeros(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % TENSOR_MAP_ALIGN
    out = raw[start:start + TENSOR_MAP_BYTES]
    assert out.ctypes.data % TENSOR_MAP_ALIGN == 0

    def array(ctype, values):
        return (ctype * len(values))(*values)

    code = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(out.ctypes.data), args["tensorDataType"], args["tensorRank"],
        ctypes.c_void_p(args["globalAddress"]),
        array(ctypes.c_uint64, args["globalDim"]), array(ctypes.c_uint64, args["globalStrides"]),
        array(ctypes.c_uint32, args["boxDim"]), array(ctypes.c_uint32, args["elementStrides"]),
        args["interleave"], args["swizzle"], args["l2Promotion"], args["oobFill"])
    return code, out.copy()


def _encode_call(tmap: TensorMap2D, via: str | None = None) -> tuple[int, np.ndarray]:
    """cuTensorMapEncodeTiled for `tmap` by `via` (default: backend()): (its CUresult, 128 bytes)."""
    return _encode_bindings(tmap) if _via(via) == "cuda-bindings" else _encode_ctypes(tmap)


def encode(tmap: TensorMap2D, *, via: str | None = None) -> np.ndarray:
    """cuTensorMapEncodeTiled for `tmap` -> the 128-byte map, shape (1,), dtype TENSOR_MAP_DTYPE.

    Pass the result straight to a CuPy kernel whose parameter is
    ``const __grid_constant__ ptx_lab::TensorMap``; ``.tobytes()`` gives the raw
    bytes. `tmap.address` must be a device pointer (0 is refused here).
    `via`: 'cuda-bindings' or 'ctypes'; None (default) takes cuda-bindings where it
    is installed (:func:`backend`). Raises CudaDriverError where the driver is
    missing or refuses.
    """
    if not isinstance(tmap, TensorMap2D):
        raise ValueError(f"tmap: expected a TensorMap2D; got {type(tmap).__name__}")
    if tmap.address == 0:
        raise ValueError("address = 0x0: encode() needs the tensor's device pointer, not NULL")
    via = _via(via)
    code, out = _encode_call(tmap, via)
    if code != CUDA_SUCCESS:
        raise CudaDriverError(f"cuTensorMapEncodeTiled returned {code} ({_error_name(code, via)}) "
                              f"for {tmap}, which ptx_lab.tensormap accepted: {tmap.driver_args()}")
    return out.view(TENSOR_MAP_DTYPE)


# ---------------------------------------------------------------- which boxes the driver takes

@dataclasses.dataclass(frozen=True)
class DriverProbe:
    """One map to hand the driver: a (rows, cols) tensor of `dtype` with rows padded to 16
    bytes, and its box. `why` says which question the row helps answer."""

    dtype: str
    shape: tuple[int, int]
    box: tuple[int, int]
    swizzle: int = 0
    why: str = ""

    @property
    def row_stride(self) -> int:
        return -(-self.shape[1] * ELEMENT_BYTES[self.dtype] // GLOBAL_ALIGN) * GLOBAL_ALIGN

    @property
    def tensor_bytes(self) -> int:
        return self.shape[0] * self.row_stride

    def tensor_map(self, address: int) -> TensorMap2D:
        return TensorMap2D(address, self.dtype, self.shape, self.row_stride, self.box, swizzle=self.swizzle)


# cuTensorMapEncodeTiled's documentation (cuda.h 13.0) limits each box dimension to 1..256 and
# the box row to a multiple of 16 bytes (at most the swizzle span when swizzled), and says
# nothing more about the box. On the H200 it still refused a float32 box of 256 x 256 on a
# (300, 8) tensor (CUDA_ERROR_INVALID_VALUE) and took a uint32 box of 256 x 4 on a (1, 4) one.
# These rows vary one thing at a time (the box row's bytes, the box's total bytes, a box wider
# or taller than the tensor, the swizzled maps Kernel A will use) so that the answers say which
# rule the driver applied. The first run (H200, driver 13000, 2026-11-30) accepted every box of
# up to 128 KiB, box rows of up to 1024 B, boxes wider or taller than the tensor and every
# swizzled map, and refused exactly the two 256 KiB boxes: the size, not the shape. Hence
# MAX_BOX_BYTES (one CTA's shared memory), and these rows between 128 and 227 KiB, which
# narrow down the driver's own limit.
DRIVER_PROBES: tuple[DriverProbe, ...] = (
    DriverProbe("float32", (16, 64), (16, 64), why="box row 256 B, 4 KiB"),
    DriverProbe("float32", (16, 128), (16, 128), why="box row 512 B, 8 KiB"),
    DriverProbe("float32", (16, 256), (16, 256), why="box row 1024 B, 16 KiB"),
    DriverProbe("bfloat16", (16, 256), (16, 256), why="box row 512 B in bf16"),
    DriverProbe("float32", (256, 32), (256, 32), why="256 rows of 128 B, 32 KiB"),
    DriverProbe("float32", (256, 64), (256, 64), why="256 rows of 256 B, 64 KiB"),
    DriverProbe("float32", (256, 128), (256, 128), why="256 rows of 512 B, 128 KiB"),
    DriverProbe("float32", (256, 160), (256, 160), why="256 rows of 640 B, 160 KiB"),
    DriverProbe("float32", (256, 192), (256, 192), why="256 rows of 768 B, 192 KiB"),
    DriverProbe("float32", (256, 224), (256, 224), why="256 rows of 896 B, 224 KiB"),
    DriverProbe("bfloat16", (256, 256), (256, 256), why="256 rows of 512 B in bf16, 128 KiB"),
    DriverProbe("uint32", (1, 4), (256, 4), why="box taller than the tensor (the H200 took it)"),
    DriverProbe("float32", (1, 64), (256, 64), why="box taller than the tensor, 64 KiB"),
    DriverProbe("float32", (16, 8), (16, 64), why="box row wider than the tensor's, 256 B"),
    DriverProbe("float32", (16, 8), (16, 256), why="box row wider than the tensor's, 1024 B"),
    DriverProbe("float32", (300, 8), (256, 200), why="the refused case's shape, 200 KiB"),
    DriverProbe("bfloat16", (40, 512), (16, 64), 128, why="Kernel A: do, 128-byte swizzle"),
    DriverProbe("bfloat16", (40, 512), (16, 32), 64, why="Kernel A: do, 64-byte swizzle"),
    DriverProbe("bfloat16", (40, 512), (16, 16), 32, why="32-byte swizzle, bf16"),
    DriverProbe("float32", (40, 128), (16, 32), 128, why="Kernel A: fp32 snapshot, 128-byte swizzle"),
    DriverProbe("float32", (40, 128), (16, 16), 64, why="Kernel A: fp32 snapshot, 64-byte swizzle"),
    DriverProbe("float32", (40, 128), (16, 8), 32, why="Kernel A: fp32 snapshot, 32-byte swizzle"),
    DriverProbe("bfloat16", (256, 64), (256, 64), 128, why="256 rows, 128-byte swizzle, 32 KiB"),
)

PROBE_HEADER = ("#", "dtype", "shape", "row_stride", "box", "swizzle", "box row B", "box B",
                "wider", "taller", "driver", "why")


def probe_driver(address: int, probes: tuple[DriverProbe, ...] = DRIVER_PROBES) -> list[tuple[str, ...]]:
    """Hands each probe's map (tensor at device pointer `address`) to cuTensorMapEncodeTiled.

    Returns one row per probe, PROBE_HEADER's columns: "wider"/"taller" say whether the
    box's row / its row count exceeds the tensor's, "driver" is "accepted",
    "CUDA_ERROR_... (code)", or "refused by TensorMap2D: ..." (which none of
    DRIVER_PROBES should be). Raises CudaDriverError where there is no driver at all.
    """
    rows = []
    for n, probe in enumerate(probes):
        esize = ELEMENT_BYTES[probe.dtype]
        try:
            tmap = probe.tensor_map(address)
        except ValueError as exc:
            answer = f"refused by TensorMap2D: {exc}"
        else:
            code, _ = _encode_call(tmap)
            answer = "accepted" if code == CUDA_SUCCESS else f"{_error_name(code)} ({code})"
        rows.append((str(n), probe.dtype, f"{probe.shape[0]}x{probe.shape[1]}", str(probe.row_stride),
                     f"{probe.box[0]}x{probe.box[1]}", str(probe.swizzle), str(probe.box[1] * esize),
                     str(probe.box[0] * probe.box[1] * esize),
                     "yes" if probe.box[1] > probe.shape[1] else "no",
                     "yes" if probe.box[0] > probe.shape[0] else "no", answer, probe.why))
    return rows


def format_table(rows: list[tuple[str, ...]], header: tuple[str, ...] = PROBE_HEADER) -> str:
    """Left-aligned columns two spaces apart, the header and a rule first."""
    widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
             for r in (header, tuple("-" * w for w in widths), *rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None, allocate=None) -> int:
    """``python -m ptx_lab.tensormap --probe-driver``: which of DRIVER_PROBES the driver encodes.

    `allocate(nbytes) -> (device pointer, device name, object keeping the memory alive)`;
    by default CuPy's. Exit status 0 whatever the driver answers, 2 without a GPU.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ptx_lab.tensormap",
                                     description="Host side of the tensor copies (tma.cuh).")
    parser.add_argument("--probe-driver", action="store_true",
                        help="hand cuTensorMapEncodeTiled each box of DRIVER_PROBES (on a GPU machine) "
                             "and print which it accepts")
    args = parser.parse_args(argv)
    if not args.probe_driver:
        parser.print_help()
        return 0
    if allocate is None:
        from .gpu import gpu_reason

        reason = gpu_reason()
        if reason is not None:
            print(f"--probe-driver needs a GPU machine with CuPy (the driver wants a context and a "
                  f"device pointer): {reason}", file=sys.stderr)
            return 2
        import cupy

        def allocate(nbytes):
            buf = cupy.zeros(nbytes, dtype=cupy.uint8)
            name = cupy.cuda.runtime.getDeviceProperties(buf.device.id)["name"]
            return buf.data.ptr, name.decode() if isinstance(name, bytes) else str(name), buf
    address, device, _memory = allocate(max(p.tensor_bytes for p in DRIVER_PROBES))   # kept to the end
    try:
        version = driver_version()
        rows = probe_driver(address)
    except CudaDriverError as exc:
        print(f"--probe-driver: {exc}", file=sys.stderr)
        return 2
    print(f"cuTensorMapEncodeTiled on {len(rows)} boxes ({device}, driver {version} through "
          f"{backend()}; tensor at {address:#x}, rows padded to 16 B):")
    print(format_table(rows))
    return 0


__all__ = ["TENSOR_MAP_BYTES", "TENSOR_MAP_ALIGN", "TENSOR_MAP_DTYPE", "SMEM_ALIGN", "DTYPES",
           "ELEMENT_BYTES", "CudaDriverError", "TensorMap2D", "dtype_name", "encode", "BACKENDS",
           "backend", "DriverProbe",
           "DRIVER_PROBES", "PROBE_HEADER", "probe_driver", "format_table", "driver_version", "main"]


if __name__ == "__main__":
    sys.exit(main())
