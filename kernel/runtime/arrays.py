"""The torch / CuPy bridge, and the one style in which every entry point checks its arrays.

Every kernel takes device arrays: CuPy arrays (bf16 as uint16 arrays of the bf16 bits, since
CuPy has no bf16 dtype: :func:`bf16_bits` makes them) or torch CUDA tensors, which are viewed
in place (:func:`cupy_view`, no copy) and answered with torch tensors from torch's allocator.
The launch goes through CuPy, for torch tensors too.

The checks come in two steps, both host work that reads no tensor data:

* :func:`describe` says what an argument is (shape, dtype, contiguity, device, address) without
  CuPy or a GPU, refusing host arrays with advice the entry point words; :func:`leading`,
  :func:`expect` and :func:`value_heads` judge it, each error naming the argument;
* :func:`to_cupy` turns a checked argument into the CuPy array the launch passes.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import numpy as np

from ..shapes import HEAD_DIM

CUDA_INSTALL = "pip install -e '.[cuda]'"   # pyproject's cuda extra: cupy-cuda13x
DTYPE_WORDS = {"bfloat16": "bf16 (torch.bfloat16, or uint16 bf16 bits in CuPy)", "float16": "float16",
               "float32": "float32"}

__all__ = ["ArrayInfo", "describe", "leading", "expect", "value_heads", "check_scale", "is_torch", "require_cupy",
           "require_gpu", "torch_gpu_reason", "cupy_view", "empty_output", "to_cupy", "torch_allocations", "torch_stream_for_cupy",
           "beta_f32", "bf16_bits", "bits_to_f32", "CUDA_INSTALL"]


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


# ----------------------------------------------------------------------------
# what an argument is, without CuPy or a GPU
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    shape: tuple[int, ...]
    dtype: str            # "bfloat16" for torch.bfloat16 and for CuPy's uint16 bf16 bits
    contiguous: bool
    device: int | None    # None: the object does not say (a bare CUDA-array-interface object)
    ptr: int
    torch: bool


def _c_contiguous(shape: tuple[int, ...], strides, itemsize: int) -> bool:
    if strides is None:
        return True
    expect_stride = itemsize
    for n, s in zip(reversed(shape), reversed(tuple(strides))):
        if n != 1 and s != expect_stride:
            return False
        expect_stride *= n
    return True


def describe(name: str, x: Any, host_advice: str) -> ArrayInfo:
    """Shape, dtype, layout and device of a torch CUDA tensor or a CUDA-array-interface object (a
    CuPy array). numpy and other host arrays are refused, the error ending in ``host_advice``
    (formatted with ``name``): what the caller takes instead."""
    on_host = hasattr(x, "__array_interface__") and not hasattr(x, "__cuda_array_interface__")
    if isinstance(x, np.ndarray) or (on_host and not is_torch(x)):
        raise TypeError(f"{name} is a {type(x).__module__}.{type(x).__name__} (host memory): "
                        + host_advice.format(name=name))
    if is_torch(x):
        if not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device} (use .cuda())")
        dtype = str(x.dtype).removeprefix("torch.")
        return ArrayInfo(tuple(x.shape), dtype, bool(x.is_contiguous()), x.device.index, int(x.data_ptr()), True)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{name} must be a CuPy array or a torch CUDA tensor, got {type(x).__name__}")
    shape = tuple(int(n) for n in cai["shape"])
    dt = np.dtype(cai["typestr"])
    dtype = "bfloat16" if dt == np.uint16 else dt.name   # CuPy has no bf16: its bits as uint16
    device = getattr(getattr(x, "device", None), "id", None)
    return ArrayInfo(shape, dtype, _c_contiguous(shape, cai.get("strides"), dt.itemsize), device,
                     int(cai["data"][0]), False)


def leading(name: str, a: ArrayInfo) -> tuple[int, int, int]:
    """(B, T, H) of the array that fixes the batch: 4-D [B, T, H, 128], B, T, H >= 1."""
    if len(a.shape) != 4:
        raise ValueError(f"{name} must be 4-D [B, T, H, {HEAD_DIM}], got shape {a.shape}")
    B, T, H, last = a.shape
    if last != HEAD_DIM:
        raise ValueError(f"{name}'s head dimension must be {HEAD_DIM}, got {last} (shape {a.shape})")
    if min(B, T, H) < 1:
        raise ValueError(f"{name} must have B, T, H >= 1, got shape {a.shape}")
    return B, T, H


def expect(name: str, a: ArrayInfo, shape: tuple, layout: str, dtypes: tuple[str, ...]) -> None:
    """ValueError / TypeError naming ``name`` unless it has this shape, one of these dtypes and is C-contiguous."""
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({layout}), got {a.shape}")
    if a.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(DTYPE_WORDS[d] for d in dtypes)}, got {a.dtype}")
    if not a.contiguous:
        raise ValueError(f"{name} must be C-contiguous (call .contiguous() / cupy.ascontiguousarray)")


def value_heads(name: str, a: ArrayInfo, B: int, T: int, H: int, qk_name: str = "q") -> int:
    """HV, the heads of ``a``, a per-value-head array ([B, T, HV, ..]: v, do, the gate, beta, Aqk, Akk)
    beside ``qk_name``'s [B, T, H, ..] (q's, or k's): H, or a multiple of it (FLA's grouped value heads,
    GVA: value head hv reads q and k at head kernel.shapes.qk_head(hv, HV, H) = hv // (HV / H)).
    ValueError naming both arrays and their heads otherwise. An array of another rank or batch is left
    to :func:`expect`, which names its shape (H comes back)."""
    if len(a.shape) < 3 or a.shape[:2] != (B, T):
        return H
    HV = a.shape[2]
    if HV < H or HV % H:
        raise ValueError(
            f"{name} has {HV} heads and {qk_name} has {H}: the value heads must be {qk_name}'s heads or a "
            f"multiple of them (FLA's grouped value heads: value head hv reads q and k at head hv // (HV / H))")
    return HV


def check_scale(scale: Any) -> float | None:
    """``scale`` as a float, or None (each kernel's default): a finite real number > 0."""
    if scale is None:
        return None
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    if not 0 < scale < np.inf:   # NaN fails too; comparisons, not np.isfinite, so that torch.compile traces it
        raise ValueError(f"scale must be finite and > 0 (the forward's q scale), got {scale}")
    return float(scale)


# ----------------------------------------------------------------------------
# CuPy and the GPU
# ----------------------------------------------------------------------------

def require_cupy(what: str = "this call"):
    """cupy, or ModuleNotFoundError saying what (``what``) needs it and how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{what} needs CuPy, which is not installed: the kernels are compiled and launched through CuPy "
            f"(for torch tensors too). Install it with {CUDA_INSTALL} (cupy-cuda13x, for CUDA 13 drivers) "
            "on a machine with a CUDA GPU (the kernels are built for sm_90a: H100/H200). "
            "kernel.reference runs the same math in float64 on the CPU.", name="cupy") from exc
    return cupy


def require_gpu(what: str) -> None:
    """RuntimeError naming why, where CuPy finds no usable GPU (cached: no cost per call)."""
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        raise RuntimeError(f"{what} needs a CUDA GPU: {reason}")


def torch_gpu_reason() -> str | None:
    """None when torch imports and sees a CUDA device, else why not (one line): for a study or tool that times
    through torch's events and allocator."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


def _torch_numpy_dtype(torch_dtype):
    """The numpy dtype a CuPy view of a torch tensor gets (bf16 -> its uint16 bits), or None."""
    import torch

    return {torch.bfloat16: np.uint16, torch.float32: np.float32, torch.float64: np.float64,
            torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64,
            torch.int16: np.int16, torch.uint8: np.uint8}.get(torch_dtype)


def cupy_view(x):
    """A CuPy array over a contiguous torch CUDA tensor's memory (no copy; keeps `x` alive).

    Built from the data pointer rather than through DLPack: torch's __dlpack__ costs ~80 us of
    host time a tensor on the H200 machine's CPU (profiled), which made the host, not the GPU,
    the longer part of a call at small shapes."""
    import cupy

    dtype = _torch_numpy_dtype(x.dtype)
    if dtype is None:
        return cupy.from_dlpack(x)                  # another dtype: to_cupy's check names it
    if x.numel() == 0:
        return cupy.empty(tuple(x.shape), dtype=dtype)
    if not x.is_contiguous():
        raise ValueError("a CuPy view needs a contiguous tensor")
    mem = cupy.cuda.UnownedMemory(x.data_ptr(), x.numel() * x.element_size(), x, x.device.index)
    return cupy.ndarray(tuple(x.shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


# empty_output's dtypes: the word -> (torch's dtype name, CuPy's dtype; bf16 as its uint16 bits)
OUTPUT_DTYPES = {"bf16": ("bfloat16", np.uint16), "f16": ("float16", np.float16), "f32": ("float32", np.float32)}


def empty_output(shape: tuple, dtype: str, device=None):
    """An uninitialised output: (what the caller gets, its CuPy view). A torch tensor on ``device`` from
    torch's caching allocator (on torch's current stream) where ``device`` is given, else a CuPy array;
    ``dtype`` one of :data:`OUTPUT_DTYPES` (bf16 as uint16 bits in CuPy)."""
    import cupy

    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(OUTPUT_DTYPES)}, got {dtype!r}")
    torch_name, cupy_dtype = OUTPUT_DTYPES[dtype]
    if device is not None:
        import torch

        t = torch.empty(shape, dtype=getattr(torch, torch_name), device=device)
        return t, cupy_view(t)
    c = cupy.empty(shape, dtype=cupy_dtype)
    return c, c


@contextlib.contextmanager
def torch_allocations(device) -> Iterator[None]:
    """Inside the block, CuPy's allocations on this thread come from torch's caching allocator on
    ``device`` (a torch.device), on torch's current stream: a torch caller's scratch is then memory
    torch counts (``torch.cuda.max_memory_allocated``) and reuses, not memory parked in CuPy's pool.
    Each allocation is a uint8 tensor that the CuPy memory keeps alive; freed, it goes back to torch's
    pool on the stream it was made on, so work that uses it must run on that stream, or be joined
    back to it before the array is dropped."""
    import cupy
    import torch

    def allocate(size: int):
        t = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), int(size), t, t.device.index), 0)

    with cupy.cuda.using_allocator(allocate):
        yield


class _StreamHandle:
    """A raw stream handle in the CUDA stream protocol (``__cuda_stream__``: version 0 and the handle), the
    form CuPy's ``Stream.from_external`` takes; torch's own streams implement it only in recent releases."""

    def __init__(self, handle: int) -> None:
        self.handle = int(handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def torch_stream_for_cupy(what: str = "this call"):
    """torch's current stream as a CuPy stream (a context manager: inside it CuPy launches there), so that a
    kernel is ordered with torch's work and a CUDA graph capture on that stream takes it in. The stream
    stays torch's: CuPy neither creates nor destroys it."""
    cupy = require_cupy(what)
    import torch

    handle = torch.cuda.current_stream().cuda_stream
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:   # CuPy before 14: ExternalStream, which 14 deprecates for from_external
        return cupy.cuda.ExternalStream(handle)
    return from_external(_StreamHandle(handle))


def to_cupy(name: str, x: Any, want: str):
    """-> cupy array; `want` is 'bf16', 'f16', 'f32', 'f32|bf16' or 'int'. bf16 comes back as uint16 bits."""
    import cupy

    if is_torch(x):
        if not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be C-contiguous (call .contiguous() / cupy.ascontiguousarray)")
        x = cupy_view(x)
    elif not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}")
    if x.device.id != cupy.cuda.Device().id:
        raise ValueError(f"{name} is on device {x.device.id}, the current device is {cupy.cuda.Device().id}")
    ok = {"bf16": x.dtype == np.uint16,
          "f16": x.dtype == np.float16,
          "f32": x.dtype == np.float32,
          "f32|bf16": x.dtype in (np.float32, np.uint16),
          "int": x.dtype in (np.int32, np.int64)}[want]
    if not ok:
        expected = {"bf16": "bf16 (uint16 bits in CuPy, torch.bfloat16)", "f16": "float16", "f32": "float32",
                    "f32|bf16": "float32 or bf16", "int": "int32 or int64"}[want]
        raise TypeError(f"{name} must be {expected}, got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (call .contiguous() / cupy.ascontiguousarray)")
    return x


def beta_f32(beta):
    """beta as a float32 CuPy array: bf16 is widened, because every kernel copies beta with
    4-byte cp.async (a token's beta alone, H * 4 bytes from the next token's)."""
    b = to_cupy("beta", beta, "f32|bf16")
    return bits_to_f32(b) if b.dtype == np.uint16 else b


# ----------------------------------------------------------------------------
# bf16 bits
# ----------------------------------------------------------------------------

def bf16_bits_rne(xp, x):
    """float -> uint16 bf16 bits in module ``xp`` (numpy or CuPy): round to nearest even, and a NaN
    becomes the quiet NaN of its sign (0x7FC0 / 0xFFC0), as ml_dtypes does: the rounding carry
    alone would turn 0x7FFFFFFF into 0x8000 (-0) and 0x7F800001 into inf."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))) >> 16
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    quiet = ((u >> 16) & xp.uint32(0x8000)) | xp.uint32(0x7FC0)
    return xp.where(nan, quiet, rounded).astype(xp.uint16)


def bf16_bits(x):
    """float array (numpy or CuPy) -> uint16 bf16 bits, round to nearest even, NaN kept NaN.
    On the host this is ml_dtypes' bfloat16 conversion; on the device the same rule in CuPy."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return bf16_bits_rne(cupy, x)
    import ml_dtypes

    with np.errstate(invalid="ignore"):   # numpy warns on every NaN it casts, which is no error here
        return np.ascontiguousarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def bits_to_f32(bits):
    """uint16 bf16 bits (numpy or CuPy) -> float32 (exact)."""
    return (bits.astype("uint32") << 16).view("float32")
