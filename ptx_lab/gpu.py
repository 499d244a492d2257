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


# Devices whose architecture-specific target ("a": features that are not forward
# compatible, such as setmaxnreg and wgmma) NVRTC should build for. CuPy asks NVRTC
# for the plain target (sm_90 on an H100/H200: measured, __CUDA_ARCH_FEAT_SM90_ALL
# is then undefined); an -arch option of ours replaces it.
ARCH_SPECIFIC = {"90": "sm_90a"}


def arch_options(backend: str, compute_capability: str) -> tuple[str, ...]:
    """The -arch option NVRTC gets for a device of `compute_capability` ("90")."""
    target = ARCH_SPECIFIC.get(compute_capability)
    # CuPy's nvcc backend passes its own -gencode, and a second target is an error
    return (f"-arch={target}",) if backend == "nvrtc" and target else ()


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
    arch = arch_options(backend, cupy.cuda.Device().compute_capability)
    mod = cupy.RawModule(code=source, options=compile_options(options) + arch, backend=backend,
                         name_expressions=list(name_expressions) if name_expressions else None)
    mod.compile()
    return mod
