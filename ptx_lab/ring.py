"""CPU model of ``ptx_lab/cuda/ring.cuh``: a ring of shared-memory stages handed between a
producer and a consumer role, by named barriers (BarrierRing) or by mbarriers (MbarrierRing).

Tile i of a walk of ``ntiles`` tiles goes through stage ``i % nstage``. Stage s has the
barriers FULL(s) = first_id + s (producers arrive when it holds its tile, consumers sync) and
EMPTY(s) = first_id + nstage + s (consumers arrive when done reading, producers sync before
refilling it). FULL counts every thread of every role, EMPTY the header's EmptyThreads (by default
the same; fewer where a role adds to the stages but never refills one). :func:`barrier_ids`,
:func:`barrier_counts`, :func:`releases` and :func:`refill_waits` are the header's closed forms.

:func:`run_roles` is the engine: it runs any number of roles over one interleaving of their
steps, with named-barrier semantics (``bar.arrive`` adds its role's threads to the barrier's
current phase and goes on, ``bar.sync`` adds them and waits until the phase holds the barrier's
count, which completes it and resets the barrier), and stops with a RingError where a role
arrives twice in one phase or overfills one, or where the roles end with a role left waiting or a
phase left part-full. A kernel's hand-offs beyond the ring are walked on it too
(tests/kernel/forward/test_handoffs.py).

:func:`walk` runs the ring's two roles on it and checks what the ring promises: the consumer
reads every tile from its stage after the producer wrote it and before the producer wrote the
next tile there. It returns the tiles the consumer read, in order. Hypothesis drives the
interleavings in tests/ptx_lab/test_ring.py; ``ptx_lab.device.ring_walk`` runs the header's ring on
a GPU.

The mbarrier ring (:func:`mbarrier_parities`, :func:`mbarrier_walk`) hands over the same way, on
:class:`ptx_lab.model.MBarrier` objects: tile i waits on FULL(i % nstage) for the parity of that
stage's use number i // nstage, and its refill waits on EMPTY for the use before. A parity only
names a phase if the waiter is at most one phase behind and never ahead of the barrier, so the
walk also checks that every wait it evaluates is for the barrier's current or previous phase;
``ptx_lab.device.mbarrier_ring_walk`` runs that ring on a GPU. Its engine, :func:`run_mbarrier_roles`,
walks any roles on mbarriers the same way (the forward's checking build, tests/kernel/forward/
test_handoffs.py).
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .model import MBarrier

MAX_BARRIER_ID = 15      # ids 1..15 are free (0 is __syncthreads)
WARP = 32

__all__ = ["barrier_ids", "barrier_counts", "releases", "refill_waits", "run_roles", "walk", "RingError",
           "MAX_BARRIER_ID", "mbarrier_parities", "run_mbarrier_roles", "mbarrier_walk"]


class RingError(AssertionError):
    """A walk broke the ring's promise (a stage read early or overwritten unread, a side arriving
    twice in one phase, or a role left waiting)."""


def _count(x, name: str, low: int) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < low:
        raise ValueError(f"{name} must be an int >= {low}; got {x!r}")
    return int(x)


def _check_ring(nstage: int, first_id: int) -> tuple[int, int]:
    nstage, first_id = _count(nstage, "nstage", 1), _count(first_id, "first_id", 1)
    if first_id + 2 * nstage - 1 > MAX_BARRIER_ID:
        raise ValueError(f"a ring of {nstage} stages from id {first_id} needs ids up to "
                         f"{first_id + 2 * nstage - 1}; a CTA has {MAX_BARRIER_ID}")
    return nstage, first_id


class _Stages:
    """What the ring's stages hold, and the two promises about them: the producer never overwrites
    an unread tile, the consumer reads each tile from its stage once, after it was written."""

    def __init__(self, nstage: int) -> None:
        self.tile: list[int | None] = [None] * nstage
        self.unread = [False] * nstage
        self.seen: list[int] = []

    def write(self, s: int, j: int) -> None:
        if self.unread[s]:
            raise RingError(f"the producer overwrites stage {s} (tile {self.tile[s]}) with tile {j} before it was read")
        self.tile[s], self.unread[s] = j, True

    def read(self, s: int, i: int) -> None:
        if self.tile[s] != i or not self.unread[s]:
            raise RingError(f"the consumer reads tile {i} from stage {s}, which holds "
                            f"{'nothing new' if not self.unread[s] else f'tile {self.tile[s]}'}")
        self.unread[s] = False
        self.seen.append(i)

    def act(self, role: str, op: tuple) -> None:
        """A role's ("write", stage, tile) or ("read", stage, tile), as the walks' engines call it."""
        if op[0] == "write":
            self.write(op[1], op[2])
        else:
            self.read(op[1], op[2])


def _interleave(roles: tuple[str, ...], can_step, step, order: Iterable[int]) -> None:
    """Step the roles until none can: `order` picks, each time several can, which one does (an index
    into the ready ones); once it runs out the first ready role goes."""
    choices = iter(order)
    while True:
        ready = [r for r in roles if can_step(r)]
        if not ready:
            return
        pick = next(choices, None)
        step(ready[0] if len(ready) == 1 or pick is None else ready[int(pick) % len(ready)])


def barrier_ids(nstage: int, first_id: int = 1) -> dict[str, list[int] | int]:
    """{"full": FULL(s) per stage, "empty": EMPTY(s) per stage, "end": the first id after the ring's}."""
    nstage, first_id = _check_ring(nstage, first_id)
    return {"full": [first_id + s for s in range(nstage)],
            "empty": [first_id + nstage + s for s in range(nstage)],
            "end": first_id + 2 * nstage}


def barrier_counts(nstage: int, threads: int, empty_threads: int | None = None, first_id: int = 1) -> dict[int, int]:
    """{barrier id: the thread count its bar instructions name}: FULL(s) counts ``threads`` (every thread of
    every role), EMPTY(s) ``empty_threads`` (the roles that release and refill stages; None: ``threads``),
    as BarrierRing<Stages, Threads, FirstId, EmptyThreads>."""
    nstage, first_id = _check_ring(nstage, first_id)
    threads = _count(threads, "threads", 1)
    empty_threads = threads if empty_threads is None else _count(empty_threads, "empty_threads", 1)
    if empty_threads > threads:
        raise ValueError(f"empty_threads ({empty_threads}) must be at most threads ({threads}): EMPTY counts "
                         f"some of the roles FULL counts")
    ids = barrier_ids(nstage, first_id)
    return {**{b: threads for b in ids["full"]}, **{b: empty_threads for b in ids["empty"]}}


def releases(i: int, ntiles: int, nstage: int) -> bool:
    """Whether tile i's consumers arrive on EMPTY: only if tile i + nstage exists."""
    return i + nstage < ntiles


def refill_waits(j: int, ntiles: int, nstage: int) -> bool:
    """Whether tile j's producers sync on EMPTY: only if tile j exists and its stage held tile j - nstage."""
    return nstage <= j < ntiles


def _programs(nstage: int, ntiles: int, first_id: int) -> dict[str, list[tuple]]:
    """Each role's steps, as ring.cuh's users run them (ring_probes.cu's walk)."""
    full = lambda s: first_id + s            # noqa: E731
    empty = lambda s: first_id + nstage + s  # noqa: E731
    producer, consumer = [], []
    for j in range(ntiles):
        s = j % nstage
        if refill_waits(j, ntiles, nstage):
            producer.append(("sync", empty(s)))
        producer.append(("write", s, j))
        producer.append(("arrive", full(s)))
    for i in range(ntiles):
        s = i % nstage
        consumer.append(("sync", full(s)))
        consumer.append(("read", s, i))
        if releases(i, ntiles, nstage):
            consumer.append(("arrive", empty(s)))
    return {"producer": producer, "consumer": consumer}


def run_roles(programs: Mapping[str, Sequence[tuple]], counts: Mapping[int, int], act: Callable[[str, tuple], None],
              order: Iterable[int] = (), threads: Mapping[str, int] | None = None) -> None:
    """Run every role's program to the end over one interleaving, with named-barrier semantics.

    ``programs``: role -> its steps, in the roles' order of preference; ("arrive", id) and ("sync", id)
    are ``bar.arrive`` and ``bar.sync`` on named barrier id, every other step goes to ``act(role, step)``
    (which checks what it touches and raises RingError on a broken promise). ``counts``: id -> the
    thread count its instructions name. ``threads``: role -> the threads it arrives with (None: 1 each).
    ``order`` chooses, each time several roles can step, which one does (an index into the ready ones,
    in the programs' order); once it runs out the first ready role goes.

    RingError where a role arrives twice in one phase of a barrier, or with more threads than the
    phase still lacks (part of its warps would complete the phase, the rest start the next), on an
    id without a count, and where the walk ends with a role waiting or a phase part-full (a hang).
    """
    roles = tuple(programs)
    size = {r: 1 for r in roles} if threads is None else {r: _count(threads[r], f"threads[{r!r}]", 1) for r in roles}
    pc = {r: 0 for r in roles}
    waiting: dict[str, int | None] = {r: None for r in roles}   # the barrier id a role is blocked on
    arrived: dict[int, list[str]] = {}                          # the current phase's arrivals per id

    def arrive(role: str, bid: int) -> None:
        if bid not in counts:
            raise RingError(f"the {role} uses barrier {bid}, which has no count")
        got = arrived.setdefault(bid, [])
        if role in got:
            raise RingError(f"the {role} arrives on barrier {bid} twice in one phase")
        got.append(role)
        total = sum(size[r] for r in got)
        if total > counts[bid]:
            raise RingError(f"the {role} overfills barrier {bid}: {sorted(got)} bring {total} threads to a phase "
                            f"of {counts[bid]}")
        if total == counts[bid]:                                # the phase completes: its waiters go on
            arrived.pop(bid)
            for r in roles:
                if waiting[r] == bid:
                    waiting[r] = None

    def step(role: str) -> None:
        op = programs[role][pc[role]]
        pc[role] += 1
        if op[0] == "arrive":
            arrive(role, op[1])
        elif op[0] == "sync":
            waiting[role] = op[1]
            arrive(role, op[1])
        else:
            act(role, op)

    _interleave(roles, lambda r: waiting[r] is None and pc[r] < len(programs[r]), step, order)
    stuck = [f"the {r} waits on barrier {waiting[r]}" for r in roles if waiting[r] is not None]
    if stuck or arrived:
        raise RingError("the walk does not finish: " + "; ".join(
            stuck + [f"barrier {b} holds arrivals of {sorted(a)}" for b, a in arrived.items()]))


def walk(nstage: int, ntiles: int, order: Iterable[int] = (), first_id: int = 1) -> list[int]:
    """Run the ring's two roles to the end (:func:`run_roles`, each role one thread of a count of 2);
    returns the tiles the consumer read, in order.

    `order` chooses, each time both roles can step, which one does (0 the producer, 1 the
    consumer); once it runs out the producer goes first. Every sequence is a legal schedule.
    RingError on a broken promise (see the module docstring).
    """
    nstage, first_id = _check_ring(nstage, first_id)
    ntiles = _count(ntiles, "ntiles", 0)
    stages = _Stages(nstage)

    run_roles(_programs(nstage, ntiles, first_id), barrier_counts(nstage, 2, first_id=first_id), stages.act, order)
    return stages.seen


# ----------------------------------------------------------------- MbarrierRing


def mbarrier_parities(i: int, nstage: int) -> tuple[int, int]:
    """(FULL's parity that hands tile i over, EMPTY's parity that frees its stage for it)."""
    use = i // nstage
    return use & 1, (use - 1) & 1


def _mbarrier_programs(nstage: int, ntiles: int) -> dict[str, list[tuple]]:
    """Each role's steps, as MbarrierRing's users run them (ring_probes.cu's mring_walk).
    A wait is ("wait", barrier, parity, the phase it means)."""
    producer, consumer = [], []
    for j in range(ntiles):
        s = j % nstage
        if refill_waits(j, ntiles, nstage):
            producer.append(("wait", ("empty", s), mbarrier_parities(j, nstage)[1], j // nstage - 1))
        producer.append(("write", s, j))
        producer.append(("arrive", ("full", s)))
    for i in range(ntiles):
        s = i % nstage
        consumer.append(("wait", ("full", s), mbarrier_parities(i, nstage)[0], i // nstage))
        consumer.append(("read", s, i))
        if releases(i, ntiles, nstage):
            consumer.append(("arrive", ("empty", s)))
    return {"producer": producer, "consumer": consumer}


def _name(key) -> str:
    """An mbarrier's key as the messages spell it: ("full", 2) -> FULL(2), "producers" -> PRODUCERS."""
    return f"{key[0].upper()}({key[1]})" if isinstance(key, tuple) else str(key).upper()


def run_mbarrier_roles(programs: Mapping[str, Sequence[tuple]], bars: Mapping, act: Callable[[str, tuple], None],
                       order: Iterable[int] = (), threads: Mapping[str, int] | None = None) -> list[str]:
    """Run every role's program over one interleaving on :class:`ptx_lab.model.MBarrier` objects
    (``bars``: key -> barrier, its count in threads); :func:`run_roles`'s engine for mbarriers.

    Steps: ("arrive", key) is one arrival of each of the role's threads (``threads``: role -> count;
    None: 1 each); ("wait", key, parity, phase) waits by ``parity`` for the barrier's phase ``phase``
    (counted from 0), the one the role means: a RingError where the parity is not that phase's, or
    where the barrier is not in that phase or the next (then the parity names another phase: the
    waiter is more than one phase behind, or ahead); every other step goes to ``act(role, step)``.
    `order` as in :func:`run_roles`. RingError where a role's arrivals overfill a phase (part of them
    would count for the next). Returns the roles left waiting (empty when every role finished); a
    phase left part-full is the caller's to judge, from the barriers.
    """
    roles = tuple(programs)
    size = {r: 1 for r in roles} if threads is None else {r: _count(threads[r], f"threads[{r!r}]", 1) for r in roles}
    pc = {r: 0 for r in roles}

    def can_step(role: str) -> bool:
        if pc[role] >= len(programs[role]):
            return False
        op = programs[role][pc[role]]
        if op[0] != "wait":
            return True
        _, key, parity, phase = op
        bar = bars[key]
        if parity != phase & 1:
            raise RingError(f"the {role} waits on {_name(key)} for its phase {phase} "
                            f"by parity {parity}, which is another phase's")
        if bar.phase not in (phase, phase + 1):
            raise RingError(f"the {role} waits on {_name(key)} for its phase {phase} by "
                            f"parity {parity}, but the barrier is in phase {bar.phase}: the parity "
                            f"names another phase")
        return bar.try_wait_parity(parity)

    def step(role: str) -> None:
        op = programs[role][pc[role]]
        pc[role] += 1
        if op[0] == "arrive":
            bar = bars[op[1]]
            if size[role] > bar.pending:
                raise RingError(f"the {role} overfills {_name(op[1])}: {size[role]} arrivals with {bar.pending} "
                                f"of {bar.count} pending")
            for _ in range(size[role]):
                bar.arrive()
        elif op[0] != "wait":
            act(role, op)

    _interleave(roles, can_step, step, order)
    return [f"the {r} waits at step {pc[r]} ({programs[r][pc[r]][0]} on {_name(programs[r][pc[r]][1])})"
            for r in roles if pc[r] < len(programs[r])]


def mbarrier_walk(nstage: int, ntiles: int, order: Iterable[int] = ()) -> list[int]:
    """Run the mbarrier ring's two roles to the end (:func:`run_mbarrier_roles`); returns the tiles the
    consumer read, in order.

    One arrival per side and phase (each side is one actor here). `order` as in :func:`walk`.
    RingError on a broken promise: a stage read early or overwritten unread, a wait whose parity
    names another phase than the one it means, a role left waiting, or arrivals left over.
    """
    nstage, ntiles = _count(nstage, "nstage", 1), _count(ntiles, "ntiles", 0)
    bars = {(kind, s): MBarrier(1) for kind in ("full", "empty") for s in range(nstage)}
    stages = _Stages(nstage)

    stuck = run_mbarrier_roles(_mbarrier_programs(nstage, ntiles), bars, stages.act, order)
    # every phase whole, and one per hand-off: FULL(s) once per tile through s, EMPTY(s) once per
    # refill of s, one fewer (an arrival past those starts a phase nobody waits for)
    uses = {s: len(range(s, ntiles, nstage)) for s in range(nstage)}
    want = {(kind, s): uses[s] - (kind == "empty" and uses[s] > 0) for kind in ("full", "empty") for s in uses}
    extra = [f"{k[0].upper()}({k[1]}) went through {b.phase} phases and {b.count - b.pending} arrivals, "
             f"not {want[k]} phases" for k, b in bars.items() if b.pending != b.count or b.phase != want[k]]
    if stuck or extra:
        raise RingError("the walk does not finish: " + "; ".join(stuck + extra))
    return stages.seen
