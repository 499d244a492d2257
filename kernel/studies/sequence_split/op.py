"""Kernel A's sequence split in the op's own backward: the whole ``kernel.kda_backward.run`` on the arguments
FLA's layer hands ``kernel.chunk_kda`` (through ``kernel.patch_fla()``), timed over segment counts (GPU,
torch, fla-core and flash-linear-attention).

    python -m kernel.studies.sequence_split.op --config 1x131072 --heads 16 --segments 1,5,9,17
    python -m kernel.studies.sequence_split.op --call bench --config 1x131072 --heads 32 --segments 5,9,17

The sweep beside it (``sweep.py``) times Kernel A alone, built for tiles made beforehand; the op runs the
build that reads FLA's Aqk and Akk blocks and our forward's states, whose tiles cost more, so its best count
can differ. The layer is the layer bench's (hidden 2048, 128 a head, seed 0); its call is recorded once,
then each count is timed in turn (median of --reps, a cold L2, the GPU kept --ahead-ms ahead of the host),
and one call of each is timed on the host.

``--call bench`` takes instead the call of the backward bench's training step (``ptx-lab bench --backward``: its
inputs, gates in [-5, 0], ``kernel.chunk_kda`` on our forward), whose ratio to cuDNN's backward through autograd
is a target at 32 heads.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from .sweep import parse_segments


def per_count(handed: tuple[tuple, dict], segments) -> dict:
    """One call of ``kernel.kda_backward.run`` on the recorded (args, kwargs) for each segment count."""
    import kernel.kda_backward as kda_backward

    (args, kwargs), run_backward = handed, kda_backward.run
    return {str(s): (lambda s=s: run_backward(*args, **{**kwargs, "segments": s})) for s in segments}


def layer_calls(cfg, heads: int, segments):
    """``kernel.kda_backward.run`` on the arguments FLA's layer hands our op, one call per segment count."""
    from kernel.tools.bench import layer as bench_layer

    lay, x, _, kw = bench_layer.layer_and_inputs(cfg, heads, 2048, 0)
    original, routed, module = bench_layer.routes()
    failures: dict = {}
    calls = bench_layer.op_backward_calls(bench_layer.layers_call(lay, x, kw, module, original), original, routed, 0,
                                           failures)
    if bench_layer.OP_OURS not in calls:
        print(f"our op's backward could not run: {failures}")
        return None
    return per_count(bench_layer.recorded_backward(calls[bench_layer.OP_OURS]), segments)


def bench_calls(cfg, heads: int, segments):
    """``kernel.kda_backward.run`` on the arguments ``kernel.chunk_kda``'s backward hands it in the backward
    bench's training step (its inputs, seed 0, gates in [-5, 0]; our forward, whose saved states spare the
    backward its forward-state scan), recorded in one call, one call per segment count."""
    from kernel import chunk_kda
    from kernel.tools import fla_kda
    from kernel.tools.bench.backward import clamped_step_inputs, retained_backwards
    from kernel.tools.bench.layer import recorded_backward

    raw, inp = clamped_step_inputs(cfg, heads)
    failures: dict = {}
    calls = retained_backwards({"ours": (fla_kda.step_forward(chunk_kda, inp), list(inp["leaves"].values()))},
                               (raw["do"], raw["dht"]), failures)
    if "ours" not in calls:
        print(f"kernel.chunk_kda's forward could not run: {failures}")
        return None
    return per_count(recorded_backward(calls["ours"]), segments)


def run(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.sequence_split.op", description=__doc__.split("\n")[0])
    ap.add_argument("--call", choices=("layer", "bench"), default="layer",
                    help="whose backward call: FLA's layer's (default) or the backward bench's")
    ap.add_argument("--config", default="1x131072")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--segments", default="1,5,9,17", type=parse_segments)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ahead-ms", type=float, default=20.0,
                    help="GPU work queued ahead of each timed call, so that host time stays out (default 20)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.heads < 1 or args.ahead_ms <= 0:
        ap.error("--reps and --heads must be >= 1, --ahead-ms > 0")
    from ptx_lab.gpu import gpu_reason

    if gpu_reason():
        print(f"the study needs a GPU: {gpu_reason()}")
        return 2
    import torch

    import kernel.tools.bench.timing as timing
    from kernel.tools.bench.configs import parse_config

    cfg = parse_config(args.config, 0)
    print(f"{args.config}, {args.heads} heads: building the {args.call}'s call ...", file=sys.stderr, flush=True)
    fns = (bench_calls if args.call == "bench" else layer_calls)(cfg, args.heads, args.segments)
    if fns is None:
        return 1
    timing.HOST_AHEAD_CYCLES = int(args.ahead_ms * timing.SLEEP_CYCLES_PER_MS)
    times = timing.time_alternating(fns, warmup=2, reps=args.reps)
    host = {}
    for name, fn in fns.items():
        torch.cuda.synchronize()
        torch.cuda._sleep(timing.HOST_AHEAD_CYCLES)
        t0 = time.perf_counter()
        fn()
        host[name] = 1e3 * (time.perf_counter() - t0)
        torch.cuda.synchronize()
    base = times[str(args.segments[0])]["median_ms"]
    print(f"| config | heads | segments | ms | / {args.segments[0]} segment(s) | host ms |")
    print("|---|---:|---|---:|---:|---:|")
    for name, t in times.items():
        print(f"| {args.config} | {args.heads} | {name} | {t['median_ms']:.3f} | {t['median_ms'] / base:.3f} | "
              f"{host[name]:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"call": args.call, "config": args.config, "heads": args.heads,
                                         "ahead_ms": args.ahead_ms, "times": times, "host_ms": host}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run())
