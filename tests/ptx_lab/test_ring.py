"""ring.cuh's named-barrier ring and mbarrier ring, and their model, ptx_lab.ring.

On the CPU: the ids are distinct and inside 1..15, the hand-off predicates pair the consumers'
EMPTY arrivals one to one with the producers' EMPTY waits, and a walk of both roles over any
interleaving hands every tile over exactly once, in order, with every barrier balanced; a ring
with a predicate off by one is caught. On the GPU: the probes of ring_probes.cu, which run the
header, give the model's ids and predicates, and a producer warp and a consumer warp walk the ring
and hand over every tile's words. The mbarrier ring gets the same: its parities, its walks, and
a broken parity or predicate caught.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import ring

WARP = 32
CPU = settings(max_examples=200, deadline=None)
nstages = st.integers(1, 7)
ntiles = st.integers(0, 40)
orders = st.lists(st.integers(0, 1), max_size=200)


@pytest.mark.parametrize("nstage", range(1, 8))
def test_the_ids_are_distinct_and_free(nstage):
    ids = ring.barrier_ids(nstage)
    used = ids["full"] + ids["empty"]
    assert ids["full"] == [1 + s for s in range(nstage)] and ids["empty"] == [1 + nstage + s for s in range(nstage)]
    assert len(set(used)) == 2 * nstage and min(used) >= 1 and max(used) < ids["end"] <= 16


def test_a_ring_too_deep_for_the_ids_is_refused():
    with pytest.raises(ValueError, match="needs ids up to 16; a CTA has 15"):
        ring.barrier_ids(8)
    with pytest.raises(ValueError, match="needs ids up to 17"):
        ring.barrier_ids(7, first_id=4)
    with pytest.raises(ValueError, match="nstage must be an int >= 1; got 0"):
        ring.walk(0, 4)


@CPU
@given(nstage=nstages, n=ntiles)
def test_every_release_meets_one_refill_wait(nstage, n):
    # the consumers of tile i release its stage exactly when the producers of tile i + nstage wait for it
    released = [i for i in range(n) if ring.releases(i, n, nstage)]
    waited = [j - nstage for j in range(n + nstage) if ring.refill_waits(j, n, nstage)]
    assert released == waited == list(range(max(n - nstage, 0)))


@CPU
@given(nstage=nstages, n=ntiles, order=orders)
def test_any_interleaving_hands_every_tile_over_once_in_order(nstage, n, order):
    assert ring.walk(nstage, n, order) == list(range(n))


@pytest.mark.parametrize("broken, message", [
    ("releases", "does not finish"),            # a consumer releasing the last tiles too: arrivals left over
    ("refill_waits", "overwrites stage"),       # a producer not waiting for a stage's second tile
])
def test_a_broken_predicate_is_caught(monkeypatch, broken, message):
    if broken == "releases":
        monkeypatch.setattr(ring, "releases", lambda i, n, nstage: True)
    else:
        monkeypatch.setattr(ring, "refill_waits", lambda j, n, nstage: n > j > nstage)
    with pytest.raises(ring.RingError, match=message):
        ring.walk(3, 10, [0] * 50)   # the producer runs ahead wherever it can


@pytest.mark.parametrize("nstage", [1, 3, 7])
def test_full_counts_every_thread_and_empty_its_own_count(nstage):
    # BarrierRing<Stages, Threads, FirstId, EmptyThreads>: EmptyThreads defaults to Threads
    ids = ring.barrier_ids(nstage)
    assert ring.barrier_counts(nstage, 192) == {b: 192 for b in ids["full"] + ids["empty"]}
    got = ring.barrier_counts(nstage, 192, 128)
    assert [got[b] for b in ids["full"]] == [192] * nstage and [got[b] for b in ids["empty"]] == [128] * nstage
    with pytest.raises(ValueError, match=r"empty_threads \(256\) must be at most threads \(192\)"):
        ring.barrier_counts(nstage, 192, 256)


def test_a_role_off_empty_must_reach_a_stages_next_tile_through_the_producers():
    # a third role that adds to every tile's stage and arrives on FULL, off EMPTY (its count the producer's
    # and the consumer's): with nothing else holding it back it arrives for a stage's next tile while the
    # consumer still waits on that stage's phase, which the run refuses (two arrivals in one phase)
    nstage, n = 2, 6
    ids = ring.barrier_ids(nstage)
    progs = ring._programs(nstage, n, 1)
    progs["adder"] = [("arrive", ids["full"][i % nstage]) for i in range(n)]
    counts = ring.barrier_counts(nstage, 3, 2)
    with pytest.raises(ring.RingError, match="the adder arrives on barrier 1 twice in one phase"):
        ring.run_roles(progs, counts, lambda role, op: None, [2] * 10)


def test_run_roles_counts_threads_and_refuses_an_overfilled_phase():
    # one role of 64 threads completes a barrier of 64 alone; 32 and 64 overfill it
    done = []
    ring.run_roles({"a": [("sync", 1), ("x",)]}, {1: 64}, lambda r, op: done.append(r), threads={"a": 64})
    assert done == ["a"]
    with pytest.raises(ring.RingError, match=r"the b overfills barrier 1: \['a', 'b'\] bring 96 threads to a phase of 64"):
        ring.run_roles({"a": [("arrive", 1)], "b": [("sync", 1)]}, {1: 64}, lambda r, op: None,
                       threads={"a": 32, "b": 64})
    with pytest.raises(ring.RingError, match="the walk does not finish: the a waits on barrier 2"):
        ring.run_roles({"a": [("sync", 2)]}, {2: 64}, lambda r, op: None, threads={"a": 32})
    with pytest.raises(ring.RingError, match="the a uses barrier 3, which has no count"):
        ring.run_roles({"a": [("arrive", 3)]}, {2: 64}, lambda r, op: None)


@CPU
@given(nstage=nstages, n=ntiles, order=orders)
def test_any_interleaving_of_the_mbarrier_ring_hands_every_tile_over_once_in_order(nstage, n, order):
    assert ring.mbarrier_walk(nstage, n, order) == list(range(n))


@pytest.mark.parametrize("nstage", range(1, 8))
def test_the_mbarrier_parities_name_each_tiles_phase(nstage):
    # tile i is stage i % nstage's use i // nstage: FULL's phase of that use, EMPTY's of the use before
    got = [ring.mbarrier_parities(i, nstage) for i in range(4 * nstage)]
    assert got == [((i // nstage) % 2, (i // nstage + 1) % 2) for i in range(4 * nstage)]


@pytest.mark.parametrize("broken, message", [
    ("releases", "went through 4 phases"),      # the last tiles released too: phases nobody waits for
    ("refill_waits", "overwrites stage"),       # a producer not waiting for a stage's second tile
    ("parity", "another phase's"),              # the refill waiting for its own use's parity
])
def test_a_broken_mbarrier_ring_is_caught(monkeypatch, broken, message):
    if broken == "releases":
        monkeypatch.setattr(ring, "releases", lambda i, n, nstage: True)
    elif broken == "refill_waits":
        monkeypatch.setattr(ring, "refill_waits", lambda j, n, nstage: n > j > nstage)
    else:
        monkeypatch.setattr(ring, "mbarrier_parities", lambda i, nstage: ((i // nstage) & 1,) * 2)
    with pytest.raises(ring.RingError, match=message):
        ring.mbarrier_walk(3, 10, [0] * 50)


# ----------------------------------------------------------------- the header on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("nstage", [1, 2, 3, 4, 6, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 17, 40])
def test_device_ids_and_predicates_are_the_models(nstage, n):
    from ptx_lab import device

    got = device.ring_ids(nstage, n)
    ids = ring.barrier_ids(nstage)
    assert (got["full"], got["empty"], got["end"]) == (ids["full"], ids["empty"], ids["end"])
    assert got["releases"] == [ring.releases(i, n, nstage) for i in range(n)]
    assert got["refill_waits"] == [ring.refill_waits(i, n, nstage) for i in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["named", "mbarrier"])
@pytest.mark.parametrize("nstage", [1, 2, 3, 4, 6, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 17, 200])
def test_device_walk_hands_every_tile_over(kind, nstage, n):
    from ptx_lab import device

    device_walk, model_walk = ((device.ring_walk, ring.walk) if kind == "named" else
                               (device.mbarrier_ring_walk, ring.mbarrier_walk))
    seen = device_walk(nstage, n)
    tiles = np.asarray(model_walk(nstage, n), dtype=np.int64)
    lane = np.arange(WARP)
    want = (tiles[:, None] * WARP + (lane + 1) % WARP).astype(np.uint32)   # the neighbour's word
    assert seen.shape == (n, WARP) and (seen == want).all(), np.argwhere(seen != want)[:4]


@pytest.mark.gpu
@pytest.mark.parametrize("nstage", [1, 2, 3, 4, 6, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 17, 40])
def test_device_mbarrier_parities_and_predicates_are_the_models(nstage, n):
    from ptx_lab import device

    got = device.mbarrier_ring_parities(nstage, n)
    want = [ring.mbarrier_parities(i, nstage) for i in range(n)]
    assert got["full_parity"] == [f for f, _ in want] and got["refill_parity"] == [r for _, r in want]
    assert got["releases"] == [ring.releases(i, n, nstage) for i in range(n)]
    assert got["refill_waits"] == [ring.refill_waits(i, n, nstage) for i in range(n)]


def test_the_device_twins_check_their_arguments_before_looking_for_a_gpu():
    from ptx_lab import device

    with pytest.raises(ValueError, match=r"nstage must be one of \(1, 2, 3, 4, 6, 7\)"):
        device.ring_walk(5, 3)
    with pytest.raises(ValueError, match="needs ids up to 16"):
        device.ring_ids(8, 3)
    with pytest.raises(ValueError, match="ntiles must be an int >= 0; got -1"):
        device.ring_walk(2, -1)
    with pytest.raises(ValueError, match=r"nstage must be one of \(1, 2, 3, 4, 6, 7\)"):
        device.mbarrier_ring_walk(5, 3)
    with pytest.raises(ValueError, match="ntiles must be an int >= 0; got -1"):
        device.mbarrier_ring_parities(2, -1)
