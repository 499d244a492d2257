"""kernel.cp: one sequence's scan over 2, 3 and 4 gloo ranks (CPU processes) = the unsplit scan.

The gloo tests need torch and skip, with the reason, where it is absent; the
one-process run (cp_dstate_scan_serial) and the checks it shares are tested
everywhere. Each group is a set of child processes (tests/kernel/cp/gloo_group.py); every
rank runs the float64 reference pair and reports its snapshots and outgoing dS through a
file (tests/kernel/cp/scan_worker.py).
Concatenated in rank order the snapshots must equal dstate_scan_reference's, and
rank 0's dS_out its dh0, to RTOL relative per snapshot (worst seen while writing
these tests: 2.2e-15, 600 examples of the one-process run on two hypothesis seeds
and the gloo groups; run with -s to print this run's worst). The fault tests
hand in parts that do not fit, or leave a rank out, and every other rank must
raise within a bounded time, the error naming the rank at fault.
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
from kernel.reference import dstate_scan_reference, segment_bounds

from . import gloo_group, scan_worker as cp_worker

RTOL = 1e-12
GROUP_TIMEOUT_S = gloo_group.GROUP_TIMEOUT_S


_worst = {"rel": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    print(f"\n[kernel.cp] worst relative error vs the unsplit scan: {_worst['rel']:.2e}")


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    num = float(np.linalg.norm(out - ref))
    den = float(np.linalg.norm(ref))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    _worst["rel"] = max(_worst["rel"], rel)
    return rel


def _reference(case: dict, snapshot_every: int | None = None):
    p = cp_worker.problem(case)
    return dstate_scan_reference(*(p[name] for name in cp.INPUT_NAMES), dht=p["dht"], tile=case["tile"],
                                 snapshot_every=snapshot_every or case["snapshot_every"])


def _check_against_reference(case: dict, bounds: list, snapshots: list, dS_out: list) -> None:
    """Rank-ordered snapshots = the unsplit scan's; rank 0's dS_out = dh0; rank r's = the
    unsplit dS entering the last tile of rank r - 1."""
    ref_snaps, ref_dh0 = _reference(case)
    every_tile, _ = _reference(case, snapshot_every=1)
    snaps = np.concatenate(snapshots, axis=1)
    assert snaps.shape == ref_snaps.shape and snaps.dtype == np.float64
    worst = max(_rel(snaps[0, m], ref_snaps[0, m]) for m in range(snaps.shape[1]))
    assert worst < RTOL, f"{case}: snapshot error {worst:.2e}"
    assert _rel(dS_out[0], ref_dh0[0]) < RTOL
    for r in range(1, len(bounds)):
        want = every_tile[0, bounds[r][0] // case["tile"] - 1]
        assert _rel(dS_out[r], want) < RTOL, f"{case}: rank {r}'s dS_out"


# ----------------------------------------------------------------------------
# running a gloo group of CPU processes
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    return gloo_group.gloo_torch(["kernel.cp", "tests.kernel.cp.scan_worker"])


def _run_group(torch, world: int, cases: list, out_dir, timeout_s: float = GROUP_TIMEOUT_S) -> dict:
    return gloo_group.run_group(torch, cp_worker.run_rank, world, cases, out_dir, timeout_s)


SMALL = dict(length=75, H=2, K=3, V=4, tile=4, seed=1)          # 19 tiles, the last partial
# explicit parts whose boundaries fall inside 4-tile snapshot chunks (tiles 5; 1, 11; 2, 5, 9)
INSIDE = {2: [(0, 20), (20, 75)], 3: [(0, 4), (4, 44), (44, 75)],
          4: [(0, 8), (8, 20), (20, 36), (36, 75)]}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_ranks_match_the_unsplit_scan(torch, world, tmp_path):
    cases = [
        dict(SMALL, snapshot_every=1, with_dht=True),
        dict(SMALL, snapshot_every=4, with_dht=False),
        dict(SMALL, snapshot_every=4, with_dht=True, tokens=INSIDE[world]),
        # GPU sizes: 16-token tiles, bf16-every-64's grid, 13 tiles
        dict(length=200, H=1, K=4, V=4, tile=16, seed=2, snapshot_every=4, with_dht=True),
    ]
    results = _run_group(torch, world, cases, tmp_path)
    for i, case in enumerate(cases):
        got = [results.get((i, r)) for r in range(world)]
        errors = {r: g for r, g in enumerate(got) if g is None or "message" in g}
        assert not errors, f"case {i}: ranks failed: {errors}"
        bounds = case.get("tokens") or segment_bounds(case["length"], case["tile"], world)
        _check_against_reference(case, bounds, [g["snapshots"] for g in got], [g["dS_out"] for g in got])
        # and the one-process run of the same parts agrees with every rank
        p = cp_worker.problem(case)
        serial = cp.cp_dstate_scan_serial(
            [cp.shard(p, r, world, tile=case["tile"], tokens=case.get("tokens", [None] * world)[r])
             for r in range(world)], cp_worker.options(case))
        for r, (snaps, dS_out) in enumerate(serial):
            np.testing.assert_allclose(got[r]["snapshots"], snaps, rtol=1e-13, atol=1e-17)
            np.testing.assert_allclose(got[r]["dS_out"], dS_out, rtol=1e-13, atol=1e-17)


def test_gloo_parts_that_do_not_fit_fail_on_every_rank(torch, tmp_path):
    world = 3
    case = dict(SMALL, snapshot_every=4, with_dht=True)
    cases = [
        dict(case, fault="offsets", fault_rank=1),
        dict(case, fault="shapes", fault_rank=1),
        dict(case, fault="tile_edge", fault_rank=0),
        case,                                   # the group is still in step afterwards
    ]
    began = time.monotonic()
    results = _run_group(torch, world, cases, tmp_path)
    took = time.monotonic() - began
    expected = [r"rank 1: starts at token 28, but rank 0 stops at 24 \(parts must be contiguous",
                r"rank 1: H, K, V \(2, 2, 4\), but rank 0 has \(2, 3, 4\)",
                r"rank 0: stops at token 25, neither a tile edge \(a multiple of tile = 4\)"]
    for i, pattern in enumerate(expected):
        for r in range(world):
            got = results.get((i, r))
            assert got is not None and got.get("type") == "CPInputError", \
                f"case {i} ({cases[i]['fault']} on rank {cases[i]['fault_rank']}): rank {r} gave {got}"
            assert "every rank raises this" in got["message"]
            assert re.search(pattern, got["message"]), (r, got["message"])
    bounds = segment_bounds(case["length"], case["tile"], world)
    _check_against_reference(case, bounds, [results[3, r]["snapshots"] for r in range(world)],
                             [results[3, r]["dS_out"] for r in range(world)])
    assert took < GROUP_TIMEOUT_S, f"the faults took {took:.1f} s: someone waited for a timeout"


def test_gloo_a_rank_that_never_arrives_times_out(torch, tmp_path):
    """Rank 2 never calls: ranks 0 and 1 give up after the timeout instead of waiting for ever,
    and rank 0 (the barrier's monitor) names rank 2."""
    world, timeout_s = 3, 2.0
    case = dict(SMALL, snapshot_every=1, with_dht=True, fault="absent", fault_rank=2,
                absent_s=timeout_s + 1.0)
    results = _run_group(torch, world, [case], tmp_path, timeout_s=timeout_s)
    assert (0, 2) not in results
    for r in (0, 1):
        got = results.get((0, r))
        assert got is not None and "message" in got, f"rank {r} gave {got}"
        assert got["seconds"] < timeout_s + 5, f"rank {r} gave up after {got['seconds']:.1f} s"
    for r in (0, 1):
        assert f"rank {r} of 3: not every rank reached it within 0:00:02" in results[0, r]["message"]
    # torch's own words, kept in the message: the monitor names the rank that did not come
    assert re.search(r"Ranks 2 failed to pass monitoredBarrier", results[0, 0]["message"]), \
        results[0, 0]["message"]


# ----------------------------------------------------------------------------
# the one-process run (no torch.distributed) and the checks it shares
# ----------------------------------------------------------------------------

@st.composite
def split_problems(draw):
    tile = draw(st.sampled_from([2, 4, 16]))
    length = draw(st.integers(1, 12 * tile))
    edges = list(range(tile, length, tile))
    cuts = sorted(draw(st.sets(st.sampled_from(edges), max_size=5))) if edges else []
    bounds = list(zip([0] + cuts, cuts + [length]))
    return dict(length=length, H=draw(st.integers(1, 2)), K=draw(st.integers(2, 4)),
                V=draw(st.integers(2, 4)), tile=tile, seed=draw(st.integers(0, 2**31 - 1)),
                snapshot_every=draw(st.sampled_from([1, 4]) | st.integers(1, 5)),
                with_dht=draw(st.booleans()), tokens=bounds)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_problems())
def test_serial_parts_match_the_unsplit_scan(case):
    p = cp_worker.problem(case)
    world = len(case["tokens"])
    parts = [cp.shard(p, r, world, tile=case["tile"], tokens=case["tokens"][r]) for r in range(world)]
    out = cp.cp_dstate_scan_serial(parts, cp_worker.options(case))
    _check_against_reference(case, case["tokens"], [s for s, _ in out], [d for _, d in out])


def _parts(world=3):
    case = dict(SMALL, snapshot_every=4, with_dht=True)
    p = cp_worker.problem(case)
    return [cp.shard(p, r, world, tile=4) for r in range(world)], p


@pytest.mark.parametrize("edit, match", [
    (lambda ps, p: ps.__setitem__(1, cp.shard(p, 1, 3, tile=4, tokens=(28, 52))),
     r"rank 1: starts at token 28, but rank 0 stops at 24 \(parts must be contiguous, in rank order\)"),
    (lambda ps, p: ps.__setitem__(0, cp.shard(p, 0, 3, tile=4, tokens=(4, 24))),
     r"rank 0: starts at token 4, but the first part must start at 0"),
    (lambda ps, p: ps.__setitem__(2, cp.shard(p, 2, 3, tile=4, tokens=(48, 72))),
     r"rank 2: stops at token 72, but the last rank must hold the sequence's end \(75\)"),
    (lambda ps, p: ps.__setitem__(1, cp.shard(p, 1, 3, tile=4, tokens=(26, 48))),
     r"rank 1: starts at token 26, not a tile edge \(a multiple of tile = 4\)"),
    (lambda ps, p: ps.__setitem__(1, cp.Part({**ps[1].inputs, "do": ps[1].inputs["do"][..., :2]},
                                             24, 48, 75)),
     r"rank 1: H, K, V \(2, 3, 2\), but rank 0 has \(2, 3, 4\)"),
    (lambda ps, p: ps.__setitem__(1, cp.Part({**ps[1].inputs, "q": ps[1].inputs["q"].astype(np.float64)},
                                             24, 48, 75)),
     r"rank 1: dtypes \{'q': 'float64'.*but rank 0 has \{'q': 'float32'"),
    (lambda ps, p: ps.__setitem__(1, cp.Part({**ps[1].inputs, "beta": ps[1].inputs["beta"][:, :3]},
                                             24, 48, 75)),
     r"rank 1: beta must have shape \(1, 24, 2\) \(\[B, T, H\]\), got \(1, 3, 2\)"),
    (lambda ps, p: ps.__setitem__(1, cp.Part(ps[1].inputs, 24, 44, 75)),
     r"rank 1: holds tokens 24 .. 43 \(20\) but its inputs have 24"),
    (lambda ps, p: ps.__setitem__(2, cp.Part(ps[2].inputs, 48, 75, 75, dht=np.zeros((2, 3, 3)))),
     r"rank 2: dht must have shape \(2, 3, 4\) \(\[H, K, V\]\), got \(2, 3, 3\)"),
])
def test_serial_rejects_parts_that_do_not_fit(edit, match):
    parts, p = _parts()
    edit(parts, p)
    with pytest.raises(cp.CPInputError, match=match):
        cp.cp_dstate_scan_serial(parts, cp.ScanOptions(tile=4, snapshot_every=4))


def test_serial_rejects_bad_options_and_mismatched_functions():
    parts, _ = _parts()

    def other_summary(part, options):
        return cp.reference_summary(part, options)

    with pytest.raises(cp.CPInputError, match=r"every rank raises this"):
        cp.cp_dstate_scan_serial(parts, "tile=4")
    # every rank must agree on the functions: the headers name them
    header = cp.header(parts[0], cp.ScanOptions(tile=4), 0, other_summary, cp.reference_scan)
    other = cp.header(parts[1], cp.ScanOptions(tile=4), 1, cp.reference_summary, cp.reference_scan)
    assert any("summary_fn, scan_fn" in p for p in cp.check_headers([header, other]))


def test_serial_checks_what_a_plugged_in_pair_returns():
    parts, _ = _parts()
    options = cp.ScanOptions(tile=4, snapshot_every=4)

    def summary_without_heads(part, options):
        M, d = cp.reference_summary(part, options)
        return M[0], d

    def scan_every_tile(part, dS_in, options):     # forgot to keep only the grid's snapshots
        return cp.reference_scan(part, dS_in, cp.ScanOptions(tile=4, snapshot_every=1))

    with pytest.raises(ValueError, match=r"summary_without_heads returned M of shape \(3, 3\), "
                                         r"expected \(2, 3, 3\)"):
        cp.cp_dstate_scan_serial(parts, options, summary_fn=summary_without_heads)
    with pytest.raises(ValueError, match=r"scan_every_tile returned snapshots of shape "
                                         r"\(1, 7, 2, 3, 4\), expected \(1, 2, 2, 3, 4\)"):
        cp.cp_dstate_scan_serial(parts, options, scan_fn=scan_every_tile)


def test_shard_splits_tiles_evenly_and_gives_dht_to_the_end():
    parts, p = _parts(world=3)
    assert [(x.start, x.stop) for x in parts] == [(0, 24), (24, 48), (48, 75)]   # 19 tiles: 6, 6, 7
    assert [x.inputs["q"].shape[1] for x in parts] == [24, 24, 27]
    assert parts[0].dht is None and parts[1].dht is None
    np.testing.assert_array_equal(parts[2].dht, p["dht"][0])
    assert parts[2].holds_end and not parts[1].holds_end


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=3, world_size=3), r"rank must be an integer in 0 .. 2, got 3"),
    (dict(rank=0, world_size=0), r"world_size must be an integer >= 1, got 0"),
    (dict(rank=0, world_size=20), r"a sequence of 75 tokens \(19 tiles of 4\) cannot give each of 20 ranks a tile"),
    (dict(rank=0, world_size=2, tokens=(10, 80)), r"tokens must be \(start, stop\) with 0 <= start < stop <= 75"),
    (dict(rank=0, world_size=2, tokens=5), r"tokens must be a \(start, stop\) pair, got 5"),
])
def test_shard_rejects_bad_arguments(kwargs, match):
    _, p = _parts()
    with pytest.raises(ValueError, match=match):
        cp.shard(p, tile=4, **kwargs)
    with pytest.raises(ValueError, match=r"inputs must hold q, k, gc, beta, mqk, inv, do.*missing mqk"):
        cp.shard({n: x for n, x in p.items() if n != "mqk"}, 0, 2, tile=4)


def test_cp_dstate_scan_needs_an_initialised_group(torch):
    import torch.distributed as dist
    parts, _ = _parts()
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match=r"needs torch.distributed initialised"):
        cp.cp_dstate_scan(parts[0], cp.ScanOptions(tile=4))


# ----------------------------------------------------------------------------
# the GPU pair's checks that run anywhere (tests/kernel/cp/test_scan_gpu.py runs it)
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [cp.kernel_summary, lambda part, options: cp.kernel_scan(part, None, options)],
                         ids=["kernel_summary", "kernel_scan"])
def test_the_gpu_pair_names_kernel_a_s_tile_and_head_dimension(fn):
    parts, _ = _parts()          # tile 4, K = 3, V = 4
    with pytest.raises(ValueError, match=r"options.tile must be 16 \(Kernel A's tile\) for the GPU pair, got 4"):
        fn(parts[1], cp.ScanOptions(tile=4))
    with pytest.raises(ValueError, match=r"needs K = V = 128 \(Kernel A's head dimension\), got K = 3, V = 4"):
        fn(parts[1], cp.ScanOptions(tile=16))
