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
   (:func:`fold_summaries`);
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
stand in for the kernel in the CPU tests (tests/kernel/ds_scan/test_split.py).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..shapes import TILE_TOKENS, snapshot_offsets

__all__ = ["ALIGN", "SEGMENTS", "MAX_SEGMENTS", "MANY_SLOTS", "MIN_SLOTS", "MIN_SEGMENT", "END_WEIGHT", "slots",
           "auto_counts", "pass_vsplits",
           "forced_counts", "counts_for", "segment_starts", "Plan", "plan", "check_summaries", "run", "phase_marks"]

ALIGN = 64          # cuts at multiples of this many tokens from the sequence's start (see above)
# The auto rule and the plan's shape, measured on the H200 (docs/log/32-sequence-split.md, 47).
# Kernel A runs one CTA per SM, and a CTA's tile costs about the same time (1.0-1.4 us) whether
# the grid is large or not: a (sequence, head) gets SMs // (sequences x heads) SMs at once, its
# slots. With 4 slots (1 x T at H = 32 on 132 SMs), 5 segments with the last one twice as long
# as each of the others measured fastest: 0.68-0.69x the unsplit scan at 1 x 131072, 0.76x at
# 1 x 32768, against 0.84x for 3 segments and 0.85-1.10x for 4, 6 or 7. With 8 slots (H = 16,
# FLA's layer) the whole backward on the layer's own call took 15.34 ms unsplit, 14.15 at 5
# segments, 14.88 at 7, 13.72 at 9, 13.90 at 12 and 13.18 at 17 (log 47): MAX_SEGMENTS from 8
# slots on. At 4 slots the whole backward on the training step's own call (1 x 131072, H = 32)
# took 22.34 ms at 5 segments against 22.83 unsplit, 22.43 at 9 and 22.73 at 17 (log 53): 5 stays.
# The last segment scans in pass 1 beside the summaries, whose tiles cost more than its own, and it
# waits for no fold, so it takes the longest share.
SEGMENTS = 5
END_WEIGHT = 2.0
MIN_SLOTS = 4
MANY_SLOTS = 8
# the most segments: the fold walks them one after another (0.28 ms at 17), and more than 17 was
# not measured
MAX_SEGMENTS = 17
# tokens: a sequence shorter than its segments x MIN_SEGMENT is not split so (a guard, not
# measured: a short segment's scan is mostly its start-up)
MIN_SEGMENT = 2048

Array = Any


def slots(sequences_x_heads: int, sm_count: int) -> int:
    """SMs a (sequence, head) may use at once (one CTA an SM): at least 1."""
    return max(1, sm_count // max(1, sequences_x_heads))


def auto_counts(lengths, H: int, sm_count: int) -> np.ndarray:
    """Segments per sequence for the auto rule, where each (sequence, head) has MIN_SLOTS SMs or
    more: MAX_SEGMENTS from MANY_SLOTS on, else SEGMENTS, each for sequences of at least that many
    times MIN_SEGMENT tokens (a shorter one takes SEGMENTS where it is long enough for them); else 1."""
    n = np.asarray(lengths, dtype=np.int64)
    have = slots(len(n) * H, sm_count)
    if have < MIN_SLOTS:
        return np.ones(len(n), dtype=np.int64)
    counts = np.where(n >= SEGMENTS * MIN_SEGMENT, SEGMENTS, 1)
    if have >= MANY_SLOTS:
        counts = np.where(n >= MAX_SEGMENTS * MIN_SEGMENT, MAX_SEGMENTS, counts)
    return counts.astype(np.int64)


def pass_vsplits(counts, slot_count: int, vsplits=(1, 2, 4, 8)) -> tuple[int, int, int]:
    """(summaries, last segments' scans, pass 3's scans): the v-splits that fit each pass in the
    slots a (sequence, head) has, the summaries at the fewest CTAs (two a middle segment: M and
    d), the last segment's scan beside them with what is left, pass 3's segments sharing all."""
    m = int(np.max(counts))
    largest = lambda fits: max([v for v in vsplits if fits(v)] or [1])
    middles = max(0, m - 2)
    return (1, largest(lambda v: 2 * middles + v <= slot_count),
            largest(lambda v: max(1, m - 1) * v <= slot_count))


def forced_counts(lengths, segments: int) -> np.ndarray:
    """``segments`` per sequence (a sequence of fewer 64-token blocks gets one per block)."""
    if isinstance(segments, (bool, np.bool_)) or not isinstance(segments, (int, np.integer)) or segments < 1:
        raise ValueError(f"segments must be 'auto' or an integer >= 1, got {segments!r}")
    n = np.asarray(lengths, dtype=np.int64)
    return np.minimum(int(segments), -(-n // ALIGN)).astype(np.int64)


def counts_for(segments, lengths, H: int, sm_count: int) -> np.ndarray:
    """Segments per sequence for the ``segments`` argument: "auto" (:func:`auto_counts`) or an
    integer (:func:`forced_counts`)."""
    return auto_counts(lengths, H, sm_count) if segments == "auto" else forced_counts(lengths, segments)


def segment_starts(length: int, count: int, end_weight: float = END_WEIGHT) -> list[int]:
    """Where ``count`` segments of a sequence of ``length`` tokens start: at 64-token edges, the
    last one ``end_weight`` times as long as each of the others (as near as the edges allow),
    every segment at least one 64-token block."""
    blocks = -(-int(length) // ALIGN)
    count = min(int(count), blocks)
    weights = np.ones(count)
    weights[-1] = end_weight if count > 1 else 1.0
    edges = np.rint(np.cumsum(weights)[:-1] / weights.sum() * blocks).astype(np.int64)
    edges = np.clip(edges, np.arange(1, count), blocks - count + np.arange(1, count))
    for j in range(1, edges.size):             # strictly increasing (rint can repeat an edge)
        edges[j] = max(edges[j], edges[j - 1] + 1)
    return [0] + [int(e) * ALIGN for e in edges]


@dataclasses.dataclass(frozen=True)   # frozen fields; cached_property and on() fill __dict__ / _on
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
    _on: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def on(self, xp, name: str):
        """The index array ``name`` (a property or field) in array module ``xp``, copied to the
        device once per plan: a host-to-device copy inside every call would stall the host."""
        key = (xp.__name__, name)
        if key not in self._on:
            self._on[key] = xp.asarray(getattr(self, name))
        return self._on[key]

    @property
    def segments(self) -> int:
        return int(self.seq.size)

    @functools.cached_property
    def ends(self) -> np.ndarray:
        """The segments that run their real scan in pass 1: each sequence's last one."""
        return np.flatnonzero(self.pos == self.count[self.seq] - 1)

    @functools.cached_property
    def middles(self) -> np.ndarray:
        """The segments pass 1 summarises: neither first nor last of their sequence."""
        return np.flatnonzero((self.pos > 0) & (self.pos < self.count[self.seq] - 1))

    @functools.cached_property
    def rest(self) -> np.ndarray:
        """The segments that run their real scan in pass 3: all but each sequence's last."""
        return np.flatnonzero(self.pos < self.count[self.seq] - 1)

    @functools.cached_property
    def end_seqs(self) -> np.ndarray:
        """The sequence of each of :attr:`ends`."""
        return self.seq[self.ends]

    @property
    def split(self) -> bool:
        return bool((self.count > 1).any())


def check_summaries(summaries, known, known_name: str, unread: int) -> int:
    """Refuses, by name, a fold's summaries that are not (M, d) pairs of one shape: every entry but
    ``unread`` (0: the first, -1: the last; the fold never reads it) is (M [H, K, K] or None,
    d [H, K, V]), and ``known`` (named ``known_name``), the
    state or dS at the fold's fixed end, is [H, K, V] or None. Returns the number of entries
    (at least 1). Both folds (this module's and the forward's) check with it."""
    try:
        m = len(summaries)
    except TypeError:
        raise ValueError(f"summaries must be a sequence of (M, d) pairs, got "
                         f"{type(summaries).__name__}") from None
    if m < 1:
        raise ValueError("summaries must hold at least one entry (one per segment), got none")
    hkv = None if known is None else tuple(known.shape)
    if hkv is not None and len(hkv) != 3:
        raise ValueError(f"{known_name} must be [H, K, V] (one sequence), got shape {hkv}")
    for j in range(m):
        if j == unread % m:
            continue
        entry = summaries[j]
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"summaries[{j}] must be an (M, d) pair, got {type(entry).__name__}")
        M, d = entry
        shape = tuple(getattr(d, "shape", ()))
        if len(shape) != 3:
            raise ValueError(f"summaries[{j}] d must be [H, K, V], got shape {shape}")
        if hkv is None:
            hkv = shape
        elif shape != hkv:
            raise ValueError(f"summaries[{j}] d must have shape {hkv} (as {known_name} and the other "
                             f"segments), got {shape}")
        H, K, _ = hkv
        if M is not None and tuple(getattr(M, "shape", ())) != (H, K, K):
            raise ValueError(f"summaries[{j}] M must have shape {(H, K, K)} ([H, K, K]) or be None, "
                             f"got {tuple(getattr(M, 'shape', ()))}")
    return m


def fold_summaries(summaries: Sequence[tuple[Any, Any] | None], dht=None) -> list:
    """Pass 2: the dS entering every segment of one sequence, from the right.

    ``summaries``: one entry per segment, in token order; entry j is (M, d),
    M [H, K, K], d [H, K, V], meaning dS_before_j = M @ dS_after_j + d. M may be
    None: the segment's dS_before is already known (its scan ran), and is d. The
    first entry is never read (what leaves the first segment is dh0) and may be None.
    ``dht`` [H, K, V] enters the last segment; None means zeros.

    Returns incoming [m]: incoming[m-1] = dht, incoming[j-1] = M_j @ incoming[j] + d_j,
    with None standing for zeros (as ``dht`` does) and an entry possibly being d_j
    itself (no copy). Only ``@`` and ``+`` are used: numpy, CuPy and torch all fold.
    """
    m = check_summaries(summaries, dht, "dht", unread=0)
    incoming = [None] * m
    incoming[-1] = dht
    for j in range(m - 1, 0, -1):
        M, d = summaries[j]
        x = incoming[j]
        incoming[j - 1] = d if (M is None or x is None) else M @ x + d
    return incoming


def plan(cu_seqlens, counts, *, tile: int = TILE_TOKENS, snapshot_every: int = 1,
         end_weight: float = END_WEIGHT) -> Plan:
    """The segments of sequences ``cu_seqlens`` (host int offsets), ``counts[n]`` runs of 64-token
    blocks each (:func:`segment_starts`)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != lengths.shape or (counts < 1).any():
        raise ValueError(f"counts must hold one integer >= 1 per sequence ({lengths.size}), got {counts.tolist()}")
    offs = snapshot_offsets(lengths, tile, snapshot_every)
    group = tile * snapshot_every                     # tokens per snapshot
    if ALIGN % group:
        raise ValueError(f"cuts every {ALIGN} tokens need snapshots every {ALIGN} tokens or a divisor of it, "
                         f"got tile {tile} x snapshot_every {snapshot_every}")
    starts, seq, pos, snap = [], [], [], []
    for n, (bos, length, m) in enumerate(zip(cu[:-1], lengths, counts)):
        for j, a in enumerate(segment_starts(int(length), int(m), end_weight)):
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


def _float64(a):
    """a in float64: numpy's and CuPy's astype, torch's double."""
    return a.astype(np.float64) if hasattr(a, "astype") else a.double()


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


# scan(segments, dht, dh0, last=...): the real scans of the given segments (an index array), each
# from dht[i] (None: zeros), snapshots into the caller's output, the dS leaving segment i into
# dh0[i]; last: these are the sequences' last segments (pass 1), else pass 3's.
ScanFn = Callable[..., None]
# summarise(segments, M, d): M[i] and d[i] of the given segments.
SummaryFn = Callable[[np.ndarray, Array, Array], None]


def run(p: Plan, dht, scan: ScanFn, summarise: SummaryFn, *, xp, H: int, K: int, V: int,
        side_by_side: Callable | None = None, fold_view: Callable[[Array], Array] | None = None):
    """The three passes; returns dh0 [N, H, K, V] (fp32), the snapshots having gone where
    ``scan`` writes them.

    ``dht`` [N, H, K, V] or None. Segment-indexed buffers ([n_seg, H, K, V] fp32) carry
    each segment's incoming dS and its dS leaving. ``side_by_side(a, b)`` runs the two
    calls of pass 1 concurrently (two streams); None runs them in turn. ``fold_view(a)``, if
    given, is the buffer ``a`` as the library that folds sees it (for a torch caller, a torch
    view: CuPy refuses its matmul while torch captures a CUDA graph, torch's runs there); else
    the fold runs on ``xp``'s arrays.
    """
    mark = _MARK.get() or (lambda name: None)
    mark("start")
    f32 = np.float32
    n_seg = p.segments
    ends, middles, rest = p.ends, p.middles, p.rest
    seg_dht = xp.zeros((n_seg, H, K, V), dtype=f32) if (dht is not None or rest.size) else None
    if dht is not None:
        seg_dht[p.on(xp, "ends")] = dht[p.on(xp, "end_seqs")]
    out = xp.empty((n_seg, H, K, V), dtype=f32)
    M = xp.empty((n_seg, H, K, K), dtype=f32) if middles.size else None
    d = xp.empty((n_seg, H, K, V), dtype=f32) if middles.size else None

    def end_scans():
        scan(ends, seg_dht if dht is not None else None, out, last=True)

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
        view = fold_view if fold_view is not None else (lambda a: a)
        M_f, d_f, out_f, seg_dht_f = (None if a is None else view(a) for a in (M, d, out, seg_dht))
        for n in np.flatnonzero(p.count > 1):
            base, m = int(p.first[n]), int(p.count[n])
            # the middles' summaries in float64, one conversion a kind: the fold is a chain of small
            # launches between pass 1 and pass 3, each a few microseconds
            if m > 2:
                M64, d64 = _float64(M_f[base + 1:base + m - 1]), _float64(d_f[base + 1:base + m - 1])
            row = [None] + [(M64[j - 1], d64[j - 1]) for j in range(1, m - 1)]
            row.append((None, _float64(out_f[base + m - 1])))
            incoming = fold_summaries(row, None)
            for j in range(m - 1):
                seg_dht_f[base + j] = incoming[j]
        mark("fold")
        scan(rest, seg_dht, out, last=False)
        mark("pass 3")
    return out[p.on(xp, "first")]
