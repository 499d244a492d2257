"""Timing on the GPU: CUDA events around each call, alone or in turn, CUPTI kernel time, the copy floor.

Every timed call starts with a cold L2 (a 512 MiB buffer zeroed first) and with
~2 ms of GPU work queued ahead of it, so that the events time the GPU, not the
call's Python (time_cuda says why). torch and CuPy are imported inside the
functions.
"""
from __future__ import annotations

import contextlib
import gc as _gc
import importlib.util
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

from .report import error_text, log

L2_FLUSH_BYTES = 512 << 20          # >> the H200's 60 MB L2
SLEEP_CYCLES_PER_MS = 1.98e6        # torch.cuda._sleep's cycles a millisecond at the H200's 1980 MHz
# GPU work queued before each timed call (torch.cuda._sleep, ~2 ms): longer than a call's host time,
# so that the GPU, not Python, is timed (time_cuda). A study may set it for its own calls.
HOST_AHEAD_CYCLES = 4_000_000
COPY_CAP_BYTES = 16 << 30           # largest buffer for the floor copy; larger counts are scaled


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


def log_failure(label: str, exc: BaseException) -> str:
    """Logs `label FAILED <error>` with a short traceback, frees the GPU memory the failed step held,
    and returns the error's text for the result dict."""
    log(f"{label} FAILED {error_text(exc)}")
    traceback.print_exc(limit=3)
    sys.stderr.flush()
    free_memory()
    return error_text(exc)


def run_configs(configs, bench_one: Callable, progress: Callable, *, failed: dict,
                after: Callable | None = None) -> list[dict]:
    """bench_one(cfg) for every configuration in turn, each result timed in ``wall_s``. One that raises
    is logged and recorded as ``{**failed, "config": name, "error": text}``, and the run goes on.
    after(cfg, res, tag) runs, inside the timing, on each result without an error; then
    progress(i, tag, res) reports it."""
    results = []
    for i, cfg in enumerate(configs):
        tag = f"[{i + 1}/{len(configs)}] {cfg.name}"
        t0 = time.perf_counter()
        try:
            res = bench_one(cfg)
        except Exception as exc:
            res = {**failed, "config": cfg.name, "error": log_failure(f"{tag}:", exc)}
        if after is not None and "error" not in res:
            after(cfg, res, tag)
        res["wall_s"] = time.perf_counter() - t0
        results.append(res)
        if "error" not in res:
            progress(i, tag, res)
    return results


@contextlib.contextmanager
def cupy_on_torch_stream():
    """Make CuPy launch on torch's current stream, so torch's events bracket Kernel A."""
    if importlib.util.find_spec("cupy") is None:
        yield
        return
    from kernel.runtime.arrays import torch_stream_for_cupy

    with torch_stream_for_cupy("the bench"):
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
        warning = host_gap_warning(name, res[name]["host_ms"], res[name]["median_ms"])
        if warning:
            log(f"    {warning}")
    return res


def host_gap_warning(name: str, host_ms: float, gpu_ms: float) -> str | None:
    """A warning where a timed call's GPU time may include the GPU waiting for the host, else None.

    The calls are queued without a sync between them, each after HOST_AHEAD_CYCLES of GPU work, so the
    queue ahead of a call grows by its GPU time plus that sleep and shrinks by its host time: a call
    whose host time is below the sum never leaves the GPU idle (its first rep aside, which the median
    drops). Above it, the call either waits for the GPU inside (a host sync, which empties the queue, so
    that the GPU idles while the host queues the rest of the call) or queues work more slowly than the
    GPU runs it."""
    ahead_ms = HOST_AHEAD_CYCLES / SLEEP_CYCLES_PER_MS   # read now: a study may have changed it
    if host_ms <= gpu_ms + ahead_ms:
        return None
    return (f"warning: {name} took {host_ms:.2f} ms of host time a call, more than its {gpu_ms:.2f} ms on the GPU "
            f"and the {ahead_ms:.0f} ms queued ahead of it: it waits for the GPU (a host sync) or the host "
            f"is slower than the GPU, and its time includes the GPU's idle gaps")


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
        return {"error": error_text(exc)}


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
