"""Kernel A's scan split along the sequence, in float64: segment summaries, their fold, three passes.

What and why
------------
Kernel A walks a sequence backwards one tile at a time, so one sequence is one
serial chain. The chain can still be cut: the tile step is affine in dS,

    dS_before_tile = A_n dS_after_tile + b_n
    A_n = Diag(exp2(gT_n)) - kd_n^T diag(beta_n) INV_n^T kr_n           [K, K]
    b_n = qd_n^T do_n - kd_n^T diag(beta_n) INV_n^T Mqk_n^T do_n        [K, V]

(read off the scan: dU = Mqk^T do + kr dS, dvcorr = INV^T dU,
dS = exp2(gT) dS + qd^T do - kd^T (beta * dvcorr)). A run of consecutive tiles,
a *segment*, is then affine too, and its *summary* (M, d) says

    dS_before_segment = M dS_after_segment + d

with M the product of its A_n (first tile leftmost) and d what the scan gives
when started from zero. Both come out of the ordinary scan: M is the scan run on
the K x K identity with do = 0 (so M needs neither q, nor do, nor Mqk: they only
ever multiply do), d is the scan started from dS = 0.

A sequence cut into segments 0 .. m-1 (token order) is then scanned in three passes:

1. every middle segment (1 .. m-2) computes its summary, all in parallel;
   the segment holding the sequence's end already knows what enters it (dht,
   zeros when absent), so it runs its real scan instead, in the same pass;
   the first segment's summary is never needed (what leaves it is dh0, which
   its own scan produces);
2. a short serial fold, right to left, gives every segment the dS entering it:
   in[m-1] = dht, in[j-1] = M_j in[j] + d_j (for the end segment, whose real
   scan already ran, its dS_before stands in for M_j in[j] + d_j);
3. every other segment runs the normal scan from its true incoming dS and
   writes its snapshots; the first one's outgoing dS is dh0.

Where segments may start and stop
---------------------------------
Segment boundaries are tile edges of the sequence (a multiple of ``tile``
tokens from its start). Nothing finer is possible: ``gc``, ``Mqk`` and ``INV``
are tile-local and INV couples every row of a tile, so a tile's step is one
affine map that does not factor into two maps over its halves. A boundary may
sit on any tile edge, not only on a snapshot edge: with ``snapshot_every`` = e
> 1 (e = 4, tile 16: FLA's 64-token chunks), a boundary at a tile edge that is
not a multiple of e tiles falls *inside* a snapshot chunk. Such a snapshot
belongs to the segment holding the chunk's last tile (the snapshot is the dS
entering that tile), so each segment scans with a snapshot at every tile and
keeps those that land on the sequence's own grid of every e-th tile.

Public names
------------
* :func:`segment_bounds`: a sequence's tile-edge split into up to S segments.
* :func:`segment_snapshots`: which of its sequence's snapshots a segment writes.
* :func:`segment_summary`: one segment's (M, d).
* :func:`fold_summaries`: pass 2, the dS entering every segment.
* :func:`dstate_scan_segmented`: :func:`dstate_scan_reference`'s arguments and
  outputs, computed by the three passes.

:func:`segment_ranges`, :func:`segment_range`, :func:`flatten_batch` and
:func:`gather_segments` (where every segment is, one checked range, segments as
a packed batch) are shared with :mod:`kernel.reference.forward_segments`, the
forward's chain split the same way.

Like the rest of :mod:`kernel.reference`, everything is array-module agnostic
(numpy in, numpy out; CuPy in, CuPy out); :func:`fold_summaries` uses only ``@``
and ``+``, so it also folds torch tensors (:mod:`kernel.cp`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..ds_scan.split import fold_summaries   # the split's algebra is the product's; the reference runs it in float64
from ..shapes import TILE_TOKENS

from .checks import check_tiling, expect_shape, int_arg, is_int, real_dtype_arg, array_module
from .dstate_scan import (check_scan_dtypes, check_scan_inputs, dstate_scan_reference,
                          snapshot_offsets)

__all__ = [
    "segment_bounds",
    "segment_snapshots",
    "segment_summary",
    "fold_summaries",
    "dstate_scan_segmented",
]

# Summaries keep no snapshots, but the scan stores one every snapshot_every
# tiles; this many tiles apart keeps that scratch small (any e >= 1 is valid).
_SUMMARY_SNAPSHOT_EVERY = 64

Array = Any
Summary = tuple[Any, Any]  # (M [H, K, K] or None, d [H, K, V])


# ----------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------



def _is_tile_edge(offset: int, length: int, tile: int) -> bool:
    """A token offset inside a sequence of ``length`` tokens where a segment may start or stop."""
    return offset == length or (0 <= offset < length and offset % tile == 0)


# ----------------------------------------------------------------------------
# where the segments are
# ----------------------------------------------------------------------------

def segment_bounds(length: int, tile: int, segments: int) -> list[tuple[int, int]]:
    """Token ranges [start, stop) splitting a sequence of ``length`` tokens at tile edges.

    The sequence's n_t = ceil(length / tile) tiles are split into
    m = min(segments, n_t) runs of consecutive tiles whose sizes differ by at
    most one (segment j holds tiles floor(j n_t / m) .. floor((j+1) n_t / m) - 1);
    a sequence shorter than ``segments`` tiles is cut into fewer segments, one of a
    single tile is not cut. Ranges are relative to the sequence's first token;
    the last one stops at ``length`` (a partial last tile stays whole).
    """
    check_tiling(tile)
    if not is_int(length) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    if not is_int(segments) or segments < 1:
        raise ValueError(f"segments must be an integer >= 1, got {segments!r}")
    n_tiles = -(-int(length) // tile)
    m = min(int(segments), n_tiles)
    edges = [j * n_tiles // m * tile for j in range(m)] + [int(length)]
    return list(zip(edges[:-1], edges[1:]))


def segment_snapshots(start: int, stop: int, length: int, tile: int,
                      snapshot_every: int) -> tuple[np.ndarray, np.ndarray]:
    """Which snapshots of its sequence a segment writes: (tiles, snapshots), int64.

    For the segment of tokens start .. stop - 1 of a sequence of ``length``
    tokens: ``tiles`` counts its tiles that carry a snapshot, from the segment's
    first tile; ``snapshots`` is the index of each in the sequence's own
    snapshot grid (snapshot m = dS entering tile min(e m + e - 1, n_t - 1),
    e = ``snapshot_every``). A segment that starts inside a snapshot chunk
    writes that chunk's snapshot only if it holds the chunk's last tile; the
    snapshots of consecutive segments, concatenated, are the sequence's.

    Refused: start, stop, length that are not ints (TypeError), and a range that is
    not a segment (ValueError): 0 <= start < stop <= length, start a tile edge, stop
    a tile edge or the sequence's end, as :func:`segment_bounds` makes them.
    """
    check_tiling(tile, snapshot_every)
    length = int_arg(length, "length", 1)
    start = int_arg(start, "start", 0)
    stop = int_arg(stop, "stop", 1)
    if not start < length:
        raise ValueError(f"start must be a token offset in 0 .. {length - 1} (length = {length}), "
                         f"got {start}")
    if not start < stop <= length:
        raise ValueError(f"stop must be in {start + 1} .. {length} (start = {start}, "
                         f"length = {length}), got {stop}")
    for name, pos in (("start", start), ("stop", stop)):
        if not _is_tile_edge(pos, length, tile):
            raise ValueError(f"{name} = {pos} is not a tile edge of a sequence of {length} tokens: "
                             f"segments start and stop at a multiple of tile = {tile}, or stop "
                             f"at {length}")
    seq_tiles = -(-length // tile)
    first = start // tile
    tiles = first + np.arange(-(-(stop - start) // tile), dtype=np.int64)
    e = snapshot_every
    keep = (tiles % e == e - 1) | (tiles == seq_tiles - 1)
    return tiles[keep] - first, tiles[keep] // e


def _bounds_from_cuts(length: int, tile: int, cuts: Sequence[int], name: str) -> list[tuple[int, int]]:
    """Ranges between explicit interior cuts (token offsets, strictly increasing tile edges)."""
    try:
        cuts = [c for c in cuts]
    except TypeError:
        raise ValueError(f"{name} must be a sequence of token offsets, got {cuts!r}") from None
    for i, c in enumerate(cuts):
        if not is_int(c):
            raise ValueError(f"{name}[{i}] must be an integer token offset, got {c!r}")
        if not 0 < c < length or c % tile != 0:
            raise ValueError(f"{name}[{i}] = {c} must be a tile edge strictly inside the sequence "
                             f"(a multiple of tile = {tile} in 1 .. {length - 1})")
        if i and c <= cuts[i - 1]:
            raise ValueError(f"{name} must be strictly increasing, got {name}[{i - 1}] = {cuts[i - 1]} "
                             f">= {name}[{i}] = {c}")
    edges = [0] + [int(c) for c in cuts] + [int(length)]
    return list(zip(edges[:-1], edges[1:]))


def segment_ranges(cu: np.ndarray, tile: int, segments) -> list[list[tuple[int, int]]]:
    """Per sequence, its segments as absolute token ranges of the flattened token axis.

    ``segments`` as the three-pass functions take it: an integer S >= 1
    (:func:`segment_bounds` on every sequence) or one list of interior cuts per
    sequence (token offsets from its first token, strictly increasing tile edges).
    """
    lengths = np.diff(cu)
    N = lengths.shape[0]
    if is_int(segments):
        if segments < 1:
            raise ValueError(f"segments must be an integer >= 1 or one list of cuts per sequence, "
                             f"got {segments!r}")
        rel = [segment_bounds(int(n), tile, int(segments)) for n in lengths]
    else:
        if isinstance(segments, bool) or not isinstance(segments, Sequence) or isinstance(segments, str):
            raise ValueError(f"segments must be an integer >= 1 or one list of cuts per sequence, "
                             f"got {segments!r}")
        if len(segments) != N:
            raise ValueError(f"segments as cuts needs one list per sequence ({N}), got {len(segments)}")
        rel = [_bounds_from_cuts(int(n), tile, cuts, f"segments[{i}]")
               for i, (n, cuts) in enumerate(zip(lengths, segments))]
    return [[(int(bos) + a, int(bos) + b) for a, b in r] for bos, r in zip(cu[:-1], rel)]


def segment_range(cu: np.ndarray, start, stop, tile: int) -> tuple[int, int]:
    """(start, stop) of one segment of the flattened token axis, checked; ``stop`` None: the
    end of the sequence holding ``start``. Both must be tile edges of that one sequence (a
    multiple of ``tile`` tokens from its first token, or ``stop`` at its end)."""
    total = int(cu[-1])
    if not is_int(start) or not 0 <= start < total:
        raise ValueError(f"start must be an integer token position in 0 .. {total - 1}, got {start!r}")
    n = int(np.searchsorted(cu, start, side="right")) - 1
    bos, eos = int(cu[n]), int(cu[n + 1])
    if stop is None:
        stop = eos
    if not is_int(stop) or not start < stop <= eos:
        raise ValueError(f"stop must be an integer in {start + 1} .. {eos} (the segment may not "
                         f"cross the end of sequence {n}, tokens {bos} .. {eos - 1}), got {stop!r}")
    for name, pos in (("start", int(start)), ("stop", int(stop))):
        if not _is_tile_edge(pos - bos, eos - bos, tile):
            raise ValueError(f"{name} = {pos} is not a tile edge of sequence {n} (tokens {bos} .. "
                             f"{eos - 1}, tile {tile}): segments start and stop at "
                             f"{bos} + a multiple of {tile}, or stop at {eos}")
    return int(start), int(stop)


# ----------------------------------------------------------------------------
# scans over a set of segments, each as its own packed "sequence"
# ----------------------------------------------------------------------------

def gather_segments(xp, flat: dict, ranges: list[tuple[int, int]]):
    """The tokens of ``ranges``, concatenated [1, sum, ...], and their cu_seqlens.

    A segment starts at a tile edge of its sequence, so its tiles are the
    sequence's own and everything tile-local (gc, Mqk, INV) stays valid.
    """
    idx = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])
    cu = np.concatenate([[0], np.cumsum([b - a for a, b in ranges])]).astype(np.int64)
    sel = xp.asarray(idx)
    return {name: x[:, sel] for name, x in flat.items()}, cu


def _scan_ranges(xp, flat: dict, ranges, dht, opts: dict, snapshot_every: int, do=None):
    """dstate_scan_reference over the given segments at once (they are independent)."""
    g, cu = gather_segments(xp, flat, ranges)
    return dstate_scan_reference(g["q"], g["k"], g["gc"], g["beta"], g["mqk"], g["inv"],
                                 g["do"] if do is None else do(g["do"]), dht=dht, cu_seqlens=cu,
                                 snapshot_every=snapshot_every, **opts)


def _summaries(xp, flat: dict, ranges, opts: dict) -> tuple[Array, Array]:
    """(M [n, H, K, K], d [n, H, K, V]) of each range, from one scan of width K + V.

    The scan treats every column of dS independently (each column meets the same
    column of do only), so the columns [I | 0] with do [0 | do] carry M and d side by side.
    """
    n = len(ranges)
    _, _, H, K = flat["q"].shape
    V = flat["do"].shape[-1]
    eye = xp.broadcast_to(xp.eye(K, dtype=np.float64), (n, H, K, K))
    dht = xp.concatenate([eye, xp.zeros((n, H, K, V), dtype=np.float64)], axis=-1)

    def widen(do):
        zeros = xp.zeros(do.shape[:-1] + (K,), dtype=np.float64)
        return xp.concatenate([zeros, xp.asarray(do, dtype=np.float64)], axis=-1)

    _, out = _scan_ranges(xp, flat, ranges, dht, opts, _SUMMARY_SNAPSHOT_EVERY, do=widen)
    return out[..., :K], out[..., K:]


def flatten_batch(B: int, T: int, **arrays) -> dict:
    """[B, T, ...] -> [1, B*T, ...]: a batch of equal-length sequences as one packed batch."""
    return {name: x.reshape((1, B * T) + tuple(x.shape[2:])) for name, x in arrays.items()}


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------

def segment_summary(q, k, gc, beta, mqk, inv, do, *, start: int = 0, stop: int | None = None,
                    scale: float | None = None, cu_seqlens=None, tile: int = TILE_TOKENS,
                    qk_l2norm: bool = True) -> tuple[Array, Array]:
    """One segment's summary (M [H, K, K], d [H, K, V]), float64.

    The inputs are :func:`dstate_scan_reference`'s (same shapes, same
    ``cu_seqlens`` packing); the segment is the tokens ``start .. stop - 1`` of
    the flattened token axis (token t of batch row b is b*T + t; with
    ``cu_seqlens``, the packed position). Both ends must be tile edges of one
    sequence: a multiple of ``tile`` tokens from its first token, or ``stop`` at
    its end. ``stop`` None: the end of the sequence holding ``start``. So a
    single sequence (or one context-parallel rank's part, which starts at a tile
    edge) needs no range at all.

    dS entering the segment's first tile (from the right, the gradient w.r.t.
    the state before the segment) = M @ dS entering from after the segment + d.
    """
    B, T, H, K, V, cu = check_scan_inputs(q, k, gc, beta, mqk, inv, do, tile, 1, cu_seqlens)
    check_scan_dtypes(q, k, gc, beta, mqk, inv, do)
    start, stop = segment_range(cu, start, stop, tile)
    xp = array_module(q)
    flat = flatten_batch(B, T, q=q, k=k, gc=gc, beta=beta, mqk=mqk, inv=inv, do=do)
    opts = dict(scale=scale, tile=tile, qk_l2norm=qk_l2norm)
    M, d = _summaries(xp, flat, [(start, stop)], opts)
    return M[0], d[0]


def dstate_scan_segmented(q, k, gc, beta, mqk, inv, do, *, segments, scale: float | None = None,
                          dht=None, cu_seqlens=None, tile: int = TILE_TOKENS, qk_l2norm: bool = True,
                          snapshot_every: int = 1):
    """:func:`dstate_scan_reference`, computed by the three passes over segments.

    Same arguments, same outputs (snapshots, dh0) in the same layout, plus
    ``segments``: either an integer S >= 1 (each sequence cut into
    min(S, its tile count) near-equal runs of tiles, :func:`segment_bounds`) or,
    one list per sequence, the token offsets (from the sequence's first token)
    of its interior cuts, each a tile edge: ``[[32, 48], [], [16]]``.
    """
    B, T, H, K, V, cu = check_scan_inputs(q, k, gc, beta, mqk, inv, do, tile, snapshot_every,
                                           cu_seqlens)
    check_scan_dtypes(q, k, gc, beta, mqk, inv, do)
    N = cu.shape[0] - 1
    if dht is not None:
        expect_shape("dht", dht, (N, H, K, V), "([N, H, K, V])")
        real_dtype_arg("dht", dht)
    bounds = segment_ranges(cu, tile, segments)
    xp = array_module(q)
    f64 = np.float64
    flat = flatten_batch(B, T, q=q, k=k, gc=gc, beta=beta, mqk=mqk, inv=inv, do=do)
    opts = dict(scale=scale, tile=tile, qk_l2norm=qk_l2norm)
    dht64 = None if dht is None else xp.asarray(dht, dtype=f64)

    # pass 1: summaries of the middle segments; the end segments' real scans
    middle = [(n, j) for n, b in enumerate(bounds) for j in range(1, len(b) - 1)]
    summary = {}
    if middle:
        M, d = _summaries(xp, flat, [bounds[n][j] for n, j in middle], opts)
        summary = {key: (M[i], d[i]) for i, key in enumerate(middle)}
    ends = [(n, len(b) - 1) for n, b in enumerate(bounds)]
    end_snaps, end_out = _scan_ranges(xp, flat, [bounds[n][j] for n, j in ends], dht64, opts, 1)
    for i, key in enumerate(ends):
        summary[key] = (None, end_out[i])            # known dS leaving the end segment

    # pass 2: the serial fold, one sequence at a time
    incoming = {}
    for n, b in enumerate(bounds):
        row = [None] + [summary[(n, j)] for j in range(1, len(b))]
        for j, x in enumerate(fold_summaries(row, None if dht64 is None else dht64[n])):
            incoming[(n, j)] = x

    # pass 3: every other segment from its true incoming dS
    rest = [(n, j) for n, b in enumerate(bounds) for j in range(len(b) - 1)]
    runs = [(ends, end_snaps, end_out)]
    if rest:
        zeros = xp.zeros((H, K, V), dtype=f64)
        dS_in = xp.stack([zeros if incoming[key] is None else incoming[key] for key in rest])
        runs.append((rest,) + _scan_ranges(xp, flat, [bounds[n][j] for n, j in rest], dS_in, opts, 1))

    # every segment's every-tile snapshots -> the sequence's grid of every e-th tile
    offsets = snapshot_offsets(np.diff(cu), tile, snapshot_every)
    snapshots = xp.zeros((int(offsets[-1]), H, K, V), dtype=f64)
    dh0 = xp.zeros((N, H, K, V), dtype=f64)
    for keys, snaps, out in runs:
        row = 0
        for i, (n, j) in enumerate(keys):
            bos, eos = int(cu[n]), int(cu[n + 1])
            start, stop = bounds[n][j]
            tiles, which = segment_snapshots(start - bos, stop - bos, eos - bos, tile, snapshot_every)
            if tiles.size:
                snapshots[xp.asarray(offsets[n] + which)] = snaps[0, xp.asarray(row + tiles)]
            row += -(-(stop - start) // tile)
            if j == 0:
                dh0[n] = out[i]
    if cu_seqlens is None:
        snapshots = snapshots.reshape(B, -1, H, K, V)
    else:
        snapshots = snapshots[None]
    return snapshots, dh0
