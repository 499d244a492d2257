"""Kernel A of one group of sequences beside Kernel B of the group before, on SMs split between them.

Our backward runs Kernel A (the dS scan) and then Kernel B (the per-token gradients), each on every SM. They are
bound by different things: A by memory bandwidth, B by latency on each SM (one CTA an SM, the memory less than half
busy). Kernel B of a group of whole sequences needs only Kernel A of the same sequences, so a batch cut into groups
can run A of the next group on a few SMs while B of this one runs on the rest (CUDA green contexts,
:mod:`kernel.runtime.green_contexts`): the first group's A and the last group's B on every SM, as
:func:`pipeline_order` lists them.

Measured on an H100 at 32x8192 with 32 heads (``kernel.studies.backward_overlap``, docs/log/62): each SM of Kernel A
on 32 SMs does 1.55x the work it does on all 132, Kernel B's time grows in proportion to the SMs it loses, and 4 groups
through a 32 | 100 split took A then B from 36.8 ms to 35.0. On the H200 it does not pay (docs/log/63: 24 | 108 and
4 groups made the step 1.09-1.20x slower): there Kernel A on all SMs is already fast, and on a few SMs, by the log's
model, as slow as on the H100, so it binds every stage. So it is off: :data:`PIPELINE` None. The bits are those of
A then B: each kernel does the same work a group as on the batch, with the batch's choices (Kernel A's vsplit,
Kernel B's runs).

Where it applies (:func:`reason_not`): at least two sequences a group (equal lengths, or a varlen batch's, the
groups then balanced by tokens: :func:`group_bounds`), the states given (the forward-state scan is not run), Kernel
A not splitting the batch's sequences, no CUDA graph being captured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Iterator, Sequence

import numpy as np

__all__ = ["Pipeline", "PIPELINE", "using_pipeline", "group_bounds", "pipeline_order", "reason_not", "launch",
           "launch_on"]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipelined backward: ``groups`` groups of whole sequences, Kernel A on ``a_sms`` SMs (the driver rounds them
    up to its granularity, 8 SMs on sm_90) beside Kernel B on the rest."""
    a_sms: int
    groups: int

    def __post_init__(self):
        for name in ("a_sms", "groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Pipeline.{name} must be an int, got {value!r}")
        if self.a_sms < 1 or self.groups < 2:
            raise ValueError(f"Pipeline: a_sms >= 1 and groups >= 2, got a_sms={self.a_sms}, groups={self.groups}")

    @classmethod
    def parse(cls, text: str) -> "Pipeline":
        """A tool's ``A_SMS,GROUPS`` (e.g. "24,4"), or a ValueError saying what was expected."""
        parts = text.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"expected A_SMS,GROUPS (two integers, e.g. 24,4), got {text!r}")
        return cls(a_sms=int(parts[0]), groups=int(parts[1]))

    def text(self) -> str:
        """The ``A_SMS,GROUPS`` that :meth:`parse` reads back (a tool's argument to a child process)."""
        return f"{self.a_sms},{self.groups}"


# The process's choice for kernel.kda_backward.run: None (off), or a Pipeline. Off: it pays on an H100, not on the
# H200 (the module's docstring).
PIPELINE: Pipeline | None = None


@contextlib.contextmanager
def using_pipeline(pipeline: Pipeline | None) -> Iterator[None]:
    """:data:`PIPELINE` set to ``pipeline`` for a block; the setting before it comes back after, on an error too."""
    global PIPELINE
    before, PIPELINE = PIPELINE, pipeline
    try:
        yield
    finally:
        PIPELINE = before


def group_bounds(cu: Sequence[int], groups: int) -> list[tuple[int, int]]:
    """The sequences [s0, s1) of each of ``groups`` groups of a batch whose offsets are ``cu`` (host, N + 1
    integers): whole sequences, each group's first edge the one nearest an even share of the tokens (the lower on
    a tie), every group at least one sequence. Offsets 0, 1, .., B split B sequences as evenly as counts allow."""
    cu = np.asarray(cu, dtype=np.int64)
    N = cu.size - 1
    if not 2 <= groups <= N:
        raise ValueError(f"groups: between 2 and the batch's {N} sequences, got {groups}")
    edges = [0]
    for j in range(1, groups):
        target = cu[-1] * j / groups
        s = int(np.searchsorted(cu, target))   # the first edge at or past the target
        if s > 0 and target - cu[s - 1] <= cu[s] - target:
            s -= 1
        edges.append(min(max(s, edges[-1] + 1), N - (groups - j)))
    edges.append(N)
    return list(zip(edges, edges[1:]))


def pipeline_order(groups: int) -> list[tuple[str, str, int]]:
    """The launches of a pipeline of ``groups`` groups, in order, as (where, kernel, group): where "all" (every SM,
    the caller's stream), "a" or "b" (the split's two sides); kernel "A" or "B". The first group's A runs on every SM
    (no B has work yet), then every later group's A on side a, every B but the last on side b after its group's A,
    and the last group's B on every SM (no A is left to run beside it)."""
    return ([("all", "A", 0)] + [("a", "A", j) for j in range(1, groups)] + [("b", "B", j) for j in range(groups - 1)]
            + [("all", "B", groups - 1)])


def reason_not(pipeline: Pipeline | None, *, N: int, states_given: bool, capturing: bool,
               scan_splits: bool) -> str | None:
    """Why a call of N sequences does not run ``pipeline`` (None: it runs it). ``scan_splits``: Kernel A would cut
    the batch's sequences into segments (few sequences x heads), which a group's scan would not."""
    if pipeline is None:
        return "off"
    if N < 2 * pipeline.groups:
        return f"{N} sequences: fewer than two a group for {pipeline.groups} groups"
    if not states_given:
        return "the states are recomputed: the forward-state scan runs beside Kernel A"
    if capturing:
        return "a CUDA graph is being captured"
    if scan_splits:
        return "Kernel A splits the batch's sequences"
    return None


@functools.lru_cache(maxsize=None)
def _split(device_id: int, a_sms: int):
    """The device's split for ``a_sms`` SMs, made once and kept for the process (two green contexts and a stream on
    each): Kernel A's side at the highest priority."""
    from .runtime.builds import HIGHEST_PRIORITY
    from .runtime.green_contexts import split

    return split(a_sms, device_id, priority_first=HIGHEST_PRIORITY)


def launch(pipeline: Pipeline, jobs: Sequence[tuple[Callable[[], None], Callable[[], None]]], device_id: int) -> None:
    """Each group's (Kernel A, Kernel B) launch of ``jobs`` through the device's split for ``pipeline.a_sms`` SMs,
    from CuPy's current stream (:func:`launch_on`)."""
    if len(jobs) != pipeline.groups:
        raise ValueError(f"jobs: one (Kernel A, Kernel B) pair a group, {pipeline.groups}; got {len(jobs)}")
    import cupy

    sp = _split(device_id, pipeline.a_sms)
    launch_on(jobs, cupy.cuda.get_current_stream(), sp.first.stream, sp.rest.stream)


def launch_on(jobs: Sequence[tuple[Callable[[], None], Callable[[], None]]], here, a_side, b_side) -> None:
    """``jobs`` in :func:`pipeline_order` on three CuPy streams: the first group's A and the last group's B on
    ``here``, the other A's on ``a_side`` and B's on ``b_side``, each B after its group's A, and ``here`` waiting for
    every launch before its later work. Each job writes into arrays allocated before (on ``here``, so that their
    memory is not reused before that wait)."""
    on = {"all": here, "a": a_side, "b": b_side}
    a_done, b_done = {}, None
    for where, kernel, j in pipeline_order(len(jobs)):
        stream = on[where]
        if kernel == "A" and j > 0:
            stream.wait_event(a_done[0])   # the first group's A waited for the caller's work: so do these
        if kernel == "B":
            stream.wait_event(a_done[j])
            if where == "all" and b_done is not None:
                stream.wait_event(b_done)
        with stream:
            jobs[j][0 if kernel == "A" else 1]()
        if kernel == "A":
            a_done[j] = stream.record()
        else:
            b_done = stream.record()
    # ``here`` waited for the last group's A and for the last B on b_side, which followed every earlier B there, each
    # after its own group's A: for every launch
