"""The KDA forward's chain split along the sequence, in float64: segment summaries, their fold, three passes.

What and why
------------
The forward walks each (sequence, head) one tile at a time, carrying the state
S [K, V] from each tile into the next, so one sequence is one serial chain: at
B = 1 the chain's length, not the bytes, sets the time. The chain can be cut
because the tile step is affine in S. From :func:`kernel.reference.kda._tile_forward`
(U = INV diag(beta) (v - Kd S0), S1 = diag(gamma) S0 + Kr^T U)::

    S_after_tile = A_n S_before_tile + b_n
    A_n = diag(gamma_n) - Kr_n^T INV_n diag(beta_n) Kd_n             [K, K]
    b_n = Kr_n^T INV_n diag(beta_n) v_n                              [K, V]

A run of consecutive tiles, a *segment*, is then affine too, and its *summary*
(M, d) says

    S_after_segment = M S_before_segment + d

with M the product of its A_n (last tile leftmost) and d what the scan gives
when started from S = 0. Both come out of the ordinary forward: every column
of S meets only the same column of v, so the scan run on the state [I | 0]
(width K + V) with the values [0 | v] carries M and d side by side. Neither
reads q (q only forms o), and M does not read v either.

o of a tile needs the state entering it (o = Qd S0 + Mqk U), so a summary
cannot stand in for a segment's real scan; it only finds what enters the next
one. A sequence cut into segments 0 .. m-1 (token order) is computed in three passes:

1. the first segment already knows what enters it (the initial state, zeros
   when absent) and runs its real scan; every middle segment (1 .. m-2)
   computes its summary, all in parallel; the last segment's summary is never
   needed (what leaves it is the final state, which its own scan produces);
2. a short serial fold, left to right, gives every segment the state entering
   it: in[0] = h0, in[j+1] = M_j in[j] + d_j (for the first segment, whose
   real scan already ran, its S_after stands in for M_0 in[0] + d_0);
3. every other segment runs its real scan from its true incoming state: its o,
   the states entering its tiles and, for the last, the final state.

This is the mirror of Kernel A's split (:mod:`kernel.reference.segments`), which
runs the other way along the sequence. The context-parallel backward
(:mod:`kernel.cp.backward`) folds the same chain across ranks with these
functions, each rank's part one segment (its summaries called (P, Q) there).

Where segments may start and stop
---------------------------------
Segment boundaries are tile edges of the sequence (a multiple of ``tile``
tokens from its start), for the same reason as Kernel A's: the gate's
cumulative sum, Mqk and INV are tile-local and INV couples every row of a
tile, so a tile's step is one affine map that does not factor into maps over
its parts. Cut at a tile edge, a segment's tiles are its sequence's own, and
the segment runs as a sequence of its own in a packed batch.

Public names
------------
* :func:`forward_segment_summary`: one segment's (M, d).
* :func:`fold_forward_summaries`: pass 2, the state entering every segment.
* :func:`kda_forward_segmented`: :func:`kda_forward_reference`'s arguments and
  outputs, computed by the three passes.

Where the segments are comes from :mod:`kernel.reference.segments`
(:func:`segment_bounds`, the same ``segments`` argument). Everything is array-module
agnostic (numpy in, numpy out; CuPy in, CuPy out), float64 throughout;
:func:`fold_forward_summaries` uses only ``@`` and ``+``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..shapes import TILE_TOKENS
from ..ds_scan.split import check_summaries   # one check for both folds
from .dstate_scan import snapshot_offsets
from .kda import check_kda_inputs, kda_forward_reference
from .segments import flatten_batch, gather_segments, segment_range, segment_ranges

__all__ = [
    "forward_segment_summary",
    "fold_forward_summaries",
    "kda_forward_segmented",
]

INPUTS = ("q", "k", "v", "g", "beta")   # kda_forward_reference's per-token inputs, in its order

Array = Any
Summary = tuple[Any, Any]  # (M [H, K, K] or None, d [H, K, V])


# ----------------------------------------------------------------------------
# scans over a set of segments, each as its own packed "sequence"
# ----------------------------------------------------------------------------

def _scan_ranges(xp, flat: dict, ranges, state_in, opts: dict, v=None):
    """kda_forward_reference over the given segments at once (each from its own row of
    ``state_in`` [n, H, K, V'], or zeros): (o [1, sum, H, V'], final [n, H, K, V'],
    states entering each tile [1, sum of tiles, H, K, V'])."""
    seg, cu = gather_segments(xp, flat, ranges)
    values = seg["v"] if v is None else v(seg["v"])
    return kda_forward_reference(seg["q"], seg["k"], values, seg["g"], seg["beta"],
                                 initial_state=state_in, cu_seqlens=cu, **opts)


def _summaries(xp, flat: dict, ranges, opts: dict) -> tuple[Array, Array]:
    """(M [n, H, K, K], d [n, H, K, V]) of each range, from one scan of width K + V.

    Each column of the state meets only the same column of v, so the state [I | 0]
    with the values [0 | v] carries M (the identity's columns, v = 0) and d (zero
    state) side by side.
    """
    n = len(ranges)
    _, _, H, K = flat["q"].shape
    V = flat["v"].shape[-1]
    eye = xp.broadcast_to(xp.eye(K, dtype=np.float64), (n, H, K, K))
    state = xp.concatenate([eye, xp.zeros((n, H, K, V), dtype=np.float64)], axis=-1)

    def widen(v):
        return xp.concatenate([xp.zeros(v.shape[:-1] + (K,), dtype=np.float64), v], axis=-1)

    _, final, _ = _scan_ranges(xp, flat, ranges, state, opts, v=widen)
    return final[..., :K], final[..., K:]


def _flat_inputs(dims, wide) -> dict:
    B, T = dims[:2]
    return flatten_batch(B, T, **{name: wide[name] for name in INPUTS})


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------

def forward_segment_summary(q, k, v, g, beta, *, start: int = 0, stop: int | None = None,
                            scale: float | None = None, cu_seqlens=None, qk_l2norm: bool = True,
                            tile: int = TILE_TOKENS) -> tuple[Array, Array]:
    """One segment's summary (M [H, K, K], d [H, K, V]), float64.

    The inputs are :func:`kda_forward_reference`'s (same shapes, same
    ``cu_seqlens`` packing); the segment is the tokens ``start .. stop - 1`` of
    the flattened token axis (token t of batch row b is b*T + t; with
    ``cu_seqlens``, the packed position). Both ends must be tile edges of one
    sequence: a multiple of ``tile`` tokens from its first token, or ``stop`` at
    its end. ``stop`` None: the end of the sequence holding ``start``.

    The state after the segment's last tile = M @ the state entering its first
    tile + d. M reads neither q nor v (only k, g, beta, through the gate's
    decay and the delta rule's correction); d reads v and not q: q only forms o.
    """
    dims, cu, xp, wide = check_kda_inputs(q, k, v, g, beta, initial_state=None,
                                          cu_seqlens=cu_seqlens, tile=tile)
    start, stop = segment_range(cu, start, stop, tile)
    opts = dict(scale=scale, qk_l2norm=qk_l2norm, tile=tile)
    M, d = _summaries(xp, _flat_inputs(dims, wide), [(start, stop)], opts)
    return M[0], d[0]


def fold_forward_summaries(summaries: Sequence[Summary | None], h0=None) -> list:
    """Pass 2: the state entering every segment of one sequence, from the left.

    ``summaries``: one entry per segment, in token order; entry j is (M, d),
    M [H, K, K], d [H, K, V], meaning S_after_j = M @ S_before_j + d. M may be
    None: the segment's S_after is already known (its scan ran), and is d. The
    last entry is never read (what leaves the last segment is the final state)
    and may be None. ``h0`` [H, K, V] enters the first segment; None means zeros.

    Returns incoming [m]: incoming[0] = h0, incoming[j+1] = M_j @ incoming[j] + d_j,
    with None standing for zeros (as ``h0`` does) and an entry possibly being d_j
    itself (no copy). The mirror of :func:`kernel.reference.fold_summaries`
    (Kernel A's chain, folded from the right).
    """
    m = check_summaries(summaries, h0, "h0", unread=-1)
    incoming = [None] * m
    incoming[0] = h0
    for j in range(m - 1):
        M, d = summaries[j]
        x = incoming[j]
        incoming[j + 1] = d if (M is None or x is None) else M @ x + d
    return incoming


def kda_forward_segmented(q, k, v, g, beta, *, segments, scale: float | None = None,
                          initial_state=None, cu_seqlens=None, qk_l2norm: bool = True,
                          tile: int = TILE_TOKENS):
    """:func:`kda_forward_reference`, computed by the three passes over segments.

    Same arguments, same outputs (o, final_state, states: the state entering
    every tile) in the same layout, plus ``segments``: either an integer S >= 1
    (each sequence cut into min(S, its tile count) near-equal runs of tiles,
    :func:`kernel.reference.segment_bounds`) or, one list per sequence, the token
    offsets (from the sequence's first token) of its interior cuts, each a tile
    edge: ``[[32, 48], [], [16]]``.
    """
    dims, cu, xp, wide = check_kda_inputs(q, k, v, g, beta, initial_state=initial_state,
                                          cu_seqlens=cu_seqlens, tile=tile)
    B, T, H, K, V = dims
    N = cu.shape[0] - 1
    bounds = segment_ranges(cu, tile, segments)
    flat = _flat_inputs(dims, wide)
    opts = dict(scale=scale, qk_l2norm=qk_l2norm, tile=tile)
    h0 = wide.get("initial_state")

    # pass 1: every sequence's first segment from h0; the summaries of the middle segments
    firsts = [(n, 0) for n in range(N)]
    runs = [(firsts, _scan_ranges(xp, flat, [b[0] for b in bounds], h0, opts))]
    middle = [(n, j) for n, b in enumerate(bounds) for j in range(1, len(b) - 1)]
    summary = {}
    if middle:
        M, d = _summaries(xp, flat, [bounds[n][j] for n, j in middle], opts)
        summary = {key: (M[i], d[i]) for i, key in enumerate(middle)}
    first_out = runs[0][1][1]
    for n in range(N):
        summary[(n, 0)] = (None, first_out[n])       # known state leaving the first segment

    # pass 2: the serial fold, one sequence at a time
    incoming = {}
    for n, b in enumerate(bounds):
        row = [summary.get((n, j)) for j in range(len(b))]
        for j, x in enumerate(fold_forward_summaries(row, None if h0 is None else h0[n])):
            incoming[(n, j)] = x

    # pass 3: every other segment from its true incoming state (never None: the first's
    # S_after is an array)
    rest = [(n, j) for n, b in enumerate(bounds) for j in range(1, len(b))]
    if rest:
        state_in = xp.stack([incoming[key] for key in rest])
        runs.append((rest, _scan_ranges(xp, flat, [bounds[n][j] for n, j in rest], state_in, opts)))

    # every segment's tokens and tiles back to their places in the sequence
    tile_offsets = snapshot_offsets(np.diff(cu), tile, 1)
    f64 = np.float64
    o = xp.zeros((B * T, H, V), dtype=f64)
    states = xp.zeros((int(tile_offsets[-1]), H, K, V), dtype=f64)
    final = xp.zeros((N, H, K, V), dtype=f64)
    for keys, (o_run, final_run, states_run) in runs:
        tokens, tiles = [], []
        for i, (n, j) in enumerate(keys):
            start, stop = bounds[n][j]
            tokens.append(np.arange(start, stop, dtype=np.int64))
            first_tile = tile_offsets[n] + (start - int(cu[n])) // tile
            tiles.append(first_tile + np.arange(-(-(stop - start) // tile), dtype=np.int64))
            if j == len(bounds[n]) - 1:
                final[n] = final_run[i]
        o[xp.asarray(np.concatenate(tokens))] = o_run[0]
        states[xp.asarray(np.concatenate(tiles))] = states_run[0]
    o = o.reshape(B, T, H, V)
    states = states.reshape(B, -1, H, K, V) if cu_seqlens is None else states[None]
    return o, final, states
