"""Kernel A's numerical contract in float64: tile quantities and the dstate scan.

What and why
------------
Kernel A walks each sequence backwards one tile (``chunk`` = 16 tokens on the
GPU) at a time, carrying the state gradient dS [K, V], and stores snapshots of
dS. This module is the float64 statement of that contract
(the contract, docs/kernel_a.md, sections 1-3), used as the oracle for the GPU kernel:

* :func:`prepare_tiles` builds what the forward pass hands to Kernel A:
  the tile-local log2 cumulative gate ``gc``, the masked attention ``Mqk`` and
  ``INV = (I + Lkk)^-1``, one tile row stored at each token.
* :func:`dstate_scan_reference` is section 3, token layout and snapshot layout
  exactly as the GPU kernel must produce them.
* :func:`snapshot_offsets` packs per-sequence snapshots (FLA's chunk_offsets).
* :func:`random_inputs` / :func:`ragged_lengths` are the seeded input
  generators shared by tests and benchmarks.

Every function is array-module agnostic: numpy arrays in, numpy out; CuPy
arrays in, CuPy out. CuPy is imported lazily and never required.

Every argument is checked at the boundary, by name: shapes, integers that are
integers (a length of 2.7 is refused, not truncated), flags that are bools, and
the values themselves -- the reference refuses NaN and inf in any input array
and a positive gate g (the gate is a natural-log decay: g <= 0). Each value check
is one elementwise pass and one reduction per array (on CuPy arrays, one
device-to-host scalar each); where it fails, a second look names the first bad
element. TypeError for a wrong type, ValueError for a wrong value.

Layout reminders (``..`` = ``B, T`` or ``1, total`` with ``cu_seqlens``)::

    q, k, g, gc : [.., H, K]      beta : [.., H]      do : [.., H, V]
    mqk, inv    : [.., H, C]      row c of a tile lives at the tile's token c
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

import math
from typing import Any, Sequence

import numpy as np

LN2 = math.log(2.0)
L2NORM_EPS = 1e-6  # the same eps as flash-linear-attention's l2norm
FLA_CHUNK = 64     # FLA's dh is stored per 64-token chunk; tiles must align with it

__all__ = [
    "array_module",
    "prepare_tiles",
    "dstate_scan_reference",
    "snapshot_offsets",
    "tile_table",
    "random_inputs",
    "ragged_lengths",
]


# ----------------------------------------------------------------------------
# array module and validation helpers
# ----------------------------------------------------------------------------

def array_module(x: Any):
    """cupy for CuPy arrays, else numpy; never needs CuPy to be installed."""
    try:
        import cupy
    except ImportError:
        return np
    return cupy.get_array_module(x)


def _to_host(x: Any) -> np.ndarray:
    """A numpy copy of a numpy/CuPy array or a sequence."""
    if hasattr(x, "__cuda_array_interface__"):
        import cupy
        return cupy.asnumpy(x)
    return np.asarray(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _int_arg(x: Any, name: str, minimum: int | None = None) -> int:
    """An int (numpy integers too; bool and float refused, never truncated), >= minimum."""
    if not _is_int(x):
        raise TypeError(f"{name} must be an int, got {x!r} ({type(x).__name__})")
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {x}")
    return int(x)


def _flag_arg(x: Any, name: str) -> bool:
    """True or False (or a numpy bool): "no" or 0.0 is not read for its truthiness."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {x!r} ({type(x).__name__})")
    return bool(x)


def _real_arg(x: Any, name: str, minimum: float | None = None) -> float:
    """A finite real number (int or float, numpy's too; not bool), >= minimum."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {x!r} ({type(x).__name__})")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _scale_arg(scale: Any, K: int) -> float:
    return K ** -0.5 if scale is None else _real_arg(scale, "scale")


def _lengths_arg(lengths: Any, name: str = "lengths", allow_empty: bool = False) -> np.ndarray:
    """Host int64 [N] of sequence lengths, every one an integer >= 1."""
    why = f"{name} must hold ints (a length is a token count: never rounded)"
    if isinstance(lengths, (list, tuple)):
        # by element, before numpy would turn [True, 3] into [1, 3] or [4, 3.0] into floats
        for i, v in enumerate(lengths):
            if not _is_int(v) and not isinstance(v, (list, tuple)):
                raise TypeError(f"{why}, got {name}[{i}] = {v!r} ({type(v).__name__})")
    n = _to_host(lengths)
    if n.ndim > 1:
        raise ValueError(f"{name} must be a flat list of ints, got shape {n.shape}")
    n = n.reshape(-1)
    if n.size == 0 and not allow_empty:
        raise ValueError(f"{name} must be a non-empty list of ints >= 1, got []")
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"{why}, got an array of {n.dtype}")
    if n.size and n.min() < 1:
        bad = int(np.argmax(n < 1))
        raise ValueError(f"{name} must all be >= 1, got {name}[{bad}] = {int(n[bad])}")
    return n.astype(np.int64)


def _first_where(xp, mask) -> tuple[int, ...]:
    """Index of the first True of a boolean array (only on the error path)."""
    flat = int(xp.argmax(mask.reshape(-1).astype(np.int8)))
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def _finite_arg(xp, x, name: str):
    """x (float64, as the caller passed it) must hold no NaN or inf: one reduction."""
    if bool(xp.isfinite(x).all()):
        return x
    bad = ~xp.isfinite(x)
    first = _first_where(xp, bad)
    raise ValueError(f"{name} holds {int(bad.sum())} non-finite value(s) (NaN or inf), the first "
                     f"{name}{list(first)} = {float(x[first])}: the float64 reference refuses them")


def _gate_arg(xp, g, name: str = "g"):
    """g (float64) must be a natural-log decay: finite and <= 0, in one reduction."""
    if bool(xp.all((g <= 0) & (g > -xp.inf))):   # NaN fails both comparisons
        return g
    _finite_arg(xp, g, name)
    first = _first_where(xp, g > 0)
    raise ValueError(f"{name} must be <= 0 (a natural-log decay gate: exp(g) in (0, 1]), got "
                     f"{int((g > 0).sum())} positive value(s), the first {name}{list(first)} = "
                     f"{float(g[first])}")


def _check_tiling(chunk: Any, snapshot_every: Any = 1) -> None:
    # chunk must divide 64 so that snapshot_every = 64 // chunk lands exactly on
    # FLA's 64-token chunk boundaries (its dh); any snapshot_every >= 1 is allowed.
    if not _is_int(chunk):
        raise TypeError(f"chunk must be an int, a positive divisor of {FLA_CHUNK}, got {chunk!r}")
    if chunk < 1 or FLA_CHUNK % int(chunk) != 0:
        raise ValueError(f"chunk must be a positive divisor of {FLA_CHUNK} "
                         f"(1, 2, 4, 8, 16, 32, 64), got {chunk!r}")
    if not _is_int(snapshot_every):
        raise TypeError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")
    if snapshot_every < 1:
        raise ValueError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")


def _expect_shape(name: str, x: Any, expected: Sequence[int], what: str) -> None:
    shape = tuple(getattr(x, "shape", ()))
    if shape != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} {what}, got {shape}")


def _expect_rank(name: str, x: Any, rank: int, layout: str) -> None:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ValueError(f"{name} must be an array {layout}, got {type(x).__name__}")
    if len(shape) != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(shape)}")


def _check_cu_seqlens(cu_seqlens: Any, batch: int, total: int) -> np.ndarray:
    """Validated host int64 offsets [N+1] (0 = cu[0] < cu[1] < ... < cu[N] = total)."""
    if batch != 1:
        raise ValueError(f"cu_seqlens needs a packed batch of size 1 ([1, total, H, ...]), "
                         f"got batch {batch}")
    cu = _to_host(cu_seqlens)
    if cu.ndim != 1:
        raise ValueError(f"cu_seqlens must be 1-D (N+1 offsets), got shape {cu.shape}")
    if cu.dtype.kind not in "iu":
        raise ValueError(f"cu_seqlens must have an integer dtype, got {cu.dtype}")
    if cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold at least 2 offsets (one sequence), "
                         f"got {cu.shape[0]}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    steps = np.diff(cu)
    if np.any(steps < 1):
        bad = int(np.argmax(steps < 1))
        raise ValueError(f"cu_seqlens must be strictly increasing (every sequence length >= 1), "
                         f"got cu_seqlens[{bad}]={int(cu[bad])} >= "
                         f"cu_seqlens[{bad + 1}]={int(cu[bad + 1])}")
    if cu[-1] != total:
        raise ValueError(f"cu_seqlens must end at the total length {total}, got {int(cu[-1])}")
    return cu


def _sequence_offsets(batch: int, seqlen: int, cu_seqlens: Any) -> np.ndarray:
    """Offsets into the flattened token axis [batch * seqlen]; equal length is N = batch."""
    if cu_seqlens is None:
        if seqlen < 1:
            raise ValueError(f"sequence length T must be >= 1, got {seqlen}")
        return np.arange(batch + 1, dtype=np.int64) * seqlen
    return _check_cu_seqlens(cu_seqlens, batch, seqlen)


def _tile_table(cu: np.ndarray, chunk: int):
    """Every tile of every sequence, in token order.

    Returns (start [n_tiles], length [n_tiles], seq_tiles [N]): tile i covers
    tokens start[i] .. start[i] + length[i] - 1 of the flattened token axis.
    """
    lengths = np.diff(cu)
    seq_tiles = -(-lengths // chunk)
    starts, lens = [], []
    for bos, n, nt in zip(cu[:-1], lengths, seq_tiles):
        first = bos + chunk * np.arange(nt, dtype=np.int64)
        starts.append(first)
        lens.append(np.minimum(chunk, bos + n - first))
    return np.concatenate(starts), np.concatenate(lens), seq_tiles


def _gather_tiles(xp, x, start: np.ndarray, length: np.ndarray, chunk: int):
    """x [total, ...] -> tiles [n, C, ...], rows past a tile's length zero."""
    c = np.arange(chunk)
    idx = np.minimum(start[:, None] + c, x.shape[0] - 1)  # clipped: masked anyway
    mask = c < length[:, None]
    tiles = x[xp.asarray(idx)]
    m = xp.asarray(mask).reshape(mask.shape + (1,) * (tiles.ndim - 2))
    return tiles * m


def _l2norm(xp, x):
    return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


# ----------------------------------------------------------------------------
# tile quantities (docs/kernel_a.md, section 2)
# ----------------------------------------------------------------------------

def prepare_tiles(q, k, g, beta, *, scale: float | None = None, qk_l2norm: bool = True,
                  chunk: int = 16, cu_seqlens=None):
    """Tile quantities the forward pass hands to Kernel A, in float64.

    q, k, g: [B, T, H, K] (or [1, total, H, K] with ``cu_seqlens``, N+1 offsets);
    g is the natural-log gate (<= 0); beta: [B, T, H].

    Returns (gc, mqk, inv):
      gc  [B, T, H, K]      tile-local cumulative gate / ln 2 (restarts every tile
                            of every sequence; a sequence's last tile may be partial)
      mqk [B, T, H, chunk]  Mqk[c, j] = s sum_d q[c,d] k[j,d] exp2(gc[c,d]-gc[j,d]), j <= c
      inv [B, T, H, chunk]  (I + Lkk)^-1, Lkk[c, j] = beta[c] sum_d k[c,d] k[j,d]
                            exp2(gc[c,d]-gc[j,d]), j < c
    with row c of a tile stored at the tile's token c; columns past a partial
    tile's end are 0. q, k are l2-normalised first when ``qk_l2norm``;
    s = scale or K**-0.5.

    Refused (ValueError, naming the array and its first bad element): NaN or inf
    in q, k, g or beta, and g > 0; a non-finite scale; qk_l2norm not a bool (TypeError).
    """
    _check_tiling(chunk)
    qk_l2norm = _flag_arg(qk_l2norm, "qk_l2norm")
    _expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    _expect_shape("g", g, q.shape, "(same as q: [B, T, H, K])")
    _expect_shape("beta", beta, (B, T, H), "([B, T, H])")
    cu = _sequence_offsets(B, T, cu_seqlens)

    xp = array_module(q)
    f64 = np.float64
    s = _scale_arg(scale, K)
    total = B * T
    qf = _finite_arg(xp, xp.asarray(q, dtype=f64), "q").reshape(total, H, K)
    kf = _finite_arg(xp, xp.asarray(k, dtype=f64), "k").reshape(total, H, K)
    gf = _gate_arg(xp, xp.asarray(g, dtype=f64)).reshape(total, H, K)
    betaf = _finite_arg(xp, xp.asarray(beta, dtype=f64), "beta").reshape(total, H)
    if qk_l2norm:
        qf, kf = _l2norm(xp, qf), _l2norm(xp, kf)

    start, length, _ = _tile_table(cu, chunk)
    C = chunk
    # tiles: [n_tiles, C, H, K]; padded rows are zero (q, k, g = 0 past the end)
    qt = _gather_tiles(xp, qf, start, length, C)
    kt = _gather_tiles(xp, kf, start, length, C)
    gt = _gather_tiles(xp, gf, start, length, C)
    bt = _gather_tiles(xp, betaf, start, length, C)
    gct = xp.cumsum(gt, axis=1) / LN2                                 # [n, C, H, K]

    rows = np.arange(C)
    mqk_t = xp.zeros(qt.shape[:3] + (C,), dtype=f64)                  # [n, C(row), H, C(col)]
    lkk_t = xp.zeros_like(mqk_t)
    for j in range(C):
        # exp2(gc[c] - gc[j]) for every row c; rows above the diagonal are masked
        # to -inf before exp2 so that a positive exponent never overflows.
        diff = gct - gct[:, j:j + 1]                                   # [n, C, H, K]
        on_or_below = xp.asarray(rows >= j)[None, :, None, None]
        below = xp.asarray(rows > j)[None, :, None, None]
        decay_le = xp.exp2(xp.where(on_or_below, diff, -xp.inf))
        decay_lt = xp.exp2(xp.where(below, diff, -xp.inf))
        kj = kt[:, j:j + 1]                                            # [n, 1, H, K]
        mqk_t[..., j] = s * xp.sum(qt * kj * decay_le, axis=-1)
        lkk_t[..., j] = bt * xp.sum(kt * kj * decay_lt, axis=-1)

    # INV = (I + Lkk)^-1 by forward substitution (unit lower triangular):
    # INV[c] = e_c - sum_{j<c} Lkk[c, j] INV[j]
    lkk = xp.moveaxis(lkk_t, 2, 1)                                     # [n, H, C, C]
    eye = xp.eye(C, dtype=f64)
    inv = xp.zeros_like(lkk)
    inv[..., 0, :] = eye[0]
    for c in range(1, C):
        inv[..., c, :] = eye[c] - xp.einsum("nhj,nhjm->nhm", lkk[..., c, :c], inv[..., :c, :])
    inv_t = xp.moveaxis(inv, 1, 2)                                     # [n, C(row), H, C(col)]

    # every token is exactly one valid (tile, row), in token order
    valid = xp.asarray(rows[None, :] < length[:, None])
    gc_out = gct[valid].reshape(B, T, H, K)
    return gc_out, mqk_t[valid].reshape(B, T, H, C), inv_t[valid].reshape(B, T, H, C)


# ----------------------------------------------------------------------------
# snapshot layout
# ----------------------------------------------------------------------------

def snapshot_offsets(lengths, chunk: int, snapshot_every: int) -> np.ndarray:
    """Start of each sequence's snapshots in the packed snapshot axis, int64 [N+1].

    A sequence of n tokens has n_t = ceil(n / chunk) tiles and
    n_s = ceil(n_t / snapshot_every) snapshots (FLA's chunk_offsets for
    chunk * snapshot_every = 64).
    """
    _check_tiling(chunk, snapshot_every)
    n = _lengths_arg(lengths, allow_empty=True)
    n_tiles = -(-n // chunk)
    n_snap = -(-n_tiles // snapshot_every)
    return np.concatenate([[0], np.cumsum(n_snap)]).astype(np.int64)


def tile_table(lengths, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Every tile of sequences of these lengths, packed one after another, in token order:
    (start, length) int64 [n_tiles]; tile i covers tokens start[i] .. start[i] + length[i] - 1."""
    _check_tiling(chunk)
    n = _to_host(lengths).astype(np.int64).reshape(-1)
    if n.size == 0 or n.min() < 1:
        raise ValueError(f"lengths must be a non-empty list of ints >= 1, got {n.tolist()}")
    start, length, _ = _tile_table(np.concatenate([[0], np.cumsum(n)]), chunk)
    return start, length


# ----------------------------------------------------------------------------
# the backward scan (docs/kernel_a.md, section 3)
# ----------------------------------------------------------------------------

def dstate_scan_reference(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None,
                          dht=None, cu_seqlens=None, chunk: int = 16, qk_l2norm: bool = True,
                          snapshot_every: int = 1):
    """The backward scan (docs/kernel_a.md, section 3) in float64, in the GPU kernel's layout.

    q, k: raw [B, T, H, K] (l2-normalised here when ``qk_l2norm``); gc: [B, T, H, K]
    (tile-local log2 cumulative gate, as from :func:`prepare_tiles`); beta [B, T, H];
    mqk, inv: [B, T, H, chunk]; do: [B, T, H, V]; dht: [N, H, K, V] or None (zeros).
    With ``cu_seqlens`` (N+1 offsets) the batch is packed: B = 1, T = total.

    Returns (snapshots, dh0), float64:
      snapshots [B, n_s, H, K, V] (equal length) or [1, sum_n n_s(n), H, K, V]
                (varlen, sequence n from ``snapshot_offsets(...)[n]``);
                snapshot m = dS entering tile min(e*m + e - 1, n_t - 1) of the
                backward walk (the gradient w.r.t. the state after that tile),
                e = ``snapshot_every``.
      dh0       [N, H, K, V], the gradient w.r.t. the initial state.

    Refused (ValueError, naming the array and its first bad element): NaN or inf
    in any input array or in scale; qk_l2norm not a bool (TypeError). gc is only
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
    _check_tiling(chunk, snapshot_every)
    qk_l2norm = _flag_arg(qk_l2norm, "qk_l2norm")
    _expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    _expect_shape("gc", gc, q.shape, "(same as q: [B, T, H, K])")
    _expect_shape("beta", beta, (B, T, H), "([B, T, H])")
    _expect_shape("mqk", mqk, (B, T, H, chunk), "([B, T, H, chunk])")
    _expect_shape("inv", inv, (B, T, H, chunk), "([B, T, H, chunk])")
    _expect_rank("do", do, 4, "[B, T, H, V]")
    V = do.shape[3]
    _expect_shape("do", do, (B, T, H, V), "([B, T, H, V], B, T, H as q)")
    cu = _sequence_offsets(B, T, cu_seqlens)
    N = cu.shape[0] - 1
    if dht is not None:
        _expect_shape("dht", dht, (N, H, K, V), "([N, H, K, V])")

    xp = array_module(q)
    f64 = np.float64
    s = _scale_arg(scale, K)
    total = B * T
    C = chunk

    def flat(name, x, *tail):
        return _finite_arg(xp, xp.asarray(x, dtype=f64), name).reshape((total,) + tail)

    qf, kf = flat("q", q, H, K), flat("k", k, H, K)
    if qk_l2norm:
        qf, kf = _l2norm(xp, qf), _l2norm(xp, kf)
    gcf, betaf, dof = flat("gc", gc, H, K), flat("beta", beta, H), flat("do", do, H, V)
    mqkf, invf = flat("mqk", mqk, H, C), flat("inv", inv, H, C)

    start, length, seq_tiles = _tile_table(cu, C)
    first_tile = np.concatenate([[0], np.cumsum(seq_tiles)])
    offsets = snapshot_offsets(np.diff(cu), C, snapshot_every)
    snapshots = xp.zeros((int(offsets[-1]), H, K, V), dtype=f64)

    dS = xp.zeros((N, H, K, V), dtype=f64) if dht is None else \
        _finite_arg(xp, xp.asarray(dht, dtype=f64), "dht").copy()
    # Walk all sequences at once, aligned at their ends: step i handles tile
    # n_t - 1 - i of every sequence that still has one.
    for i in range(int(seq_tiles.max())):
        act = np.nonzero(seq_tiles > i)[0]                # active sequences
        tile_in_seq = seq_tiles[act] - 1 - i              # tile index within each sequence
        tid = first_tile[act] + tile_in_seq
        st, ln = start[tid], length[tid]
        # tiles of the active sequences; rows past a partial tile's end are zero
        qt = _gather_tiles(xp, qf, st, ln, C)             # [A, C, H, K]
        kt = _gather_tiles(xp, kf, st, ln, C)             # [A, C, H, K]
        gt = _gather_tiles(xp, gcf, st, ln, C)            # [A, C, H, K]
        bt = _gather_tiles(xp, betaf, st, ln, C)          # [A, C, H]
        dot = _gather_tiles(xp, dof, st, ln, C)           # [A, C, H, V]
        mt = _gather_tiles(xp, mqkf, st, ln, C)           # [A, C(row), H, C(col)]
        it = _gather_tiles(xp, invf, st, ln, C)           # [A, C(row), H, C(col)]
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


# ----------------------------------------------------------------------------
# seeded inputs for tests and benchmarks
# ----------------------------------------------------------------------------

GATE_LOWER_BOUND = -5.0   # Kimi Linear clamps the per-token log gate at -5
GATE_LOGIT_MEAN = 3.0     # logsigmoid(N(3, 1)): ~ -0.05 a token, a 16-token tile keeps ~ 0.45
DO_SCALE = 0.1
DHT_SCALE = 0.1


def random_inputs(B: int, T: int, H: int, K: int = 128, V: int = 128, *,
                  lengths: Sequence[int] | None = None, seed: int = 0,
                  gate_strength: float = 1.0, with_dht: bool = True, xp=np) -> dict:
    """Seeded, realistic float32 inputs of the KDA backward.

    Without ``lengths``: [B, T, H, ...] and cu_seqlens None. With ``lengths``
    (a list of ints >= 1): a packed batch [1, sum(lengths), H, ...] and
    ``cu_seqlens`` (int64 numpy, N+1); B and T are then ignored.

    q, k ~ N(0, 1) (unit vectors after l2norm); v ~ N(0, 1); do ~ 0.1 N(0, 1);
    g = clip(gate_strength * logsigmoid(N(3, 1)), -5, 0) (natural-log gate;
    gate_strength 0 = no decay, 1 = a 16-token tile decays to ~0.45 typically);
    beta = sigmoid(N(0, 1)); dht ~ 0.1 N(0, 1) [N, H, K, V] or None.

    Returns dict with keys q, k, v, g, beta, do, dht, cu_seqlens; arrays are
    float32 on ``xp`` (numpy or cupy), cu_seqlens stays on the host.

    Refused: B, T (without lengths), H, K, V that are not ints >= 1, lengths
    that are not ints >= 1 (2.7 is refused, not truncated), a negative or
    non-int seed, a gate_strength that is not a finite real >= 0 (NaN would
    make g NaN, a negative one would turn decay into growth), with_dht not a
    bool, xp without ``asarray``. TypeError for a type, ValueError for a value.
    """
    if lengths is not None:
        lens = _lengths_arg(lengths)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        for name, x in (("B", B), ("T", T)):
            if x is not None and not _is_int(x):
                raise TypeError(f"{name} must be an int or None (ignored with lengths), got {x!r}")
        B, T, N = 1, int(cu[-1]), int(lens.size)
    else:
        B, T = _int_arg(B, "B", 1), _int_arg(T, "T", 1)
        cu, N = None, B
    H, K, V = _int_arg(H, "H", 1), _int_arg(K, "K", 1), _int_arg(V, "V", 1)
    seed = _int_arg(seed, "seed", 0)
    gate_strength = _real_arg(gate_strength, "gate_strength", 0.0)
    with_dht = _flag_arg(with_dht, "with_dht")
    if not callable(getattr(xp, "asarray", None)):
        raise TypeError(f"xp must be an array module with asarray (numpy or cupy), got {xp!r}")

    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    logit = rng.normal(GATE_LOGIT_MEAN, 1.0, (B, T, H, K))
    logsigmoid = -np.logaddexp(0.0, -logit)
    g = np.clip(gate_strength * logsigmoid, GATE_LOWER_BOUND, 0.0)
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))
    do = DO_SCALE * rng.standard_normal((B, T, H, V))
    dht = DHT_SCALE * rng.standard_normal((N, H, K, V)) if with_dht else None

    def dev(x):
        return None if x is None else xp.asarray(x.astype(f32))

    return {"q": dev(q), "k": dev(k), "v": dev(v), "g": dev(g), "beta": dev(beta),
            "do": dev(do), "dht": dev(dht), "cu_seqlens": cu}


def ragged_lengths(n: int, total: int, seed: int = 0) -> list[int]:
    """n sequence lengths summing to ``total``, in a seeded random order.

    Always contains the edge cases 1, 15, 16, 17; the other n - 4 lengths are
    random (>= 1) and nudged off multiples of 16 where possible, e.g.
    ragged_lengths(64, 262144) for benchmarks. n, total and seed (>= 0) must be
    ints (TypeError otherwise; 64.0 is not a count).
    """
    n, total, seed = _int_arg(n, "n"), _int_arg(total, "total"), _int_arg(seed, "seed", 0)
    edge = [1, 15, 16, 17]
    rest_n, rest_total = n - len(edge), total - sum(edge)
    if rest_n < 0 or rest_total < rest_n or (rest_n == 0 and rest_total != 0):
        raise ValueError(f"ragged_lengths needs n >= 4 and total >= {sum(edge)} + (n - 4) "
                         f"(exactly {sum(edge)} when n == 4), got n={n}, total={total}")
    rng = np.random.default_rng(seed)
    rest = np.ones(rest_n, dtype=np.int64)
    if rest_n:
        weights = rng.uniform(0.2, 1.0, rest_n)
        extra = np.floor(weights / weights.sum() * (rest_total - rest_n)).astype(np.int64)
        extra[: rest_total - rest_n - int(extra.sum())] += 1       # spread the rounding
        rest += extra
        # move one token between neighbours to leave multiples of 16
        for i in range(rest_n - 1):
            if rest[i] % 16 == 0 and rest[i + 1] > 1:
                rest[i] += 1
                rest[i + 1] -= 1
    out = np.concatenate([np.asarray(edge, dtype=np.int64), rest])
    rng.shuffle(out)
    assert int(out.sum()) == total and out.min() >= 1
    return [int(x) for x in out]
