"""One rank of tests/kernel/cp/test_scan.py, in a child process of its own.

The parent and every child build the same seeded problem from a case (a plain
dict, so it pickles), and each child reports every case back as a file in the
run's directory: ``case<i>_rank<r>.npz`` (snapshots, dS_out) or
``case<i>_rank<r>.err`` (the exception's type and message, JSON). A case's
``fault`` makes one rank hand in a part that does not fit (``offsets``,
``shapes``, ``tile_edge``) or not arrive at all (``absent``).
"""
from __future__ import annotations

from kernel import cp
from kernel.reference import prepare_tiles, random_inputs

from . import gloo_group


def problem(case: dict) -> dict:
    """The case's one sequence: dstate_scan_reference's inputs [1, T, ...] and dht [1, H, K, V]."""
    inp = random_inputs(1, case["length"], case["H"], case["K"], case["V"], seed=case["seed"],
                        with_dht=case["with_dht"])
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=case["tile"])
    return dict(q=inp["q"], k=inp["k"], gc=gc, beta=inp["beta"], mqk=mqk, inv=inv, do=inp["do"],
                dht=inp["dht"])


def options(case: dict) -> cp.ScanOptions:
    return cp.ScanOptions(tile=case["tile"], snapshot_every=case["snapshot_every"])


def part_of(case: dict, rank: int, world: int) -> cp.Part:
    inputs = problem(case)
    tokens = None if case.get("tokens") is None else tuple(case["tokens"][rank])
    fault = case.get("fault")
    if fault is not None and rank == case["fault_rank"]:
        tile = case["tile"]
        fair = cp.shard(inputs, rank, world, tile=tile, tokens=tokens)
        start, stop = fair.start, fair.stop
        if fault == "offsets":          # leaves a one-tile gap after the previous rank
            tokens = (start + tile, stop)
        elif fault == "tile_edge":      # stops one token past a tile edge
            tokens = (start, stop + 1)
        elif fault == "shapes":         # one key dimension fewer than the others
            inputs = {name: (x[..., :-1] if name in ("q", "k", "gc") else x) for name, x in inputs.items()}
    return cp.shard(inputs, rank, world, tile=case["tile"], tokens=tokens)


def run_case(case: dict, rank: int, world: int, timeout) -> dict:
    snaps, dS_out = cp.cp_dstate_scan(part_of(case, rank, world), options(case), timeout=timeout)
    return dict(snapshots=snaps, dS_out=dS_out)


def run_rank(rank: int, world: int, port: int, cases: list, out_dir: str, timeout_s: float) -> None:
    """torch.multiprocessing entry point (tests/kernel/cp/gloo_group.py runs it)."""
    gloo_group.serve(rank, world, port, cases, out_dir, timeout_s, run_case)
