"""Which part of the forward's per-tile path binds its time: builds with one part knocked out, each timed
against the intact build in one process (README.md).

    python -m kernel.studies.forward_critical_path                                  # 32x8192, every knockout
    python -m kernel.studies.forward_critical_path --configs 32x8192,32x8192:w4 --reps 9 --json knockouts.json
    python -m kernel.studies.forward_critical_path --parts inv-solve,mqk           # some of them
    python -m kernel.studies.forward_critical_path --trees DIR                     # write the patched trees, no GPU

GPU (CuPy, and torch for the bench's timer). A knockout's outputs are wrong on purpose and are never
compared with anything. Per configuration one process times, on one set of inputs, the intact build,
then each knockout followed by the intact build again (source_ab.time_sides): a knockout's "intact"
time is the faster of the intact runs either side of it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from kernel.tools import source_ab

from . import knockouts

INTACT = "intact"


def parse_args(argv: Sequence[str] | None):
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.forward_critical_path",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="32x8192",
                    help="comma-separated BxT or BxT:w<consumer warps> (the forward's auto_config(warps); "
                         "default %(default)s at the auto rule's choice)")
    ap.add_argument("--reps", type=int, default=7, help="timed calls per build and configuration (median; default 7)")
    ap.add_argument("--heads", type=int, default=32, help="heads (H = HV; default 32)")
    ap.add_argument("--parts", help=f"comma-separated knockouts (default all: {','.join(knockouts.BY_NAME)})")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--trees", type=Path,
                    help="write each knockout's patched tree under this directory (DIR/<knockout>/kernel/...) "
                         "and stop: no GPU")
    a = ap.parse_args(argv)
    try:
        a.specs = [source_ab.parse_spec(c, knockouts.KERNEL) for c in a.configs.split(",") if c.strip()]
        names = None if a.parts is None else [p.strip() for p in a.parts.split(",") if p.strip()]
        a.knockouts = knockouts.select(names)
    except ValueError as exc:
        ap.error(str(exc))
    if not a.specs:
        ap.error("--configs names no configuration")
    if not a.knockouts:
        ap.error("--parts names no knockout")
    if a.heads < 1 or a.reps < 1:
        ap.error(f"--heads and --reps must be at least 1, got {a.heads} and {a.reps}")
    return a


def build_trees(chosen: Sequence[knockouts.Knockout], into: Path,
                log: Callable[[str], None] = print) -> list[tuple[knockouts.Knockout, Path]]:
    """Each knockout's patched copy under into/<name>; (knockout, its cuda directory) in order."""
    trees = []
    for k in chosen:
        cuda = knockouts.build_tree(k, into / k.name)
        files = sorted({e.path.rsplit("/", 1)[-1] for e in k.edits})
        log(f"built {k.name}: {len(k.edits)} edit(s) of {', '.join(files)} ({k.part})")
        trees.append((k, cuda))
    return trees


def sides(trees: Sequence[tuple[knockouts.Knockout, Path]], intact: Path) -> list[tuple[str, Path]]:
    """The order one configuration runs in: intact, then each knockout followed by intact again."""
    out = [(INTACT, intact)]
    for k, cuda in trees:
        out += [(k.name, cuda), (INTACT, intact)]
    return out


def measure(specs: Sequence[source_ab.Spec], trees: Sequence[tuple[knockouts.Knockout, Path]], heads: int,
            reps: int, time_sides: Callable = source_ab.time_sides,
            log: Callable[[str], None] = print) -> tuple[list[dict], list[dict]]:
    """(one row a configuration and knockout, one row a configuration's intact runs). `time_sides`:
    source_ab.time_sides, or a stand-in with its signature (the tests')."""
    intact = source_ab.source_dir(knockouts.KERNEL)
    rows, intact_rows = [], []
    for spec in specs:
        def progress(side: dict) -> None:
            log(f"  {spec.name} {side['label']}: first call {side['first_call_s']:.1f} s, median {side['ms']:.3f} ms")

        log(f"{spec.name}: intact, then each of {len(trees)} knockout(s) and intact again, median of {reps}")
        runs = time_sides(knockouts.KERNEL, spec, heads, reps, sides(trees, intact), on_side=progress, hashed=())
        intact_ms = [r["ms"] for r in runs[::2]]
        intact_rows.append(dict(config=spec.name, runs_ms=intact_ms, spread=max(intact_ms) / min(intact_ms) - 1))
        for n, (k, _) in enumerate(trees):
            side = runs[2 * n + 1]
            assert side["label"] == k.name, (side["label"], k.name)
            base = min(runs[2 * n]["ms"], runs[2 * n + 2]["ms"])
            rows.append(dict(config=spec.name, knockout=k.name, part=k.part, intact_ms=base, knocked_out_ms=side["ms"],
                             saved_ms=base - side["ms"], share=(base - side["ms"]) / base,
                             first_call_s=side["first_call_s"]))
    return rows, intact_rows


def table(rows: Sequence[dict], intact_rows: Sequence[dict]) -> str:
    """The markdown table, and a line a configuration on how far its intact runs spread (saved times
    inside that spread are not told apart from noise)."""
    lines = ["| config | part knocked out | ms intact | ms knocked out | saved ms | share of intact |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['config']} | {r['knockout']}: {r['part']} | {r['intact_ms']:.3f} | {r['knocked_out_ms']:.3f} "
              f"| {r['saved_ms']:+.3f} | {100 * r['share']:+.1f}% |" for r in rows]
    lines.append("")
    lines += [f"{r['config']}: {len(r['runs_ms'])} intact runs, {min(r['runs_ms']):.3f} .. {max(r['runs_ms']):.3f} ms "
              f"(spread {100 * r['spread']:.1f}%)" for r in intact_rows]
    return "\n".join(lines)


def _gpu_problem() -> str | None:
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        return f"the study times kernels on a GPU: {reason}"
    try:
        import torch   # noqa: F401  (the bench's timer: torch's events and its GPU-ahead sleep)
    except ImportError:
        return "the study times with the bench's timer, which needs torch (pip install -e '.[torch]')"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.trees is not None:
        if a.trees.exists() and any(a.trees.iterdir()):
            print(f"--trees {a.trees}: not an empty directory", file=sys.stderr)
            return 2
        build_trees(a.knockouts, a.trees)
        print(f"wrote {len(a.knockouts)} patched tree(s) under {a.trees} (compare with diff -ru against the "
              f"working tree's kernel/forward/cuda)")
        return 0
    problem = _gpu_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    print(f"forward knockouts: H = {a.heads}, median of {a.reps}; the knockouts' outputs are wrong on purpose "
          f"and are not compared", flush=True)
    with tempfile.TemporaryDirectory(prefix="forward-knockouts-") as tmp:
        trees = build_trees(a.knockouts, Path(tmp), log=lambda s: print(s, flush=True))
        rows, intact_rows = measure(a.specs, trees, a.heads, a.reps, log=lambda s: print(s, flush=True))
    print("\n" + table(rows, intact_rows))
    if a.json:
        a.json.write_text(json.dumps(dict(heads=a.heads, reps=a.reps, configs=[s.name for s in a.specs],
                                          rows=rows, intact=intact_rows), indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
