"""Kernel B at every run length: one CTA walks ``run_chunks`` consecutive 64-token chunks of a sequence, carrying
the state across their boundaries, so a CTA's start (its first loads, with the state's 32 KB, waiting with nothing
else on the SM) is paid once a run. Each length of kernel.token_gradients.RUN_CHUNKS is timed in turn in one
process per configuration, and the launch's cost model (waves x (chunks a run + RUN_START_CHUNKS)) is fitted to the
times, which says what a CTA's start costs and whether the auto choice is the fastest.

    python -m kernel.studies.kernel_b_runs --configs 4x8192,32x8192,1x131072 [--heads 32] [--reps 7] [--json FILE]

Kernel B runs as ``kernel.chunk_kda``'s backward calls it (kernel.tools.source_ab's inputs and call: bf16 dS every
tile, rstd given, dq and dk in bf16). The stored states are a constant, so the runs' gradients (which carry the state
instead) are not compared here; tests/kernel/token_gradients compare each run length with float64. GPU, CuPy and
torch.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from ..timed_configs import parse_configs, run_configs


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.kernel_b_runs", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="4x8192,32x8192,1x131072", help="comma-separated BxT (default %(default)s)")
    p.add_argument("--heads", type=int, default=32, help="heads, H = HV (default 32, the bench's)")
    p.add_argument("--reps", type=int, default=7, help="timed calls a run length, in turn (median; default 7)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    args.configs = parse_configs(p, args.configs)
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    return args


def waves(ctas: int, sms: int) -> int:
    """Rounds of one CTA an SM that ``ctas`` CTAs take."""
    return -(-ctas // sms)


def fit_start_cost(rows: Sequence[dict]) -> dict:
    """The launch's cost model, ms = t_chunk x waves x (chunks a run + start), fitted by least squares to rows of
    {run_chunks, waves, ms}: t_chunk (a chunk's ms in a wave), start (a CTA's start in chunks: RUN_START_CHUNKS'
    measured value) and the model's ms per row. Linear in (t_chunk, t_chunk x start)."""
    A = np.array([[r["waves"] * r["run_chunks"], r["waves"]] for r in rows], dtype=np.float64)
    y = np.array([r["ms"] for r in rows], dtype=np.float64)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return {"t_chunk_ms": float(a), "start_chunks": float(b / a) if a else float("nan"),
            "model_ms": [float(x) for x in A @ np.array([a, b])]}


def report(row: dict) -> str:
    """One configuration's table: a row a run length, its CTAs, waves, ms, against one chunk a run, the model's."""
    base = next(r["ms"] for r in row["runs"] if r["run_chunks"] == 1)
    fit = row["fit"]
    lines = [f"{row['config']}, H = {row['heads']}, {row['sms']} SMs: a CTA's start fitted at {fit['start_chunks']:.3f} "
             f"chunks of {fit['t_chunk_ms'] * 1e3:.2f} us (the launch assumes {row['assumed_start_chunks']}); "
             f"auto picks {row['auto']} chunks a run, the fastest was {row['fastest']}",
             "| chunks a run | CTAs | waves | ms | / one chunk a run | model ms |", "|---:|---:|---:|---:|---:|---:|"]
    for r, model_ms in zip(row["runs"], fit["model_ms"]):
        lines.append(f"| {r['run_chunks']} | {r['ctas']:,} | {r['waves']} | {r['ms']:.3f} | {r['ms'] / base:.3f} | "
                     f"{model_ms:.3f} |")
    return "\n".join(lines)


def measure(config: str, heads: int, reps: int) -> dict:
    import torch

    from kernel.runtime.builds import sm_count
    from kernel.token_gradients import launch
    from kernel.tools import source_ab
    from kernel.tools.bench.timing import cupy_on_torch_stream, time_alternating

    spec = source_ab.parse_spec(config, "b")
    cu = np.arange(spec.B + 1, dtype=np.int64) * spec.T
    x = source_ab.drawn_inputs(spec, heads)
    run, _ = source_ab.kernel_b_call(spec, heads, x)   # one set of arrays for every length
    fns = {c: functools.partial(run, run_chunks=c) for c in launch.RUN_CHUNKS}
    with cupy_on_torch_stream():
        for c, fn in fns.items():   # the build compiles once, before any timing
            fn()
            torch.cuda.synchronize()
        times = time_alternating({str(c): fn for c, fn in fns.items()}, warmup=1, reps=reps)
    sms = sm_count()
    runs = []
    for c in launch.RUN_CHUNKS:
        ctas = launch.run_plan(cu, heads, c).runs * heads
        runs.append({"run_chunks": c, "ctas": ctas, "waves": waves(ctas, sms), "ms": times[str(c)]["median_ms"]})
    return {"config": config, "heads": heads, "reps": reps, "sms": sms, "runs": runs, "fit": fit_start_cost(runs),
            "auto": launch.run_plan(cu, heads, sms=sms).run_chunks, "assumed_start_chunks": launch.RUN_START_CHUNKS,
            "fastest": min(runs, key=lambda r: r["ms"])["run_chunks"]}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_configs("kernel_b_runs", args.configs, args.heads, lambda c: measure(c, args.heads, args.reps), report,
                       args.json)


if __name__ == "__main__":
    sys.exit(main())
