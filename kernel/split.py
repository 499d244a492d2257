"""Kernel A's sequence split: one long sequence's scan cut into segments that run side by side.

Why
---
Kernel A walks each (sequence, head) backwards one 16-token tile at a time, so a
batch of few sequences gives the GPU few serial chains: at 1 x 131072 tokens with
H = 32, 32 chains (128 CTAs at vsplit 4) each walk 8192 tiles, and the scan is
bound by one tile's latency, not by memory. The tile step is affine in dS, so a
sequence can be cut into segments and scanned in three passes
(:mod:`kernel.reference.segments` has the algebra and the float64 reference):

1. every middle segment computes its summary (M, d) -- Kernel A's ``summary``
   build: role 0 scans the segment from dS = 0 (d), role 1 scans the identity
   with do = 0 (M), both without snapshots, in one launch -- while, on a second
   stream, every sequence's last segment (and every sequence not split) runs
   its real scan from dht;
2. a short fold, in float64, gives each segment the dS entering it
   (:func:`kernel.reference.fold_summaries`);
3. every other segment runs its real scan from that dS.

Each launch is Kernel A over the *segments* as a packed batch: the segment
boundaries refine the sequences' cu_seqlens, the launch's CTA order names the
segments it runs, and each segment's snapshot offset points into its sequence's
own place in the output, so the snapshots land where the unsplit scan puts them.
Cuts sit at multiples of 64 tokens from the sequence's start: a whole number of
snapshot groups (snapshot_every 4 x 16 tokens) and of FLA's 64-token chunks,
whose Aqk / Akk blocks and gate Kernel A reads relative to the chunk.

What it costs: the middle segments are read twice (pass 1 and 3) and scanned
three times (d, M, the real scan), without storing snapshots in pass 1. It pays
where the unsplit grid leaves SMs idle; :func:`auto_counts` splits only there.

This module plans the split (host arrays only, no GPU) and runs the passes
through two functions that launch the scans, so the float64 reference can
stand in for the kernel in the CPU tests (tests/kernel/test_split.py).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator

import numpy as np

from .reference import fold_summaries, segment_bounds
from .reference.checks import _is_int
from .reference.dstate_scan import snapshot_offsets

__all__ = ["ALIGN", "WAVES", "MIN_SEGMENT", "auto_counts", "forced_counts", "Plan", "plan", "run", "phase_marks"]

ALIGN = 64          # cuts at multiples of this many tokens from the sequence's start (see above)
# The auto rule (measured on the H200, docs/log/32-sequence-split.md): split until the
# real scans' CTAs (segments x heads, vsplit 1) cover WAVES waves of the SMs, with no
# segment shorter than MIN_SEGMENT tokens.
WAVES = 2
MIN_SEGMENT = 2048

Array = Any


def auto_counts(lengths, H: int, sm_count: int, *, waves: float = WAVES,
                min_segment: int = MIN_SEGMENT) -> np.ndarray:
    """Segments per sequence for the auto rule: all ones where the unsplit grid (a CTA per
    sequence and head at vsplit 1) already covers 90% of the SMs, else each sequence in
    about length / L segments, with L chosen so that all segments together come to
    ``waves`` x ``sm_count`` CTAs, L at least ``min_segment`` tokens."""
    n = np.asarray(lengths, dtype=np.int64)
    if len(n) * H >= 0.9 * sm_count:
        return np.ones(len(n), dtype=np.int64)
    target = max(1.0, waves * sm_count / H)                # segments over the whole batch
    seg_len = max(float(min_segment), float(n.sum()) / target)
    return np.maximum(1, np.floor(n / seg_len + 0.5)).astype(np.int64)


def forced_counts(lengths, segments: int) -> np.ndarray:
    """``segments`` per sequence (a sequence of fewer 64-token blocks gets one per block)."""
    if isinstance(segments, (bool, np.bool_)) or not _is_int(segments) or segments < 1:
        raise ValueError(f"segments must be 'auto' or an integer >= 1, got {segments!r}")
    n = np.asarray(lengths, dtype=np.int64)
    return np.minimum(int(segments), -(-n // ALIGN)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where the segments are and which launch runs each.

    Segments are numbered in token order over the whole batch; segment i covers tokens
    ``cu[i] .. cu[i + 1] - 1`` of the packed token axis (so ``cu`` refines the
    sequences' cu_seqlens) and belongs to sequence ``seq[i]`` at position ``pos[i]`` of
    its ``count[seq[i]]`` segments. ``snap_offsets[i]``: the first snapshot it writes, in
    its sequence's place of the packed snapshot axis (``snap_offsets[-1]`` is the total).
    """
    cu: np.ndarray            # int64 [n_seg + 1]
    seq: np.ndarray           # int64 [n_seg]
    pos: np.ndarray           # int64 [n_seg]
    count: np.ndarray         # int64 [N]: segments per sequence
    snap_offsets: np.ndarray  # int64 [n_seg + 1]
    first: np.ndarray         # int64 [N]: each sequence's first segment (its dS leaving is dh0)

    @property
    def segments(self) -> int:
        return int(self.seq.size)

    @property
    def ends(self) -> np.ndarray:
        """The segments that run their real scan in pass 1: each sequence's last one."""
        return np.flatnonzero(self.pos == self.count[self.seq] - 1)

    @property
    def middles(self) -> np.ndarray:
        """The segments pass 1 summarises: neither first nor last of their sequence."""
        return np.flatnonzero((self.pos > 0) & (self.pos < self.count[self.seq] - 1))

    @property
    def rest(self) -> np.ndarray:
        """The segments that run their real scan in pass 3: all but each sequence's last."""
        return np.flatnonzero(self.pos < self.count[self.seq] - 1)

    @property
    def split(self) -> bool:
        return bool((self.count > 1).any())


def plan(cu_seqlens, counts, *, chunk: int = 16, snapshot_every: int = 1) -> Plan:
    """The segments of sequences ``cu_seqlens`` (host int offsets), ``counts[n]`` near-equal
    runs of 64-token blocks each (:func:`kernel.reference.segment_bounds` with chunk 64)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != lengths.shape or (counts < 1).any():
        raise ValueError(f"counts must hold one integer >= 1 per sequence ({lengths.size}), got {counts.tolist()}")
    offs = snapshot_offsets(lengths, chunk, snapshot_every)
    group = chunk * snapshot_every                     # tokens per snapshot
    if ALIGN % group:
        raise ValueError(f"cuts every {ALIGN} tokens need snapshots every {ALIGN} tokens or a divisor of it, "
                         f"got chunk {chunk} x snapshot_every {snapshot_every}")
    starts, seq, pos, snap = [], [], [], []
    for n, (bos, length, m) in enumerate(zip(cu[:-1], lengths, counts)):
        for j, (a, _) in enumerate(segment_bounds(int(length), ALIGN, int(m))):
            starts.append(int(bos) + a)
            seq.append(n)
            pos.append(j)
            snap.append(int(offs[n]) + a // group)
    seg_cu = np.array(starts + [int(cu[-1])], dtype=np.int64)
    seq = np.array(seq, dtype=np.int64)
    pos = np.array(pos, dtype=np.int64)
    real = np.bincount(seq, minlength=lengths.size)
    first = np.concatenate([[0], np.cumsum(real)[:-1]]).astype(np.int64)
    return Plan(cu=seg_cu, seq=seq, pos=pos, count=real.astype(np.int64),
                snap_offsets=np.array(snap + [int(offs[-1])], dtype=np.int64), first=first)


_MARK: contextvars.ContextVar = contextvars.ContextVar("kernel_split_mark", default=None)


@contextlib.contextmanager
def phase_marks(mark: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, every :func:`run` calls ``mark(name)`` as it starts ("start") and after
    each pass ("pass 1", "fold", "pass 3"): a timer records an event there (the split's
    study, kernel/studies/sequence_split). Outside, run() marks nothing."""
    token = _MARK.set(mark)
    try:
        yield
    finally:
        _MARK.reset(token)


# scan(segments, dht, dh0): the real scans of the given segments (an index array), each from
# dht[i] (None: zeros), snapshots into the caller's output, the dS leaving segment i into dh0[i].
ScanFn = Callable[[np.ndarray, Array | None, Array], None]
# summarise(segments, M, d): M[i] and d[i] of the given segments.
SummaryFn = Callable[[np.ndarray, Array, Array], None]


def run(p: Plan, dht, scan: ScanFn, summarise: SummaryFn, *, xp, H: int, K: int, V: int,
        side_by_side: Callable | None = None):
    """The three passes; returns dh0 [N, H, K, V] (fp32), the snapshots having gone where
    ``scan`` writes them.

    ``dht`` [N, H, K, V] or None. Segment-indexed buffers ([n_seg, H, K, V] fp32) carry
    each segment's incoming dS and its dS leaving. ``side_by_side(a, b)`` runs the two
    calls of pass 1 concurrently (two streams); None runs them in turn.
    """
    mark = _MARK.get() or (lambda name: None)
    mark("start")
    f32 = np.float32
    n_seg = p.segments
    ends, middles, rest = p.ends, p.middles, p.rest
    seg_dht = xp.zeros((n_seg, H, K, V), dtype=f32) if (dht is not None or rest.size) else None
    if dht is not None:
        seg_dht[xp.asarray(ends)] = dht[xp.asarray(p.seq[ends])]
    out = xp.empty((n_seg, H, K, V), dtype=f32)
    M = xp.empty((n_seg, H, K, K), dtype=f32) if middles.size else None
    d = xp.empty((n_seg, H, K, V), dtype=f32) if middles.size else None

    def end_scans():
        scan(ends, seg_dht if dht is not None else None, out)

    def summaries():
        if middles.size:
            summarise(middles, M, d)

    if side_by_side is not None and middles.size:
        side_by_side(summaries, end_scans)
    else:
        summaries()
        end_scans()
    mark("pass 1")

    if rest.size:
        # pass 2, per split sequence: incoming[j] for its segments 0 .. m-2 (the end's is known)
        f64 = np.float64
        for n in np.flatnonzero(p.count > 1):
            base, m = int(p.first[n]), int(p.count[n])
            row = [None] + [(M[base + j].astype(f64), d[base + j].astype(f64)) for j in range(1, m - 1)]
            row.append((None, out[base + m - 1].astype(f64)))
            incoming = fold_summaries(row, None)
            for j in range(m - 1):
                seg_dht[base + j] = incoming[j]
        mark("fold")
        scan(rest, seg_dht, out)
        mark("pass 3")
    return out[xp.asarray(p.first)]
