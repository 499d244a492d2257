"""One rank of tests/kernel/cp/test_backward.py, in a child process of its own.

The parent and every child build the same seeded problem from a case (a plain dict, so it
pickles); each child reports every case back through tests/kernel/cp/gloo_group.py's files. A
case's ``fault`` makes one rank hand in a part that does not fit (``offsets``, ``shapes``)
or not arrive at all (``absent``).
"""
from __future__ import annotations

import numpy as np

from kernel.cp import backward as cp_backward
from kernel.reference import random_inputs

from . import gloo_group


def problem(case: dict) -> dict:
    """The case's one sequence: raw q, k, v, g, beta, do [1, T, ...], initial_state and dht [1, H, K, V]."""
    inp = random_inputs(1, case["length"], case["H"], case["K"], case["V"], seed=case["seed"], with_dht=True)
    rng = np.random.default_rng(case["seed"] + 1)
    h0 = 0.3 * rng.standard_normal((1, case["H"], case["K"], case["V"])) if case["with_h0"] else None
    return dict({name: inp[name] for name in cp_backward.INPUT_NAMES}, initial_state=h0,
                dht=inp["dht"] if case["with_dht"] else None)


def options(case: dict) -> cp_backward.BackwardOptions:
    return cp_backward.BackwardOptions(tile=case["tile"])


def part_of(case: dict, rank: int, world: int) -> cp_backward.BackwardPart:
    inputs = problem(case)
    tokens = None if case.get("tokens") is None else tuple(case["tokens"][rank])
    if case.get("fault") is not None and rank == case["fault_rank"]:
        fair = cp_backward.shard(inputs, rank, world, tile=case["tile"], tokens=tokens)
        if case["fault"] == "offsets":      # leaves a one-tile gap after the previous rank
            tokens = (fair.start + case["tile"], fair.stop)
        elif case["fault"] == "shapes":     # one value column fewer than the others
            inputs = dict(inputs, v=inputs["v"][..., :-1], do=inputs["do"][..., :-1])
    return cp_backward.shard(inputs, rank, world, tile=case["tile"], tokens=tokens)


def run_case(case: dict, rank: int, world: int, timeout) -> dict:
    timing: dict = {}
    got = cp_backward.cp_kda_backward(part_of(case, rank, world), options(case), timeout=timeout, timing=timing)
    return dict({name: np.asarray(x) for name, x in got.items()}, exchange_bytes=timing.get("exchange_bytes", 0))


def run_rank(rank: int, world: int, port: int, cases: list, out_dir: str, timeout_s: float) -> None:
    """torch.multiprocessing entry point (tests/kernel/cp/gloo_group.py runs it)."""
    gloo_group.serve(rank, world, port, cases, out_dir, timeout_s, run_case)
