"""Kernel A behind an array API: validation, output allocation, launch.

    snapshots, dh0 = dstate_scan(q, k, gc, beta, mqk, inv, do, ...)

Inputs are device arrays: CuPy arrays (bf16 tensors as uint16 arrays holding the
bf16 bits, since CuPy has no bf16 dtype: :func:`bf16_bits` makes them) or torch
CUDA tensors (viewed in place, without a copy; results come back as torch tensors,
bf16 as torch.bfloat16, allocated by torch). numpy arrays and CPU tensors are
refused with a TypeError that says so. The launch goes through CuPy, for torch
tensors too: without CuPy the call raises ModuleNotFoundError naming the install
(``pip install -e '.[cuda]'``, i.e. cupy-cuda13x, and a CUDA GPU).
The kernel runs on CuPy's current stream: when torch works on a stream other than
the default one, point CuPy at it first (``with cupy.cuda.ExternalStream(
torch.cuda.current_stream().cuda_stream): ...``, as kernel.bench does).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from . import build, split
from .build import CHUNK, D, Config
from .reference.checks import FLA_CHUNK   # with fla_inputs, mqk / inv are FLA's Aqk / Akk: FLA_CHUNK columns

SNAPSHOT_DTYPES = ("float32", "bfloat16")
CUDA_INSTALL = "pip install -e '.[cuda]'"   # pyproject's cuda extra: cupy-cuda13x
ARRAY_KINDS = ("CuPy arrays (bf16 as uint16 bits: kernel.api.bf16_bits) or torch CUDA tensors "
               "(torch.bfloat16 / torch.float32)")


# ----------------------------------------------------------------------------
# array plumbing
# ----------------------------------------------------------------------------

def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_numpy_dtype(torch_dtype):
    """The numpy dtype a CuPy view of a torch tensor gets (bf16 -> its uint16 bits), or None."""
    import torch

    return {torch.bfloat16: np.uint16, torch.float32: np.float32, torch.float64: np.float64,
            torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64,
            torch.int16: np.int16, torch.uint8: np.uint8}.get(torch_dtype)


def _require_cupy():
    """cupy, or ModuleNotFoundError saying what is missing and how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ModuleNotFoundError(
            "kernel.dstate_scan needs CuPy, which is not installed: Kernel A is compiled and launched "
            f"through CuPy (for torch tensors too). Install it with {CUDA_INSTALL} (cupy-cuda13x, for "
            "CUDA 13 drivers) on a machine with a CUDA GPU (Kernel A is built for sm_90a: H100/H200). "
            "kernel.reference runs the same math in float64 on the CPU.", name="cupy") from exc
    return cupy


def _require_gpu() -> None:
    """RuntimeError naming why, where CuPy finds no usable GPU (cached: no cost per call)."""
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        raise RuntimeError(f"kernel.dstate_scan needs a CUDA GPU: {reason}")


def _check_device_arrays(**arrays) -> None:
    """Host arrays are refused by name before CuPy is needed: numpy arrays and CPU tensors."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray):
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got a numpy.ndarray: Kernel A "
                f"runs on the GPU and takes device arrays, {ARRAY_KINDS}. Move it first, e.g. "
                f"cupy.asarray(kernel.api.bf16_bits({name})) for a bf16 input, cupy.asarray({name}) for "
                f"a float32 one, or torch.from_numpy({name}).cuda()")
        if _is_torch(x) and not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device}: Kernel A "
                            f"takes device arrays, {ARRAY_KINDS} (move it with .cuda())")


def _cupy_view(x):
    """A CuPy array over a contiguous torch CUDA tensor's memory (no copy; keeps `x` alive).

    Built from the data pointer rather than through DLPack: torch's __dlpack__ costs
    ~80 us of host time a tensor on the H200 machine's CPU (profiled), which made the
    host, not the GPU, the longer part of a call at small shapes."""
    import cupy

    dtype = _torch_numpy_dtype(x.dtype)
    if dtype is None:
        return cupy.from_dlpack(x)                  # another dtype: _to_cupy's check names it
    if x.numel() == 0:
        return cupy.empty(tuple(x.shape), dtype=dtype)
    if not x.is_contiguous():
        raise ValueError("a CuPy view needs a contiguous tensor")
    mem = cupy.cuda.UnownedMemory(x.data_ptr(), x.numel() * x.element_size(), x, x.device.index)
    return cupy.ndarray(tuple(x.shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _to_cupy(name: str, x: Any, want: str):
    """-> cupy array; `want` is 'bf16', 'f32', 'f32|bf16' or 'int'. bf16 comes back as uint16 bits."""
    import cupy

    if _is_torch(x):
        if not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be C-contiguous (call .contiguous() / cupy.ascontiguousarray)")
        x = _cupy_view(x)
    elif not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}")
    if x.device.id != cupy.cuda.Device().id:
        raise ValueError(f"{name} is on device {x.device.id}, the current device is {cupy.cuda.Device().id}")
    ok = {"bf16": x.dtype == np.uint16,
          "f32": x.dtype == np.float32,
          "f32|bf16": x.dtype in (np.float32, np.uint16),
          "int": x.dtype in (np.int32, np.int64)}[want]
    if not ok:
        expect = {"bf16": "bf16 (uint16 bits in CuPy, torch.bfloat16)", "f32": "float32",
                  "f32|bf16": "float32 or bf16", "int": "int32 or int64"}[want]
        raise TypeError(f"{name} must be {expect}, got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (call .contiguous() / cupy.ascontiguousarray)")
    return x


def beta_f32(beta):
    """beta as a float32 CuPy array: bf16 is widened, because every kernel copies beta with
    4-byte cp.async (a token's beta alone, H * 4 bytes from the next token's)."""
    b = _to_cupy("beta", beta, "f32|bf16")
    return bits_to_f32(b) if b.dtype == np.uint16 else b


def _check_shape(name: str, x, expected: tuple) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(x.shape)}")


def read_int_constants(mod, name: str, count: int) -> tuple[int, ...]:
    """The `count` ints of the module's `extern "C" __constant__ int name[count]` (or a scalar, count 1)."""
    import cupy

    return tuple(int(v) for v in cupy.ndarray((count,), dtype=np.int32, memptr=mod.get_global(name)).get())


def module(cfg: Config):
    """The compiled cupy.RawModule of one configuration (cached): the entry file's text with
    build.options(cfg), which name the directory of its headers (NVRTC compiles the text, so
    it has no file to look beside)."""
    from ptx_lab.gpu import load_module

    return load_module(build.source(), build.options(cfg))


def kernel_function(mod, name: str, prefix: str, *, label: str, threads_expected: int | None = None,
                    advice: str = ""):
    """(function, shared memory bytes, threads) of a module's kernel, from the module's own
    ``<prefix>_smem_bytes`` and ``<prefix>_threads`` constants: the threads checked against the
    host's expectation, the shared memory against this GPU's opt-in limit (``label`` names the
    build in the errors, ``advice`` says what to change), then requested for every launch."""
    import cupy

    fn = mod.get_function(name)
    (smem,) = read_int_constants(mod, f"{prefix}_smem_bytes", 1)
    (threads,) = read_int_constants(mod, f"{prefix}_threads", 1)
    if threads_expected is not None and threads != threads_expected:
        raise RuntimeError(f"{label} was built with {threads} threads per CTA, its Config expects {threads_expected}")
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if smem > limit:
        raise ValueError(f"{label} needs {smem} B of shared memory per CTA, this GPU allows {limit} B{advice}")
    fn.max_dynamic_shared_size_bytes = smem
    return fn, smem, threads


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config):
    mod = module(cfg)
    fn, smem, threads = kernel_function(mod, build.KERNEL_NAME, "kda", label=f"Kernel A configuration {cfg.name()}",
                                        threads_expected=cfg.threads,
                                        advice=": use fewer stages (tuning nstage) or other knobs")
    tma_dims = read_int_constants(mod, "kda_tma_dims", 6)
    return fn, smem, threads, tma_dims


# The kernel's last parameter, kda::TmaMaps: 7 tensor maps of 128 bytes, passed by value
# (a numpy array of size one: CuPy copies its bytes into the parameter).
TMA_MAP_NAMES = ("q", "k", "gc", "do", "mqk", "inv", "snap")
MAPS_DTYPE = np.dtype([("opaque", "<u8", (16 * len(TMA_MAP_NAMES),))])
INT32_MAX = 2**31 - 1   # tensor-copy coordinates are signed 32-bit


_NO_MAPS = np.zeros(1, dtype=MAPS_DTYPE)


def _tma_maps(cfg: Config, tma_dims, q, k, gc, do, mqk, inv, snapshots):
    """The tensor maps the configuration uses (the others stay zero), as one parameter."""
    uses_loads, uses_snap = cfg.loads == build.LOADS_TMA, cfg.snap_store == build.SNAP_TMA
    if not (uses_loads or uses_snap):
        return _NO_MAPS
    B, T, H, _ = q.shape
    loads = (q.data.ptr, k.data.ptr, gc.data.ptr, do.data.ptr, mqk.data.ptr, inv.data.ptr) if uses_loads else None
    snap = (snapshots.data.ptr, snapshots.size // D) if uses_snap else None
    return _encoded_maps(cfg.snap_bf16, tma_dims, B * T, H, loads, snap)


# Encoding is host work on every call (validation in Python, a driver call per map, about
# as long as a small launch), and the same tensors come back call after call (CuPy's pool
# hands the snapshot buffer the same address), so the encoded parameter is cached by
# everything it depends on. The kernel only reads it.
@functools.lru_cache(maxsize=64)
def _encoded_maps(snap_bf16: bool, tma_dims: tuple, tokens: int, H: int, loads, snap) -> np.ndarray:
    from ptx_lab import tensormap
    from ptx_lab.tensormap import TensorMap2D

    do_cols, do_swz, gc_cols, kw, band, snap_swz = tma_dims
    wanted = {}

    def want(name, *args, **kwargs):   # TensorMap2D's own checks, with the argument named
        try:
            wanted[name] = TensorMap2D(*args, **kwargs)
        except ValueError as exc:
            raise ValueError(f"{name}: its tensor map for Kernel A's tensor copies: {exc}") from exc

    if loads is not None:
        if tokens > INT32_MAX:
            raise ValueError(f"tensor-copy loads address tokens with 32-bit coordinates; B * T = {tokens}")
        q, k, gc, do, mqk, inv = loads
        wide, small = (tokens, H * D), (tokens, H * CHUNK)
        want("q", q, "bfloat16", wide, H * D * 2, (CHUNK, D))
        want("k", k, "bfloat16", wide, H * D * 2, (CHUNK, D))
        want("gc", gc, "float32", wide, H * D * 4, (CHUNK, gc_cols))
        want("do", do, "bfloat16", wide, H * D * 2, (CHUNK, do_cols), swizzle=do_swz)
        want("mqk", mqk, "bfloat16", small, H * CHUNK * 2, (CHUNK, CHUNK), swizzle=2 * CHUNK)
        want("inv", inv, "bfloat16", small, H * CHUNK * 2, (CHUNK, CHUNK), swizzle=2 * CHUNK)
    if snap is not None:
        ptr, rows = snap
        if rows > INT32_MAX:
            raise ValueError(f"tensor-store snapshots address rows with 32-bit coordinates; "
                             f"snapshots have {rows} rows of {D}")
        want("snap", ptr, "bfloat16" if snap_bf16 else "float32", (rows, D), D * (2 if snap_bf16 else 4),
             (kw, band), swizzle=snap_swz)
    maps = np.zeros(1, dtype=MAPS_DTYPE)
    words = maps["opaque"][0]
    for name, tmap in wanted.items():
        i = TMA_MAP_NAMES.index(name)
        words[16 * i:16 * (i + 1)] = tensormap.encode(tmap)["opaque"][0]
    return maps   # shared by the calls that hit the cache: never written after this


@functools.lru_cache(maxsize=64)
def _device_tables(cu_bytes: bytes, snapshot_every: int):
    """cu_seqlens, snapshot offsets and the CTA order on the device, cached per batch layout
    (a host-to-device copy per call would stall the host inside a timed region)."""
    import cupy

    from .reference import snapshot_offsets

    cu = np.frombuffer(cu_bytes, dtype=np.int64)
    lengths = np.diff(cu)
    offs = np.asarray(snapshot_offsets(lengths, CHUNK, snapshot_every), dtype=np.int64)
    return cupy.asarray(cu), cupy.asarray(offs), cupy.asarray(_longest_first(lengths)), int(offs[-1])


def _longest_first(lengths: np.ndarray) -> np.ndarray:
    """The CTA order of a launch: indices of ``lengths``, longest first (ties in index order), so
    that a varlen batch's tail is not one long scan started last."""
    return np.argsort(-lengths, kind="stable").astype(np.int32)


def _sm_count() -> int:
    import cupy

    return _sm_count_of(cupy.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_id: int) -> int:
    import cupy

    # Device.attributes queries every attribute the driver has (host time on every call)
    return cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMultiProcessorCount, device_id)


def choose_vsplit(ctas: int, sm_count: int) -> int:
    """Smallest v-split whose grid covers ~90% of the SMs (more splits repeat R1 per CTA;
    at 1 x 131072 x H32, vsplit 8 measured slower than 4 in bf16 mode: 37.3 vs 18.9 ms)."""
    for v in build.VSPLITS:
        if ctas * v >= 0.9 * sm_count:
            return v
    return build.VSPLITS[-1]


# ----------------------------------------------------------------------------
# the API
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The scan's inputs after :func:`_checked_inputs`: CuPy arrays (torch ones viewed in place)."""
    arrays: tuple        # q, k, gc, beta (fp32), mqk, inv, do
    dht: Any
    B: int
    T: int
    H: int
    cu: np.ndarray       # host int64 [N + 1]
    torch_device: Any    # the torch inputs' device, or None for CuPy inputs


def _checked_inputs(q, k, gc, beta, mqk, inv, do, dht, cu_seqlens, small: int) -> _Inputs:
    """Every array and cu_seqlens checked (kind, device, dtype, layout, shape), naming the argument."""
    _check_device_arrays(q=q, k=k, gc=gc, beta=beta, mqk=mqk, inv=inv, do=do, dht=dht)
    cupy = _require_cupy()
    _require_gpu()

    torch_in = _is_torch(q)
    dev = q.device if torch_in else None

    q = _to_cupy("q", q, "bf16")
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D [B, T, H, {D}], got shape {tuple(q.shape)}")
    B, T, H, Dq = q.shape
    if Dq != D:
        raise ValueError(f"q's head dimension must be {D}, got {Dq}")
    if T == 0 or B == 0 or H == 0:
        raise ValueError(f"q must have B, T, H >= 1, got shape {tuple(q.shape)}")
    k = _to_cupy("k", k, "bf16")
    _check_shape("k", k, (B, T, H, D))
    do = _to_cupy("do", do, "bf16")
    _check_shape("do", do, (B, T, H, D))
    gc = _to_cupy("gc", gc, "f32")
    _check_shape("gc", gc, (B, T, H, D))
    beta = beta_f32(beta)
    _check_shape("beta", beta, (B, T, H))
    mqk = _to_cupy("mqk", mqk, "bf16")
    _check_shape("mqk", mqk, (B, T, H, small))
    inv = _to_cupy("inv", inv, "bf16")
    _check_shape("inv", inv, (B, T, H, small))

    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs a packed batch of size 1, got q with batch {B}")
        cu = cu_seqlens.get() if isinstance(cu_seqlens, cupy.ndarray) else (
            cu_seqlens.cpu().numpy() if _is_torch(cu_seqlens) else np.asarray(cu_seqlens))
        if cu.ndim != 1 or cu.size < 2:
            raise ValueError(f"cu_seqlens must be 1-D with N+1 >= 2 offsets, got shape {cu.shape}")
        if not np.issubdtype(cu.dtype, np.integer):
            raise TypeError(f"cu_seqlens must be int32 or int64, got {cu.dtype}")
        cu = cu.astype(np.int64)
        if cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
        if np.any(np.diff(cu) < 1):
            raise ValueError("cu_seqlens must be strictly increasing (every sequence length >= 1)")
        if cu[-1] != T:
            raise ValueError(f"cu_seqlens must end at the total length {T}, got {cu[-1]}")
    else:
        cu = np.arange(B + 1, dtype=np.int64) * T
    if dht is not None:
        dht = _to_cupy("dht", dht, "f32")
        _check_shape("dht", dht, (cu.size - 1, H, D, D))

    return _Inputs((q, k, gc, beta, mqk, inv, do), dht, B, T, H, cu, dev)


def dstate_scan(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None, dht=None,
                cu_seqlens=None, qk_l2norm: bool = True, snapshot_dtype: str = "float32",
                snapshot_every: int = 1, vsplit: int | str = "auto", segments: int | str = "auto",
                tuning: dict | None = None):
    """Kernel A: the backward dstate scan of KDA. Its contract, in float64, is
    :func:`kernel.reference.dstate_scan_reference` (same arguments, same layouts).

    Arrays are device arrays: CuPy arrays (bf16 tensors as uint16 arrays of the
    bf16 bits, see :func:`bf16_bits`) or torch CUDA tensors (torch.bfloat16 /
    torch.float32, viewed in place; the results are then torch tensors). numpy
    arrays and CPU tensors are refused (TypeError). It needs CuPy, for torch
    tensors too, and a CUDA GPU: ``pip install -e '.[cuda]'`` (cupy-cuda13x).

    q, k, do: bf16 [B, T, H, 128]; gc: fp32 [B, T, H, 128]; beta: fp32 or bf16
    [B, T, H]; mqk, inv: bf16 [B, T, H, 16]; dht: fp32 [N, H, 128, 128] or None.
    Varlen: B == 1 and cu_seqlens (N+1 int offsets, 0 .. T, every length >= 1).
    Returns (snapshots, dh0): snapshots [B, n_snap, H, 128, 128] (varlen:
    [1, total snapshots, H, 128, 128], packed per sequence like FLA's
    chunk_offsets) in `snapshot_dtype`, every `snapshot_every` tiles of 16
    tokens; dh0 fp32 [N, H, 128, 128].

    `segments`: the sequence split (:mod:`kernel.split`). "auto" cuts long sequences
    into segments scanned side by side where the unsplit grid would leave SMs idle
    (few sequences x heads), and leaves larger batches as they are; an integer S
    cuts every sequence into min(S, its 64-token blocks) segments (1: never split).
    The result is the same scan (exact algebra, rounded like the unsplit kernel),
    bit-identical from call to call. `vsplit`, when given, applies to every launch.

    `tuning` (benchmarks and profiling): overrides of build.Config's knobs,
    e.g. {"nstage": 3, "producers": 4, "timing": True}; with a split they apply to
    the real scans, not to the summaries.

    What is checked, all of it host work that reads no tensor data:

    * every array: its kind (CuPy / torch CUDA), that it lives on the current
      device, its dtype, C-contiguity and shape (head dimension 128, B, T, H >= 1,
      the others matching q's);
    * cu_seqlens (copied to the host when on the device: N+1 ints): B == 1, 1-D,
      integers, 0 first, strictly increasing, T last;
    * snapshot_dtype, snapshot_every (1 or 4), vsplit, the tuning knobs, scale
      (a finite number), qk_l2norm (a bool);
    * that the configuration's shared memory fits this GPU and, for the
      tensor-copy configurations, that B * T and the snapshot rows fit 32-bit
      coordinates and every tensor map passes ptx_lab.tensormap's checks.

    What is NOT checked: the values. No scan for NaN or inf, none for a gc that
    is not a tile-local cumulative log2 gate of a g <= 0 (gc <= 0, non-increasing
    within each 16-token tile, restarting at every tile and sequence), none that
    mqk and inv belong to q, k, gc and beta. Such a scan would read every input
    once: at 32 x 8192 tokens with H = 32 that is 11.4 GB (q, k, do 6.4 GB, gc
    4.3 GB, mqk and inv 0.54 GB, beta 34 MB, dht 67 MB), as many bytes as the
    kernel itself reads (1.0x its input reads; 72% of all its traffic with bf16
    snapshots every 64 tokens, 25% with fp32 snapshots every tile): about 2.7 ms
    at the copy floor's measured 4.3 TB/s, next to the kernel's 4.2 ms
    (docs/log/run-k.md). What happens instead: nothing is raised. A NaN or
    inf in the inputs of one (sequence, head) makes that head's dS non-finite
    from that tile backwards, so its snapshots of the earlier tiles and its dh0
    come out NaN or inf; a gc above 0 or rising within a tile makes dS grow
    instead of decay, i.e. wrong numbers that can overflow to inf. Each
    (sequence, head) is scanned by its own CTAs from its own inputs, so the
    damage stays in that head's outputs. To check the values, run the float64
    reference on a sample (kernel.reference refuses NaN, inf and g > 0 by name).
    """
    return launch(q, k, gc, beta, mqk, inv, do, scale=scale, dht=dht, cu_seqlens=cu_seqlens,
                  qk_l2norm=qk_l2norm, snapshot_dtype=snapshot_dtype, snapshot_every=snapshot_every,
                  vsplit=vsplit, segments=segments, tuning=tuning)


def check_vsplit(vsplit) -> None:
    """ValueError naming ``vsplit`` unless it is "auto" or one of build.VSPLITS (2.5 and True are
    refused, not rounded to a split)."""
    if vsplit != "auto" and (isinstance(vsplit, (bool, np.bool_)) or not isinstance(vsplit, (int, np.integer))
                             or vsplit not in build.VSPLITS):
        raise ValueError(f"vsplit must be 'auto' or one of {build.VSPLITS}, got {vsplit!r}")


def check_segments(segments) -> None:
    """ValueError naming ``segments`` unless it is "auto" or an integer >= 1."""
    if segments != "auto" and (isinstance(segments, (bool, np.bool_)) or not isinstance(segments, (int, np.integer))
                               or segments < 1):
        raise ValueError(f"segments must be 'auto' or an integer >= 1, got {segments!r}")


def launch(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None, dht=None, cu_seqlens=None,
           qk_l2norm: bool = True, snapshot_dtype: str = "float32", snapshot_every: int = 1,
           vsplit: int | str = "auto", segments: int | str = "auto", tuning: dict | None = None,
           fla_inputs: bool = False):
    """:func:`dstate_scan`'s checks and launch. With ``fla_inputs`` the kernel reads gc, mqk
    and inv as FLA's forward stored them (kernel.fla_entry: its g, and Aqk / Akk with 64
    columns, whose 16 x 16 diagonal blocks are Kernel A's Mqk / INV)."""
    small = FLA_CHUNK if fla_inputs else CHUNK   # columns of mqk / inv
    if snapshot_dtype not in SNAPSHOT_DTYPES:
        raise ValueError(f"snapshot_dtype must be one of {SNAPSHOT_DTYPES}, got {snapshot_dtype!r}")
    if isinstance(snapshot_every, (bool, np.bool_)) or not isinstance(snapshot_every, (int, np.integer)) \
            or snapshot_every not in (1, 4):
        raise ValueError(f"snapshot_every must be 1 or 4, got {snapshot_every!r}")
    if not isinstance(qk_l2norm, (bool, np.bool_)):
        raise TypeError(f"qk_l2norm must be a bool (True or False), got {qk_l2norm!r}")
    if scale is not None:
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale must be a real number or None, got {scale!r}")
        if not np.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    check_vsplit(vsplit)
    check_segments(segments)
    c = _checked_inputs(q, k, gc, beta, mqk, inv, do, dht, cu_seqlens, small)
    cupy = _require_cupy()
    q, k, gc, beta, mqk, inv, do = c.arrays
    dht, B, H, cu = c.dht, c.B, c.H, c.cu
    torch_in, dev = c.torch_device is not None, c.torch_device
    lengths = np.diff(cu)
    N = lengths.size

    cu_d, offs_d, order, total_snaps = _device_tables(cu.tobytes(), snapshot_every)
    if cu_seqlens is None:
        snap_shape = (B, total_snaps // B, H, D, D)
    else:
        snap_shape = (1, total_snaps, H, D, D)

    sm = _sm_count()
    knobs = dict(tuning or {})
    fixed = {"vsplit", "snap_bf16", "snap_every", "has_dht", "l2norm", "fla_inputs", "summary"} & set(knobs)
    if fixed:
        raise ValueError(f"tuning must not set {sorted(fixed)}: those follow from the other arguments")
    unknown = set(knobs) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise ValueError(f"tuning has unknown knobs {sorted(unknown)}")
    base = dict(snap_bf16=snapshot_dtype == "bfloat16", snap_every=snapshot_every, l2norm=bool(qk_l2norm),
                fla_inputs=bool(fla_inputs))
    counts = split.counts_for(segments, lengths, H, sm)
    # the unsplit scan's configuration: its knobs checked before anything is allocated (a split's
    # scans take the same ones), its module built only where it runs
    cfg = Config(vsplit=choose_vsplit(N * H, sm) if vsplit == "auto" else int(vsplit),
                 has_dht=dht is not None, **base, **knobs)

    if torch_in:   # torch's allocator and torch tensors out, CuPy views for the launch
        import torch

        snap_t = torch.empty(snap_shape, dtype=torch.bfloat16 if cfg.snap_bf16 else torch.float32, device=dev)
        dh0_t = torch.empty((N, H, D, D), dtype=torch.float32, device=dev)
        snapshots, dh0 = _cupy_view(snap_t), _cupy_view(dh0_t)
    else:
        snapshots = cupy.empty(snap_shape, dtype=np.uint16 if cfg.snap_bf16 else np.float32)
        dh0 = cupy.empty((N, H, D, D), dtype=np.float32)
    s = float(scale) if scale is not None else D ** -0.5
    inputs = (q, k, gc, beta, mqk, inv, do)
    if (counts > 1).any():
        dh0[...] = _split_scan(inputs, dht, snapshots, cu, counts, H=H, scale=s, sm=sm, vsplit=vsplit,
                               base=base, knobs=knobs)
    else:
        fn, smem, threads, tma_dims = _kernel(cfg)
        null = np.uint64(0)
        maps = _tma_maps(cfg, tma_dims, q, k, gc, do, mqk, inv, snapshots)
        fn((N * H * cfg.vsplit,), (threads,),
           (*inputs, dht if dht is not None else null, snapshots, dh0, cu_d, offs_d, order, np.int32(H),
            np.float32(s), maps),
           shared_mem=smem)

    if torch_in:
        return snap_t, dh0_t
    return snapshots, dh0


# ----------------------------------------------------------------------------
# the sequence split (kernel.split): its launches
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _split_tables(cu_bytes: bytes, counts_bytes: bytes, snapshot_every: int, end_weight: float):
    """The split's plan and its device tables (segment cu_seqlens and snapshot offsets), cached
    per batch layout like :func:`_device_tables`."""
    import cupy

    p = split.plan(np.frombuffer(cu_bytes, dtype=np.int64), np.frombuffer(counts_bytes, dtype=np.int64),
                   chunk=CHUNK, snapshot_every=snapshot_every, end_weight=end_weight)
    return p, cupy.asarray(p.cu), cupy.asarray(p.snap_offsets)


@functools.lru_cache(maxsize=256)
def _launch_order(cu_bytes: bytes, segs_bytes: bytes):
    """The CTA order of a launch over some segments: longest first (as for sequences)."""
    import cupy

    seg_len = np.diff(np.frombuffer(cu_bytes, dtype=np.int64))
    segs = np.frombuffer(segs_bytes, dtype=np.int64)
    return cupy.asarray(segs[_longest_first(seg_len[segs])].astype(np.int32))


@functools.lru_cache(maxsize=None)
def _side_stream(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


def _side_by_side(first, second) -> None:
    """first() on a side stream beside second() on the current one; the current stream then
    waits for both (the side stream allocates nothing: the callers' buffers are made before)."""
    import cupy

    main = cupy.cuda.get_current_stream()
    side = _side_stream(cupy.cuda.Device().id)
    side.wait_event(main.record())
    with side:
        first()
    second()
    main.wait_event(side.record())


def _launch_summaries(inputs, M, d, cu_d, offs_d, order, *, H: int, scale: float, vsplit: int, base: dict) -> None:
    """The summary build over the sequences ``order`` names (of the batch ``cu_d`` packs): two CTAs
    of each (sequence, head, v part), grid y 0 computing d into ``d``, 1 computing M into ``M``
    (passed as the snapshots pointer, which a summary build never stores snapshots to)."""
    cfg = build.summary_config(vsplit, base["l2norm"], base["fla_inputs"])
    fn, smem, threads, _ = _kernel(cfg)
    fn((order.size * H * cfg.vsplit, 2), (threads,),
       (*inputs, np.uint64(0), M, d, cu_d, offs_d, order, np.int32(H), np.float32(scale), _NO_MAPS),
       shared_mem=smem)


def summaries(q, k, gc, beta, mqk, inv, do, *, cu_seqlens=None, scale: float | None = None,
              qk_l2norm: bool = True, vsplit: int | str = "auto", fla_inputs: bool = False):
    """Each sequence's summary (M [N, H, K, K], d [N, H, K, V], fp32) by Kernel A's summary
    build: dS entering the sequence's first tile from the right = M @ dS after its last + d
    (kernel.reference.segment_summary is the float64 contract). For a sequence split over
    devices, a segment is a sequence of its own (:mod:`kernel.cp`).

    The inputs are :func:`dstate_scan`'s (CuPy arrays or torch CUDA tensors, checked the same
    way); M and d come back as CuPy arrays, or torch tensors for torch inputs."""
    check_vsplit(vsplit)
    c = _checked_inputs(q, k, gc, beta, mqk, inv, do, None, cu_seqlens, FLA_CHUNK if fla_inputs else CHUNK)
    cupy = _require_cupy()
    H, cu, dev = c.H, c.cu, c.torch_device
    torch_in = dev is not None
    N = cu.size - 1
    cu_d, offs_d, order, _ = _device_tables(cu.tobytes(), 4)
    if torch_in:
        import torch

        M_t = torch.empty((N, H, D, D), dtype=torch.float32, device=dev)
        d_t = torch.empty((N, H, D, D), dtype=torch.float32, device=dev)
        M, d = _cupy_view(M_t), _cupy_view(d_t)
    else:
        M, d = cupy.empty((N, H, D, D), dtype=np.float32), cupy.empty((N, H, D, D), dtype=np.float32)
    v = choose_vsplit(2 * N * H, _sm_count()) if vsplit == "auto" else int(vsplit)
    _launch_summaries(c.arrays, M, d, cu_d, offs_d, order, H=H,
                      scale=float(scale) if scale is not None else D ** -0.5, vsplit=v,
                      base=dict(l2norm=bool(qk_l2norm), fla_inputs=bool(fla_inputs)))
    return (M_t, d_t) if torch_in else (M, d)


def _split_scan(inputs, dht, snapshots, cu: np.ndarray, counts: np.ndarray, *, H: int, scale: float, sm: int,
                vsplit, base: dict, knobs: dict):
    """The three passes of :func:`kernel.split.run` with Kernel A's launches; returns dh0."""
    import cupy

    p, seg_cu, seg_offs = _split_tables(cu.tobytes(), counts.astype(np.int64).tobytes(), base["snap_every"],
                                        float(split.END_WEIGHT))
    null = np.uint64(0)
    args_s, scale_s = np.int32(H), np.float32(scale)
    # each pass's CTAs share the SMs a (sequence, head) has (split.pass_vsplits), unless forced
    v_sum, v_end, v_rest = (split.pass_vsplits(counts, split.slots(len(counts) * H, sm)) if vsplit == "auto"
                            else (int(vsplit),) * 3)

    def scan(segs, seg_dht, out, *, last: bool):
        cfg = Config(vsplit=v_end if last else v_rest, has_dht=seg_dht is not None, **base, **knobs)
        fn, smem, threads, tma_dims = _kernel(cfg)
        q, k, gc, _, mqk, inv, do = inputs
        maps = _tma_maps(cfg, tma_dims, q, k, gc, do, mqk, inv, snapshots)
        fn((segs.size * H * cfg.vsplit,), (threads,),
           (*inputs, seg_dht if seg_dht is not None else null, snapshots, out, seg_cu, seg_offs,
            _launch_order(p.cu.tobytes(), segs.tobytes()), args_s, scale_s, maps), shared_mem=smem)

    def summarise(segs, M, d):
        _launch_summaries(inputs, M, d, seg_cu, seg_offs, _launch_order(p.cu.tobytes(), segs.tobytes()),
                          H=H, scale=scale, vsplit=v_sum, base=base)

    return split.run(p, dht, scan, summarise, xp=cupy, H=H, K=D, V=D, side_by_side=_side_by_side)


def bf16_bits(x):
    """float array (numpy or cupy) -> uint16 bf16 bits, round to nearest even."""
    xp = np
    try:
        import cupy

        xp = cupy.get_array_module(x)
    except ImportError:
        pass
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))
    return (rounded >> 16).astype(xp.uint16)


def bits_to_f32(bits):
    """uint16 bf16 bits (numpy or cupy) -> float32 (exact)."""
    return (bits.astype("uint32") << 16).view("float32")


__all__ = ["dstate_scan", "summaries", "module", "choose_vsplit", "check_vsplit", "check_segments", "bf16_bits", "bits_to_f32", "SNAPSHOT_DTYPES"]
