"""Kernel A's sequence split timed over segment counts, pass by pass (GPU, torch).

    python -m kernel.studies.sequence_split.sweep --configs 1x131072,1x32768 --segments 1,4,8,16

For each configuration (H heads, bf16 snapshots every 64 tokens: FLA's dh layout) and
each segment count S (every sequence cut into min(S, its 64-token blocks); "auto" is
kernel.ds_scan.split's rule), kernel.dstate_scan is timed with the bench's timer (cold L2, the
GPU given work ahead of each call) and, in the same process, its passes are timed from
events kernel.ds_scan.split.run marks (pass 1: summaries beside the last segments' scans;
the fold; pass 3: the other segments' scans; GPU work queued ahead, as the timer does). Beside them: the two-pass byte floor
(the unsplit scan's bytes plus the middle segments' inputs read again in pass 1,
at the device's copy rate) and the time against S = 1 from the same process.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import numpy as np


def _num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def parse_segments(text: str) -> list:
    """'1,5,auto' -> [1, 5, 'auto']; anything else than 'auto' or an integer >= 1 is refused."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item != "auto" and not (item.isdigit() and int(item) >= 1):
            raise argparse.ArgumentTypeError(f"segment counts are 'auto' or integers >= 1, got {item!r}")
        out.append("auto" if item == "auto" else int(item))
    return out


def parse_weights(text: str) -> list[float]:
    """'1.5,2' -> [1.5, 2.0]: the last segment's length against the others', each > 0."""
    try:
        out = [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"end weights are numbers, got {text!r}") from None
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"end weights must be > 0, got {text!r}")
    return out


def run(argv: Sequence[str] | None = None) -> int:
    """The sweep; 2 (and a line saying why) where no GPU is usable."""
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.sequence_split.sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="1x32768,1x131072,1x524288,2x65536")
    ap.add_argument("--segments", default="1,3,4,5,8,auto", type=parse_segments)
    ap.add_argument("--end-weights", default=None, type=parse_weights,
                    help="comma-separated lengths of the last segment against the others' (kernel.ds_scan.split.END_WEIGHT "
                         "for the run; default: its value)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--snapshot", default="bf16-every-64", choices=("bf16-every-64", "fp32-every-tile"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.heads < 1:
        ap.error("--reps and --heads must be >= 1")
    from ptx_lab.gpu import gpu_reason

    if gpu_reason():
        print(f"the sweep needs a GPU: {gpu_reason()}")
        return 2

    import cupy
    import torch

    from kernel.ds_scan import launch, split
    from kernel.runtime import builds
    from kernel.tools.bench.configs import MODES, kernel_a_bytes, parse_config
    from kernel.tools.bench.inputs import build_tiles, cu_for_kernel_a, make_inputs
    from kernel.tools.bench.timing import (HOST_AHEAD_CYCLES, L2_FLUSH_BYTES, copy_floor_ms, cupy_on_torch_stream,
                                           free_memory, time_cuda)

    dtype, every = MODES[args.snapshot]
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    sm = builds.sm_count()
    rows = []
    for spec in args.configs.split(","):
        cfg = parse_config(spec)
        H = args.heads
        raw = make_inputs(cfg, H, seed=0, gate_strength=1.0)
        cu = cu_for_kernel_a(raw["cu_seqlens"])
        gc, mqk, inv = build_tiles(raw["q"], raw["k"], raw["g"], raw["beta"], lengths=cfg.lengths)
        torch.cuda.synchronize()
        nbytes = kernel_a_bytes(cfg.lengths, H, snapshot_dtype=dtype, snapshot_every=every)
        base_ms = None
        weights = args.end_weights or [split.END_WEIGHT]
        variants = [(seg, w) for seg in args.segments for w in (weights if seg != 1 else [1.0])]
        for seg, weight in variants:
            split.END_WEIGHT = weight       # read by kernel.ds_scan.launch at each call (its plan cache keys on it)
            counts = split.counts_for(seg, cfg.lengths, H, sm)

            def call():
                with cupy_on_torch_stream():
                    return launch.dstate_scan(raw["q"], raw["k"], gc, raw["beta"], mqk, inv, raw["do"],
                                           dht=raw["dht"], cu_seqlens=cu, snapshot_dtype=dtype,
                                           snapshot_every=every, segments=seg)

            t = time_cuda(call, warmup=2, reps=args.reps, flush=flush)
            # the passes, from kernel.ds_scan.split.run's marks (median over reps)
            phases: dict[str, list] = {}
            for _ in range(max(3, args.reps // 2)):
                marks = []
                with cupy_on_torch_stream(), split.phase_marks(
                        lambda name: marks.append((name, cupy.cuda.get_current_stream().record()))):
                    torch.cuda._sleep(HOST_AHEAD_CYCLES)   # as time_cuda: the events time the GPU, not Python
                    flush.zero_()
                    call()
                torch.cuda.synchronize()
                for (_, a), (name, b) in zip(marks, marks[1:]):
                    phases.setdefault(name, []).append(cupy.cuda.get_elapsed_time(a, b))
            phase_ms = {k: float(np.median(v)) for k, v in phases.items()}
            p = split.plan(np.concatenate([[0], np.cumsum(cfg.lengths)]), counts, snapshot_every=every,
                           end_weight=weight)
            middle_tokens = int(sum(p.cu[i + 1] - p.cu[i] for i in p.middles))
            floor_bytes = nbytes["total"] + nbytes["inputs"] * middle_tokens // max(1, cfg.tokens)
            floor = copy_floor_ms(floor_bytes, warmup=1, reps=5, flush=flush)["ms"]
            if seg == 1:
                base_ms = t["median_ms"]
            row = dict(config=cfg.name, segments=seg, end_weight=weight, counts=sorted(set(counts.tolist())),
                       ms=t["median_ms"],
                       vs_unsplit=None if base_ms is None else t["median_ms"] / base_ms,
                       floor_ms=floor, phases=phase_ms)
            rows.append(row)
            ph = " ".join(f"{k} {v:.3f}" for k, v in phase_ms.items()) or "(unsplit)"
            print(f"{cfg.name:>10} S={str(seg):>4} w={weight:.2f} counts {row['counts']}: {t['median_ms']:.3f} ms"
                  f" ({_num(row['vs_unsplit'])} of S=1),"
                  f" floor {floor:.3f} ms; {ph}", flush=True)
            free_memory()
        del raw, gc, mqk, inv
        free_memory()
    print("\n| config | S | last's weight | counts | ms | / S=1 | two-pass floor ms | pass 1 | fold | pass 3 |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ph = r["phases"]
        print(f"| {r['config']} | {r['segments']} | {r['end_weight']:.2f} | {r['counts']} | {r['ms']:.3f} | "
              f"{_num(r['vs_unsplit'])} | "
              f"{r['floor_ms']:.3f} | {_num(ph.get('pass 1'))} | {_num(ph.get('fold'))} | {_num(ph.get('pass 3'))} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run())
