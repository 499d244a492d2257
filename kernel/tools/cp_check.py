"""One sequence's backward scan (or, with --backward, its whole backward) split over the ranks of a
torch.distributed group: exactness and time.

    # one rank a GPU, NCCL (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
    torchrun --nproc-per-node 4 -m kernel.tools.cp_check --T 131072 --heads 32
    # N ranks started here, gloo; with Kernel A they share this machine's GPUs (rank r on GPU r mod count)
    ptx-lab cp-check --spawn 2 --T 8192 --heads 4
    # the float64 pair on CPU processes (no GPU): small K, V and tiles
    ptx-lab cp-check --spawn 3 --pair reference --T 200 --heads 2 --K 8 --V 8 --tile 4
    # the whole backward (kernel.cp.backward), float64 pair
    ptx-lab cp-check --backward --spawn 3 --T 200 --heads 2 --K 8 --V 8 --tile 4

Every rank builds the same seeded sequence (kernel.reference.random_inputs), takes its part of
the tiles (kernel.cp.shard: contiguous, in rank order) and runs kernel.cp.cp_dstate_scan with
the chosen pair: ``kernel`` (kernel.cp.kernel_summary / kernel_scan, Kernel A on this rank's GPU)
or ``reference`` (float64). Each rank times its passes (its summary, the all_gather of the
summaries, its scan from the folded incoming dS) over --reps calls and keeps the median. With
--check (the default), each rank also runs the unsplit scan of the whole sequence with the same
pair and compares its share: its snapshots and the dS leaving its part (rank 0's is dh0). Rank
0 prints one line per rank and the worst errors, and writes --json.

--backward runs kernel.cp.backward.cp_kda_backward instead: each rank's summaries in both
directions, their all_gather, and its part's whole backward. With --check each rank compares
its tokens' gradients (and rank 0 dh0) with kda_backward_reference on the whole sequence. Only
the float64 pair exists for it (``--pair reference``, the default with --backward).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from typing import Sequence

import numpy as np

from kernel import cp
from kernel.cp import backward as cp_backward
from kernel.reference import (dstate_scan_reference, kda_backward_reference, prepare_tiles, random_inputs,
                              segment_snapshots)
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS

PAIRS = {"kernel": (cp.kernel_summary, cp.kernel_scan), "reference": (cp.reference_summary, cp.reference_scan)}


def _log(msg: str) -> None:
    print(msg, flush=True)


def problem(args) -> dict:
    """The seeded sequence, the same on every rank: the scan's inputs [1, T, ...] and dht [1, H, K, V].
    Kernel A's pair gets its device layout (bf16 bits, as kernel.tools.check builds them)."""
    if args.pair == "kernel":
        from kernel.tools import check

        kern, _ = check.inputs(check.Case("cp-check", B=1, T=args.T, H=args.heads, dht=True, seed=args.seed))
        return {n: kern[n] for n in (*cp.INPUT_NAMES, "dht")}
    raw = random_inputs(1, args.T, args.heads, args.K, args.V, seed=args.seed, with_dht=True)
    gc, mqk, inv = prepare_tiles(raw["q"], raw["k"], raw["g"], raw["beta"], tile=args.tile)
    return dict(q=raw["q"], k=raw["k"], gc=gc, beta=raw["beta"], mqk=mqk, inv=inv, do=raw["do"], dht=raw["dht"])


def _host64(x) -> np.ndarray:
    if hasattr(x, "get"):
        x = x.get()
    return np.asarray(x, dtype=np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den > 0 else float(np.linalg.norm(a))


def _unsplit(args, inputs: dict, options: cp.ScanOptions):
    """(snapshots on the sequence's grid, the every-tile snapshots, dh0) of the whole sequence, where the
    pair computes them (the GPU's for Kernel A: the every-tile ones are 17 GB at 131072 tokens, H = 32)."""
    ins = [inputs[n] for n in cp.INPUT_NAMES]
    if args.pair == "kernel":
        from kernel.ds_scan.launch import dstate_scan

        snaps, dh0 = dstate_scan(*ins, dht=inputs["dht"], snapshot_every=options.snapshot_every)
        every, _ = dstate_scan(*ins, dht=inputs["dht"], snapshot_every=1)
    else:
        snaps, dh0 = dstate_scan_reference(*ins, dht=inputs["dht"], tile=options.tile,
                                           snapshot_every=options.snapshot_every)
        every, _ = dstate_scan_reference(*ins, dht=inputs["dht"], tile=options.tile, snapshot_every=1)
    return snaps, every, dh0


def _timed(reps: int, call):
    """(the last result, the median of each pass's seconds) over ``reps`` calls of ``call(timing)``,
    every rank starting each call together; "total_s" is the whole call's."""
    import torch

    times = []
    for _ in range(max(1, reps)):
        torch.distributed.barrier()
        t = {}
        began = time.perf_counter()
        result = call(t)
        t["total_s"] = time.perf_counter() - began
        times.append(t)
    return result, {k: statistics.median(t[k] for t in times) for k in times[0]}


def run_rank(args, rank: int, world: int) -> dict:
    """This rank's part: its passes timed, its share checked; returns what rank 0 reports."""
    xp = np
    if args.pair == "kernel":
        import cupy

        cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", rank)) % cupy.cuda.runtime.getDeviceCount()).use()
        xp = cupy
    inputs = problem(args)
    part = cp.shard(inputs, rank, world, tile=args.tile)
    options = cp.ScanOptions(tile=args.tile, snapshot_every=args.snapshot_every)
    summary_fn, scan_fn = PAIRS[args.pair]
    timeout = datetime.timedelta(seconds=args.timeout)
    (snaps, dS_out), med = _timed(args.reps, lambda t: cp.cp_dstate_scan(
        part, options, timeout=timeout, summary_fn=summary_fn, scan_fn=scan_fn, timing=t))
    out = dict(rank=rank, start=part.start, stop=part.stop, **med)
    if args.pair == "kernel":   # CuPy's pool keeps the blocks it grew to: about this rank's peak
        out["cupy_pool_bytes"] = int(xp.get_default_memory_pool().total_bytes())
    if args.check:
        ref_snaps, every, ref_dh0 = _unsplit(args, inputs, options)
        _, idx = segment_snapshots(part.start, part.stop, part.length, args.tile, args.snapshot_every)
        # only this rank's share of the unsplit scan goes to the host in float64
        ref_part = _host64(ref_snaps[0, xp.asarray(idx)]) if idx.size else None
        want = _host64(ref_dh0[0] if rank == 0 else every[0, part.start // args.tile - 1])
        del ref_snaps, every
        out["snapshots_rel"] = _rel(_host64(snaps)[0], ref_part) if idx.size else 0.0
        out["dS_out_rel"] = _rel(_host64(dS_out), want)
    return out


def backward_problem(args) -> dict:
    """The seeded sequence of --backward, the same on every rank: raw q, k, v, g, beta, do
    [1, T, ...], an initial state and dht [1, H, K, V]."""
    raw = random_inputs(1, args.T, args.heads, args.K, args.V, seed=args.seed, with_dht=True)
    h0 = 0.1 * np.random.default_rng(args.seed + 1).standard_normal((1, args.heads, args.K, args.V))
    return dict({n: raw[n] for n in cp_backward.INPUT_NAMES}, initial_state=h0, dht=raw["dht"])


def run_rank_backward(args, rank: int, world: int) -> dict:
    """--backward: this rank's whole backward, its passes timed, its gradients checked."""
    inputs = backward_problem(args)
    part = cp_backward.shard(inputs, rank, world, tile=args.tile)
    options = cp_backward.BackwardOptions(tile=args.tile)
    timeout = datetime.timedelta(seconds=args.timeout)
    got, med = _timed(args.reps, lambda t: cp_backward.cp_kda_backward(part, options, timeout=timeout, timing=t))
    out = dict(rank=rank, start=part.start, stop=part.stop, **med)
    if args.check:
        ref = kda_backward_reference(*(inputs[n] for n in cp_backward.INPUT_NAMES),
                                     initial_state=inputs["initial_state"], dht=inputs["dht"], tile=args.tile)
        out["gradients_rel"] = {n: _rel(_host64(got[n]), ref[n][:, part.start:part.stop])
                                for n in cp_backward.GRADIENTS}
        if rank == 0:
            out["gradients_rel"]["dh0"] = _rel(_host64(got["dS_out"]), ref["dh0"][0])
    return out


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e5 else f"{n_bytes / 1e3:.1f} kB"


def _worst(row: dict) -> float:
    if "gradients_rel" in row:
        return max(row["gradients_rel"].values())
    return max(row["snapshots_rel"], row["dS_out_rel"])


def _report(r: dict) -> str:
    """One rank's line: its token range, each pass's median time, and its errors against the unsplit run."""
    first, last = ("summaries", "backward") if "backward_s" in r else ("first pass", "scan")
    line = (f"  rank {r['rank']}: tokens {r['start']}..{r['stop'] - 1}: "
            f"{first} {1e3 * r[first.replace(' ', '_') + '_s']:.3f} ms, "
            f"exchange {1e3 * r['exchange_s']:.3f} ms ({_size(r['exchange_bytes'])}), "
            f"{last} {1e3 * r[last + '_s']:.3f} ms, total {1e3 * r['total_s']:.3f} ms")
    if "cupy_pool_bytes" in r:
        line += f", CuPy pool {r['cupy_pool_bytes'] / 1e9:.2f} GB"
    if "gradients_rel" in r:
        line += ", gradients " + " ".join(f"{n} {e:.1e}" for n, e in r["gradients_rel"].items()) + " vs unsplit"
    elif "dS_out_rel" in r:
        line += f", snapshots {r['snapshots_rel']:.2e}, dS out {r['dS_out_rel']:.2e} vs unsplit"
    return line


def _rank_main(rank: int, world: int, port: int, args) -> None:
    """torch.multiprocessing entry point for --spawn: one rank on this machine."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    raise SystemExit(_group_main(args))


def _group_main(args) -> int:
    import torch.distributed as dist

    cp.init_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if rank == 0:
            _log(f"cp-check: 1 x {args.T} tokens, H = {args.heads}, {world} ranks ({dist.get_backend()}), "
                 f"{'the whole backward' if args.backward else 'the dS scan'}, pair {args.pair}, "
                 f"{args.reps} rep(s)")
        mine = (run_rank_backward if args.backward else run_rank)(args, rank, world)
        rows: list = [None] * world
        dist.all_gather_object(rows, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    for r in rows:
        _log(_report(r))
    if args.check:
        worst = max(_worst(r) for r in rows)
        _log(f"worst relative error against the unsplit {'backward' if args.backward else 'scan'}: "
             f"{worst:.2e} (bound {args.bound:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), ranks=rows), f, indent=1)
        _log(f"wrote {args.json}")
    return 0 if not args.check or worst < args.bound else 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now: a group's rendezvous on this machine (env://)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: Sequence[str] | None, prog: str = "python -m kernel.tools.cp_check"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=8192, help="tokens of the one sequence")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--backward", action="store_true",
                    help="the whole backward (kernel.cp.backward) instead of Kernel A's scan; float64 pair only")
    ap.add_argument("--pair", choices=sorted(PAIRS), default=None,
                    help="kernel: Kernel A on each rank's GPU; reference: float64 (any K, V, tile). "
                         "Default: kernel, or reference with --backward")
    ap.add_argument("--K", type=int, default=HEAD_DIM, help=f"reference pair only (Kernel A: {HEAD_DIM})")
    ap.add_argument("--V", type=int, default=HEAD_DIM, help=f"reference pair only (Kernel A: {HEAD_DIM})")
    ap.add_argument("--tile", type=int, default=TILE_TOKENS,
                    help=f"tokens a tile, a divisor of {CHUNK_TOKENS} (Kernel A's: {TILE_TOKENS}; the reference "
                         f"pair takes any)")
    ap.add_argument("--snapshot-every", type=int, default=1, choices=(1, 4))
    ap.add_argument("--spawn", type=int, default=0,
                    help="start this many ranks here (gloo unless --backend); 0: this process is one rank "
                         "of a group started by torchrun")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                    help="default: gloo with --spawn, else NCCL where CUDA is available")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the unsplit scan (for sequences whose every-tile snapshots do not fit)")
    ap.add_argument("--bound", type=float, default=None,
                    help="largest relative error against the unsplit scan (default: 1e-12 reference, 5e-3 kernel)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.pair is None:
        args.pair = "reference" if args.backward else "kernel"
    if args.backward and args.pair != "reference":
        ap.error("--backward has only the float64 pair (--pair reference): the whole backward's GPU pair "
                 "is not built (docs/kda_backward.md, section 10)")
    if args.pair == "kernel" and (args.K, args.V, args.tile) != (HEAD_DIM, HEAD_DIM, TILE_TOKENS):
        ap.error(f"--pair kernel runs Kernel A: K = V = {HEAD_DIM}, tile {TILE_TOKENS}")
    if args.T < 1 or args.heads < 1 or args.spawn < 0 or args.reps < 1:
        ap.error("need --T, --heads, --reps >= 1 and --spawn >= 0")
    if args.spawn and args.backend is None:
        args.backend = "gloo"
    if args.bound is None:
        args.bound = 1e-12 if args.pair == "reference" else 5e-3
    return args


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.cp_check") -> int:
    args = parse_args(argv, prog)
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError:
        print("cp-check needs torch (pip install -e '.[torch]'; a CPU build runs the reference pair)",
              file=sys.stderr)
        return 2
    if not args.spawn:
        if "RANK" not in os.environ:
            print("cp-check: not started by torchrun (no RANK in the environment); use --spawn N to start "
                  "N ranks here", file=sys.stderr)
            return 2
        return _group_main(args)
    ctx = torch.multiprocessing.start_processes(_rank_main, args=(args.spawn, free_port(), args),
                                                nprocs=args.spawn, join=False, start_method="spawn")
    deadline = time.monotonic() + args.timeout + 60
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"cp-check: the ranks still ran after {args.timeout + 60:.0f} s; killed", file=sys.stderr)
                return 1
    except torch.multiprocessing.ProcessExitedException as exc:     # a rank exited non-zero: others killed
        print(f"cp-check: {exc}", file=sys.stderr)
        return 1
    except torch.multiprocessing.ProcessRaisedException as exc:
        print(f"cp-check: a rank raised:\n{exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
