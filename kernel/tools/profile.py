"""Where Kernel A's, Kernel B's and the forward's cycles go: per-warp clock64 accounting of each phase of a tile.

    ptx-lab profile [--shape 1x16384] [--H 32] [--vsplit 4 1] [--mode bf16x4]
                    [--tune nstage=3 producers=4 ...]      (or python -m kernel.tools.profile)
    ptx-lab profile --kernel b [--configs 32x8192,1x131072] [--H 32]
    ptx-lab profile --kernel f [--configs 32x8192,1x131072] [--H 32]

Builds the kernel with KDA_TIMING=1 (config.Config.timing): lane 0 of every warp
of the first 8 CTAs adds clock64 deltas per phase into `kda_timing`. Printed per
configuration, in cycles per tile (mean over those warps):

    producers: wait for loads (cp.async.wait_group + __syncwarp), R1
               (+ FULL arrive), wait EMPTY (the consumers still hold the stage),
               issue loads (cp.async address math and issue)
    consumers: snapshot store, wait FULL (the producers are behind), G1..G5
               (with ksplit 2 this includes the pair exchange; its barrier wait is
               also shown on its own, "of which pair wait")

A role that waits most of the tile is not the bottleneck; the other one is.
The uninstrumented time of the same launch is printed beside it, so the cost
of the accounting itself is visible. Needs a GPU.

Kernel B (``--kernel b``) is built with KDB_TIMING=1 (its ``timing`` build) and run in the
training step's form (kernel.tools.source_ab's inputs: rstd given, bf16 dq and dk). Every warp
of every CTA charges each phase of its tiles (token_gradients_timing.cuh's TimingPhase, in the
order of KERNEL_B_PHASES); the report gives, per configuration and phase, the cycles per tile
(the mean over warps and CTAs), its share of the tile, and the fastest and slowest warp's mean.
A phase that ends at a CTA barrier holds the wait there: where the slowest warp's work sets the
pace, the fastest warp's "barrier" phase is long.

The forward (``--kernel f``) is built with KF_TIMING=1 (its ``timing`` builds, one a consumer-warp
count), in the configuration its launch picks for the inputs, training mode, on the bench's kind of
inputs (q and k unit rows, FLA's cumsum gate). Each role's warps charge four slots of every tile
(forward_timing.cuh): what they wait on, their work, the hand-off after it, and the refill or store.
Printed per role, in cycles per tile (the mean over its warps and the CTAs): the role that waits
least sets the pace.
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Sequence

import numpy as np

from kernel.ds_scan import config

PRODUCER_SLOTS = ("total", "wait loads", "R1", "wait EMPTY", "issue loads")
CONSUMER_SLOTS = ("total", "snapshot", "wait FULL", "G1..G5")
PAIR_SLOT = 4        # consumers: the ksplit-2 pair barrier, a part of G1..G5
# Kernel B's phases of a tile, token_gradients_timing.cuh's TimingPhase in order
KERNEL_B_PHASES = ("issue loads", "wait first loads + barrier", "wait loads + barrier", "R1 + barrier", "V phase",
                   "V barrier", "reduce + barrier", "K products", "K elementwise", "l2norm + stores", "dg",
                   "end + stores")
# the forward's slots of a tile (forward_timing.cuh's TimingSlot, in order), and what each means to each role
FORWARD_SLOTS = ("wait", "work", "pass", "refill")
FORWARD_ROLES = {"consumers": ("FULL", "chain + F2", "release + state store", "o store"),
                 "producers": ("copies landed", "R1", "products or hand-over", "publish + EMPTY + issue"),
                 "product warps": ("R1 handed over", "Mqk, Akk, INV", "hand-back + publish", "")}


def _inputs(B: int, T: int, H: int, seed: int = 0):
    """Kernel A inputs with the magnitudes of a real KDA layer (l2-normalised q/k,
    gates of a few units per tile); values do not change the timing."""
    import cupy as cp

    from kernel.ds_scan.launch import bf16_bits
    from kernel.reference import random_inputs

    r = random_inputs(B, T, H, seed=seed, xp=cp)
    T16 = -(-T // 16) * 16
    g = cp.pad(r["g"], ((0, 0), (0, T16 - T), (0, 0), (0, 0)))
    gc = cp.cumsum(g.reshape(B, T16 // 16, 16, H, 128), axis=2).reshape(B, T16, H, 128)[:, :T]
    gc = (gc / np.log(2)).astype(cp.float32)
    rng = cp.random.default_rng(seed)
    small = lambda: bf16_bits(rng.standard_normal((B, T, H, 16), dtype=cp.float32) * 0.1)
    return dict(q=bf16_bits(r["q"]), k=bf16_bits(r["k"]), gc=gc, beta=r["beta"].astype(cp.float32),
                mqk=small(), inv=small(), do=bf16_bits(r["do"]))


def _time_ms(fn, reps: int = 5) -> float:
    import cupy as cp

    fn()
    times = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return float(np.median(times))


def profile(B: int, T: int, H: int, vsplit: int, mode: str, tune: dict) -> dict:
    import cupy as cp

    from kernel.ds_scan import launch
    from kernel.runtime import builds

    x = _inputs(B, T, H)
    dtype, every = {"bf16x4": ("bfloat16", 4), "f32x1": ("float32", 1),
                    "bf16x1": ("bfloat16", 1), "f32x4": ("float32", 4)}[mode]
    call = lambda tuning: launch.dstate_scan(x["q"], x["k"], x["gc"], x["beta"], x["mqk"], x["inv"], x["do"],
                                          snapshot_dtype=dtype, snapshot_every=every, vsplit=vsplit,
                                          tuning=tuning)
    plain_ms = _time_ms(lambda: call(tune))
    cfg = config.Config(vsplit=vsplit, snap_bf16=dtype == "bfloat16", snap_every=every, timing=True, **tune)
    mod = launch.module(cfg)
    dims = builds.read_int_constants(mod, "kda_timing_dims", 3)
    timing_ctas = dims[0]
    counters = cp.ndarray(dims, dtype=cp.uint64, memptr=mod.get_global("kda_timing"))
    call({**tune, "timing": True})               # compile + warm
    counters.fill(0)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    call({**tune, "timing": True})
    e1.record()
    e1.synchronize()
    timed_ms = cp.cuda.get_elapsed_time(e0, e1)
    c = counters.get().astype(np.float64)
    tiles = -(-T // 16)
    consumers = cfg.consumers
    ctas = min(timing_ctas, B * H * vsplit)
    cons = c[:ctas, :consumers].mean(axis=(0, 1)) / tiles
    prod = c[:ctas, consumers:consumers + cfg.producers, :len(PRODUCER_SLOTS)].mean(axis=(0, 1)) / tiles
    return dict(shape=f"{B}x{T}", H=H, vsplit=vsplit, mode=mode, tune=tune, producers=cfg.producers,
                consumers=consumers, ksplit=cfg.ksplit, mt=cfg.mt, plain_ms=plain_ms, timed_ms=timed_ms, tiles=tiles,
                consumer=dict(zip(CONSUMER_SLOTS, cons)), pair_wait=float(cons[PAIR_SLOT]),
                producer=dict(zip(PRODUCER_SLOTS, prod)))


def format_result(r: dict) -> str:
    tune = " ".join(f"{k}={v}" for k, v in r["tune"].items()) or "defaults"
    head = (f"{r['shape']} H{r['H']} vsplit {r['vsplit']} {r['mode']} ({tune}; {r['consumers']} consumer, "
            f"{r['producers']} producer warps): "
            f"{r['plain_ms']:.3f} ms plain, {r['timed_ms']:.3f} ms instrumented, {r['tiles']} tiles per CTA")
    cons = "  consumers, cycles/tile: " + ", ".join(f"{k} {v:,.0f}" for k, v in r["consumer"].items())
    if r.get("pair_wait"):
        cons += f" (of which pair wait {r['pair_wait']:,.0f})"
    prod = "  producers, cycles/tile: " + ", ".join(f"{k} {v:,.0f}" for k, v in r["producer"].items())
    return "\n".join((head, cons, prod))


# ----------------------------------------------------------------------------
# Kernel B
# ----------------------------------------------------------------------------

def _time_with_buffer(mod, pointer: str, cycles, plain, timed) -> tuple[float, float]:
    """(plain ms, timed ms), median of 5 calls each, after pointing the timing build's ``pointer`` (a device
    global of ``mod``) at ``cycles``; the timed calls each write every CTA's sums there again. The pointer goes
    back to null after (a later launch of the build, say by a test, then writes nothing rather than into memory
    ``cycles`` no longer owns)."""
    import cupy as cp

    from kernel.tools import source_ab

    slot = cp.ndarray((1,), dtype=cp.uint64, memptr=mod.get_global(pointer))
    slot[0] = cycles.data.ptr
    try:
        plain_ms, timed_ms = source_ab.median_ms(plain, 5), source_ab.median_ms(timed, 5)
        cp.cuda.get_current_stream().synchronize()
    finally:
        slot[0] = 0
        cp.cuda.get_current_stream().synchronize()
    return plain_ms, timed_ms


def kernel_b_tiles(B: int, T: int, H: int, run_chunks: int = 1) -> np.ndarray:
    """The tiles of each of Kernel B's CTAs on B sequences of T tokens and H heads, a CTA a run of ``run_chunks``
    chunks, in the order kdb_timing holds them (cta = head x runs + run: the grid is (runs, heads))."""
    from kernel.shapes import CHUNK_TOKENS, TILE_TOKENS

    span = CHUNK_TOKENS * run_chunks
    starts = np.arange(0, T, span)
    per_run = -(-np.minimum(span, T - starts) // TILE_TOKENS)
    return np.tile(np.tile(per_run, B), H)


def summarize_kernel_b(cycles: np.ndarray, tiles: np.ndarray) -> dict:
    """Per phase of KERNEL_B_PHASES, from ``cycles`` [CTAs, warps, phases] (kdb_timing) and ``tiles`` [CTAs]:
    the cycles per tile (mean over warps and tiles), the share of the tile, and the fastest and slowest warp's
    (each warp's cycles over all CTAs, per tile)."""
    c = np.asarray(cycles, dtype=np.float64)
    if c.ndim != 3 or c.shape[2] != len(KERNEL_B_PHASES) or c.shape[0] != len(tiles):
        raise ValueError(f"cycles must be [CTAs ({len(tiles)}), warps, {len(KERNEL_B_PHASES)} phases], "
                         f"got {c.shape}")
    n = float(np.sum(tiles))
    per_warp = c.sum(axis=0) / n                     # [warps, phases]: each warp's cycles per tile
    mean = per_warp.mean(axis=0)
    total = float(mean.sum())
    return {"tile_cycles": total, "tiles": int(n), "ctas": int(c.shape[0]), "warps": int(c.shape[1]),
            "phases": [dict(phase=name, cycles=float(mean[i]), share=float(mean[i] / total) if total else 0.0,
                            fastest=float(per_warp[:, i].min()), slowest=float(per_warp[:, i].max()))
                       for i, name in enumerate(KERNEL_B_PHASES)]}


def format_kernel_b(r: dict) -> str:
    """The report of one configuration: a head line and a table of the phases."""
    head = (f"Kernel B {r['config']} H{r['H']}, {r['run_chunks']} chunks a CTA: {r['plain_ms']:.3f} ms plain, "
            f"{r['timed_ms']:.3f} ms instrumented; {r['ctas']:,} CTAs of {r['warps']} warps, {r['tiles']:,} tiles, "
            f"{r['tile_cycles']:,.0f} cycles a tile (the mean warp's)")
    rows = ["| phase | cycles / tile | share | fastest warp | slowest warp |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {p['phase']} | {p['cycles']:,.0f} | {100 * p['share']:.1f}% | {p['fastest']:,.0f} | "
             f"{p['slowest']:,.0f} |" for p in r["phases"]]
    return "\n".join((head, *rows))


def profile_kernel_b(config: str, H: int, run_chunks: int | str = "auto") -> dict:
    """Kernel B's timing build on one configuration (BxT) against its plain build, on the GPU, a CTA a run of
    ``run_chunks`` chunks (kernel.token_gradients.run_plan's choice for "auto")."""
    import cupy as cp

    from kernel.runtime import builds
    from kernel.token_gradients.launch import BUILD, Build, run_plan
    from kernel.tools import source_ab

    spec = source_ab.parse_spec(config, "b")
    x = source_ab.drawn_inputs(spec, H)
    chunks = run_plan(np.arange(spec.B + 1, dtype=np.int64) * spec.T, H, run_chunks).run_chunks
    plain, _ = source_ab.kernel_b_call(spec, H, x, run_chunks=chunks)   # one set of arrays for both builds
    timed = functools.partial(plain, timing=True)
    tiles = kernel_b_tiles(spec.B, spec.T, H, chunks)
    mod = BUILD.module(Build(timing=True))   # the module the timed launch runs (load_module caches it)
    warps, phases = builds.read_int_constants(mod, "kdb_timing_dims", 2)
    if phases != len(KERNEL_B_PHASES):
        raise RuntimeError(f"the timing build has {phases} phases, KERNEL_B_PHASES names {len(KERNEL_B_PHASES)}")
    cycles = cp.zeros((tiles.size, warps, phases), dtype=cp.uint32)
    plain_ms, timed_ms = _time_with_buffer(mod, "kdb_timing", cycles, plain, timed)
    return {"config": config, "H": H, "run_chunks": chunks, "plain_ms": plain_ms, "timed_ms": timed_ms,
            **summarize_kernel_b(cycles.get(), tiles)}


# ----------------------------------------------------------------------------
# the forward
# ----------------------------------------------------------------------------

def summarize_forward(cycles: np.ndarray, tiles_per_cta: int, warps: int, producers: int, product_warps: int) -> dict:
    """Per role, from ``cycles`` [CTAs, warps, FORWARD_SLOTS] (kf_timing; warps in the kernel's order: consumers,
    producers, product warps): each slot's cycles per tile, the mean over the role's warps and the CTAs."""
    c = np.asarray(cycles, dtype=np.float64)
    total = warps + producers + product_warps
    if c.ndim != 3 or c.shape[1:] != (total, len(FORWARD_SLOTS)):
        raise ValueError(f"cycles must be [CTAs, {total} warps, {len(FORWARD_SLOTS)} slots], got {c.shape}")
    spans = {"consumers": (0, warps), "producers": (warps, warps + producers),
             "product warps": (warps + producers, total)}
    roles = {}
    for role, (a, b) in spans.items():
        if b > a:
            per_tile = c[:, a:b].mean(axis=(0, 1)) / tiles_per_cta
            roles[role] = dict(zip(FORWARD_SLOTS, (float(x) for x in per_tile)))
    return {"ctas": int(c.shape[0]), "tiles_per_cta": int(tiles_per_cta), "roles": roles}


def format_forward(r: dict) -> str:
    """The report of one configuration: a head line and a row a role, each slot's cycles a tile named for it."""
    head = (f"the forward {r['config']} H{r['H']} ({r['build']}): {r['plain_ms']:.3f} ms plain, "
            f"{r['timed_ms']:.3f} ms instrumented; {r['ctas']:,} CTAs of {r['tiles_per_cta']:,} tiles")
    rows = ["| role | " + " | ".join(FORWARD_SLOTS) + " | tile |", "|---|" + "---:|" * (len(FORWARD_SLOTS) + 1)]
    for role, slots in r["roles"].items():
        cells = [f"{slots[s]:,.0f} ({name})" if name else f"{slots[s]:,.0f}"
                 for s, name in zip(FORWARD_SLOTS, FORWARD_ROLES[role])]
        rows.append(f"| {role} | " + " | ".join(cells) + f" | {sum(slots.values()):,.0f} |")
    return "\n".join((head, *rows))


def profile_forward(config: str, H: int) -> dict:
    """The forward's timing build on one configuration (BxT), in the build its launch picks, beside that build."""
    import dataclasses

    import cupy as cp

    from kernel.forward import forward, plan_forward
    from kernel.forward.launch import module
    from kernel.runtime import builds
    from kernel.shapes import TILE_TOKENS
    from kernel.tools import source_ab

    spec = source_ab.parse_spec(config, "f")
    x = source_ab.drawn_inputs(spec, H)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    plain = plan_forward(*args, output_final_state=True, training=True, sm_count=builds.sm_count()).config
    timed = dataclasses.replace(plain, timing=True)
    plan = plan_forward(*args, output_final_state=True, training=True, config=timed)
    mod = module(timed)
    (slots,) = builds.read_int_constants(mod, "kf_timing_slots", 1)
    if slots != len(FORWARD_SLOTS):
        raise RuntimeError(f"the timing build has {slots} slots, FORWARD_SLOTS names {len(FORWARD_SLOTS)}")
    cycles = cp.zeros((plan.ctas, timed.threads // 32, slots), dtype=cp.uint32)

    def run(cfg):
        return lambda: forward(*args, output_final_state=True, training=True, config=cfg)

    plain_ms, timed_ms = _time_with_buffer(mod, "kf_timing", cycles, run(plain), run(timed))
    tiles = -(-spec.T // TILE_TOKENS)
    return {"config": config, "H": H, "build": plain.name(), "plain_ms": plain_ms, "timed_ms": timed_ms,
            **summarize_forward(cycles.get(), tiles, timed.warps, timed.producers, timed.product_warps)}


def _run_chunks(text: str) -> int | str:
    from kernel.token_gradients.launch import RUN_CHUNKS

    if text == "auto":
        return text
    if not text.isdigit() or int(text) not in RUN_CHUNKS:
        raise argparse.ArgumentTypeError(f"expected 'auto' or one of {RUN_CHUNKS}, got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.profile") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=("a", "b", "f"), default="a",
                    help="Kernel A (default), Kernel B or the forward (f)")
    ap.add_argument("--configs", default="32x8192,1x131072",
                    help="Kernel B and the forward: BxT configurations, comma-separated (default 32x8192,1x131072)")
    ap.add_argument("--shape", default="1x16384", help="BxT (default 1x16384)")
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--vsplit", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--mode", default="bf16x4", choices=("bf16x4", "f32x1", "bf16x1", "f32x4"))
    ap.add_argument("--tune", nargs="*", default=[], help="config.Config knobs, e.g. nstage=3 producers=4")
    ap.add_argument("--run-chunks", default="auto", type=_run_chunks,
                    help="Kernel B: the chunks a CTA walks, 'auto' (the launch's choice) or one of "
                         "kernel.token_gradients.RUN_CHUNKS")
    args = ap.parse_args(argv)
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is not None:
        print(f"{prog} needs a GPU ({gpu_reason()})", file=sys.stderr)
        return 2
    if args.kernel == "b":
        for shape in args.configs.split(","):
            print(format_kernel_b(profile_kernel_b(shape.strip(), args.H, args.run_chunks)), flush=True)
        return 0
    if args.kernel == "f":
        for shape in args.configs.split(","):
            print(format_forward(profile_forward(shape.strip(), args.H)), flush=True)
        return 0
    B, T = (int(v) for v in args.shape.lower().split("x"))
    for vs in args.vsplit:
        print(format_result(profile(B, T, args.H, vs, args.mode, config.parse_knobs(args.tune))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
