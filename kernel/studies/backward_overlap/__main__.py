"""Kernel A and Kernel B side by side on SMs split between them, against one after the other on every SM.

    python -m kernel.studies.backward_overlap --configs 32x8192 [--heads 32] [--sm-counts 16,24,32,48] [--reps 5]
                                               [--groups 8] [--json FILE]

At each configuration (run one a call: each configuration in its own process), on one set of inputs
(kernel.tools.source_ab's, in the training step's form), timed in turn (``time_alternating``):

* on every SM: Kernel A alone, Kernel B alone, A then B on one stream, A and B at once on two streams (A's at the
  highest priority), the batch as ``--groups`` groups of whole sequences in turn, and those groups pipelined on the
  two streams (kernel.backward_pipeline.launch_on: each B after its group's A, the next group's A beside it);
* for each SM count k of ``--sm-counts``: A alone on a green context of k SMs, B alone on one of the rest, both
  at once on the two, and the groups pipelined through them, the first group's A and the last group's B on every
  SM.

The groups are views of the same arrays (:func:`group_views`). B's outputs after a run on each split's rest are
checked against a run on torch's stream, from zeroed outputs (a launch that ran nowhere would leave zeros). The
report puts each pipeline beside its model (:func:`pipelined_ms`). GPU, CuPy, torch and cuda-bindings.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from kernel.backward_pipeline import group_bounds, launch_on
from kernel.shapes import CHUNK_TOKENS, TILE_TOKENS

from ..timed_configs import parse_configs, run_configs


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.backward_overlap", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="32x8192", help="comma-separated BxT (default %(default)s)")
    p.add_argument("--heads", type=int, default=32, help="heads, H = HV (default 32, the bench's)")
    p.add_argument("--sm-counts", default="16,24,32,48",
                   help="Kernel A's side of each split, in SMs (the driver rounds up; default %(default)s)")
    p.add_argument("--groups", type=int, default=8, help="groups of sequences the modelled pipeline runs (default 8)")
    p.add_argument("--reps", type=int, default=5, help="timed calls a variant, in turn (median; default 5)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    args.configs = parse_configs(p, args.configs)
    try:
        args.sm_counts = [int(s) for s in args.sm_counts.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sm-counts: expected comma-separated integers, got {args.sm_counts!r}")
    if not args.sm_counts or min(args.sm_counts) < 1:
        p.error("--sm-counts: at least one count, each >= 1")
    if args.heads < 1 or args.reps < 1 or args.groups < 2:
        p.error("--heads and --reps must be >= 1, --groups >= 2")
    return args


def pipelined_ms(a_all: float, b_all: float, a_part: float, b_rest: float, groups: int) -> float:
    """A backward that cuts the batch into ``groups`` groups of sequences: the first group's Kernel A on every SM,
    then each later group's A on the split's first side beside the group before's B on the rest, then the last
    group's B on every SM. Each group does 1 / groups of the work; the middle's time is its slower side's.
    Interference between the sides (the memory both share) is not modelled: the measured 'both' row shows it."""
    return (a_all + b_all) / groups + (groups - 1) / groups * max(a_part, b_rest)


def group_views(T: int, x: dict, arrays: dict, b0: int, b1: int) -> tuple[dict, dict]:
    """Sequences b0 .. b1 - 1 of Kernel A's and B's inputs ``x`` (sequences first) and of Kernel B's ``arrays``
    (kernel.tools.source_ab.kernel_b_arrays: dS a tile, the states a 64-token chunk, each sequence's rows in
    order): views, no copy. Each sequence holds T tokens."""
    tiles, chunks = -(-T // TILE_TOKENS), -(-T // CHUNK_TOKENS)
    return ({name: a[b0:b1] for name, a in x.items()},
            {"ds": arrays["ds"][b0 * tiles:b1 * tiles], "states": arrays["states"][b0 * chunks:b1 * chunks],
             "rstd": tuple(r[b0:b1] for r in arrays["rstd"]),
             "out": {name: o[b0:b1] for name, o in arrays["out"].items()}})


def group_outputs(T: int, a_out: dict, b0: int, b1: int) -> dict:
    """Sequences b0 .. b1 - 1 of Kernel A's outputs ``a_out`` (kernel.tools.source_ab.kernel_a_outputs: dS a tile
    of each sequence in order, packed in one row, and dh0 a sequence): views, no copy, each C-contiguous (the
    group's rows are one run of the allocation)."""
    tiles = -(-T // TILE_TOKENS)
    ds = a_out["snapshots"][0, b0 * tiles:b1 * tiles]
    return {"snapshots": ds.reshape(1, *ds.shape), "dh0": a_out["dh0"][b0:b1]}


def _checksum(arrays) -> int:
    """A sum of every output's 32-bit words on the device (enough to tell outputs written from zeros)."""
    import cupy

    return sum(int(cupy.sum(a.view(cupy.uint32), dtype=cupy.uint64)) for a in arrays)


def measure(config: str, heads: int, sm_counts: Sequence[int], reps: int, groups: int) -> dict:
    import cupy
    import torch

    from kernel.runtime.builds import HIGHEST_PRIORITY
    from kernel.tools import source_ab
    from kernel.tools.bench.timing import time_alternating

    from kernel.runtime.green_contexts import device_sms, split

    spec = source_ab.parse_spec(config, "a")
    x = source_ab.drawn_inputs(spec, heads)
    here = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)   # the timer's events' stream
    # Kernel A's outputs once, before timing: a call that allocated them would take them from CuPy's pool on the
    # stream it runs on, whose free blocks are kept per stream, so a side stream's first 17 GB (at 32x8192) were
    # a fresh allocation (and, memory short, every stream's free blocks released) inside the timed region. The
    # groups write views of the same arrays: they cover the batch once, and no variant runs the whole batch's A
    # beside a group's.
    with here:
        a_out = source_ab.kernel_a_outputs(spec, heads)
    scan = source_ab.kernel_a_call(spec, x, out=a_out)
    arrays = source_ab.kernel_b_arrays(spec, heads)
    gradients, b_out = source_ab.kernel_b_call(spec, heads, x, arrays)
    # the same work in groups of whole sequences, on views of the same arrays: (Kernel A, Kernel B) a group
    parts = []
    for b0, b1 in group_bounds(np.arange(spec.B + 1), groups):
        part = dataclasses.replace(spec, B=b1 - b0)
        x_g, arrays_g = group_views(spec.T, x, arrays, b0, b1)
        parts.append((source_ab.kernel_a_call(part, x_g, out=group_outputs(spec.T, a_out, b0, b1)),
                      source_ab.kernel_b_call(part, heads, x_g, arrays_g)[0]))

    def side_by_side(*jobs):
        """Each (stream, kernel) launched on its stream after the work queued on torch's, which then waits for all."""
        ready = here.record()
        done = []
        for stream, fn in jobs:
            stream.wait_event(ready)
            with stream:
                fn()   # writes into arrays made before timing: allocates nothing
            done.append(stream.record())
        for event in done:
            here.wait_event(event)

    def pipeline(a_side, b_side):
        """The groups as the product pipelines them (kernel.backward_pipeline.launch_on) on torch's stream and the
        two sides."""
        launch_on(parts, here, a_side, b_side)

    def groups_in_turn():
        with here:
            for a, b in parts:
                a()
                b()

    high = cupy.cuda.Stream(non_blocking=True, priority=HIGHEST_PRIORITY)
    low = cupy.cuda.Stream(non_blocking=True)
    variants = {"A": lambda: side_by_side((here, scan)), "B": lambda: side_by_side((here, gradients)),
                "A then B": lambda: side_by_side((here, scan), (here, gradients)),
                "A | B, two streams": lambda: side_by_side((high, scan), (low, gradients)),
                "groups in turn": groups_in_turn,
                "groups, two streams": lambda: pipeline(high, low)}
    total, smallest, align = device_sms()
    splits, used = [], []   # every split made (to close), and (row, split) of those timed
    try:
        for k in sm_counts:
            sp = split(k, priority_first=HIGHEST_PRIORITY)
            splits.append(sp)
            ka, kb = sp.first.sms, sp.rest.sms
            if any(r["a_sms"] == ka for r, _ in used):   # the driver rounded two counts to one split
                continue
            variants[f"A on {ka}"] = lambda sp=sp: side_by_side((sp.first.stream, scan))
            variants[f"B on {kb}"] = lambda sp=sp: side_by_side((sp.rest.stream, gradients))
            variants[f"A on {ka} | B on {kb}"] = lambda sp=sp: side_by_side((sp.first.stream, scan),
                                                                            (sp.rest.stream, gradients))
            variants[f"groups, A on {ka} | B on {kb}"] = lambda sp=sp: pipeline(sp.first.stream, sp.rest.stream)
            used.append(({"asked": k, "a_sms": ka, "b_sms": kb}, sp))
        # B's outputs from a run on a split's stream, against torch's stream's
        b_arrays = lambda: list(b_out().values())   # noqa: E731
        side_by_side((here, gradients))
        with here:   # the zeros and the sums in order with the runs (a split's streams do not wait for CuPy's own)
            want = _checksum(b_arrays())
        same = []
        for _, sp in used:
            with here:
                for a in b_arrays():
                    a.fill(0)
            side_by_side((sp.rest.stream, gradients))
            with here:
                same.append(_checksum(b_arrays()) == want)
        torch.cuda.synchronize()
        times = time_alternating(variants, warmup=1, reps=reps)
    finally:
        torch.cuda.synchronize()
        for sp in splits:
            sp.close()
    ms = {name: t["median_ms"] for name, t in times.items()}
    serial = ms["A then B"]
    rows = [row for row, _ in used]
    for row, ok in zip(rows, same):
        ka, kb = row["a_sms"], row["b_sms"]
        row.update(a_ms=ms[f"A on {ka}"], b_ms=ms[f"B on {kb}"], both_ms=ms[f"A on {ka} | B on {kb}"],
                   b_same_bits=ok, modelled_ms=pipelined_ms(ms["A"], ms["B"], ms[f"A on {ka}"], ms[f"B on {kb}"],
                                                             groups),
                   pipeline_ms=ms[f"groups, A on {ka} | B on {kb}"])
    return {"config": config, "heads": heads, "reps": reps, "groups": groups, "device_sms": total,
            "smallest_partition": smallest, "alignment": align, "a_ms": ms["A"], "b_ms": ms["B"], "serial_ms": serial,
            "two_streams_ms": ms["A | B, two streams"], "groups_in_turn_ms": ms["groups in turn"],
            "groups_two_streams_ms": ms["groups, two streams"], "splits": rows, "times": times}


def report(row: dict) -> str:
    """One configuration's tables: the variants on every SM, then each split, against A then B."""
    serial, G = row["serial_ms"], row["groups"]
    whole = [("Kernel A alone", row["a_ms"]), ("Kernel B alone", row["b_ms"]), ("A then B", serial),
             ("A and B at once on two streams, A's first", row["two_streams_ms"]),
             (f"{G} groups of sequences in turn", row["groups_in_turn_ms"]),
             (f"{G} groups pipelined on two streams, A's first", row["groups_two_streams_ms"])]
    lines = [f"{row['config']}, H = {row['heads']}, {row['device_sms']} SMs (partitions of at least "
             f"{row['smallest_partition']}, in steps of {row['alignment']}); median of {row['reps']}",
             "| on every SM | ms | / A then B |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.3f} | {ms / serial:.3f} |" for name, ms in whole]
    lines += ["", f"| Kernel A on | Kernel B on | A alone ms | B alone ms | both ms | both / A then B | "
              f"{G} groups pipelined ms | / A then B | modelled ms | B's bits |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in row["splits"]:
        lines.append(f"| {s['a_sms']} SMs | {s['b_sms']} SMs | {s['a_ms']:.3f} | {s['b_ms']:.3f} | {s['both_ms']:.3f} "
                     f"| {s['both_ms'] / serial:.3f} | {s['pipeline_ms']:.3f} | {s['pipeline_ms'] / serial:.3f} | "
                     f"{s['modelled_ms']:.3f} | {'same' if s['b_same_bits'] else 'DIFFERENT'} |")
    best = min(row["splits"], key=lambda s: s["pipeline_ms"], default=None)
    if best is not None:
        lines.append(f"fastest pipeline: Kernel A on {best['a_sms']} SMs, {best['pipeline_ms']:.3f} ms against "
                     f"{serial:.3f} one after the other ({serial - best['pipeline_ms']:+.3f} ms saved; the model said "
                     f"{best['modelled_ms']:.3f})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_configs("backward_overlap", args.configs, args.heads,
                       lambda c: measure(c, args.heads, args.sm_counts, args.reps, args.groups), report, args.json)


if __name__ == "__main__":
    sys.exit(main())
