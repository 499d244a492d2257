"""Where a training step of FLA's KDA layer spends its GPU time, kernel by kernel, FLA's path beside ours.

    python -m kernel.studies.layer_profile --configs 1x131072
    python -m kernel.studies.layer_profile --configs 4x8192,32x8192 --sides ours --top 12 --json prof.json
    python -m kernel.studies.layer_profile --step op --heads 32 --configs 1x131072 --sides ours

The step is the layer bench's (``ptx-lab bench --layer``: ``fla.layers.kda.KimiDeltaAttention`` at its
defaults, hidden 2048, 16 heads of 128, bf16; forward, then the gradients of x and of every parameter).
Each side runs 2 steps unmeasured, then ``--steps`` steps under torch.profiler (CUDA activity only),
then the same number timed by CUDA events around each step. Printed per side: the step's time by events
(what the GPU took, wall), the sum of its kernels' times (larger than the wall where kernels overlap:
Kernel A's sequence split runs two streams), and the kernels by time a step, largest first. A kernel of
this package (its function one of ``kernel.registry.KERNELS``'; FLA too names some kernels kda_*) is
tagged ``ours``; the others are FLA's, torch's and cuBLAS's. The kernels both sides run (the
projections, the short convolutions, the norms) take the same time on both, so the difference between
the sides is the KDA op's.

``--step op`` profiles instead the op's own training step as ``ptx-lab bench --backward`` times it (FLA's
``chunk_kda`` against ``kernel.chunk_kda``: the bench's inputs at ``--heads`` heads, gates in [-5, 0], the
l2norm in the op; forward, then the gradients of q, k, v, g, beta and the initial state), where the
backward's targets against cuDNN's are set at 32 heads.

Needs a CUDA GPU, torch, fla-core and flash-linear-attention.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Sequence

from kernel.tools.bench.cli import pipeline_argument

SIDES = ("fla", "ours")
STEPS = ("layer", "op")


def our_kernels() -> frozenset[str]:
    """The function names of this package's kernels."""
    from kernel import registry

    return frozenset(build.function for build in registry.KERNELS)


def parse_args(argv: Sequence[str] | None):
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.layer_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="1x131072", help="comma-separated BxT or varlenNxT, as ptx-lab bench takes "
                                                          "them (default 1x131072)")
    ap.add_argument("--sides", default=",".join(SIDES), help="fla, ours or both (default both)")
    ap.add_argument("--step", choices=STEPS, default="layer",
                    help="layer: FLA's KDA layer's training step (default); op: the backward bench's chunk_kda step")
    ap.add_argument("--heads", type=int, default=None,
                    help="heads of 128 (default: the layer bench's for --step layer, the backward bench's for op)")
    ap.add_argument("--steps", type=int, default=3, help="steps profiled, and then timed (default 3)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed a side (default 25)")
    ap.add_argument("--json", type=Path, help="also write every kernel's time here")
    ap.add_argument("--qk-copies", action="store_true",
                    help="our side on the op's copies path (kernel.fla_dropin.setting.RAW_QK_ROWS off: q and k "
                         "normalised into copies first) instead of its raw-row path, to compare the two")
    ap.add_argument("--backward-pipeline", type=pipeline_argument, metavar="A_SMS,GROUPS",
                    help="our side with its backward pipelined (kernel.backward_pipeline: GROUPS groups of sequences, "
                         "each group's Kernel A on A_SMS SMs beside the group before's Kernel B)")
    args = ap.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        ap.error(f"--sides: expected names from {', '.join(SIDES)}, got {args.sides!r}")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    if args.heads is not None and args.heads < 1:
        ap.error(f"--heads must be at least 1, got {args.heads}")
    args.sides = sides
    return args


def kernel_times(events, steps: int) -> dict[str, float]:
    """ms a step by kernel name, from torch.profiler's events of ``steps`` steps."""
    import torch

    times: dict[str, float] = collections.Counter()
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] += e.device_time_total / steps / 1e3
    return dict(times)


def layer_steps(cfg, heads: int | None, sides: Sequence[str]) -> dict:
    """side -> one training step of FLA's layer with that side's chunk_kda (the layer bench's)."""
    from kernel.tools.bench.layer import HIDDEN, LAYER_HEADS, layer_and_inputs, layer_step, routes

    layer, x, dout, kw = layer_and_inputs(cfg, heads or LAYER_HEADS, HIDDEN, seed=0)
    original, routed, layer_module = routes()
    ops = {"fla": original, "ours": routed}
    return {side: layer_step(layer, x, dout, kw, ops[side], layer_module, original) for side in sides}


def op_steps(cfg, heads: int | None, sides: Sequence[str]) -> dict:
    """side -> one training step of the op as the backward bench times it: FLA's chunk_kda or kernel.chunk_kda
    on the bench's inputs (seed 0, gates in [-5, 0], safe_gate), forward and the gradients of every input."""
    import torch

    import kernel
    from kernel.tools import fla_kda
    from kernel.tools.bench.backward import clamped_step_inputs
    from kernel.tools.bench.cli import BENCH_HEADS

    raw, inp = clamped_step_inputs(cfg, heads or BENCH_HEADS)
    xs = list(inp["leaves"].values())
    ops = {"fla": fla_kda.import_fla()["chunk_kda"], "ours": kernel.chunk_kda}

    def step_of(op):
        forward = fla_kda.step_forward(op, inp)
        return lambda: torch.autograd.grad(forward(), xs, (raw["do"], raw["dht"]))
    return {side: step_of(ops[side]) for side in sides}


def profile_config(config: str, sides: Sequence[str], steps: int, step: str = "layer", heads: int | None = None) -> dict:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernel.tools.bench.configs import parse_config

    cfg = parse_config(config, 0)
    res = {}
    for side, step_fn in (op_steps if step == "op" else layer_steps)(cfg, heads, sides).items():
        for _ in range(2):   # FLA compiles and tunes in its first call on a shape
            step_fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step_fn()
            torch.cuda.synchronize()
        kernels = kernel_times(prof.events(), steps)
        walls = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step_fn()
            end.record()
            torch.cuda.synchronize()
            walls.append(start.elapsed_time(end))
        res[side] = dict(wall_ms=float(np.median(walls)), kernel_sum_ms=sum(kernels.values()), kernels=kernels)
    return res


def report(config: str, res: dict, top: int) -> None:
    mine = our_kernels()
    for side, r in res.items():
        ours = sum(ms for name, ms in r["kernels"].items() if name in mine)
        print(f"==== {config}, {side}: step {r['wall_ms']:.3f} ms by events; kernels {r['kernel_sum_ms']:.3f} ms a step"
              + (f", of which ours {ours:.3f}" if ours else ""), flush=True)
        for name, ms in sorted(r["kernels"].items(), key=lambda kv: -kv[1])[:top]:
            tag = "ours" if name in mine else ""
            print(f"  {ms:8.3f} ms  {tag:4}  {name[:100]}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from kernel.tools.bench.layer import missing_requirement

    why = missing_requirement()
    if why is None:
        import torch
        if not torch.cuda.is_available():
            why = "no CUDA device"
    if why is not None:
        print(f"layer_profile: needs a CUDA GPU, torch, fla-core and flash-linear-attention ({why})", file=sys.stderr)
        return 2
    if args.qk_copies:
        from kernel.fla_dropin import setting

        setting.RAW_QK_ROWS = False
    if args.backward_pipeline is not None:
        from kernel import backward_pipeline

        backward_pipeline.PIPELINE = args.backward_pipeline
    out = {}
    for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
        out[config] = profile_config(config, args.sides, args.steps, args.step, args.heads)
        report(config, out[config], args.top)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
