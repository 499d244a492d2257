"""The rstd pass timed beside FLA's l2norm pass, which it replaces in the op, in one process.

    python -m kernel.studies.row_rstd --configs 32x8192,8x32768,1x131072 [--heads 32] [--reps 20] [--depths 4]
                                      [--json FILE]

Per configuration: q and k bf16 [B, T, H, 128], standard normal (seed 0). Timed in turn (``time_alternating``:
CUDA events around each call, a cold L2 and the GPU kept busy ahead of it, the sides alternating call by call,
after a warm-up call each that also compiles): ``kernel.row_rstd.row_rstd(q, k)`` at each depth asked for, and,
where fla-core is installed, FLA's ``l2norm_fwd`` on q and on k, the pass the op runs today. Printed: each side's
median ms and its rate against the bytes it must move, and ours over FLA's.

Bytes (rows = B T H, of each of q and k): the rstd pass reads 2 rows 256 B and writes 2 rows 4 B; FLA's l2norm
also writes the normalised rows, 2 rows 256 B more. At 32x8192 with 32 heads that is 4.36 GB against 8.66 GB: at
an H200's ~4.3 TB/s of copy rate, a floor of 1.0 ms against 2.0 ms. GPU, CuPy and torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from kernel.row_rstd.launch import bytes_moved   # the rstd pass's bytes at its floor
from kernel.shapes import HEAD_DIM

from ..timed_configs import parse_configs, run_configs

NAME = "row_rstd"


def fla_bytes_moved(rows: int) -> int:
    """FLA's l2norm pass's on q and k: the rstd pass's bytes, and both written normalised (256 B a row)."""
    return bytes_moved(rows) + 2 * rows * 2 * HEAD_DIM


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.row_rstd", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="32x8192,8x32768,1x131072", help="comma-separated BxT (default %(default)s)")
    p.add_argument("--heads", type=int, default=32, help="heads H of q and k (default 32, the bench's)")
    p.add_argument("--reps", type=int, default=20, help="timed calls a side, in turn (median; default 20)")
    p.add_argument("--depths", default="4", help="comma-separated Config.depth values of ours to time (default 4)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    args.configs = parse_configs(p, args.configs)
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    from kernel.row_rstd import DEPTHS

    try:
        args.depths = [int(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        p.error(f"--depths: expected whole numbers of {DEPTHS}, got {args.depths!r}")
    if not args.depths or any(d not in DEPTHS for d in args.depths):
        p.error(f"--depths: each must be one of {DEPTHS}, got {args.depths}")
    return args


def ours_name(depth: int) -> str:
    return f"rstd pass d{depth}"


def report(row: dict) -> str:
    """One configuration's lines: each side's median ms and rate, ours over FLA's."""
    rows = row["rows"]
    lines = [f"{row['config']}, H = {row['heads']} ({rows} rows of q and of k; median of {row['reps']} in turn, "
             f"{row['device']}):"]
    for depth in row["depths"]:
        ms, moved = row["ours_ms"][str(depth)], row["bytes"]
        lines.append(f"  {ours_name(depth)}: {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s of {moved / 1e9:.2f} GB "
                     f"(reads 2 x {rows} x 256 B, writes 2 x {rows} x 4 B)")
    if row["fla_ms"] is None:
        lines.append(f"  FLA's l2norm_fwd: not timed ({row['fla_missing']})")
        return "\n".join(lines)
    fla = row["fla_ms"]
    lines.append(f"  FLA's l2norm_fwd on q and k: {fla:.3f} ms, {row['fla_bytes'] / fla / 1e6:.0f} GB/s of "
                 f"{row['fla_bytes'] / 1e9:.2f} GB (also writes the normalised rows)")
    lines.append("  ours / FLA's: " + ", ".join(f"d{d} {row['ours_ms'][str(d)] / fla:.3f}" for d in row["depths"]))
    return "\n".join(lines)


def fla_l2norm():
    """(FLA's l2norm_fwd, None), or (None, why not)."""
    try:
        from fla.modules.l2norm import l2norm_fwd
    except ImportError as exc:
        return None, f"fla-core is not installed ({exc})"
    return l2norm_fwd, None


def measure(config: str, heads: int, reps: int, depths: Sequence[int]) -> dict:
    import torch

    from kernel.tools.bench.timing import L2_FLUSH_BYTES, time_alternating

    from kernel.row_rstd import Config, row_rstd

    B, T = (int(n) for n in config.lower().split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, T, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    rows = B * T * heads
    fns = {ours_name(d): (lambda cfg=Config(depth=d): row_rstd(q, k, config=cfg)) for d in depths}
    l2norm, missing = fla_l2norm()
    if l2norm is not None:
        fns["fla"] = lambda: (l2norm(q), l2norm(k))
    for name, fn in fns.items():   # each compiles (ours) or tunes (FLA's) once, before any timing
        fn()
        torch.cuda.synchronize()
        print(f"  {config}: {name} ready", file=sys.stderr, flush=True)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    times = time_alternating(fns, warmup=1, reps=reps, flush=flush)
    row = {"config": config, "heads": heads, "reps": reps, "rows": rows, "depths": list(depths),
           "device": torch.cuda.get_device_name(), "bytes": bytes_moved(rows), "fla_bytes": fla_bytes_moved(rows),
           "ours_ms": {str(d): times[ours_name(d)]["median_ms"] for d in depths},
           "fla_ms": times["fla"]["median_ms"] if l2norm is not None else None, "fla_missing": missing}
    del q, k, flush
    torch.cuda.empty_cache()
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_configs(NAME, args.configs, args.heads, lambda c: measure(c, args.heads, args.reps, args.depths),
                       report, args.json)


if __name__ == "__main__":
    sys.exit(main())
