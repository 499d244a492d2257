"""Kernel A's numerical contract in float64: tile quantities and the dstate scan.

What and why
------------
Kernel A walks each sequence backwards one tile (``tile`` tokens: TILE_TOKENS = 16 on the
GPU) at a time, carrying the state gradient dS [K, V], and stores snapshots of
dS. This module is the float64 statement of that contract
(the contract, docs/kernel_a.md, sections 1-3), used as the oracle for the GPU kernel:

* :func:`prepare_tiles` builds what the forward pass hands to Kernel A:
  the tile-local log2 cumulative gate ``gc``, the masked attention ``Mqk`` and
  ``INV = (I + Lkk)^-1``, one tile row stored at each token.
* :func:`dstate_scan_reference` is section 3, token layout and snapshot layout
  exactly as the GPU kernel must produce them.
* :func:`snapshot_offsets` packs per-sequence snapshots (FLA's chunk_offsets).
* The seeded input generators shared by tests and benchmarks
  (``random_inputs``, ``ragged_lengths``) are in :mod:`kernel.reference.inputs`,
  the argument checks in :mod:`kernel.reference.checks`.

Every function is array-module agnostic: numpy arrays in, numpy out; CuPy
arrays in, CuPy out. CuPy is imported lazily and never required.

Every argument is checked at the boundary, by name: shapes, real floating dtypes
(a complex or string array is not silently cast), integers that are
integers (a length of 2.7 is refused, not truncated), flags that are bools, and
the values themselves -- the reference refuses NaN and inf in any input array
and a positive gate g (the gate is a natural-log decay: g <= 0). Each value check
is one elementwise pass and one reduction per array (on CuPy arrays, one
device-to-host scalar each); where it fails, a second look names the first bad
element. TypeError for a wrong type, ValueError for a wrong value.

Layout reminders (``..`` = ``B, T`` or ``1, total`` with ``cu_seqlens``)::

    q, k, g, gc : [.., H, K]      beta : [.., H]      do : [.., H, V]
    mqk, inv    : [.., H, tile]   row c of a tile lives at the tile's token c
    dht, dh0    : [N, H, K, V]    snapshots : [B, n_s, H, K, V] or [1, sum n_s, H, K, V]

Pseudo-code of the scan (per sequence, per head)::

    dS = dht
    for tile n = n_t-1 .. 0:
        if n is a snapshot tile: snapshot = dS
        dU     = Mqk^T do + kr dS
        dvcorr = INV^T dU
        dS     = exp2(gT) * dS + qd^T do - kd^T (beta * dvcorr)
    dh0 = dS
"""
from __future__ import annotations

import numpy as np

from .. import shapes

from .checks import (LN2, check_tiling, expect_rank, expect_shape, finite_arg, flag_arg,
                     gate_arg, gather_tiles, l2norm, lengths_arg, real_dtype_arg, scale_arg,
                     sequence_offsets, tiles_of_offsets, array_module)

__all__ = [
    "array_module",
    "prepare_tiles",
    "dstate_scan_reference",
    "snapshot_offsets",
    "tile_table",
]


# ----------------------------------------------------------------------------
# tile quantities (docs/kernel_a.md, section 2)
# ----------------------------------------------------------------------------

def prepare_tiles(q, k, g, beta, *, scale: float | None = None, qk_l2norm: bool = True,
                  tile: int = shapes.TILE_TOKENS, cu_seqlens=None):
    """Tile quantities the forward pass hands to Kernel A, in float64.

    q, k, g: [B, T, H, K] (or [1, total, H, K] with ``cu_seqlens``, N+1 offsets);
    g is the natural-log gate (<= 0); beta: [B, T, H].

    Returns (gc, mqk, inv):
      gc  [B, T, H, K]      tile-local cumulative gate / ln 2 (restarts every tile
                            of every sequence; a sequence's last tile may be partial)
      mqk [B, T, H, tile]   Mqk[c, j] = s sum_d q[c,d] k[j,d] exp2(gc[c,d]-gc[j,d]), j <= c
      inv [B, T, H, tile]   (I + Lkk)^-1, Lkk[c, j] = beta[c] sum_d k[c,d] k[j,d]
                            exp2(gc[c,d]-gc[j,d]), j < c
    with row c of a tile stored at the tile's token c; columns past a partial
    tile's end are 0. q, k are l2-normalised first when ``qk_l2norm``;
    s = scale or K**-0.5.

    Refused (ValueError, naming the array and its first bad element): NaN or inf
    in q, k, g or beta, and g > 0; a dtype that is not real floating (complex, strings,
    ints); a scale that is not a finite real > 0; qk_l2norm not a bool (TypeError).
    """
    check_tiling(tile)
    qk_l2norm = flag_arg(qk_l2norm, "qk_l2norm")
    expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    expect_shape("g", g, q.shape, "(same as q: [B, T, H, K])")
    expect_shape("beta", beta, (B, T, H), "([B, T, H])")
    for name, x in (("q", q), ("k", k), ("g", g), ("beta", beta)):
        real_dtype_arg(name, x)
    cu = sequence_offsets(B, T, cu_seqlens)

    xp = array_module(q)
    f64 = np.float64
    s = scale_arg(scale, K)
    total = B * T
    qf = finite_arg(xp, xp.asarray(q, dtype=f64), "q").reshape(total, H, K)
    kf = finite_arg(xp, xp.asarray(k, dtype=f64), "k").reshape(total, H, K)
    gf = gate_arg(xp, xp.asarray(g, dtype=f64)).reshape(total, H, K)
    betaf = finite_arg(xp, xp.asarray(beta, dtype=f64), "beta").reshape(total, H)
    if qk_l2norm:
        qf, kf = l2norm(xp, qf), l2norm(xp, kf)

    start, length, _ = tiles_of_offsets(cu, tile)
    # tiles: [n_tiles, tile, H, K]; padded rows are zero (q, k, g = 0 past the end)
    qt = gather_tiles(xp, qf, start, length, tile)
    kt = gather_tiles(xp, kf, start, length, tile)
    gt = gather_tiles(xp, gf, start, length, tile)
    bt = gather_tiles(xp, betaf, start, length, tile)
    gct = xp.cumsum(gt, axis=1) / LN2                                 # [n, tile, H, K]

    rows = np.arange(tile)
    mqk_t = xp.zeros(qt.shape[:3] + (tile,), dtype=f64)               # [n, tile(row), H, tile(col)]
    lkk_t = xp.zeros_like(mqk_t)
    for j in range(tile):
        # exp2(gc[c] - gc[j]) for every row c; rows above the diagonal are masked
        # to -inf before exp2 so that a positive exponent never overflows.
        diff = gct - gct[:, j:j + 1]                                   # [n, tile, H, K]
        on_or_below = xp.asarray(rows >= j)[None, :, None, None]
        below = xp.asarray(rows > j)[None, :, None, None]
        decay_le = xp.exp2(xp.where(on_or_below, diff, -xp.inf))
        decay_lt = xp.exp2(xp.where(below, diff, -xp.inf))
        kj = kt[:, j:j + 1]                                            # [n, 1, H, K]
        mqk_t[..., j] = s * xp.sum(qt * kj * decay_le, axis=-1)
        lkk_t[..., j] = bt * xp.sum(kt * kj * decay_lt, axis=-1)

    # INV = (I + Lkk)^-1 by forward substitution (unit lower triangular):
    # INV[c] = e_c - sum_{j<c} Lkk[c, j] INV[j]
    lkk = xp.moveaxis(lkk_t, 2, 1)                                     # [n, H, tile, tile]
    eye = xp.eye(tile, dtype=f64)
    inv = xp.zeros_like(lkk)
    inv[..., 0, :] = eye[0]
    for c in range(1, tile):
        inv[..., c, :] = eye[c] - xp.einsum("nhj,nhjm->nhm", lkk[..., c, :c], inv[..., :c, :])
    inv_t = xp.moveaxis(inv, 1, 2)                                     # [n, tile(row), H, tile(col)]

    # every token is exactly one valid (tile, row), in token order
    valid = xp.asarray(rows[None, :] < length[:, None])
    gc_out = gct[valid].reshape(B, T, H, K)
    return gc_out, mqk_t[valid].reshape(B, T, H, tile), inv_t[valid].reshape(B, T, H, tile)


# ----------------------------------------------------------------------------
# snapshot layout
# ----------------------------------------------------------------------------

def snapshot_offsets(lengths, tile: int, snapshot_every: int) -> np.ndarray:
    """Start of each sequence's snapshots in the packed snapshot axis, int64 [N+1].

    A sequence of n tokens has n_t = ceil(n / tile) tiles and
    n_s = ceil(n_t / snapshot_every) snapshots (FLA's chunk_offsets for
    tile * snapshot_every = 64).
    """
    check_tiling(tile, snapshot_every)
    return shapes.snapshot_offsets(lengths_arg(lengths, allow_empty=True), tile, snapshot_every)


def tile_table(lengths, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Every tile of sequences of these lengths, packed one after another, in token order:
    (start, length) int64 [n_tiles]; tile i covers tokens start[i] .. start[i] + length[i] - 1.
    lengths: a non-empty list (or int array) of ints >= 1; 2.7 is refused, not truncated."""
    check_tiling(tile)
    n = lengths_arg(lengths)
    start, length, _ = tiles_of_offsets(np.concatenate([[0], np.cumsum(n)]), tile)
    return start, length


# ----------------------------------------------------------------------------
# the backward scan (docs/kernel_a.md, section 3)
# ----------------------------------------------------------------------------

def check_scan_inputs(q, k, gc, beta, mqk, inv, do, tile: int, snapshot_every: int, cu_seqlens):
    """The shape checks of :func:`dstate_scan_reference`'s arrays (kernel.reference.segments
    makes the same ones); returns (B, T, H, K, V, cu) with cu the sequence offsets."""
    check_tiling(tile, snapshot_every)
    expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    expect_shape("gc", gc, q.shape, "(same as q: [B, T, H, K])")
    expect_shape("beta", beta, (B, T, H), "([B, T, H])")
    expect_shape("mqk", mqk, (B, T, H, tile), "([B, T, H, tile])")
    expect_shape("inv", inv, (B, T, H, tile), "([B, T, H, tile])")
    expect_rank("do", do, 4, "[B, T, H, V]")
    V = do.shape[3]
    expect_shape("do", do, (B, T, H, V), "([B, T, H, V], B, T, H as q)")
    return B, T, H, K, V, sequence_offsets(B, T, cu_seqlens)


def check_scan_dtypes(q, k, gc, beta, mqk, inv, do) -> None:
    """The float64 scan's arrays hold real floats. Apart from check_scan_inputs because
    kernel.cp checks its GPU parts' shapes with that, and those hold bf16 bits."""
    for name, x in (("q", q), ("k", k), ("gc", gc), ("beta", beta), ("mqk", mqk), ("inv", inv),
                    ("do", do)):
        real_dtype_arg(name, x)


def dstate_scan_reference(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None,
                          dht=None, cu_seqlens=None, tile: int = shapes.TILE_TOKENS, qk_l2norm: bool = True,
                          snapshot_every: int = 1):
    """The backward scan (docs/kernel_a.md, section 3) in float64, in the GPU kernel's layout.

    q, k: raw [B, T, H, K] (l2-normalised here when ``qk_l2norm``); gc: [B, T, H, K]
    (tile-local log2 cumulative gate, as from :func:`prepare_tiles`); beta [B, T, H];
    mqk, inv: [B, T, H, tile]; do: [B, T, H, V]; dht: [N, H, K, V] or None (zeros).
    With ``cu_seqlens`` (N+1 offsets) the batch is packed: B = 1, T = total.

    Returns (snapshots, dh0), float64:
      snapshots [B, n_s, H, K, V] (equal length) or [1, sum_n n_s(n), H, K, V]
                (varlen, sequence n from ``snapshot_offsets(...)[n]``);
                snapshot m = dS entering tile min(e*m + e - 1, n_t - 1) of the
                backward walk (the gradient w.r.t. the state after that tile),
                e = ``snapshot_every``.
      dh0       [N, H, K, V], the gradient w.r.t. the initial state.

    Refused (ValueError, naming the array and its first bad element): NaN or inf
    in any input array, a dtype that is not real floating, a scale that is not a
    finite real > 0; qk_l2norm not a bool (TypeError). gc is only
    checked to be finite. A gc built from a gate g <= 0 is also <= 0 and
    non-increasing within each tile, but gc usually comes from other code (FLA's
    chunk-local cumsum, an fp32 tile builder) where float32 rounding in a parallel
    scan can leave it a few ulps above 0 or rising by an ulp; the math here is
    well defined for that and matches what the kernel computes, so a strict check
    would refuse real inputs and a loose one would need a tolerance nobody has
    measured. The monotonicity check would also cost a second pass with a
    temporary the size of gc (differences that must skip tile and sequence
    starts). The gate's sign is checked where it enters: :func:`prepare_tiles`.
    """
    qk_l2norm = flag_arg(qk_l2norm, "qk_l2norm")
    B, T, H, K, V, cu = check_scan_inputs(q, k, gc, beta, mqk, inv, do, tile, snapshot_every, cu_seqlens)
    check_scan_dtypes(q, k, gc, beta, mqk, inv, do)
    N = cu.shape[0] - 1
    if dht is not None:
        expect_shape("dht", dht, (N, H, K, V), "([N, H, K, V])")
        real_dtype_arg("dht", dht)

    xp = array_module(q)
    f64 = np.float64
    s = scale_arg(scale, K)
    total = B * T

    def flat(name, x, *tail):
        return finite_arg(xp, xp.asarray(x, dtype=f64), name).reshape((total,) + tail)

    qf, kf = flat("q", q, H, K), flat("k", k, H, K)
    if qk_l2norm:
        qf, kf = l2norm(xp, qf), l2norm(xp, kf)
    gcf, betaf, dof = flat("gc", gc, H, K), flat("beta", beta, H), flat("do", do, H, V)
    mqkf, invf = flat("mqk", mqk, H, tile), flat("inv", inv, H, tile)

    start, length, seq_tiles = tiles_of_offsets(cu, tile)
    first_tile = np.concatenate([[0], np.cumsum(seq_tiles)])
    offsets = snapshot_offsets(np.diff(cu), tile, snapshot_every)
    snapshots = xp.zeros((int(offsets[-1]), H, K, V), dtype=f64)

    dS = xp.zeros((N, H, K, V), dtype=f64) if dht is None else \
        finite_arg(xp, xp.asarray(dht, dtype=f64), "dht").copy()
    # Walk all sequences at once, aligned at their ends: step i handles tile
    # n_t - 1 - i of every sequence that still has one.
    for i in range(int(seq_tiles.max())):
        act = np.nonzero(seq_tiles > i)[0]                # active sequences
        tile_in_seq = seq_tiles[act] - 1 - i              # tile index within each sequence
        tid = first_tile[act] + tile_in_seq
        st, ln = start[tid], length[tid]
        # tiles of the active sequences; rows past a partial tile's end are zero
        qt = gather_tiles(xp, qf, st, ln, tile)          # [A, tile, H, K]
        kt = gather_tiles(xp, kf, st, ln, tile)          # [A, tile, H, K]
        gt = gather_tiles(xp, gcf, st, ln, tile)         # [A, tile, H, K]
        bt = gather_tiles(xp, betaf, st, ln, tile)       # [A, tile, H]
        dot = gather_tiles(xp, dof, st, ln, tile)        # [A, tile, H, V]
        mt = gather_tiles(xp, mqkf, st, ln, tile)        # [A, tile(row), H, tile(col)]
        it = gather_tiles(xp, invf, st, ln, tile)        # [A, tile(row), H, tile(col)]
        gT = gcf[xp.asarray(st + ln - 1)]                 # [A, H, K], last real token

        a = xp.asarray(act)
        dSa = dS[a]                                       # [A, H, K, V]
        # snapshot[n] = dS entering tile n, for the last tile of each group of e
        snap = (tile_in_seq % snapshot_every == snapshot_every - 1) | (tile_in_seq == seq_tiles[act] - 1)
        if snap.any():
            rows = offsets[act[snap]] + tile_in_seq[snap] // snapshot_every
            snapshots[xp.asarray(rows)] = dSa[xp.asarray(np.nonzero(snap)[0])]

        qd = s * qt * xp.exp2(gt)                         # R1: rebuilt from raw q, k and gc
        kd = kt * xp.exp2(gt)
        kr = kt * xp.exp2(gT[:, None] - gt)
        dU = xp.einsum("ajhc,ajhv->achv", mt, dot) + xp.einsum("achk,ahkv->achv", kr, dSa)  # G1+G2
        dvcorr = xp.einsum("achj,achv->ajhv", it, dU)                                        # G3
        T1 = xp.einsum("achk,achv->ahkv", qd, dot) \
            - xp.einsum("achk,achv->ahkv", kd, bt[..., None] * dvcorr)                       # G4+G5
        dS[a] = xp.exp2(gT)[..., None] * dSa + T1                                            # combine

    if cu_seqlens is None:
        snapshots = snapshots.reshape(B, -1, H, K, V)
    else:
        snapshots = snapshots[None]
    return snapshots, dS
