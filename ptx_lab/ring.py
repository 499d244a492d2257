"""CPU model of ``ptx_lab/cuda/ring.cuh``: a ring of shared-memory stages handed between a
producer and a consumer role, by named barriers (BarrierRing) or by mbarriers (MbarrierRing).

Tile i of a walk of ``ntiles`` tiles goes through stage ``i % nstage``. Stage s has the
barriers FULL(s) = first_id + s (producers arrive when it holds its tile, consumers sync) and
EMPTY(s) = first_id + nstage + s (consumers arrive when done reading, producers sync before
refilling it); both count every thread of both roles. :func:`barrier_ids`, :func:`releases` and
:func:`refill_waits` are the header's closed forms.

:func:`walk` runs both roles over one interleaving of their steps, with named-barrier semantics
(``bar.arrive`` adds its side's threads to the barrier's current phase and goes on, ``bar.sync``
adds them and waits until the phase is complete, which resets the barrier), and checks what the
ring promises: the consumer reads every tile from its stage after the producer wrote it and
before the producer wrote the next tile there, no side arrives twice in one phase, and both roles
finish with every barrier back at zero (no hang, no arrival left over). It returns the tiles the
consumer read, in order. Hypothesis drives the interleavings in tests/ptx_lab/test_ring.py;
``ptx_lab.device.ring_walk`` runs the header's ring on a GPU.

The mbarrier ring (:func:`mbarrier_parities`, :func:`mbarrier_walk`) hands over the same way, on
:class:`ptx_lab.model.MBarrier` objects: tile i waits on FULL(i % nstage) for the parity of that
stage's use number i // nstage, and its refill waits on EMPTY for the use before. A parity only
names a phase if the waiter is at most one phase behind and never ahead of the barrier, so the
walk also checks that every wait it evaluates is for the barrier's current or previous phase;
``ptx_lab.device.mbarrier_ring_walk`` runs that ring on a GPU.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .model import MBarrier

MAX_BARRIER_ID = 15      # ids 1..15 are free (0 is __syncthreads)
WARP = 32

__all__ = ["barrier_ids", "releases", "refill_waits", "walk", "RingError", "MAX_BARRIER_ID",
           "mbarrier_parities", "mbarrier_walk"]


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


def walk(nstage: int, ntiles: int, order: Iterable[int] = (), first_id: int = 1) -> list[int]:
    """Run the ring's two roles to the end; returns the tiles the consumer read, in order.

    `order` chooses, each time both roles can step, which one does (0 the producer, 1 the
    consumer); once it runs out the producer goes first. Every sequence is a legal schedule.
    RingError on a broken promise (see the module docstring).
    """
    nstage, first_id = _check_ring(nstage, first_id)
    ntiles = _count(ntiles, "ntiles", 0)
    progs = _programs(nstage, ntiles, first_id)
    roles = ("producer", "consumer")
    pc = {r: 0 for r in roles}
    waiting: dict[str, int | None] = {r: None for r in roles}   # the barrier id a role is blocked on
    arrived: dict[int, set[str]] = {}                           # the current phase's arrivals per id
    stages = _Stages(nstage)

    def complete(bid: int) -> None:
        arrived.pop(bid)                                        # both sides: the phase completes
        for r in roles:
            if waiting[r] == bid:
                waiting[r] = None

    def arrive(role: str, bid: int) -> None:
        got = arrived.setdefault(bid, set())
        if role in got:
            raise RingError(f"the {role} arrives on barrier {bid} twice in one phase")
        got.add(role)
        if len(got) == len(roles):
            complete(bid)

    def step(role: str) -> None:
        op = progs[role][pc[role]]
        pc[role] += 1
        if op[0] == "arrive":
            arrive(role, op[1])
        elif op[0] == "sync":
            waiting[role] = op[1]
            arrive(role, op[1])
        elif op[0] == "write":
            stages.write(op[1], op[2])
        else:
            stages.read(op[1], op[2])

    _interleave(roles, lambda r: waiting[r] is None and pc[r] < len(progs[r]), step, order)
    stuck = [f"the {r} waits on barrier {waiting[r]}" for r in roles if waiting[r] is not None]
    if stuck or arrived:
        raise RingError("the walk does not finish: " + "; ".join(
            stuck + [f"barrier {b} holds arrivals of {sorted(a)}" for b, a in arrived.items()]))
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


def mbarrier_walk(nstage: int, ntiles: int, order: Iterable[int] = ()) -> list[int]:
    """Run the mbarrier ring's two roles to the end; returns the tiles the consumer read, in order.

    One arrival per side and phase (each side is one actor here). `order` as in :func:`walk`.
    RingError on a broken promise: a stage read early or overwritten unread, a wait whose parity
    names another phase than the one it means, a role left waiting, or arrivals left over.
    """
    nstage, ntiles = _count(nstage, "nstage", 1), _count(ntiles, "ntiles", 0)
    progs = _mbarrier_programs(nstage, ntiles)
    bars = {(kind, s): MBarrier(1) for kind in ("full", "empty") for s in range(nstage)}
    roles = ("producer", "consumer")
    pc = {r: 0 for r in roles}
    stages = _Stages(nstage)

    def can_step(role: str) -> bool:
        if pc[role] >= len(progs[role]):
            return False
        op = progs[role][pc[role]]
        if op[0] != "wait":
            return True
        _, key, parity, phase = op
        bar = bars[key]
        if parity != phase & 1:
            raise RingError(f"the {role} waits on {key[0].upper()}({key[1]}) for its phase {phase} "
                            f"by parity {parity}, which is another phase's")
        if bar.phase not in (phase, phase + 1):
            raise RingError(f"the {role} waits on {key[0].upper()}({key[1]}) for its phase {phase} by "
                            f"parity {parity}, but the barrier is in phase {bar.phase}: the parity "
                            f"names another phase")
        return bar.try_wait_parity(parity)

    def step(role: str) -> None:
        op = progs[role][pc[role]]
        pc[role] += 1
        if op[0] == "arrive":
            bars[op[1]].arrive()
        elif op[0] == "write":
            stages.write(op[1], op[2])
        elif op[0] == "read":
            stages.read(op[1], op[2])

    _interleave(roles, can_step, step, order)
    stuck = [f"the {r} waits at step {pc[r]} ({progs[r][pc[r]][0]} on {progs[r][pc[r]][1]})"
             for r in roles if pc[r] < len(progs[r])]
    # every phase whole, and one per hand-off: FULL(s) once per tile through s, EMPTY(s) once per
    # refill of s, one fewer (an arrival past those starts a phase nobody waits for)
    uses = {s: len(range(s, ntiles, nstage)) for s in range(nstage)}
    want = {(kind, s): uses[s] - (kind == "empty" and uses[s] > 0) for kind in ("full", "empty") for s in uses}
    extra = [f"{k[0].upper()}({k[1]}) went through {b.phase} phases and {b.count - b.pending} arrivals, "
             f"not {want[k]} phases" for k, b in bars.items() if b.pending != b.count or b.phase != want[k]]
    if stuck or extra:
        raise RingError("the walk does not finish: " + "; ".join(stuck + extra))
    return stages.seen
