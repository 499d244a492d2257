"""Kernel A's sequence split in the op's own backward: the whole ``kernel.kda_backward.run`` on the arguments
FLA's layer hands ``kernel.chunk_kda`` (through ``kernel.patch_fla()``), timed over segment counts (GPU,
torch, fla-core and flash-linear-attention).

    python -m kernel.studies.sequence_split.op --config 1x131072 --heads 16 --segments 1,5,9,17

The sweep beside it (``sweep.py``) times Kernel A alone, built for tiles made beforehand; the op runs the
build that reads FLA's Aqk and Akk blocks and our forward's states, whose tiles cost more, so its best count
can differ. The layer is the layer bench's (hidden 2048, 128 a head, seed 0); its call is recorded once,
then each count is timed in turn (median of --reps, a cold L2, the GPU kept --ahead-ms ahead of the host),
and one call of each is timed on the host.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from .sweep import parse_segments


def run(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.sequence_split.op", description=__doc__.split("\n")[0])
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

    import kernel.kda_backward as kda_backward
    import kernel.tools.bench.timing as timing
    from kernel.tools.bench import layer as bench_layer
    from kernel.tools.bench.configs import parse_config

    cfg = parse_config(args.config, 0)
    print(f"{args.config}, {args.heads} heads: building the layer and recording its call ...", file=sys.stderr,
          flush=True)
    lay, x, _, kw = bench_layer.layer_and_inputs(cfg, args.heads, 2048, 0)
    original, routed, module = bench_layer.routes()
    failures: dict = {}
    calls = bench_layer.op_backward_calls(bench_layer.layers_call(lay, x, kw, module, original), original, routed, 0,
                                           failures)
    if bench_layer.OP_OURS not in calls:
        print(f"our op's backward could not run: {failures}")
        return 1
    handed_args, handed_kwargs = bench_layer.recorded_backward(calls[bench_layer.OP_OURS])
    run_backward = kda_backward.run
    fns = {str(s): (lambda s=s: run_backward(*handed_args, **{**handed_kwargs, "segments": s}))
           for s in args.segments}
    timing.HOST_AHEAD_CYCLES = int(args.ahead_ms * 2e6)   # torch.cuda._sleep's cycles at about 2 GHz
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
        args.json.write_text(json.dumps({"config": args.config, "heads": args.heads, "ahead_ms": args.ahead_ms,
                                         "times": times, "host_ms": host}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run())
