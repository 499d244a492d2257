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
the default one, point CuPy at it first (``with kernel.runtime.arrays.torch_stream_for_cupy():
...``, as kernel.bench does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import numpy as np

from . import config, split
from .config import Config
from ..runtime import builds
from ..runtime.arrays import (beta_f32, bf16_bits, bits_to_f32, check_scale, cupy_view, describe, expect, is_torch,
                             leading, require_cupy, require_gpu, to_cupy, torch_allocations, value_heads)
from ..shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS, check_cu_seqlens, snapshot_offsets, states_shape

SNAPSHOT_DTYPES = ("float32", "bfloat16")
ARRAY_KINDS = ("CuPy arrays (bf16 as uint16 bits: kernel.ds_scan.bf16_bits) or torch CUDA tensors "
               "(torch.bfloat16 / torch.float32)")
WHAT = "kernel.dstate_scan"   # what the GPU and CuPy errors name
# What describe's refusal of a host array says after "(host memory): " (numpy arrays and CPU tensors are
# refused before, by _check_device_arrays, with the way to move each)
HOST_ADVICE = f"Kernel A runs on the GPU and takes device arrays, {ARRAY_KINDS}"


def _check_device_arrays(**arrays) -> None:
    """Host arrays are refused by name before CuPy is needed: numpy arrays and CPU tensors."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray):
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got a numpy.ndarray: Kernel A "
                f"runs on the GPU and takes device arrays, {ARRAY_KINDS}. Move it first, e.g. "
                f"cupy.asarray(kernel.ds_scan.bf16_bits({name})) for a bf16 input, cupy.asarray({name}) for "
                f"a float32 one, or torch.from_numpy({name}).cuda()")
        if is_torch(x) and not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor, got a tensor on {x.device}: Kernel A "
                            f"takes device arrays, {ARRAY_KINDS} (move it with .cuda())")


def module(cfg: Config):
    """The compiled cupy.RawModule of one configuration (cached): the entry file's text with
    config.options(cfg), which name the directory of its headers (NVRTC compiles the text, so
    it has no file to look beside)."""
    return config.BUILD.module(cfg)


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    mod = module(cfg)
    fn, smem, threads = builds.kernel_function(config.BUILD, mod, label=f"Kernel A configuration {cfg.name()}",
                                               threads_expected=cfg.threads,
                                               advice=": use fewer stages (tuning nstage) or other knobs")
    tma_dims = builds.read_int_constants(mod, "kda_tma_dims", 6)
    return fn, smem, threads, tma_dims


# The kernel's last parameter, kda::TmaMaps: 7 tensor maps of 128 bytes, passed by value
# (a numpy array of size one: CuPy copies its bytes into the parameter).
TMA_MAP_NAMES = ("q", "k", "gc", "do", "mqk", "inv", "snap")
MAPS_DTYPE = np.dtype([("opaque", "<u8", (16 * len(TMA_MAP_NAMES),))])
INT32_MAX = 2**31 - 1   # tensor-copy coordinates are signed 32-bit


_NO_MAPS = np.zeros(1, dtype=MAPS_DTYPE)


def _tma_maps(cfg: Config, tma_dims, q, k, gc, do, mqk, inv, snapshots, *, H: int, HV: int):
    """The tensor maps the configuration uses (the others stay zero), as one parameter: q and k of
    ``H`` heads, the others of ``HV``."""
    uses_loads, uses_snap = cfg.loads == config.LOADS_TMA, cfg.snap_store == config.SNAP_TMA
    if not (uses_loads or uses_snap):
        return _NO_MAPS
    B, T = q.shape[:2]
    loads = (q.data.ptr, k.data.ptr, gc.data.ptr, do.data.ptr, mqk.data.ptr, inv.data.ptr) if uses_loads else None
    snap = (snapshots.data.ptr, snapshots.size // HEAD_DIM) if uses_snap else None
    return encode_tensor_maps(cfg.snap_bf16, tma_dims, B * T, H, HV, loads, snap)


# Encoding is host work on every call (validation in Python, a driver call per map, about
# as long as a small launch), and the same tensors come back call after call (CuPy's pool
# hands the snapshot buffer the same address), so the encoded parameter is cached by
# everything it depends on. The kernel only reads it.
@functools.lru_cache(maxsize=64)
def encode_tensor_maps(snap_bf16: bool, tma_dims: tuple, tokens: int, H: int, HV: int, loads, snap) -> np.ndarray:
    """Kernel A's tensor-map parameter for ``tokens`` rows of q and k (``H`` heads) and of the other
    inputs (``HV`` heads: FLA's grouped value heads when more), and for the snapshots: ``loads`` the six
    inputs' addresses or None, ``snap`` (address, rows) or None; the maps not asked for stay zero."""
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
        qk, wide, small = (tokens, H * HEAD_DIM), (tokens, HV * HEAD_DIM), (tokens, HV * TILE_TOKENS)
        want("q", q, "bfloat16", qk, H * HEAD_DIM * 2, (TILE_TOKENS, HEAD_DIM))
        want("k", k, "bfloat16", qk, H * HEAD_DIM * 2, (TILE_TOKENS, HEAD_DIM))
        want("gc", gc, "float32", wide, HV * HEAD_DIM * 4, (TILE_TOKENS, gc_cols))
        want("do", do, "bfloat16", wide, HV * HEAD_DIM * 2, (TILE_TOKENS, do_cols), swizzle=do_swz)
        want("mqk", mqk, "bfloat16", small, HV * TILE_TOKENS * 2, (TILE_TOKENS, TILE_TOKENS), swizzle=2 * TILE_TOKENS)
        want("inv", inv, "bfloat16", small, HV * TILE_TOKENS * 2, (TILE_TOKENS, TILE_TOKENS), swizzle=2 * TILE_TOKENS)
    if snap is not None:
        ptr, rows = snap
        if rows > INT32_MAX:
            raise ValueError(f"tensor-store snapshots address rows with 32-bit coordinates; "
                             f"snapshots have {rows} rows of {HEAD_DIM}")
        want("snap", ptr, "bfloat16" if snap_bf16 else "float32", (rows, HEAD_DIM), HEAD_DIM * (2 if snap_bf16 else 4),
             (kw, band), swizzle=snap_swz)
    maps = np.zeros(1, dtype=MAPS_DTYPE)
    words = maps["opaque"][0]
    for name, tmap in wanted.items():
        i = TMA_MAP_NAMES.index(name)
        words[16 * i:16 * (i + 1)] = tensormap.encode(tmap)["opaque"][0]
    return maps   # shared by the calls that hit the cache: never written after this


def choose_vsplit(ctas: int, sm_count: int) -> int:
    """Smallest v-split whose grid covers ~90% of the SMs (more splits repeat R1 per CTA;
    at 1 x 131072 x H32, vsplit 8 measured slower than 4 in bf16 mode: 37.3 vs 18.9 ms)."""
    for v in config.VSPLITS:
        if ctas * v >= 0.9 * sm_count:
            return v
    return config.VSPLITS[-1]


def scan_vsplit(vsplit: int | str, sequences_x_heads: int, sm_count: int) -> int:
    """The v-split a scan over ``sequences_x_heads`` (sequence, value head) pairs runs: ``vsplit``, or for "auto"
    :func:`choose_vsplit`'s (a caller that cuts the batch into parts passes the batch's pairs, so that each part
    runs the batch's split)."""
    return choose_vsplit(sequences_x_heads, sm_count) if vsplit == "auto" else int(vsplit)


# ----------------------------------------------------------------------------
# the API
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScanInputs:
    """The scan's inputs, checked: CuPy arrays (torch ones viewed in place), the batch layout and the
    torch device the outputs go to. :func:`launch` makes them from a caller's arguments; a caller
    that checked its own arguments at its boundary (kernel.ds_scan.fla, kernel.kda_backward) builds
    them (:func:`scan_inputs_of`) and calls :func:`run`, so that nothing is checked twice."""
    arrays: tuple        # q, k, gc, beta (fp32), mqk, inv, do
    dht: Any
    B: int
    T: int
    H: int               # q's and k's heads
    HV: int              # the other arrays' (value) heads: H, or a multiple of it (FLA's grouped value heads)
    cu: np.ndarray       # host int64 [N + 1]
    torch_device: Any    # the torch inputs' device, or None for CuPy inputs


# what to_cupy holds each of the scan's arrays to, in the kernel's order q, k, gc, beta, mqk, inv, do
# (None: beta, which beta_f32 takes in fp32 or bf16 and widens)
ARRAY_WANTS = ("bf16", "bf16", "f32", None, "bf16", "bf16", "bf16")


def scan_inputs_of(named: dict, dht, *, B: int, T: int, H: int, HV: int, cu: np.ndarray) -> ScanInputs:
    """The :class:`ScanInputs` of arrays a caller's boundary checked (kind, dtype, shape, layout):
    ``named`` maps the caller's names to q, k, gc, beta, mqk, inv, do, in that order (q, k of ``H``
    heads, the others of ``HV``); ``cu`` is the host int64 cu_seqlens [N + 1]. Each array becomes the
    CuPy array the launch passes (to_cupy: a torch tensor viewed in place, and every array held to the
    current device), beta widened to fp32."""
    arrays = tuple(beta_f32(x) if want is None else to_cupy(name, x, want)
                   for (name, x), want in zip(named.items(), ARRAY_WANTS))
    if dht is not None:
        dht = to_cupy("dht", dht, "f32")
    first = next(iter(named.values()))
    return ScanInputs(arrays, dht, B, T, H, HV, cu, first.device if is_torch(first) else None)


def _checked_inputs(q, k, gc, beta, mqk, inv, do, dht, cu_seqlens, small: int) -> ScanInputs:
    """Every array and cu_seqlens checked (kind, device, dtype, layout, shape), naming the argument;
    ``small``: the columns of mqk and inv."""
    # host arrays first, with the way to device ones, and before CuPy is needed
    _check_device_arrays(q=q, k=k, gc=gc, beta=beta, mqk=mqk, inv=inv, do=do, dht=dht)
    require_cupy(WHAT)
    require_gpu(WHAT)

    named = dict(q=q, k=k, gc=gc, beta=beta, mqk=mqk, inv=inv, do=do)
    a = {name: describe(name, x, HOST_ADVICE) for name, x in named.items()}
    B, T, H = leading("q", a["q"])
    HV = value_heads("do", a["do"], B, T, H)
    for name, shape, layout, dtypes in (
            ("q", (B, T, H, HEAD_DIM), "[B, T, H, K]", ("bfloat16",)),
            ("k", (B, T, H, HEAD_DIM), "same as q: [B, T, H, K]", ("bfloat16",)),
            ("do", (B, T, HV, HEAD_DIM), f"[B, T, HV, V], V = {HEAD_DIM}", ("bfloat16",)),
            ("gc", (B, T, HV, HEAD_DIM), "[B, T, HV, K]", ("float32",)),
            ("beta", (B, T, HV), "[B, T, HV]", ("float32", "bfloat16")),
            ("mqk", (B, T, HV, small), f"[B, T, HV, {small}]", ("bfloat16",)),
            ("inv", (B, T, HV, small), f"[B, T, HV, {small}]", ("bfloat16",))):
        expect(name, a[name], shape, layout, dtypes)

    if cu_seqlens is not None:
        cu = check_cu_seqlens(cu_seqlens, B, T)
    else:
        cu = np.arange(B + 1, dtype=np.int64) * T
    if dht is not None:
        expect("dht", describe("dht", dht, HOST_ADVICE), (cu.size - 1, HV, HEAD_DIM, HEAD_DIM), "[N, HV, K, V]",
               ("float32",))
    return scan_inputs_of(named, dht, B=B, T=T, H=H, HV=HV, cu=cu)


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

    q, k: bf16 [B, T, H, 128]; do: bf16 [B, T, HV, 128]; gc: fp32 [B, T, HV, 128]; beta:
    fp32 or bf16 [B, T, HV]; mqk, inv: bf16 [B, T, HV, 16]; dht: fp32 [N, HV, 128, 128] or None.
    HV = H, or a multiple of it: FLA's grouped value heads, value head hv reading q and k at head
    hv // (HV / H) (kernel.shapes.qk_head), as if they were repeated to HV heads (the reference's
    contract on q.repeat(HV // H, axis=2)), without the copy.
    Varlen: B == 1 and cu_seqlens (N+1 int offsets, 0 .. T, every length >= 1).
    Returns (snapshots, dh0): snapshots [B, n_snap, HV, 128, 128] (varlen:
    [1, total snapshots, HV, 128, 128], packed per sequence like FLA's
    chunk_offsets) in `snapshot_dtype`, every `snapshot_every` tiles of 16
    tokens; dh0 fp32 [N, HV, 128, 128].

    `segments`: the sequence split (:mod:`kernel.ds_scan.split`). "auto" cuts long sequences
    into segments scanned side by side where the unsplit grid would leave SMs idle
    (few sequences x heads), and leaves larger batches as they are; an integer S
    cuts every sequence into min(S, its 64-token blocks) segments (1: never split).
    The result is the same scan (exact algebra, rounded like the unsplit kernel),
    bit-identical from call to call. `vsplit`, when given, applies to every launch.

    `tuning` (benchmarks and profiling): overrides of config.Config's knobs,
    e.g. {"nstage": 3, "producers": 4, "timing": True}; with a split they apply to
    the real scans, not to the summaries.

    What is checked, all of it host work that reads no tensor data:

    * every array: its kind (CuPy / torch CUDA), that it lives on the current
      device, its dtype, C-contiguity and shape (head dimension 128, B, T, H >= 1,
      the others matching q's, their heads H or a multiple of it);
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
    """ValueError naming ``vsplit`` unless it is "auto" or one of config.VSPLITS (2.5 and True are
    refused, not rounded to a split)."""
    if vsplit != "auto" and (isinstance(vsplit, (bool, np.bool_)) or not isinstance(vsplit, (int, np.integer))
                             or vsplit not in config.VSPLITS):
        raise ValueError(f"vsplit must be 'auto' or one of {config.VSPLITS}, got {vsplit!r}")


# Config fields that the arguments of a call decide: a tuning dict may not set them
ARGUMENT_FIELDS = frozenset({"vsplit", "snap_bf16", "snap_every", "has_dht", "l2norm", "fla_inputs", "token_gate",
                             "summary"})


def check_tuning(tuning) -> dict:
    """A copy of ``tuning`` (None: no overrides) after refusing, by name, knobs that the arguments
    decide (ARGUMENT_FIELDS) and knobs that config.Config does not have."""
    if tuning is not None and not isinstance(tuning, dict):
        raise TypeError(f"tuning must be a dict of config.Config knobs or None, got {type(tuning).__name__}")
    knobs = dict(tuning or {})
    fixed = ARGUMENT_FIELDS & set(knobs)
    if fixed:
        raise ValueError(f"tuning must not set {sorted(fixed)}: those follow from the other arguments")
    unknown = set(knobs) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise ValueError(f"tuning has unknown knobs {sorted(unknown)}")
    return knobs


def check_segments(segments) -> None:
    """ValueError naming ``segments`` unless it is "auto" or an integer >= 1."""
    if segments != "auto" and (isinstance(segments, (bool, np.bool_)) or not isinstance(segments, (int, np.integer))
                               or segments < 1):
        raise ValueError(f"segments must be 'auto' or an integer >= 1, got {segments!r}")


OUTPUT_NAMES = ("snapshots", "dh0")   # what a call allocates, unless given its arrays (``out``)


def output_shapes(B: int, HV: int, cu: np.ndarray, snapshot_every: int, varlen: bool) -> dict:
    """The shapes of the arrays :func:`launch` allocates (OUTPUT_NAMES) for a batch of B sequences (varlen: one
    packed row whose host int64 cu_seqlens is ``cu``; else ``cu`` is B sequences of equal length) at HV value
    heads: host arithmetic, for a caller that allocates them once and passes them as ``out``."""
    total = int(snapshot_offsets(np.diff(cu), TILE_TOKENS, snapshot_every)[-1])
    return {"snapshots": states_shape(total, B, HV, varlen=varlen), "dh0": (cu.size - 1, HV, HEAD_DIM, HEAD_DIM)}


def check_out(out, c: ScanInputs, *, snapshot_dtype: str, snapshot_every: int, varlen: bool) -> dict | None:
    """``out`` (None, or a dict of the arrays a call would allocate: OUTPUT_NAMES) checked like the inputs: each
    array's kind, its device (the inputs'), dtype, C-contiguity and shape, the error naming ``out['...']``.
    Returns None or a copy of the dict."""
    if out is None:
        return None
    if not isinstance(out, dict):
        raise TypeError(f"out must be None or a dict of {OUTPUT_NAMES} arrays, got {type(out).__name__}")
    missing, unknown = set(OUTPUT_NAMES) - set(out), set(out) - set(OUTPUT_NAMES)
    if missing or unknown:
        raise ValueError(f"out must hold exactly {OUTPUT_NAMES}; missing {sorted(missing)}, unknown {sorted(unknown)}")
    shapes = output_shapes(c.B, c.HV, c.cu, snapshot_every, varlen)
    layouts = {"snapshots": "[1, total snapshots, HV, K, V]" if varlen else "[B, snapshots a sequence, HV, K, V]",
               "dh0": "[N, HV, K, V]"}
    dtypes = {"snapshots": "bfloat16" if snapshot_dtype == "bfloat16" else "float32", "dh0": "float32"}
    device = getattr(getattr(c.arrays[0], "device", None), "id", None)   # the inputs', as to_cupy held them
    for name in OUTPUT_NAMES:
        label = f"out['{name}']"
        _check_device_arrays(**{label: out[name]})
        a = describe(label, out[name], HOST_ADVICE)
        expect(label, a, shapes[name], layouts[name], (dtypes[name],))
        if device is not None and a.device is not None and a.device != device:
            raise ValueError(f"{label} is on device {a.device}, the inputs on device {device}")
    return dict(out)


def launch(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None, dht=None, cu_seqlens=None,
           qk_l2norm: bool = True, snapshot_dtype: str = "float32", snapshot_every: int = 1,
           vsplit: int | str = "auto", segments: int | str = "auto", tuning: dict | None = None,
           fla_inputs: bool = False, token_gate: bool = False, out: dict | None = None):
    """:func:`dstate_scan`'s checks and launch. With ``fla_inputs`` the kernel reads gc, mqk
    and inv as FLA's forward stored them (kernel.ds_scan.fla: its g, and Aqk / Akk with 64
    columns, whose 16 x 16 diagonal blocks are Kernel A's Mqk / INV); with ``token_gate`` too, gc is
    each token's natural-log gate, which the kernel sums within each tile (kernel.shapes.tile_gate_sums).

    ``out``: None (the outputs are allocated by the call, as dstate_scan's are), or a dict of the arrays to write
    into and return, {"snapshots": ..., "dh0": ...}, CuPy arrays or torch CUDA tensors of the shapes
    :func:`output_shapes` gives, in ``snapshot_dtype`` (bf16 as uint16 bits in CuPy) and fp32, C-contiguous, on
    the inputs' device (:func:`check_out`). Such a call allocates nothing on the device once the batch layout's
    tables are cached (its first call), unless beta is bf16 (widened to an fp32 copy) or the sequence split
    runs (its segment buffers, summaries and fold: pass ``segments=1`` for none). A call that allocates on a
    stream other than the one that freed the memory gets no reuse from CuPy's pool, whose free blocks are
    kept per stream: a timed call on a side stream would time a fresh allocation."""
    small = CHUNK_TOKENS if fla_inputs else TILE_TOKENS   # columns of mqk / inv
    if snapshot_dtype not in SNAPSHOT_DTYPES:
        raise ValueError(f"snapshot_dtype must be one of {SNAPSHOT_DTYPES}, got {snapshot_dtype!r}")
    if isinstance(snapshot_every, (bool, np.bool_)) or not isinstance(snapshot_every, (int, np.integer)) \
            or snapshot_every not in (1, 4):
        raise ValueError(f"snapshot_every must be 1 or 4, got {snapshot_every!r}")
    if not isinstance(qk_l2norm, (bool, np.bool_)):
        raise TypeError(f"qk_l2norm must be a bool (True or False), got {qk_l2norm!r}")
    if not isinstance(token_gate, (bool, np.bool_)):
        raise TypeError(f"token_gate must be a bool (True or False), got {token_gate!r}")
    if token_gate and not fla_inputs:
        raise ValueError("token_gate needs fla_inputs=True: each token's gate in place of FLA's chunk cumsum")
    check_scale(scale)
    check_vsplit(vsplit)
    check_segments(segments)
    knobs = check_tuning(tuning)
    c = _checked_inputs(q, k, gc, beta, mqk, inv, do, dht, cu_seqlens, small)
    varlen = cu_seqlens is not None
    given = check_out(out, c, snapshot_dtype=snapshot_dtype, snapshot_every=snapshot_every, varlen=varlen)
    return run(c, scale=scale, varlen=varlen, qk_l2norm=bool(qk_l2norm),
               snapshot_dtype=snapshot_dtype, snapshot_every=snapshot_every, vsplit=vsplit, segments=segments,
               knobs=knobs, fla_inputs=bool(fla_inputs), token_gate=bool(token_gate), out=given)


def run(c: ScanInputs, *, scale: float | None, varlen: bool, qk_l2norm: bool, snapshot_dtype: str,
        snapshot_every: int, vsplit: int | str, segments: int | str, knobs: dict, fla_inputs: bool,
        token_gate: bool = False, out: dict | None = None):
    """Kernel A on checked inputs (:class:`ScanInputs`) and checked options: allocation and launch, no
    check of its own. Returns (snapshots, dh0), torch tensors where ``c.torch_device`` is set, or the arrays of
    ``out`` (checked by :func:`check_out`) where given, written in place."""
    cupy = require_cupy(WHAT)
    q, k, gc, beta, mqk, inv, do = c.arrays
    dht, B, H, HV, cu = c.dht, c.B, c.H, c.HV, c.cu
    torch_in, dev = c.torch_device is not None, c.torch_device
    lengths = np.diff(cu)
    N = lengths.size

    cu_d, offs_d, order, total_snaps = builds.device_tables(cu, snapshot_every)
    snap_shape = states_shape(total_snaps, B, HV, varlen=varlen)

    sm = builds.sm_count()
    base = dict(snap_bf16=snapshot_dtype == "bfloat16", snap_every=snapshot_every, l2norm=bool(qk_l2norm),
                fla_inputs=bool(fla_inputs), token_gate=bool(token_gate))
    counts = split.counts_for(segments, lengths, HV, sm)
    # the unsplit scan's configuration: its knobs checked before anything is allocated (a split's
    # scans take the same ones), its module built only where it runs
    cfg = Config(vsplit=scan_vsplit(vsplit, N * HV, sm),
                 has_dht=dht is not None, **base, **knobs)

    if out is not None:   # the caller's arrays, returned as given; CuPy views (no copy) for the launch
        result = out["snapshots"], out["dh0"]
        snapshots = to_cupy("out['snapshots']", result[0], "bf16" if cfg.snap_bf16 else "f32")
        dh0 = to_cupy("out['dh0']", result[1], "f32")
    elif torch_in:   # torch's allocator and torch tensors out, CuPy views for the launch
        import torch

        snap_t = torch.empty(snap_shape, dtype=torch.bfloat16 if cfg.snap_bf16 else torch.float32, device=dev)
        dh0_t = torch.empty((N, HV, HEAD_DIM, HEAD_DIM), dtype=torch.float32, device=dev)
        snapshots, dh0 = cupy_view(snap_t), cupy_view(dh0_t)
        result = snap_t, dh0_t
    else:
        snapshots = cupy.empty(snap_shape, dtype=np.uint16 if cfg.snap_bf16 else np.float32)
        dh0 = cupy.empty((N, HV, HEAD_DIM, HEAD_DIM), dtype=np.float32)
        result = snapshots, dh0
    s = float(scale) if scale is not None else HEAD_DIM ** -0.5
    inputs = (q, k, gc, beta, mqk, inv, do)
    if (counts > 1).any():
        # the split's buffers (each segment's dS in and out, the summaries, the fold): torch's memory
        # for a torch caller, which torch then counts and reuses
        with torch_allocations(dev) if torch_in else contextlib.nullcontext():
            dh0[...] = _split_scan(inputs, dht, snapshots, cu, counts, H=H, HV=HV, scale=s, sm=sm, vsplit=vsplit,
                                   base=base, knobs=knobs, torch_device=dev if torch_in else None)
    else:
        fn, smem, threads, tma_dims = kernel(cfg)
        null = np.uint64(0)
        maps = _tma_maps(cfg, tma_dims, q, k, gc, do, mqk, inv, snapshots, H=H, HV=HV)
        fn((N * HV * cfg.vsplit,), (threads,),
           (*inputs, dht if dht is not None else null, snapshots, dh0, cu_d, offs_d, order, np.int32(HV),
            np.int32(H), np.float32(s), maps),
           shared_mem=smem)
    return result


# ----------------------------------------------------------------------------
# the sequence split (kernel.ds_scan.split): its launches
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _split_tables(cu_bytes: bytes, counts_bytes: bytes, snapshot_every: int, end_weight: float):
    """The split's plan and its device tables (segment cu_seqlens and snapshot offsets), cached
    per batch layout like :func:`_device_tables`."""
    import cupy

    p = split.plan(np.frombuffer(cu_bytes, dtype=np.int64), np.frombuffer(counts_bytes, dtype=np.int64),
                   tile=TILE_TOKENS, snapshot_every=snapshot_every, end_weight=end_weight)
    return p, cupy.asarray(p.cu), cupy.asarray(p.snap_offsets)


@functools.lru_cache(maxsize=256)
def _launch_order(cu_bytes: bytes, segs_bytes: bytes):
    """The CTA order of a launch over some segments: longest first (as for sequences)."""
    import cupy

    seg_len = np.diff(np.frombuffer(cu_bytes, dtype=np.int64))
    segs = np.frombuffer(segs_bytes, dtype=np.int64)
    return cupy.asarray(segs[builds.longest_first(seg_len[segs])].astype(np.int32))


def _launch_summaries(inputs, M, d, cu_d, offs_d, order, *, H: int, HV: int, scale: float, vsplit: int,
                      base: dict) -> None:
    """The summary build over the sequences ``order`` names (of the batch ``cu_d`` packs): two CTAs
    of each (sequence, value head, v part), grid y 0 computing d into ``d``, 1 computing M into ``M``
    (passed as the snapshots pointer, which a summary build never stores snapshots to)."""
    cfg = config.summary_config(vsplit, base["l2norm"], base["fla_inputs"], base["token_gate"])
    fn, smem, threads, _ = kernel(cfg)
    fn((order.size * HV * cfg.vsplit, 2), (threads,),
       (*inputs, np.uint64(0), M, d, cu_d, offs_d, order, np.int32(HV), np.int32(H), np.float32(scale), _NO_MAPS),
       shared_mem=smem)


def summaries(q, k, gc, beta, mqk, inv, do, *, cu_seqlens=None, scale: float | None = None,
              qk_l2norm: bool = True, vsplit: int | str = "auto", fla_inputs: bool = False):
    """Each sequence's summary (M [N, HV, K, K], d [N, HV, K, V], fp32) by Kernel A's summary
    build: dS entering the sequence's first tile from the right = M @ dS after its last + d
    (kernel.reference.segment_summary is the float64 contract). For a sequence split over
    devices, a segment is a sequence of its own (:mod:`kernel.cp`).

    The inputs are :func:`dstate_scan`'s (CuPy arrays or torch CUDA tensors, checked the same
    way); M and d come back as CuPy arrays, or torch tensors for torch inputs."""
    check_vsplit(vsplit)
    c = _checked_inputs(q, k, gc, beta, mqk, inv, do, None, cu_seqlens, CHUNK_TOKENS if fla_inputs else TILE_TOKENS)
    cupy = require_cupy(WHAT)
    H, HV, cu, dev = c.H, c.HV, c.cu, c.torch_device
    torch_in = dev is not None
    N = cu.size - 1
    cu_d, offs_d, order, _ = builds.device_tables(cu, 4)
    shape = (N, HV, HEAD_DIM, HEAD_DIM)
    if torch_in:
        import torch

        M_t = torch.empty(shape, dtype=torch.float32, device=dev)
        d_t = torch.empty(shape, dtype=torch.float32, device=dev)
        M, d = cupy_view(M_t), cupy_view(d_t)
    else:
        M, d = cupy.empty(shape, dtype=np.float32), cupy.empty(shape, dtype=np.float32)
    v = choose_vsplit(2 * N * HV, builds.sm_count()) if vsplit == "auto" else int(vsplit)
    _launch_summaries(c.arrays, M, d, cu_d, offs_d, order, H=H, HV=HV,
                      scale=float(scale) if scale is not None else HEAD_DIM ** -0.5, vsplit=v,
                      base=dict(l2norm=bool(qk_l2norm), fla_inputs=bool(fla_inputs), token_gate=False))
    return (M_t, d_t) if torch_in else (M, d)


def _split_scan(inputs, dht, snapshots, cu: np.ndarray, counts: np.ndarray, *, H: int, HV: int, scale: float,
                sm: int, vsplit, base: dict, knobs: dict, torch_device=None):
    """The three passes of :func:`kernel.ds_scan.split.run` with Kernel A's launches; returns dh0. For a
    torch caller (``torch_device``) the fold runs in torch on views of the buffers, so that a training step
    through the split can be captured in a CUDA graph."""
    import cupy

    fold_view = None
    if torch_device is not None:
        import torch

        fold_view = lambda a: torch.as_tensor(a, device=torch_device)   # noqa: E731 (no copy)

    p, seg_cu, seg_offs = _split_tables(cu.tobytes(), counts.astype(np.int64).tobytes(), base["snap_every"],
                                        float(split.END_WEIGHT))
    null = np.uint64(0)
    heads, scale_s = (np.int32(HV), np.int32(H)), np.float32(scale)
    # each pass's CTAs share the SMs a (sequence, head) has (split.pass_vsplits), unless forced
    v_sum, v_end, v_rest = (split.pass_vsplits(counts, split.slots(len(counts) * HV, sm)) if vsplit == "auto"
                            else (int(vsplit),) * 3)

    def scan(segs, seg_dht, out, *, last: bool):
        cfg = Config(vsplit=v_end if last else v_rest, has_dht=seg_dht is not None, **base, **knobs)
        fn, smem, threads, tma_dims = kernel(cfg)
        q, k, gc, _, mqk, inv, do = inputs
        maps = _tma_maps(cfg, tma_dims, q, k, gc, do, mqk, inv, snapshots, H=H, HV=HV)
        fn((segs.size * HV * cfg.vsplit,), (threads,),
           (*inputs, seg_dht if seg_dht is not None else null, snapshots, out, seg_cu, seg_offs,
            _launch_order(p.cu.tobytes(), segs.tobytes()), *heads, scale_s, maps), shared_mem=smem)

    def summarise(segs, M, d):
        _launch_summaries(inputs, M, d, seg_cu, seg_offs, _launch_order(p.cu.tobytes(), segs.tobytes()),
                          H=H, HV=HV, scale=scale, vsplit=v_sum, base=base)

    return split.run(p, dht, scan, summarise, xp=cupy, H=HV, K=HEAD_DIM, V=HEAD_DIM, side_by_side=builds.side_by_side,
                     fold_view=fold_view)


__all__ = ["dstate_scan", "summaries", "run", "output_shapes", "check_out", "OUTPUT_NAMES", "ScanInputs",
           "scan_inputs_of", "module", "choose_vsplit", "check_vsplit", "check_segments", "check_tuning", "kernel",
           "encode_tensor_maps", "bf16_bits", "bits_to_f32", "SNAPSHOT_DTYPES"]
