"""kernel.cp.backward: the whole KDA backward of one sequence over 1-4 ranks = the unsplit backward.

The one-process run (cp_kda_backward_serial) is tested everywhere, on hypothesis-drawn
lengths, splits and boundary states; the gloo groups (CPU processes, torch needed) run the
same float64 pair through the real exchange. Concatenated in rank order, every rank's
gradients must equal kda_backward_reference's on the whole sequence, and rank 0's dS_out its
dh0, to RTOL relative (worst seen while writing these tests: 4.5e-16; run with -s to print
this run's). A wrong summary (P or M transposed, a chain folded the wrong way) gives errors
of order 1, so the bound cannot pass by accident. The fault tests hand in parts that do not
fit, or leave a rank out: every other rank raises within a bounded time, naming the rank.
"""
from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import cp
from kernel.cp import backward as cp_backward
from kernel.reference import kda_backward_reference

from . import backward_worker as worker
from . import gloo_group

RTOL = 1e-12
_worst = {"rel": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    print(f"\n[kernel.cp.backward] worst relative error vs the unsplit backward: {_worst['rel']:.2e}")


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    num, den = float(np.linalg.norm(out - ref)), float(np.linalg.norm(ref))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    _worst["rel"] = max(_worst["rel"], rel)
    return rel


def _check(case: dict, results: list[dict]) -> None:
    p = worker.problem(case)
    ref = kda_backward_reference(*(p[name] for name in cp_backward.INPUT_NAMES), initial_state=p["initial_state"],
                                 dht=p["dht"], tile=case["tile"])
    for name in cp_backward.GRADIENTS:
        got = np.concatenate([r[name] for r in results], axis=1)
        assert got.shape == ref[name].shape, (name, got.shape)
        assert _rel(got, ref[name]) < RTOL, f"{case}: {name} {_rel(got, ref[name]):.2e}"
    assert _rel(results[0]["dS_out"], ref["dh0"][0]) < RTOL, f"{case}: dh0"


SMALL = dict(length=75, H=2, K=3, V=4, tile=4, seed=1, with_h0=True, with_dht=True)   # 19 tiles, the last partial


# ----------------------------------------------------------------------------
# one process: every part in turn
# ----------------------------------------------------------------------------

def _serial(case: dict, world: int, tokens=None) -> list[dict]:
    inputs = worker.problem(case)
    parts = [cp_backward.shard(inputs, r, world, tile=case["tile"], tokens=None if tokens is None else tokens[r])
             for r in range(world)]
    return cp_backward.cp_kda_backward_serial(parts, worker.options(case))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 90), tile=st.sampled_from([4, 8, 16]), world=st.integers(1, 4),
       with_h0=st.booleans(), with_dht=st.booleans(), seed=st.integers(0, 2 ** 16), data=st.data())
def test_every_split_gives_the_unsplit_gradients(length, tile, world, with_h0, with_dht, seed, data):
    tiles = -(-length // tile)
    world = min(world, tiles)
    # parts of whole tiles, drawn: world - 1 cut points among the tile edges
    cuts = sorted(data.draw(st.lists(st.integers(1, tiles - 1), min_size=world - 1, max_size=world - 1,
                                     unique=True))) if world > 1 else []
    edges = [0] + [c * tile for c in cuts] + [length]
    case = dict(length=length, H=2, K=3, V=2, tile=tile, seed=seed, with_h0=with_h0, with_dht=with_dht)
    _check(case, _serial(case, world, list(zip(edges, edges[1:]))))


def test_even_shards_and_the_real_head_sizes():
    """shard's even split, and K = V = 128 with 16-token tiles (the GPU's sizes), 3 ranks."""
    _check(SMALL, _serial(SMALL, 4))
    case = dict(length=70, H=1, K=128, V=128, tile=16, seed=3, with_h0=True, with_dht=True)
    _check(case, _serial(case, 3))


def test_a_wrong_summary_is_caught():
    """P transposed on the middle rank: the gradients of the ranks after it move by far more than RTOL."""
    case = dict(SMALL, K=4, V=4)
    inputs = worker.problem(case)
    parts = [cp_backward.shard(inputs, r, 3, tile=4) for r in range(3)]

    def transposed(part, options):
        s = cp_backward.reference_summaries(part, options)
        if s["forward"] is not None and s["forward"][0] is not None:
            P, Q = s["forward"]
            s["forward"] = (np.swapaxes(P, 1, 2), Q)
        return s

    got = cp_backward.cp_kda_backward_serial(parts, worker.options(case), summaries_fn=transposed)
    p = worker.problem(case)
    ref = kda_backward_reference(*(p[n] for n in cp_backward.INPUT_NAMES), initial_state=p["initial_state"],
                                 dht=p["dht"], tile=4)
    stop = parts[1].stop
    assert np.linalg.norm(got[2]["dq"] - ref["dq"][:, stop:]) / np.linalg.norm(ref["dq"][:, stop:]) > 1e-3


def _parts(case, world, **change):
    inputs = worker.problem(case)
    parts = [cp_backward.shard(inputs, r, world, tile=case["tile"]) for r in range(world)]
    for r, kw in change.items():
        parts[int(r[1:])] = cp_backward.BackwardPart(**{**parts[int(r[1:])].__dict__, **kw})
    return parts


@pytest.mark.parametrize("change, pattern", [
    (dict(r1=dict(start=40)), r"rank 1: holds tokens 40 .. 47 \(8\) but its inputs have 24"),
    (dict(r0=dict(length=76)), r"rank 1: sequence length 75, but rank 0 has 76"),
    (dict(r0=dict(initial_state=np.zeros((2, 3, 5)))),
     r"rank 0: initial_state must have shape \(2, 3, 4\) \(\[H, K, V\]\), got \(2, 3, 5\)"),
])
def test_parts_that_do_not_fit_are_refused_naming_the_rank(change, pattern):
    with pytest.raises(cp.CPInputError, match=pattern):
        cp_backward.cp_kda_backward_serial(_parts(SMALL, 3, **change), worker.options(SMALL))


def test_a_plugged_in_pair_must_keep_the_shapes():
    parts = _parts(SMALL, 3)

    def bad_summaries(part, options):
        s = cp_backward.reference_summaries(part, options)
        if s["backward"] is not None and s["backward"][0] is not None:
            s["backward"] = (s["backward"][0][:, :2], s["backward"][1])
        return s

    with pytest.raises(ValueError, match=r"bad_summaries returned the backward matrix of shape \(2, 2, 3\), "
                                         r"expected \(2, 3, 3\)"):
        cp_backward.cp_kda_backward_serial(parts, worker.options(SMALL), summaries_fn=bad_summaries)

    def bad_backward(part, state_in, dS_in, options):
        out = cp_backward.reference_backward(part, state_in, dS_in, options)
        return dict(out, dbeta=out["dbeta"][..., :1])

    with pytest.raises(ValueError, match=r"bad_backward returned dbeta of shape"):
        cp_backward.cp_kda_backward_serial(parts, worker.options(SMALL), backward_fn=bad_backward)


def test_shard_checks_its_arguments():
    inputs = worker.problem(SMALL)
    with pytest.raises(ValueError, match="cannot give each of 30 ranks a tile"):
        cp_backward.shard(inputs, 0, 30, tile=4)
    with pytest.raises(ValueError, match="missing beta"):
        cp_backward.shard({k: v for k, v in inputs.items() if k != "beta"}, 0, 2, tile=4)
    with pytest.raises(ValueError, match=r"dht'\] must be \[1, H, K, V\] or \[H, K, V\]"):
        cp_backward.shard(dict(inputs, dht=np.zeros((2, 2, 3, 4))), 0, 2, tile=4)
    part = cp_backward.shard(inputs, 1, 2, tile=4)
    assert part.initial_state is None and part.dht is not None and part.holds_end


# ----------------------------------------------------------------------------
# gloo groups of CPU processes
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    return gloo_group.gloo_torch(["kernel.cp.backward", "tests.kernel.cp.backward_worker"])


def _group(torch, world, cases, tmp_path, timeout_s=gloo_group.GROUP_TIMEOUT_S):
    return gloo_group.run_group(torch, worker.run_rank, world, cases, tmp_path, timeout_s)


UNEVEN = {2: [(0, 20), (20, 75)], 3: [(0, 4), (4, 44), (44, 75)], 4: [(0, 8), (8, 20), (20, 36), (36, 75)]}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_ranks_give_the_unsplit_gradients(torch, world, tmp_path):
    cases = [SMALL, dict(SMALL, with_h0=False, with_dht=False, seed=5), dict(SMALL, tokens=UNEVEN[world])]
    results = _group(torch, world, cases, tmp_path)
    for i, case in enumerate(cases):
        got = [results.get((i, r)) for r in range(world)]
        assert all(g is not None and "dq" in g for g in got), f"case {i}: {got}"
        _check(case, got)
        H, K, V = case["H"], case["K"], case["V"]
        assert int(got[0]["exchange_bytes"]) == world * H * K * (2 * K + 2 * V) * 8


def test_gloo_faults_raise_on_every_rank(torch, tmp_path):
    world = 3
    cases = [dict(SMALL, fault="offsets", fault_rank=1), dict(SMALL, fault="shapes", fault_rank=1), SMALL]
    began = time.monotonic()
    results = _group(torch, world, cases, tmp_path)
    took = time.monotonic() - began
    expected = [r"rank 1: starts at token 28, but rank 0 stops at 24 \(parts must be contiguous",
                r"rank 1: H, K, V \(2, 3, 3\), but rank 0 has \(2, 3, 4\)"]
    for i, pattern in enumerate(expected):
        for r in range(world):
            got = results.get((i, r))
            assert got is not None and got.get("type") == "CPInputError", f"case {i}: rank {r} gave {got}"
            assert "context-parallel KDA backward over 3 ranks" in got["message"]
            assert re.search(pattern, got["message"]), (r, got["message"])
    _check(SMALL, [results[2, r] for r in range(world)])
    assert took < gloo_group.GROUP_TIMEOUT_S, f"the faults took {took:.1f} s: someone waited for a timeout"


def test_gloo_a_rank_that_never_arrives_is_named(torch, tmp_path):
    timeout_s = 2.0
    case = dict(SMALL, fault="absent", fault_rank=1, absent_s=timeout_s + 1.0)
    results = _group(torch, 3, [case], tmp_path, timeout_s=timeout_s)
    assert (0, 1) not in results
    for r in (0, 2):
        got = results.get((0, r))
        assert got is not None and "message" in got and got["seconds"] < timeout_s + 5, f"rank {r} gave {got}"
        assert f"rank {r} of 3: not every rank reached it within 0:00:02" in got["message"]
    assert re.search(r"Ranks 1 failed to pass monitoredBarrier", results[0, 0]["message"])

