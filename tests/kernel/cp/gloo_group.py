"""Running a gloo group of CPU processes for the context-parallel tests (test_scan, test_backward).

Each group is a set of child processes (torch.multiprocessing, forkserver with torch
preloaded, so a rank starts in well under a second) that rendezvous env:// on 127.0.0.1 and
a free port. A worker (``run_rank(rank, world, port, cases, out_dir, timeout_s)``) reports
every case back as a file in the run's directory: ``case<i>_rank<r>.npz`` (its arrays) or
``case<i>_rank<r>.err`` (the exception's type, message and seconds, JSON).
"""
from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from kernel.tools.cp_check import free_port

GROUP_TIMEOUT_S = 20.0     # every collective of a test group; a healthy case takes well under 1 s
DEADLINE_S = 60.0          # a whole group, start to exit: past it the test kills the ranks and fails
PORT_ATTEMPTS = 3          # the free port can be taken by someone else before rank 0 binds it


def gloo_torch(preload: list[str]):
    """torch with gloo, or the test skips; ranks fork from a server that preloaded ``preload``."""
    torch = pytest.importorskip("torch", reason="kernel.cp's distributed path needs torch (the "
                                                "[torch] extra; CI installs the CPU build)")
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no torch.distributed with gloo")
    # every rank forks from one server that imported torch once (a fresh interpreter
    # per rank would import torch per rank); no effect if the server already runs
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", *preload])
    return torch


def serve(rank: int, world: int, port: int, cases: list, out_dir: str, timeout_s: float, run_case) -> None:
    """A worker's body: join the gloo group, run every case by ``run_case(case, rank, world,
    timeout) -> {name: array}``, report each. A case whose ``fault`` is "absent" on this rank
    is never called: this rank sleeps ``absent_s`` and the others must give up on their own."""
    from kernel import cp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    timeout = datetime.timedelta(seconds=timeout_s)
    cp.init_group("gloo", timeout=timeout)
    out = Path(out_dir)
    import torch.distributed as dist
    try:
        for i, case in enumerate(cases):
            stem = out / f"case{i}_rank{rank}"
            if case.get("fault") == "absent" and rank == case["fault_rank"]:
                time.sleep(case["absent_s"])
                continue
            began = time.monotonic()
            try:
                np.savez(f"{stem}.npz", **run_case(case, rank, world, timeout))
            except Exception as exc:   # reported to the parent, which decides
                stem.with_suffix(".err").write_text(json.dumps(dict(
                    type=type(exc).__name__, message=str(exc), seconds=time.monotonic() - began)))
    finally:
        dist.destroy_process_group()


def run_group(torch, worker, world: int, cases: list, out_dir, timeout_s: float = GROUP_TIMEOUT_S) -> dict:
    """Run every case on a fresh group of ``world`` ranks; {(case, rank): arrays or error}."""
    for attempt in range(PORT_ATTEMPTS):
        run_dir = out_dir / f"attempt{attempt}"
        run_dir.mkdir()
        ctx = torch.multiprocessing.start_processes(
            worker, args=(world, free_port(), cases, str(run_dir), timeout_s),
            nprocs=world, join=False, start_method="forkserver")
        deadline = time.monotonic() + DEADLINE_S
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    for p in ctx.processes:
                        p.kill()
                    pytest.fail(f"ranks {alive} of {world} still ran after {DEADLINE_S:.0f} s (a hang)")
        except torch.multiprocessing.ProcessRaisedException as exc:
            if "EADDRINUSE" in str(exc) and attempt + 1 < PORT_ATTEMPTS:
                continue
            raise
        return collect(run_dir, len(cases), world)
    raise AssertionError("unreachable")


def collect(run_dir, n_cases: int, world: int) -> dict:
    results = {}
    for i in range(n_cases):
        for r in range(world):
            stem = run_dir / f"case{i}_rank{r}"
            if stem.with_suffix(".err").exists():
                results[i, r] = json.loads(stem.with_suffix(".err").read_text())
            elif stem.with_suffix(".npz").exists():
                with np.load(stem.with_suffix(".npz")) as f:
                    results[i, r] = {name: f[name] for name in f.files}
    return results
