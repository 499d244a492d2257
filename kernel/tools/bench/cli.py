"""Kernel A against flash-linear-attention on one GPU, in one process.

What and why
------------
Kernel A (``kernel.dstate_scan``) does the serial half of the KDA backward: it
walks each sequence backwards in 16-token tiles and stores snapshots of the
state gradient dS. flash-linear-attention (fla-core 0.6.0, Triton) does the
same work with ``chunk_kda_bwd_dAv`` + ``chunk_gated_delta_rule_bwd_dhu`` at
64-token chunks (see ``kernel.fla_adapter``). This bench feeds both the same
raw inputs (q, k, v, g, beta, do, dht), times them with CUDA events, prices
Kernel A against a copy of the bytes it must move, and (``--precision``)
measures both against the float64 reference of ``kernel.reference``.

Sections: idea -> inputs -> Kernel A's tile inputs -> timing -> byte floor ->
precision -> report -> main.

    python -m kernel.bench                    # the five configs, H = 32, D = 128
    python -m kernel.bench --quick            # 4x8192 and 1x32768, few repetitions
    python -m kernel.bench --configs 32x8192,varlen64x262144 --precision --json out.json

Importing this module needs neither torch, CuPy nor fla (only numpy); the
device work is imported inside the functions that do it.
"""
from __future__ import annotations

import argparse
import contextlib
import gc as _gc
import json
import math
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

D = 128          # K = V = D: the only head size Kernel A is built for
TILE = 16        # Kernel A's tile (C)
FLA_CHUNK = 64   # FLA's chunk; Kernel A's "fla" snapshot mode stores every 64 // TILE tiles
LN2 = math.log(2.0)
L2NORM_EPS = 1e-6

# Snapshot modes of Kernel A: name -> (snapshot_dtype, snapshot_every)
MODES = {
    "fla": ("bfloat16", FLA_CHUNK // TILE),   # FLA-compatible: exactly FLA's dh
    "seed": ("float32", 1),                   # the seed's: fp32 after every tile
}
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

DEFAULT_CONFIGS = ("32x8192", "8x32768", "1x131072", "4x8192", "varlen64x262144")
QUICK_CONFIGS = ("4x8192", "1x32768")
L2_FLUSH_BYTES = 512 << 20          # >> the H200's 60 MB L2
# GPU work queued before each timed call (torch.cuda._sleep, ~2 ms at 1980 MHz): longer than a
# call's host time, so that the GPU, not Python, is timed (time_cuda)
HOST_AHEAD_CYCLES = 4_000_000
HOST_AHEAD_WARN_MS = 1.5
COPY_CAP_BYTES = 16 << 30           # largest buffer for the floor copy; larger counts are scaled


def log(*args) -> None:
    print(*args, flush=True)


# ----------------------------------------------------------------------------
# configurations
# ----------------------------------------------------------------------------

@dataclass
class Config:
    """B equal sequences of T tokens, or (varlen) a packed batch of ragged ones."""
    name: str
    B: int
    T: int
    lengths: list[int]          # per-sequence lengths (N of them)
    varlen: bool

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def N(self) -> int:
        return len(self.lengths)


_BT_RE = re.compile(r"^(\d+)x(\d+)$")
_VAR_RE = re.compile(r"^varlen(?:(\d+)x(\d+))?$")


def parse_config(spec: str, seed: int = 0) -> Config:
    """'BxT' (equal lengths) or 'varlenNxTOTAL' (N ragged lengths summing to TOTAL,
    from ``kernel.reference.ragged_lengths``); plain 'varlen' is varlen64x262144."""
    s = spec.strip().lower()
    m = _BT_RE.match(s)
    if m:
        B, T = int(m.group(1)), int(m.group(2))
        if B < 1 or T < 1:
            raise ValueError(f"config {spec!r}: B and T must be >= 1")
        return Config(name=f"{B}x{T}", B=B, T=T, lengths=[T] * B, varlen=False)
    m = _VAR_RE.match(s)
    if m:
        from kernel.reference import ragged_lengths
        n = int(m.group(1)) if m.group(1) else 64
        total = int(m.group(2)) if m.group(2) else 262144
        lengths = ragged_lengths(n, total, seed=seed)
        return Config(name=f"varlen{n}x{total}", B=1, T=total, lengths=lengths, varlen=True)
    raise ValueError(f"config {spec!r}: expected 'BxT' (e.g. 32x8192) or 'varlenNxTOTAL' "
                     f"(e.g. varlen64x262144)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m kernel.bench",
        description="Kernel A (dstate scan) vs flash-linear-attention dAv+dhu on one GPU.")
    p.add_argument("--configs", default=None,
                   help="comma-separated BxT or varlenNxTOTAL (default: "
                        + ",".join(DEFAULT_CONFIGS) + ")")
    p.add_argument("--quick", action="store_true",
                   help="small subset (" + ",".join(QUICK_CONFIGS) + "), few repetitions")
    p.add_argument("--heads", type=int, default=32, help="H (default 32); D is fixed at 128")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3, quick 1)")
    p.add_argument("--reps", type=int, default=None, help="timed calls, median reported "
                                                         "(default 20, quick 5)")
    p.add_argument("--snapshot", choices=("both", "fla", "seed"), default="both",
                   help="Kernel A snapshot modes: fla = bf16 every 4 tiles (FLA's dh), "
                        "seed = fp32 every tile (default both)")
    p.add_argument("--vsplit", default="auto", choices=("auto", "1", "2", "4", "8"),
                   help="Kernel A's V split (default auto)")
    p.add_argument("--tune", nargs="*", default=[], metavar="KNOB=N",
                   help="Kernel A build knobs (kernel.build.Config), e.g. ksplit=2 producers=8")
    p.add_argument("--no-alternate", action="store_true",
                   help="skip the alternating timing (Kernel A's fla mode and FLA's dAv+dhu called in "
                        "turn, the same number of times, after the separate timings)")
    p.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention")
    p.add_argument("--no-kernel", action="store_true", help="skip Kernel A")
    p.add_argument("--cupti", action="store_true",
                   help="also take kernel-only times with torch.profiler (CUPTI); off by default: "
                        "on the device machine a profiled run stalled past 4 minutes")
    p.add_argument("--precision", action="store_true",
                   help="relative Frobenius errors vs the float64 reference on sampled heads")
    p.add_argument("--precision-heads", type=int, default=2,
                   help="heads (the first ones) used by --precision (default 2)")
    p.add_argument("--precision-seqs", type=int, default=None,
                   help="at most this many sequences (the first ones) for --precision "
                        "(default all)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--gate-strength", type=float, default=1.0,
                   help="gate strength of kernel.reference.random_inputs (default 1)")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="bar chart of the timings")
    p.add_argument("--json", metavar="FILE", default=None, help="write every number as JSON")
    p.add_argument("--from-json", metavar="FILE", nargs="+", default=None,
                   help="time nothing: print the tables (and --plot / --json) of earlier runs' JSON "
                        "files, one row per config, e.g. configs timed in separate processes. Each "
                        "row's ratios come from its own run; no GPU needed")
    args = p.parse_args(argv)
    if args.configs is None:
        args.configs = ",".join(QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS)
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    if args.heads < 1 or args.reps < 1 or args.warmup < 0 or args.precision_heads < 1:
        p.error("--heads, --reps, --precision-heads must be >= 1 and --warmup >= 0")
    args.vsplit = args.vsplit if args.vsplit == "auto" else int(args.vsplit)
    from kernel.build import parse_knobs
    args.tuning = parse_knobs(args.tune)
    args.modes = list(MODES) if args.snapshot == "both" else [args.snapshot]
    return args


# ----------------------------------------------------------------------------
# bytes Kernel A must move (the floor)
# ----------------------------------------------------------------------------

def n_snapshots(lengths: Sequence[int], snapshot_every: int, tile: int = TILE) -> int:
    """Total snapshots: ceil(ceil(n / tile) / every) per sequence (FLA's NT for every = 4)."""
    n_tiles = -(-np.asarray(lengths, dtype=np.int64) // tile)
    return int((-(-n_tiles // snapshot_every)).sum())


def kernel_a_bytes(lengths: Sequence[int], H: int, *, snapshot_dtype: str, snapshot_every: int,
                   with_dht: bool = True, beta_bytes: int = 4, d: int = D,
                   tile: int = TILE) -> dict[str, int]:
    """Bytes Kernel A reads and writes at least: every input once, every output once.

    inputs : q, k, do bf16 [tok, H, d]; gc fp32 [tok, H, d]; beta [tok, H];
             mqk, inv bf16 [tok, H, tile]; dht fp32 [N, H, d, d] (if given)
    outputs: snapshots [n_snap, H, d, d] in snapshot_dtype; dh0 fp32 [N, H, d, d]
    (cu_seqlens, a few hundred bytes, is left out.)
    """
    tok, N = int(sum(lengths)), len(lengths)
    rows = tok * H
    state = H * d * d
    inputs = rows * (3 * d * 2 + d * 4 + beta_bytes + 2 * tile * 2)
    if with_dht:
        inputs += N * state * 4
    snaps = n_snapshots(lengths, snapshot_every, tile) * state * DTYPE_BYTES[snapshot_dtype]
    dh0 = N * state * 4
    return {"inputs": inputs, "snapshots": snaps, "dh0": dh0, "total": inputs + snaps + dh0}


# ----------------------------------------------------------------------------
# tiles and snapshot rows (host index math, numpy)
# ----------------------------------------------------------------------------

def tile_table(lengths: Sequence[int], tile: int = TILE):
    """Every tile of every sequence in token order: (start, length) int64 arrays
    over the flattened token axis."""
    n = np.asarray(lengths, dtype=np.int64)
    bos = np.concatenate([[0], np.cumsum(n)[:-1]])
    seq_tiles = -(-n // tile)
    seq = np.repeat(np.arange(n.size), seq_tiles)
    first = np.concatenate([[0], np.cumsum(seq_tiles)[:-1]])
    in_seq = np.arange(int(seq_tiles.sum())) - first[seq]
    start = bos[seq] + tile * in_seq
    length = np.minimum(tile, bos[seq] + n[seq] - start)
    return start, length


def every_k_rows(lengths: Sequence[int], every: int, tile: int = TILE) -> np.ndarray:
    """Rows of the every-tile snapshot axis that form the every-`every`-tiles one.

    Snapshot m of a sequence with n_t tiles is the one of tile min(every*m + every - 1,
    n_t - 1); both axes are packed per sequence (FLA's chunk_offsets)."""
    n = np.asarray(lengths, dtype=np.int64)
    n_t = -(-n // tile)
    n_s = -(-n_t // every)
    off1 = np.concatenate([[0], np.cumsum(n_t)[:-1]])
    seq = np.repeat(np.arange(n.size), n_s)
    m = np.arange(int(n_s.sum())) - np.concatenate([[0], np.cumsum(n_s)[:-1]])[seq]
    return off1[seq] + np.minimum(every * m + every - 1, n_t[seq] - 1)


# ----------------------------------------------------------------------------
# inputs on the GPU (torch): kernel.reference.random_inputs' recipe
# ----------------------------------------------------------------------------

def make_inputs(cfg: Config, H: int, *, seed: int, gate_strength: float, device="cuda") -> dict:
    """Raw inputs for both kernels, drawn on the GPU with the recipe of
    ``kernel.reference.random_inputs`` (not its random stream: numpy at these
    sizes would take minutes). q, k, v, do bf16; g, beta, dht fp32.

        q, k, v ~ N(0, 1); do ~ 0.1 N(0, 1); beta = sigmoid(N(0, 1));
        g = clip(gate_strength * logsigmoid(N(3, 1)), -5, 0); dht ~ 0.1 N(0, 1)
    """
    import torch
    from kernel import reference as ref

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shape = (cfg.B, cfg.T, H, D)
    bf16, f32 = torch.bfloat16, torch.float32

    def randn(shp, dtype):
        return torch.randn(shp, generator=gen, device=device, dtype=dtype)

    q, k, v = randn(shape, bf16), randn(shape, bf16), randn(shape, bf16)
    g = randn(shape, f32).add_(ref.GATE_LOGIT_MEAN)
    g = torch.nn.functional.logsigmoid(g).mul_(gate_strength).clamp_(ref.GATE_LOWER_BOUND, 0.0)
    beta = torch.sigmoid(randn(shape[:3], f32))
    do = randn(shape, bf16).mul_(ref.DO_SCALE)
    dht = randn((cfg.N, H, D, D), f32).mul_(ref.DHT_SCALE)
    cu = np.concatenate([[0], np.cumsum(cfg.lengths)]).astype(np.int64) if cfg.varlen else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "do": do, "dht": dht, "cu_seqlens": cu}


def build_tiles(q, k, g, beta, *, lengths: Sequence[int], scale: float | None = None,
                qk_l2norm: bool = True, tile: int = TILE, out_dtype=None,
                max_elems: int = 1 << 27):
    """Kernel A's tile inputs (spec section 2) from raw q, k, g, beta, in fp32 on the GPU.

    q, k, g [B, T, H, K] (packed [1, total, ...] when `lengths` has several ragged
    sequences), beta [B, T, H]. Returns gc fp32 [B, T, H, K] and mqk, inv [B, T, H, tile]
    in `out_dtype` (default bf16, what dstate_scan takes). The same math as
    ``kernel.reference.prepare_tiles``, but fp32 and in slices of at most
    `max_elems` elements of the [tiles, heads, C, C, K] decay tensor, so it fits
    next to the 32x8192x32 inputs (the float64 reference would need ~100 GB).
    """
    import torch

    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    B, T, H, K = q.shape
    C = tile
    total = B * T
    if int(sum(lengths)) != total:
        raise ValueError(f"lengths sum to {int(sum(lengths))}, inputs hold {total} tokens")
    s = float(scale) if scale is not None else K ** -0.5
    dev = q.device
    qf, kf, gf = (x.reshape(total, H, K) for x in (q, k, g))
    bf = beta.reshape(total, H)
    gc_out = torch.empty(total, H, K, dtype=torch.float32, device=dev)
    mqk_out = torch.empty(total, H, C, dtype=out_dtype, device=dev)
    inv_out = torch.empty(total, H, C, dtype=out_dtype, device=dev)

    start, length = tile_table(lengths, C)
    n_tiles = start.size
    per_tile_head = C * C * K
    hg = max(1, min(H, max_elems // per_tile_head))              # heads per slice
    tg = max(1, max_elems // (per_tile_head * hg))                # tiles per slice
    lane = np.arange(C)
    le = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev))          # j <= c
    lt = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev), -1)      # j <  c
    eye = torch.eye(C, dtype=torch.float32, device=dev)

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False     # the batched mat-vecs below stay fp32
    try:
        for t0 in range(0, n_tiles, tg):
            st, ln = start[t0:t0 + tg], length[t0:t0 + tg]
            tok0, tok1 = int(st[0]), int(st[-1] + ln[-1])        # tiles cover tokens tok0..tok1-1
            idx_np = np.minimum(st[:, None] + lane, tok1 - 1) - tok0
            valid_np = lane[None, :] < ln[:, None]                 # [nt, C]
            idx = torch.from_numpy(idx_np.reshape(-1)).to(dev)
            valid = torch.from_numpy(valid_np).to(dev)
            nt = st.size
            for h0 in range(0, H, hg):
                h1 = min(H, h0 + hg)

                def gather(x):  # [tok, H, ...] -> [nt, C, h, ...] fp32, padded rows zero
                    t = x[tok0:tok1, h0:h1].index_select(0, idx).float()
                    t = t.reshape((nt, C) + tuple(t.shape[1:]))
                    return t * valid.reshape((nt, C) + (1,) * (t.dim() - 2))

                qt, kt, gt, bt = gather(qf), gather(kf), gather(gf), gather(bf)
                if qk_l2norm:
                    qt = qt * torch.rsqrt((qt * qt).sum(-1, keepdim=True) + L2NORM_EPS)
                    kt = kt * torch.rsqrt((kt * kt).sum(-1, keepdim=True) + L2NORM_EPS)
                gct = torch.cumsum(gt, dim=1) / LN2                 # [nt, C, h, K]
                qh, kh, gh = (x.permute(0, 2, 1, 3) for x in (qt, kt, gct))   # [nt, h, C, K]
                # E[c, j, d] = exp2(gc[c,d] - gc[j,d]) for j <= c (masked to -inf first:
                # a positive exponent above the diagonal could overflow)
                E = gh[:, :, :, None, :] - gh[:, :, None, :, :]    # [nt, h, C(c), C(j), K]
                E.masked_fill_(~le[:, :, None], -math.inf).exp2_()
                P = E.mul_(kh[:, :, None, :, :])                    # k[j, d] E[c, j, d]
                mqk = torch.matmul(P, qh[..., None])[..., 0].mul_(s)          # [nt, h, C, C]
                kk = torch.matmul(P, kh[..., None])[..., 0]
                del E, P
                lkk = kk.masked_fill_(~lt, 0.0).mul_(bt.permute(0, 2, 1)[..., None])
                inv = torch.linalg.solve_triangular(eye + lkk, eye.expand_as(lkk).contiguous(),
                                                    upper=False, unitriangular=True)
                # back to token order: tile row c lives at the tile's token c
                gc_out[tok0:tok1, h0:h1] = gct[valid]
                mqk_out[tok0:tok1, h0:h1] = mqk.permute(0, 2, 1, 3)[valid].to(out_dtype)
                inv_out[tok0:tok1, h0:h1] = inv.permute(0, 2, 1, 3)[valid].to(out_dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return (gc_out.reshape(B, T, H, K), mqk_out.reshape(B, T, H, C),
            inv_out.reshape(B, T, H, C))


# ----------------------------------------------------------------------------
# timing (CUDA events)
# ----------------------------------------------------------------------------

def free_memory() -> None:
    """Drop cached blocks of both allocators (torch's and CuPy's pools compete)."""
    _gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except ImportError:
        pass
    if "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        try:
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


@contextlib.contextmanager
def cupy_on_torch_stream():
    """Make CuPy launch on torch's current stream, so torch's events bracket Kernel A."""
    try:
        import cupy
    except ImportError:
        yield
        return
    import torch
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        yield


def time_cuda(fn: Callable[[], Any], *, warmup: int, reps: int, flush=None) -> dict:
    """Median/min/mean ms of `fn` over `reps` calls, each bracketed by CUDA events.

    Before every timed call `flush` (a 512 MiB buffer) is zeroed, so the call
    starts with a cold L2, and the GPU is first given HOST_AHEAD_CYCLES of work
    (torch.cuda._sleep), so that the events time the GPU, not the call's Python:
    on the H200 machine's CPU Kernel A's call took 0.63-0.76 ms of host time,
    longer than the memset (0.17 ms), and 4x8192 read 0.68-0.70 ms instead of
    0.55. The host time per call is returned too (`host_ms`). Outputs are dropped
    between calls. (time_alternating with one function.)
    """
    return time_alternating({"fn": fn}, warmup=warmup, reps=reps, flush=flush)["fn"]


def time_alternating(fns: dict[str, Callable[[], Any]], *, warmup: int, reps: int, flush=None,
                     record: list | None = None) -> dict[str, dict]:
    """Median/min/mean ms of each of `fns`, called in turn: `reps` rounds, each calling every
    function once (forward in even rounds, backward in odd ones), each call bracketed by CUDA
    events after the GPU-ahead sleep and L2 flush time_cuda describes; outputs are dropped
    between calls.

    Why: the H200 lowers its SM clock under its power limit (nvidia-smi: "SW power cap",
    1440-1785 MHz during Kernel A at 32 x 8192), so two kernels timed one after the other
    can run at different clocks. Called in turn, they see the same power state. `record`, if
    given, gets the names in call order.
    """
    import torch

    names = list(fns)
    for name in names:
        for _ in range(warmup):
            out = fns[name]()
            del out
    torch.cuda.synchronize()
    events = {n: [] for n in names}
    host = {n: [] for n in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(HOST_AHEAD_CYCLES)   # the GPU busy while the host queues the call
            if flush is not None:
                flush.zero_()
            start.record()
            t0 = time.perf_counter()
            out = fns[name]()
            host[name].append(time.perf_counter() - t0)
            end.record()
            del out
            events[name].append((start, end))
            if record is not None:
                record.append(name)
    torch.cuda.synchronize()
    res = {}
    for name in names:
        ms = sorted(s.elapsed_time(e) for s, e in events[name])
        res[name] = {"median_ms": float(np.median(ms)), "min_ms": float(ms[0]),
                     "mean_ms": float(np.mean(ms)), "reps": reps,
                     "host_ms": float(np.median(host[name]) * 1e3)}
        if res[name]["host_ms"] > HOST_AHEAD_WARN_MS:
            log(f"    warning: {name} took {res[name]['host_ms']:.2f} ms of host time a call, close to the "
                f"~2 ms of GPU work queued ahead of it: its time may include host gaps")
    return res


def kernel_only_ms(fn: Callable[[], Any], *, reps: int) -> dict | None:
    """GPU time of the kernels `fn` launches (CUPTI via torch.profiler), per call.

    Unlike the event timing this leaves out every gap between kernels (host
    overhead, a host-device copy that syncs the stream, ...); copies and memsets
    are not counted. None when the profiler is not usable.
    """
    import torch
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                out = fn()
                del out
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for e in prof.key_averages():
            if not str(getattr(e, "device_type", "")).endswith("CUDA"):
                continue
            if e.key.startswith(("Memcpy", "Memset")):
                continue
            us = getattr(e, "device_time_total", None)
            if us is None:
                us = getattr(e, "cuda_time_total", 0.0)
            kernels[e.key] = kernels.get(e.key, 0.0) + float(us)
        if not kernels:
            return None
        return {"ms": sum(kernels.values()) / reps / 1e3,
                "kernels": {k[:80]: v / reps / 1e3 for k, v in kernels.items()}}
    except Exception as exc:  # the profiler is optional
        return {"error": _err(exc)}


def copy_floor_ms(total_bytes: int, *, warmup: int, reps: int, flush=None) -> dict:
    """Time a device-to-device copy that reads and writes total_bytes / 2 each (so it
    moves total_bytes, like the kernel). Buffers above COPY_CAP_BYTES are timed at
    the cap and scaled linearly."""
    import torch

    half = max(1, total_bytes // 2)
    n = min(half, COPY_CAP_BYTES)
    buf = {"src": torch.ones(n, dtype=torch.uint8, device="cuda")}
    buf["dst"] = torch.empty_like(buf["src"])
    t = time_cuda(lambda: buf["dst"].copy_(buf["src"]), warmup=max(1, warmup), reps=reps,
                  flush=flush)
    buf.clear()
    scale = half / n
    ms = t["median_ms"] * scale
    return {"ms": ms, "copied_bytes": n, "scaled_by": scale,
            "GBps": total_bytes / (ms * 1e6)}


# ----------------------------------------------------------------------------
# Kernel A and FLA on one config
# ----------------------------------------------------------------------------

def kernel_a_import():
    """(dstate_scan, None) or (None, reason)."""
    try:
        from kernel.api import dstate_scan
    except Exception as exc:
        return None, f"{exc.__class__.__name__}: {exc}"
    return dstate_scan, None


def fla_import():
    """(fla_adapter module, description) or (None, reason)."""
    from kernel import fla_adapter
    ok, why = fla_adapter.available()
    return (fla_adapter if ok else None), why


def _cu_for_kernel_a(cu):
    # host int64: a device tensor would cost dstate_scan a device-to-host copy (a stream
    # sync) inside every timed call
    return None if cu is None else np.asarray(cu, dtype=np.int64)


def _cu_for_fla(cu):
    import torch
    return None if cu is None else torch.as_tensor(cu, dtype=torch.int64, device="cuda")


def run_kernel_a(dstate_scan, raw: dict, tiles: tuple, *, mode: str, vsplit, scale=None, tuning=None):
    """One dstate_scan call in snapshot mode `mode` (torch tensors in and out)
    -> (snapshots, dh0)."""
    dtype, every = MODES[mode]
    gc, mqk, inv = tiles
    with cupy_on_torch_stream():
        return dstate_scan(raw["q"], raw["k"], gc, raw["beta"], mqk, inv, raw["do"],
                           scale=scale, dht=raw["dht"], cu_seqlens=raw.get("cu_a"),
                           qk_l2norm=True, snapshot_dtype=dtype, snapshot_every=every,
                           vsplit=vsplit, tuning=tuning)


def as_torch(x, bf16_bits: bool = False):
    """A torch view of a torch or CuPy array (DLPack); uint16 bf16 bits -> torch.bfloat16."""
    import torch
    if not isinstance(x, torch.Tensor):
        x = torch.from_dlpack(x)
    if bf16_bits and x.dtype in (torch.uint16, torch.int16):
        x = x.view(torch.bfloat16)
    return x


def bench_config(cfg: Config, args, dstate_scan, fla, flush) -> dict:
    """Time Kernel A (each snapshot mode) and FLA on one config; returns a result dict."""
    import torch

    H = args.heads
    res: dict[str, Any] = {"config": cfg.name, "B": cfg.B, "T": cfg.T, "H": H, "D": D,
                           "N": cfg.N, "tokens": cfg.tokens, "varlen": cfg.varlen,
                           "kernel_a": {}, "fla": {}, "floor": {}, "bytes": {}}
    if cfg.varlen:
        res["lengths"] = list(cfg.lengths)
    for mode in args.modes:
        dt, ev = MODES[mode]
        res["bytes"][mode] = kernel_a_bytes(cfg.lengths, H, snapshot_dtype=dt, snapshot_every=ev)

    # 1. the byte floor, while the GPU is still empty
    free_memory()
    if dstate_scan is not None:
        for mode in args.modes:
            try:
                res["floor"][mode] = copy_floor_ms(res["bytes"][mode]["total"],
                                                   warmup=args.warmup,
                                                   reps=max(3, args.reps // 2), flush=flush)
            except Exception as exc:
                res["floor"][mode] = {"error": _err(exc)}
                log(f"    floor copy ({mode}) failed: {_err(exc)}")
                free_memory()

    # 2. raw inputs, shared by both
    t0 = time.perf_counter()
    raw = make_inputs(cfg, H, seed=args.seed, gate_strength=args.gate_strength)
    raw["cu_a"] = _cu_for_kernel_a(raw["cu_seqlens"])
    torch.cuda.synchronize()
    res["inputs_s"] = time.perf_counter() - t0
    inputs_bytes = res["bytes"][args.modes[0]]["inputs"]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    res["l2_note"] = (f"inputs {inputs_bytes / 1e9:.2f} GB vs L2 {l2 / 2**20:.0f} MiB: "
                      + ("no need to rotate input sets; " if inputs_bytes > 2 * l2 else
                         "inputs would fit in L2; ")
                      + "L2 flushed (512 MiB memset) before every timed call")

    # 3. Kernel A
    if dstate_scan is not None:
        res["vsplit"] = _resolved_vsplit(args.vsplit, cfg.N * H)
        t0 = time.perf_counter()
        try:
            tiles = build_tiles(raw["q"], raw["k"], raw["g"], raw["beta"], lengths=cfg.lengths)
            torch.cuda.synchronize()
        except Exception as exc:
            tiles = None
            res["kernel_a"]["error"] = f"building gc/mqk/inv: {_err(exc)}"
            log(f"    {res['kernel_a']['error']}")
            free_memory()
        res["build_tiles_s"] = time.perf_counter() - t0
        for mode in (args.modes if tiles is not None else []):
            try:
                t = time_cuda(lambda: run_kernel_a(dstate_scan, raw, tiles, mode=mode,
                                                   vsplit=args.vsplit, tuning=args.tuning),
                              warmup=args.warmup, reps=args.reps, flush=flush)
                if args.cupti:
                    t["kernel_only"] = kernel_only_ms(
                        lambda: run_kernel_a(dstate_scan, raw, tiles, mode=mode, vsplit=args.vsplit,
                                             tuning=args.tuning),
                        reps=min(args.reps, 5))
                t["GBps"] = res["bytes"][mode]["total"] / (t["median_ms"] * 1e6)
                floor = _get(res, "floor", mode, "ms")
                t["vs_floor"] = None if floor is None else t["median_ms"] / floor
                res["kernel_a"][mode] = t
            except Exception as exc:
                res["kernel_a"][mode] = {"error": _err(exc)}
                log(f"    Kernel A {mode}-mode failed: {_err(exc)}")
            free_memory()
    else:
        tiles = None

    # 4. FLA
    if fla is not None:
        try:
            t0 = time.perf_counter()
            # FLA's autotune keys leave out B and T: tune for this configuration, not the first one
            res["fla_autotune_reset"] = fla.reset_autotune()
            state = fla.prepare(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"],
                                cu_seqlens=_cu_for_fla(raw["cu_seqlens"]))
            calls = fla.callables(state, raw["do"], raw["dht"])
            torch.cuda.synchronize()
            res["fla_prepare_s"] = time.perf_counter() - t0
            for name, fn in calls.items():
                try:
                    res["fla"][name] = time_cuda(fn, warmup=max(1, args.warmup),
                                                 reps=args.reps, flush=flush)
                    if args.cupti:
                        res["fla"][name]["kernel_only"] = kernel_only_ms(fn, reps=min(args.reps, 5))
                except Exception as exc:
                    res["fla"][name] = {"error": _err(exc)}
                    log(f"    FLA {name} failed: {_err(exc)}")
                    free_memory()
            # 5. both in turn, under the same power state (time_alternating says why)
            if (not args.no_alternate and tiles is not None and "fla" in args.modes
                    and "median_ms" in res["kernel_a"].get("fla", {}) and "median_ms" in res["fla"].get("dAv+dhu", {})):
                try:
                    alt = time_alternating(
                        {"kernel_a_fla": lambda: run_kernel_a(dstate_scan, raw, tiles, mode="fla",
                                                              vsplit=args.vsplit, tuning=args.tuning),
                         "fla_dAv+dhu": calls["dAv+dhu"]},
                        warmup=1, reps=args.reps, flush=flush)
                    res["alternating"] = alt
                    res["ratio_alternating"] = alt["kernel_a_fla"]["median_ms"] / alt["fla_dAv+dhu"]["median_ms"]
                except Exception as exc:
                    res["alternating"] = {"error": _err(exc)}
                    log(f"    alternating timing failed: {_err(exc)}")
                    free_memory()
            del state, calls
            res["fla_autotune"] = fla.autotune_choices()   # FLA's block sizes for this shape
        except Exception as exc:
            res["fla"]["error"] = _err(exc)
            log(f"    FLA failed: {_err(exc)}")
        free_memory()
    del tiles
    free_memory()

    a = res["kernel_a"].get("fla", {}).get("median_ms")
    f = res["fla"].get("dAv+dhu", {}).get("median_ms")
    if a is not None and f is not None:
        res["ratio_a_fla"] = a / f
    raw.clear()
    free_memory()
    return res


def _alternating_text(res: dict) -> str:
    alt = res.get("alternating")
    if not alt:
        return "-"
    if "error" in alt:
        return f"failed ({alt['error']})"
    return (f"A {alt['kernel_a_fla']['median_ms']:.3f} ms, FLA {alt['fla_dAv+dhu']['median_ms']:.3f} ms, "
            f"ratio {res['ratio_alternating']:.3f}")


def _resolved_vsplit(vsplit, ctas: int):
    """The split 'auto' picks (kernel.api.choose_vsplit), for the record."""
    if vsplit != "auto":
        return vsplit
    try:
        import torch
        from kernel.api import choose_vsplit
        return choose_vsplit(ctas, torch.cuda.get_device_properties(0).multi_processor_count)
    except Exception:
        return "auto"


def _err(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# ----------------------------------------------------------------------------
# precision against the float64 reference (sampled heads)
# ----------------------------------------------------------------------------

def rel_fro(x, ref, chunk: int = 1 << 26) -> float:
    """||x - ref||_F / ||ref||_F in float64, in slices (x, ref torch tensors, same numel)."""
    xf, rf = x.reshape(-1), ref.reshape(-1)
    if xf.numel() != rf.numel():
        raise ValueError(f"rel_fro: {tuple(x.shape)} vs {tuple(ref.shape)}")
    num = den = 0.0
    for i in range(0, rf.numel(), chunk):
        r = rf[i:i + chunk].double()
        d = xf[i:i + chunk].double() - r
        num += float((d * d).sum())
        den += float((r * r).sum())
    return math.sqrt(num / den) if den > 0 else float("nan")


def _slice_inputs(raw: dict, cfg: Config, heads: int, seqs: int | None):
    """The first `heads` heads (and the first `seqs` sequences) as new contiguous tensors."""
    lengths = list(cfg.lengths)
    out = {}
    if seqs is not None and seqs < cfg.N:
        if cfg.varlen:
            n_tok = int(sum(lengths[:seqs]))
            tsl, bsl = slice(0, n_tok), slice(0, 1)
        else:
            tsl, bsl = slice(0, cfg.T), slice(0, seqs)
        lengths = lengths[:seqs]
    else:
        tsl, bsl = slice(None), slice(None)
    for key in ("q", "k", "v", "g", "do"):
        out[key] = raw[key][bsl, tsl, :heads].contiguous()
    out["beta"] = raw["beta"][bsl, tsl, :heads].contiguous()
    out["dht"] = raw["dht"][: len(lengths), :heads].contiguous()
    out["cu_seqlens"] = (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                         if cfg.varlen else None)
    out["cu_a"] = _cu_for_kernel_a(out["cu_seqlens"])
    return out, lengths


def precision_config(cfg: Config, args, dstate_scan, fla) -> dict:
    """Relative Frobenius errors of dh0 and snapshots vs kernel.reference in float64 (CuPy).

    Kernel A and FLA run on the same sampled heads they would see in the full
    run (heads are independent); the reference gets the same raw values
    (bf16 q, k, do; fp32 g, beta, dht) in float64 and builds its own float64
    gc, mqk, inv with prepare_tiles. The bf16 rounding of the exact dh is the
    yardstick for any bf16 snapshot.
    """
    import cupy
    import torch
    from kernel import reference as ref

    out: dict[str, Any] = {}
    raw = make_inputs(cfg, args.heads, seed=args.seed, gate_strength=args.gate_strength)
    sl, lengths = _slice_inputs(raw, cfg, args.precision_heads, args.precision_seqs)
    del raw
    free_memory()
    out["heads"], out["sequences"] = args.precision_heads, len(lengths)
    out["tokens"] = int(sum(lengths))

    def to_cp(t):  # torch -> CuPy float64 (CuPy has no bf16: widen in torch first)
        return cupy.from_dlpack(t.double().contiguous())

    to_torch = as_torch
    # the float64 reference
    q64, k64, g64, b64, do64, dht64 = (to_cp(sl[key]) for key in
                                       ("q", "k", "g", "beta", "do", "dht"))
    cu = sl["cu_seqlens"]
    t0 = time.perf_counter()
    gc_r, mqk_r, inv_r = ref.prepare_tiles(q64, k64, g64, b64, qk_l2norm=True, chunk=TILE,
                                           cu_seqlens=cu)
    snaps_r, dh0_r = ref.dstate_scan_reference(q64, k64, gc_r, b64, mqk_r, inv_r, do64,
                                               dht=dht64, cu_seqlens=cu, chunk=TILE,
                                               qk_l2norm=True, snapshot_every=1)
    cupy.cuda.Device().synchronize()
    out["reference_s"] = time.perf_counter() - t0
    H_s = args.precision_heads
    snaps1 = to_torch(snaps_r).reshape(-1, H_s, D, D)                        # every tile
    rows4 = torch.from_numpy(every_k_rows(lengths, MODES["fla"][1])).to(snaps1.device)
    snaps4 = snaps1.index_select(0, rows4)                                   # every 64 tokens
    dh0_t = to_torch(dh0_r)
    out["yardstick"] = {"bf16_of_exact_dh": rel_fro(snaps4.to(torch.bfloat16), snaps4),
                        "fp32_of_exact_dh": rel_fro(snaps1.float(), snaps1)}

    if dstate_scan is not None:
        tiles = build_tiles(sl["q"], sl["k"], sl["g"], sl["beta"], lengths=lengths,
                            out_dtype=torch.float32)
        out["builder_fp32_vs_f64"] = {
            "gc": rel_fro(tiles[0], to_torch(gc_r)), "mqk": rel_fro(tiles[1], to_torch(mqk_r)),
            "inv": rel_fro(tiles[2], to_torch(inv_r))}
        tiles = (tiles[0], tiles[1].to(torch.bfloat16), tiles[2].to(torch.bfloat16))
        out["kernel_a"] = {}
        for mode in args.modes:
            try:
                snaps, dh0 = run_kernel_a(dstate_scan, sl, tiles, mode=mode, vsplit=args.vsplit,
                                          tuning=args.tuning)
                snaps, dh0 = as_torch(snaps, bf16_bits=mode == "fla"), as_torch(dh0)
                refs = snaps4 if mode == "fla" else snaps1
                out["kernel_a"][mode] = {"dh0": rel_fro(dh0, dh0_t), "snapshots": rel_fro(snaps, refs)}
                del snaps, dh0
            except Exception as exc:
                out["kernel_a"][mode] = {"error": _err(exc)}
        del tiles
    if fla is not None:
        try:
            state = fla.prepare(sl["q"], sl["k"], sl["v"], sl["g"], sl["beta"],
                                cu_seqlens=_cu_for_fla(cu))
            dh, dh0f = fla.dh_dh0(state, sl["do"], sl["dht"])
            out["fla"] = {"dh0": rel_fro(dh0f, dh0_t), "dh": rel_fro(dh, snaps4)}
            del state, dh, dh0f
        except Exception as exc:
            out["fla"] = {"error": _err(exc)}
    del snaps1, snaps4, snaps_r, dh0_r, gc_r, mqk_r, inv_r
    free_memory()
    return out


# ----------------------------------------------------------------------------
# report: table, plot
# ----------------------------------------------------------------------------

TABLE_COLUMNS = ("config", "A fla-mode ms", "A seed-mode ms", "FLA dAv+dhu ms", "FLA w_u ms",
                 "ratio A/FLA", "A/FLA in turn", "A GB/s", "floor ms", "A/floor")


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def table_row(res: dict) -> list[str]:
    """One row of the timing table; A GB/s, floor, A/floor are for the fla mode
    (the seed mode's when only it ran); '-' where a number is missing."""
    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    mode = "fla" if _get(res, "kernel_a", "fla", "median_ms") is not None else "seed"
    return [
        res.get("config", "?"),
        f(_get(res, "kernel_a", "fla", "median_ms"), ".3f"),
        f(_get(res, "kernel_a", "seed", "median_ms"), ".3f"),
        f(_get(res, "fla", "dAv+dhu", "median_ms"), ".3f"),
        f(_get(res, "fla", "recompute_w_u", "median_ms"), ".3f"),
        f(res.get("ratio_a_fla"), ".2f"),
        f(res.get("ratio_alternating"), ".2f"),
        f(_get(res, "kernel_a", mode, "GBps"), ".0f"),
        f(_get(res, "floor", mode, "ms"), ".3f"),
        f(_get(res, "kernel_a", mode, "vs_floor"), ".2f"),
    ]


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = TABLE_COLUMNS) -> str:
    """A Markdown table, numbers right-aligned."""
    rows = [list(map(str, r)) for r in rows]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"row {r} has {len(r)} cells, header {len(header)}")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells, left_first=True):
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(c.ljust(w) if i == 0 and left_first else c.rjust(w))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


PRECISION_COLUMNS = ("config", "heads x seqs", "A fla dh0", "A fla snaps", "A seed dh0",
                     "A seed snaps", "FLA dh0", "FLA dh", "bf16(exact dh)", "mqk/inv in")


def precision_row(res: dict) -> list[str]:
    p = res.get("precision", {})

    def e(*keys):
        x = _get(p, *keys)
        return "-" if x is None else f"{x:.2e}"

    b = _get(p, "builder_fp32_vs_f64")
    built = "-" if b is None else f"{max(b['mqk'], b['inv']):.1e}"
    return [res.get("config", "?"), f"{p.get('heads', '-')} x {p.get('sequences', '-')}",
            e("kernel_a", "fla", "dh0"), e("kernel_a", "fla", "snapshots"),
            e("kernel_a", "seed", "dh0"), e("kernel_a", "seed", "snapshots"),
            e("fla", "dh0"), e("fla", "dh"), e("yardstick", "bf16_of_exact_dh"), built]


def plot(results: Sequence[dict], path: str) -> None:
    """Grouped bars per config: Kernel A (each mode), FLA dAv+dhu, FLA + recompute_w_u;
    the fla-mode byte floor as a tick."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("Kernel A fla-mode", ("kernel_a", "fla", "median_ms")),
              ("Kernel A seed-mode", ("kernel_a", "seed", "median_ms")),
              ("FLA dAv+dhu", ("fla", "dAv+dhu", "median_ms")),
              ("FLA recompute_w_u", ("fla", "recompute_w_u", "median_ms"))]
    # a series no config has (e.g. --snapshot fla: no seed mode) gets no bar and no legend entry
    series = [(label, keys) for label, keys in series if any(_get(r, *keys) is not None for r in results)]
    names = [r["config"] for r in results]
    x = np.arange(len(names))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(names)), 4.5))
    for i, (label, keys) in enumerate(series):
        vals = [_get(r, *keys) for r in results]
        ax.bar(x + (i - (len(series) - 1) / 2) * w, [v if v is not None else 0 for v in vals],
               w, label=label)
    floors = [_get(r, "floor", "fla", "ms") for r in results]
    if any(f is not None for f in floors):
        ax.scatter([xi - 1.5 * w for xi, f in zip(x, floors) if f is not None],
                   [f for f in floors if f is not None], marker="_", s=400, color="k",
                   label="byte floor (fla-mode)", zorder=3)
    ax.set_xticks(x)
    ax.set_xticklabels(names)
    ax.set_ylabel("ms (median)")
    ax.set_title("Kernel A vs flash-linear-attention (H200, H=32, D=128)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------

def environment() -> dict:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch
        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["device"] = p.name
            env["sms"] = p.multi_processor_count
            env["l2_bytes"] = getattr(p, "L2_cache_size", None)
            env["memory_bytes"] = p.total_memory
    except ImportError:
        env["torch"] = None
    return env


def log_precision_table(results: Sequence[dict]) -> None:
    log("")
    log("relative Frobenius error vs the float64 reference (sampled heads):")
    log(format_table([precision_row(r) for r in results], PRECISION_COLUMNS))


def report_from_json(paths: Sequence[str], plot_path: str | None, json_path: str | None) -> int:
    """The table, precision table and plot of configs timed by earlier runs (--json files)."""
    results, runs = [], []
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
            rows = data["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(f"{path}: not a kernel.bench --json file ({_err(exc)})")
            return 1
        runs.append({"file": path, "environment": data.get("environment"), "args": data.get("args")})
        for r in rows:
            results.append({**r, "source": path})
    ok = [r for r in results if "error" not in r]
    log(f"{len(ok)} config(s) from {len(paths)} file(s); each row's ratios were measured in its own run")
    log(format_table([table_row(r) for r in ok]))
    prec = [r for r in ok if "precision" in r and "error" not in r["precision"]]
    if prec:
        log_precision_table(prec)
    for r in results:
        if "error" in r:
            log(f"{r['config']} ({r['source']}): {r['error']}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"runs": runs, "results": results}, fh, indent=1, default=str)
        log(f"wrote {json_path}")
    if plot_path and ok:
        plot(ok, plot_path)
        log(f"wrote {plot_path}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return report_from_json(args.from_json, args.plot, args.json)
    configs = []
    for spec in args.configs.split(","):
        if spec.strip():
            try:
                configs.append(parse_config(spec, seed=args.seed))
            except ValueError as exc:
                log(f"skipping config: {exc}")

    try:
        import torch
    except ImportError as exc:
        log(f"torch is not installed ({exc}): the bench needs torch and a CUDA GPU")
        return 1
    if not torch.cuda.is_available():
        log("torch sees no CUDA device: nothing to time")
        return 1

    env = environment()
    log(f"device: {env.get('device')} ({env.get('sms')} SMs, L2 "
        f"{(env.get('l2_bytes') or 0) / 2**20:.0f} MiB), torch {env['torch']}")
    dstate_scan = None
    if not args.no_kernel:
        dstate_scan, why = kernel_a_import()
        log("Kernel A: kernel.api.dstate_scan" if dstate_scan else f"Kernel A not available ({why})")
    fla, why = None, "skipped (--no-fla)"
    if not args.no_fla:
        fla, why = fla_import()
        log(f"FLA: {why}" if fla else f"flash-linear-attention not found ({why})")
    env["fla"] = why if fla else None
    log(f"H={args.heads}, D={D}, modes={args.modes}, vsplit={args.vsplit}, "
        f"tuning={args.tuning or 'defaults'}, warm-up "
        f"{args.warmup}, median of {args.reps}; seed {args.seed}")

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    results = []
    for i, cfg in enumerate(configs):
        tag = f"[{i + 1}/{len(configs)}] {cfg.name}"
        t0 = time.perf_counter()
        try:
            res = bench_config(cfg, args, dstate_scan, fla, flush)
        except Exception as exc:
            log(f"{tag}: FAILED {_err(exc)}")
            traceback.print_exc(limit=3)
            sys.stderr.flush()
            res = {"config": cfg.name, "error": _err(exc)}
            free_memory()
        if args.precision and "error" not in res:
            try:
                res["precision"] = precision_config(cfg, args, dstate_scan, fla)
            except Exception as exc:
                res["precision"] = {"error": _err(exc)}
                log(f"{tag}: precision FAILED {_err(exc)}")
                traceback.print_exc(limit=3)
                sys.stderr.flush()
                free_memory()
        res["wall_s"] = time.perf_counter() - t0
        results.append(res)
        if "error" not in res:
            cells = dict(zip(TABLE_COLUMNS, table_row(res)))
            extra = ""
            if "precision" in res and "error" not in res["precision"]:
                extra = "; precision " + " ".join(
                    f"{h}={c}" for h, c in zip(PRECISION_COLUMNS[2:], precision_row(res)[2:]))
            ko = {m: _get(res, "kernel_a", m, "kernel_only", "ms") for m in MODES}
            ko["FLA"] = _get(res, "fla", "dAv+dhu", "kernel_only", "ms")
            ko_txt = ", ".join(f"{m} {v:.3f}" for m, v in ko.items() if v is not None)
            log(f"{tag}: A (vsplit {res.get('vsplit', '-')}) fla {cells['A fla-mode ms']} ms, "
                f"seed {cells['A seed-mode ms']} ms, "
                f"FLA dAv+dhu {cells['FLA dAv+dhu ms']} ms (w_u {cells['FLA w_u ms']}), "
                f"floor {cells['floor ms']} ms, A/floor {cells['A/floor']}, "
                f"in turn: {_alternating_text(res)} "
                f"[{res['wall_s']:.0f} s]; kernels only (CUPTI): {ko_txt or '-'}{extra}")
            if i == 0 and "l2_note" in res:
                log(f"    {res['l2_note']}")

    ok = [r for r in results if "error" not in r]
    log("")
    log(format_table([table_row(r) for r in ok]))
    log("A = Kernel A (vsplit %s); ratio, A GB/s, floor and A/floor use the fla mode (bf16 "
        "snapshot every 64 tokens = FLA's dh); floor = device copy of the same bytes; "
        "'A/FLA in turn' = both called alternately, %d times each (same power state)."
        % (args.vsplit, args.reps))
    if args.precision:
        log_precision_table([r for r in ok if "precision" in r])
    for r in results:
        if "error" in r:
            log(f"{r['config']}: {r['error']}")

    del flush
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "args": {k: v for k, v in vars(args).items()},
                       "results": results}, fh, indent=1, default=str)
        log(f"wrote {args.json}")
    if args.plot and ok:
        try:
            plot(ok, args.plot)
            log(f"wrote {args.plot}")
        except Exception as exc:
            log(f"plot failed: {_err(exc)}")
    return 0 if ok or not configs else 1


if __name__ == "__main__":
    sys.exit(main())
