"""One description of a kernel's build, and the launch helpers every kernel shares.

A :class:`KernelBuild` says everything the API, the tools and CI need to compile a kernel:

* its entry file, and the headers beside it that belong to it (a glob);
* the text a compile cache sees: the entry file with a digest of those headers, kernel/shapes.cuh
  and ptx_lab's as its first line (CuPy keys its on-disk cache on the text and the options only,
  so a header change alone would otherwise load the cubin built before it);
* its default variant, its options for one variant, every variant the API can launch, and the SASS instructions
  each variant must hold;
* the constants it exports (``<prefix>_smem_bytes``, ``<prefix>_threads``), which the launch
  reads back instead of recomputing the source's layout on the host.

The other helpers here are what launches share: the SM count, one side stream per device, the
longest-first CTA order of a batch and its device tables.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ptx_lab import CUDA_INCLUDE_DIR

from ..shapes import TILE_TOKENS, snapshot_offsets

__all__ = ["KernelBuild", "SHAPES_HEADER", "read_int_constants", "kernel_function", "sm_count", "side_stream",
           "serial_stream", "HIGHEST_PRIORITY", "side_by_side", "longest_first", "device_tables",
           "check_choice", "check_flags"]

# The shapes every kernel's device source includes (as "../../shapes.cuh" from its cuda/ folder, so
# that nvcc on the entry file and NVRTC through the folder's -I both find it with no -I of its own)
SHAPES_HEADER = Path(__file__).resolve().parents[1] / "shapes.cuh"


def check_choice(cfg, name: str, allowed: tuple[int, ...]) -> None:
    """A kernel Config's knob ``name``: an integer (a bool is not one) among ``allowed``, or a ValueError naming it."""
    value = getattr(cfg, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value not in allowed:
        raise ValueError(f"Config.{name} must be one of {allowed}, got {value!r}")


def check_flags(cfg, *names: str) -> None:
    """A kernel Config's switches ``names``: each True or False, or a ValueError naming it."""
    for name in names:
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"Config.{name} must be True or False, got {getattr(cfg, name)!r}")


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    title: str                                   # what errors and reports call it, e.g. "Kernel A"
    entry: Path                                  # the entry file; its own headers sit beside it
    headers: str | tuple[str, ...]               # glob(s), beside the entry file, of the headers it includes:
                                                 # its own, and any it shares with another kernel's room
                                                 # ("../../forward_states/cuda/forward_states_chain.cuh")
    function: str                                # the __global__ function's name
    constants: str                               # prefix of its exported smem / threads constants
    default: Callable[[], Any]                   # the API's default variant: what CI compiles the entry with
    options: Callable[[Any], tuple[str, ...]]    # variant -> nvcc / NVRTC options
    variants: Callable[[], list]                 # every variant the API can launch
    label: Callable[[Any], str]                  # variant -> its row name in reports
    required_sass: Callable[[Any], tuple[str, ...]]   # variant -> SASS mnemonics it must hold

    def header_paths(self) -> list[Path]:
        """The headers ``headers`` names (beside the entry file, or reached from there), each once."""
        patterns = (self.headers,) if isinstance(self.headers, str) else self.headers
        return sorted({p for pattern in patterns for p in self.entry.parent.glob(pattern)})

    def header_digest(self) -> str:
        """sha256 over the kernel's headers (``headers``), kernel/shapes.cuh and ptx_lab's, names and contents."""
        h = hashlib.sha256()
        patterns = (self.headers,) if isinstance(self.headers, str) else self.headers
        for base, pattern in (*((self.entry.parent, p) for p in patterns), (SHAPES_HEADER.parent, SHAPES_HEADER.name),
                              (Path(CUDA_INCLUDE_DIR), "*.cuh")):
            for path in sorted(base.glob(pattern)):
                h.update(f"{base.name}/{path.name}\0".encode())
                h.update(path.read_bytes())
                h.update(b"\0")
        return h.hexdigest()

    def source(self) -> str:
        """The entry file's text with :meth:`header_digest` as a first-line comment."""
        return f"// headers sha256 {self.header_digest()}\n" + self.entry.read_text()

    def module(self, variant):
        """The compiled cupy.RawModule of one variant (cached per process by ptx_lab.gpu)."""
        from ptx_lab.gpu import load_module

        return load_module(self.source(), self.options(variant))


def read_int_constants(mod, name: str, count: int) -> tuple[int, ...]:
    """The `count` ints of the module's `extern "C" __constant__ int name[count]` (or a scalar, count 1)."""
    import cupy

    return tuple(int(v) for v in cupy.ndarray((count,), dtype=np.int32, memptr=mod.get_global(name)).get())


def kernel_function(build: KernelBuild, mod, *, label: str, threads_expected: int | None = None,
                    advice: str = ""):
    """(function, shared memory bytes, threads) of a module's kernel, from the module's own
    ``<prefix>_smem_bytes`` and ``<prefix>_threads`` constants: the threads checked against the
    host's expectation, the shared memory against this GPU's opt-in limit (``label`` names the
    build in the errors, ``advice`` says what to change), then requested for every launch."""
    import cupy

    fn = mod.get_function(build.function)
    (smem,) = read_int_constants(mod, f"{build.constants}_smem_bytes", 1)
    (threads,) = read_int_constants(mod, f"{build.constants}_threads", 1)
    if threads_expected is not None and threads != threads_expected:
        raise RuntimeError(f"{label} was built with {threads} threads per CTA, its Config expects {threads_expected}")
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if smem > limit:
        raise ValueError(f"{label} needs {smem} B of shared memory per CTA, this GPU allows {limit} B{advice}")
    fn.max_dynamic_shared_size_bytes = smem
    return fn, smem, threads


def sm_count() -> int:
    """The current device's SM count (cached per device)."""
    import cupy

    return _sm_count_of(cupy.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_id: int) -> int:
    import cupy

    # Device.attributes queries every attribute the driver has (host time on every call)
    return cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMultiProcessorCount, device_id)


@functools.lru_cache(maxsize=None)
def side_stream(device_id: int):
    """One non-blocking stream per device, beside the caller's: where a second kernel runs at once."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


# CUDA clamps a stream priority outside the device's range (cudaDeviceGetStreamPriorityRange: 0 to -5 on
# an H200; lower runs first) to the range's nearest end, so this number asks for the highest
HIGHEST_PRIORITY = -(1 << 16)


@functools.lru_cache(maxsize=None)
def serial_stream(device_id: int):
    """One non-blocking stream per device at its highest priority, beside the caller's: for a serial path
    that other work runs around. Where both have CTAs waiting, the block scheduler gives this stream's
    the SMs that free up first, so the serial path does not queue behind the wide work."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True, priority=HIGHEST_PRIORITY)


def side_by_side(first, second) -> None:
    """first() on the side stream beside second() on the current one; the current stream then
    waits for both (the side stream allocates nothing: the callers' buffers are made before)."""
    import cupy

    main = cupy.cuda.get_current_stream()
    side = side_stream(cupy.cuda.Device().id)
    side.wait_event(main.record())
    with side:
        first()
    second()
    main.wait_event(side.record())


def longest_first(lengths: np.ndarray) -> np.ndarray:
    """The CTA order of a launch: indices of ``lengths``, longest first (ties in index order), so
    that a varlen batch's tail is not one long scan started last."""
    return np.argsort(-lengths, kind="stable").astype(np.int32)


@functools.lru_cache(maxsize=64)
def _device_tables(cu_bytes: bytes, snapshot_every: int):
    import cupy

    cu = np.frombuffer(cu_bytes, dtype=np.int64)
    lengths = np.diff(cu)
    offs = snapshot_offsets(lengths, TILE_TOKENS, snapshot_every)
    return cupy.asarray(cu), cupy.asarray(offs), cupy.asarray(longest_first(lengths)), int(offs[-1])


def device_tables(cu_seqlens: np.ndarray, snapshot_every: int):
    """(cu_seqlens, snapshot offsets, CTA order, total snapshots) of a batch layout on the device:
    host int64 offsets in, cached per layout (a host-to-device copy per call would stall the host
    inside a timed region)."""
    return _device_tables(np.ascontiguousarray(cu_seqlens, dtype=np.int64).tobytes(), snapshot_every)
