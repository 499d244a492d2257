"""Finding a GPU and compiling CUDA sources that include ptx_lab's headers.

Everything that runs device code goes through :func:`load_module`, so that the
experiments, the tests and Kernel A compile the same headers the same way.
Importing this module never needs CuPy or a GPU.
"""
from __future__ import annotations

import functools
from typing import Sequence

from . import CUDA_INCLUDE_DIR


@functools.lru_cache(maxsize=1)
def gpu_reason() -> str | None:
    """None when a CUDA GPU is usable through CuPy, else why not (one line)."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or a device
        return f"no CUDA device ({exc.__class__.__name__}: {exc})"
    if n == 0:
        return "no CUDA device"
    return None


def has_gpu() -> bool:
    return gpu_reason() is None


def compile_options(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """NVRTC/nvcc options shared by every module: C++17 and the header path."""
    return ("-std=c++17", f"-I{CUDA_INCLUDE_DIR}", *extra)


@functools.lru_cache(maxsize=None)
def load_module(source: str, options: tuple[str, ...] = (), backend: str = "nvrtc",
                name_expressions: tuple[str, ...] | None = None):
    """Compile `source` (which may #include "mma.cuh" etc.) into a cupy.RawModule.

    Cached per (source, options, backend): a configuration compiles once per
    process. `backend` is "nvrtc" (default) or "nvcc".
    """
    import cupy

    if backend not in ("nvrtc", "nvcc"):
        raise ValueError(f"backend must be 'nvrtc' or 'nvcc', got {backend!r}")
    mod = cupy.RawModule(code=source, options=compile_options(options), backend=backend,
                         name_expressions=list(name_expressions) if name_expressions else None)
    mod.compile()
    return mod
