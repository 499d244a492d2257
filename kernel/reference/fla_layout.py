"""FLA's forward tensors as Kernel A's inputs, in float64: the blueprint of the on-chip loads.

What and why
------------
flash-linear-attention's chunked KDA forward (``chunk_kda_fwd``, fla-core 0.6.0,
chunk 64) already holds everything Kernel A reads, so nobody should have to
build gc, Mqk and INV at tile 16 before calling it. This module states, in
float64, how FLA's tensors map onto Kernel A's:

* :func:`fla_forward_tensors` emulates what FLA's forward stores (values and
  layout, including the partial last chunk, varlen, and the uninitialised part
  of ``Aqk``).
* :func:`kernel_a_inputs_from_fla` is the blueprint of the load path the GPU
  kernel will get: read the 16 x 16 diagonal blocks of ``Aqk`` / ``Akk`` in
  place, mask their strictly-upper triangle, rebase the gate per tile. It
  returns exactly what :func:`kernel.reference.prepare_tiles` returns.

The three identities (a ``tile`` of 16 tokens inside FLA's ``chunk`` of 64, or any tile
that divides the chunk)::

    Mqk[t, c, j] = Aqk[row c of tile t, tile * (t mod 4) + j]  for j <= c, else 0
    INV[t, c, j] = Akk[row c of tile t, tile * (t mod 4) + j]  (as stored)
    gc[t, c]     = g64[row c of tile t] - (t mod 4 > 0 ? g64[row before tile t] : 0)

where t counts tiles from the sequence's start (FLA's chunks restart at every
sequence start, and so do Kernel A's tiles). Why they hold: the gate
difference gc[c] - gc[j] does not depend on where the cumulative sum starts;
``Akk`` is the inverse of a block-lower-triangular matrix, whose diagonal
blocks are the inverses of the diagonal blocks; FLA stores ``Akk`` without a
diag(beta) factor, like Kernel A's INV.

What FLA stores (read from the 0.6.0 source, ``chunk_kda_fwd``,
``chunk_kda_fwd_intra``, ``chunk_local_cumsum``), ``..`` = ``B, T`` or ``1, total``::

    q, k  [.., H, K]      as given, or l2-normalised (use_qk_l2norm_in_kernel)
    g64   [.., H, K] fp32 cumsum of the natural-log gate within each 64-chunk of
                          each sequence, times 1/ln2 (restarts at chunk and sequence starts)
    Aqk   [.., H, 64]     row c: s sum_d q[c,d] k[j,d] exp2(g64[c,d] - g64[j,d]) for
                          j <= c of the same chunk; columns j > c are never written
                          (torch.empty: inf, NaN, up to 3e38 were seen on the H200)
    Akk   [.., H, 64]     row c of (I + Lkk_64)^-1, Lkk_64[c, j] = beta[c] sum_d k[c,d]
                          k[j,d] exp2(g64[c,d] - g64[j,d]) for j < c; zero above the
                          diagonal (a zero-filled buffer, lower-triangular blocks)

A sequence's last chunk may be partial: it simply has fewer rows (no row past
the sequence's end exists for it), and within a row the columns past the
sequence's end lie above the diagonal. With GVA (more value heads than key
heads) FLA stores g, beta, Aqk, Akk per value head; this statement takes q and k
repeated per value head instead (the same math), and refuses the unrepeated ones.

Every function is array-module agnostic (numpy in, numpy out; CuPy in, CuPy out).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..shapes import CHUNK_TOKENS, TILE_TOKENS
from .checks import (LN2, expect_rank, expect_shape, finite_arg, first_where,
                     flag_arg, gate_arg, gather_tiles, l2norm, real_dtype_arg, scale_arg,
                     sequence_offsets, tiles_of_offsets, array_module)

UPPER_FILLS = ("garbage", "zero")
# What FLA's Aqk holds above the diagonal of a row: whatever torch.empty left there.
# Seen on the H200: inf, NaN and finite values up to 3e38 (bf16's largest is 3.39e38).
GARBAGE = (math.inf, -math.inf, math.nan, 3.0e38, -3.0e38, 1.0e30)

__all__ = ["FlaTensors", "fla_forward_tensors", "fla_diagonal_blocks",
           "kernel_a_inputs_from_fla"]


class FlaTensors(NamedTuple):
    """What FLA's forward stores for its backward (float64 here), shapes as the inputs'.

    q, k [.., H, K]; g64 [.., H, K] (chunk-local cumsum / ln 2); Aqk, Akk [.., H, chunk].
    """
    q: Any
    k: Any
    g64: Any
    Aqk: Any
    Akk: Any


# ----------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------

def _expect_count(name: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer ({what}), got {value!r}")
    return int(value)


def _check_chunk_and_tile(chunk: Any, tile: Any) -> tuple[int, int]:
    tile = _expect_count("tile", tile, f"Kernel A's tile in tokens, {TILE_TOKENS} on the GPU")
    chunk = _expect_count("chunk", chunk, f"FLA's chunk_size, {CHUNK_TOKENS} by default")
    if chunk % tile:
        raise ValueError(f"chunk must be a multiple of tile (Kernel A's tiles must lie inside FLA's "
                         f"chunks), got chunk={chunk}, tile={tile}")
    return chunk, tile


def _is_bf16(dtype) -> bool:
    return getattr(dtype, "name", "") == "bfloat16"


def _non_finite(xp, x):
    """Where x is NaN or inf; uint16 is read as bf16 bits (exponent all ones)."""
    if np.dtype(x.dtype) == np.uint16:
        return (x & 0x7F80) == 0x7F80
    return ~xp.isfinite(x)


def _check_read_blocks(xp, name: str, blocks, block: np.ndarray, tile: int) -> None:
    """The masked diagonal blocks of Aqk or Akk ([B, T, H, tile]) must be finite: what
    Kernel A reads of the matrix (the strictly-upper triangle is masked out before)."""
    bad = _non_finite(xp, blocks)
    if not bool(bad.any()):
        return
    b, t, h, j = first_where(xp, bad)
    col = int(block[b * blocks.shape[1] + t]) * tile + j
    value = blocks[b, t, h, j]
    if np.dtype(blocks.dtype) == np.uint16:
        value = (np.uint32(int(value)) << 16).view(np.float32)
    raise ValueError(f"{name} holds {int(bad.sum())} non-finite value(s) (NaN or inf) where Kernel A "
                     f"reads it (on or below the diagonal of its {tile} x {tile} diagonal blocks), "
                     f"the first {name}{[b, t, h, col]} = {float(value)}")


def _refuse_gva(name: str, x: Any, q_heads: int, layout: str) -> None:
    """FLA's GVA stores g, beta, Aqk, Akk per value head (HV > H key heads): this float64 statement
    takes one head count, and GVA is the same math on q and k repeated per value head."""
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) >= 3 and shape[2] > q_heads and shape[2] % q_heads == 0:
        raise ValueError(
            f"{name} has {shape[2]} heads and q has {q_heads}: that is FLA's GVA (more value heads "
            f"than key heads), which this float64 statement takes as q and k repeated per value head "
            f"(the kernels read them in place). Repeat q and k to {shape[2]} heads first "
            f"(q.repeat_interleave({shape[2] // q_heads}, dim=2); FLA maps value head hv to key head "
            f"hv // {shape[2] // q_heads}) and pass {name} {layout} with H = {shape[2]}")


# ----------------------------------------------------------------------------
# FLA's forward tensors
# ----------------------------------------------------------------------------

def fla_forward_tensors(q, k, g, beta, *, scale: float | None = None, cu_seqlens=None,
                        qk_l2norm: bool = True, chunk: int = CHUNK_TOKENS,
                        upper: str = "garbage") -> FlaTensors:
    """Float64 emulation of the tensors FLA's ``chunk_kda_fwd`` keeps for its backward.

    q, k, g: [B, T, H, K] (or [1, total, H, K] with ``cu_seqlens``, N+1 offsets); g is the
    natural-log per-token gate (<= 0); beta: [B, T, H] (after its sigmoid).
    ``scale`` defaults to K**-0.5 (FLA's default); ``qk_l2norm`` stands for FLA's
    ``use_qk_l2norm_in_kernel`` (q, k are normalised first and stored normalised).

    Returns :class:`FlaTensors` (q, k, g64, Aqk, Akk), float64, with the chunks of
    ``chunk`` tokens restarting at every sequence start (FLA: chunk_size 64, or 32):
      g64 [.., H, K]      cumsum of g within the chunk / ln 2
      Aqk [.., H, chunk]  row c (token c of its chunk): s sum_d q[c,d] k[j,d] exp2(g64[c,d]-g64[j,d])
                          for j <= c; columns j > c hold what ``upper`` says: "garbage" fills
                          them with inf, -inf, NaN, +-3e38 and 1e30 (what FLA's never-written
                          entries can hold), "zero" with zeros
      Akk [.., H, chunk]  row c of (I + Lkk)^-1 over the chunk, Lkk[c, j] = beta[c] sum_d
                          k[c,d] k[j,d] exp2(g64[c,d]-g64[j,d]) for j < c; zero for j > c
    A partial last chunk has rows only for the sequence's tokens.

    Refused, by name: NaN or inf in q, k, g or beta, g > 0 (ValueError); a dtype
    that is not real floating (ValueError); a scale that is not a finite real > 0;
    qk_l2norm not a bool (TypeError).
    """
    chunk = _expect_count("chunk", chunk, f"FLA's chunk_size, {CHUNK_TOKENS} by default")
    qk_l2norm = flag_arg(qk_l2norm, "qk_l2norm")
    if upper not in UPPER_FILLS:
        raise ValueError(f"upper must be one of {UPPER_FILLS}, got {upper!r}")
    expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    _refuse_gva("g", g, H, "[B, T, H, K]")
    expect_shape("g", g, q.shape, "(same as q: [B, T, H, K])")
    _refuse_gva("beta", beta, H, "[B, T, H]")
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

    # FLA's chunks are tiles of `chunk` tokens restarting at each sequence start
    start, length, _ = tiles_of_offsets(cu, chunk)
    qc = gather_tiles(xp, qf, start, length, chunk)                        # [n, C, H, K]
    kc = gather_tiles(xp, kf, start, length, chunk)                        # [n, C, H, K]
    gq = gather_tiles(xp, gf, start, length, chunk)
    bc = gather_tiles(xp, betaf, start, length, chunk)
    g64 = xp.cumsum(gq, axis=1) / LN2                                       # [n, C, H, K]

    rows = np.arange(chunk)
    on_or_below = xp.asarray(rows[:, None] >= rows[None, :])                # [C(c), C(j)]
    below = xp.asarray(rows[:, None] > rows[None, :])
    # exp2(g64[c] - g64[j]) for j <= c, all pairs at once; -inf above the diagonal so
    # that a positive exponent never overflows
    diff = g64[:, :, None] - g64[:, None, :]                                # [n, c, j, H, K]
    decay = xp.exp2(xp.where(on_or_below[None, :, :, None, None], diff, -xp.inf))
    aqk = s * xp.sum(qc[:, :, None] * kc[:, None] * decay, axis=-1)         # [n, c, j, H]
    lkk = bc[:, :, None] * xp.sum(kc[:, :, None] * kc[:, None] * decay, axis=-1)
    lkk = xp.where(below[None, :, :, None], lkk, 0.0)

    # Akk = (I + Lkk)^-1 by a general solve of the whole chunk (not by blocks, and not by
    # forward substitution as prepare_tiles does): the tests compare two independent routes.
    # Rows past a partial chunk's end have k = beta = 0, so they are identity rows.
    a = xp.moveaxis(lkk, 3, 1) + xp.eye(chunk, dtype=f64)                   # [n, H, c, j]
    identity = xp.ascontiguousarray(xp.broadcast_to(xp.eye(chunk, dtype=f64), a.shape))
    akk = xp.linalg.solve(a, identity)
    # FLA stores exact zeros above the diagonal (a pivoting solve leaves rounding there)
    akk = xp.moveaxis(xp.where(on_or_below, akk, 0.0), 1, 2)                # [n, c, H, j]
    aqk = xp.moveaxis(aqk, 3, 2)                                            # [n, c, H, j]

    # every token is exactly one valid (chunk, row), in token order
    valid = rows[None, :] < length[:, None]                                 # [n, C], host
    valid_d = xp.asarray(valid)
    row_of_token = np.broadcast_to(rows, valid.shape)[valid]                # [total]
    above = xp.asarray(rows[None, :] > row_of_token[:, None])[:, None, :]   # [total, 1, C]
    aqk_t = aqk[valid_d]                                                    # [total, H, C]
    if upper == "garbage":
        fill = xp.asarray(np.asarray(GARBAGE, dtype=f64))
        pattern = xp.arange(total * H * chunk).reshape(total, H, chunk) % len(GARBAGE)
        aqk_t = xp.where(above, fill[pattern], aqk_t)
    else:
        aqk_t = xp.where(above, 0.0, aqk_t)

    return FlaTensors(q=qf.reshape(B, T, H, K), k=kf.reshape(B, T, H, K),
                      g64=g64[valid_d].reshape(B, T, H, K),
                      Aqk=aqk_t.reshape(B, T, H, chunk),
                      Akk=akk[valid_d].reshape(B, T, H, chunk))


# ----------------------------------------------------------------------------
# the blueprint of the on-chip path
# ----------------------------------------------------------------------------

def _tile_rows(cu: np.ndarray, chunk: int, tile: int):
    """Per token (host int64 [total]): its diagonal block in FLA's chunk row, its row in
    Kernel A's tile, and the token just before its tile."""
    lengths = np.diff(cu)
    token = np.arange(int(cu[-1]), dtype=np.int64)
    pos = token - np.repeat(cu[:-1], lengths)      # position in its sequence
    in_chunk = pos % chunk                          # FLA's chunks restart at each sequence start
    return in_chunk // tile, in_chunk % tile, token - in_chunk % tile - 1


def _check_fla_matrix(name: str, x: Any, shape: tuple | None, chunk: int) -> tuple:
    expect_rank(name, x, 4, "[B, T, H, chunk]")
    if x.shape[3] != chunk:
        raise ValueError(f"{name} must have chunk = {chunk} columns a row ([B, T, H, chunk], FLA's "
                         f"chunk_size), got shape {tuple(x.shape)}: pass chunk={x.shape[3]} if FLA "
                         f"ran with chunk_size={x.shape[3]}")
    if shape is not None:
        expect_shape(name, x, shape, "(same as Aqk: [B, T, H, chunk])")
    real_dtype_arg(name, x, bits_ok=True)
    return tuple(x.shape)


def fla_diagonal_blocks(A, *, cu_seqlens=None, chunk: int = CHUNK_TOKENS, tile: int = TILE_TOKENS):
    """The tile x tile diagonal blocks of an FLA chunk matrix (Aqk or Akk), as stored.

    A: [B, T, H, chunk] (or [1, total, H, chunk] with ``cu_seqlens``). Returns
    [B, T, H, tile]: row c of Kernel A's tile t holds A's row at columns
    tile * (t mod chunk/tile) .. + tile - 1, with t counted from the sequence's start.
    Nothing is masked (Aqk's strictly-upper triangle comes back as FLA left it).

    Read in place: A is viewed as [tokens, H, chunk/tile, tile] (a reshape, no copy for a
    contiguous A) and each token's block is picked by indexing, so only the
    [tokens, H, tile] result is ever written, never a copy of A.
    """
    chunk, tile = _check_chunk_and_tile(chunk, tile)
    B, T, H, _ = _check_fla_matrix("A", A, None, chunk)
    cu = sequence_offsets(B, T, cu_seqlens)
    return _blocks(A, _tile_rows(cu, chunk, tile)[0], chunk, tile)


def _blocks(A, block: np.ndarray, chunk: int, tile: int):
    xp = array_module(A)
    B, T, H, _ = A.shape
    total = B * T
    by_block = A.reshape(total, H, chunk // tile, tile)             # a view where A is contiguous
    picked = by_block[xp.asarray(np.arange(total))[:, None], xp.asarray(np.arange(H))[None, :],
                      xp.asarray(block)[:, None]]                   # [total, H, tile]
    return picked.reshape(B, T, H, tile)


def kernel_a_inputs_from_fla(Aqk, Akk, g64, *, cu_seqlens=None, chunk: int = CHUNK_TOKENS,
                             tile: int = TILE_TOKENS):
    """Kernel A's (gc, mqk, inv) read from FLA's forward tensors, as the GPU kernel will.

    Aqk, Akk: [B, T, H, chunk] (FLA's, chunk_size = ``chunk``; any dtype that holds
    floats, or uint16 bf16 bits as in CuPy); g64: [B, T, H, K] (FLA's chunk-local
    cumsum of the gate / ln 2); varlen: B = 1 and ``cu_seqlens`` (N+1 offsets).
    ``tile`` is Kernel A's tile (16 on the GPU) and must divide ``chunk``.

    Returns (gc, mqk, inv) in exactly the layout :func:`prepare_tiles` returns
    ([B, T, H, K], [B, T, H, tile], [B, T, H, tile]), in the inputs' dtypes:
      mqk = Aqk's diagonal block, strictly-upper triangle (j > c) replaced by 0;
      inv = Akk's diagonal block, the same mask (FLA stores zeros there already: the mask
            costs nothing and keeps a differently initialised Akk from reaching an MMA);
      gc  = g64 minus g64 at the token before the tile (nothing for a chunk's first tile),
            in g64's dtype: with fp32 g64 this is the fp32 subtraction the kernel will do.
    The mask is a select, never a multiplication (0 * inf is NaN).

    Refused, by name (ValueError): NaN or inf where the blocks are read (on or below
    their diagonal; above it FLA's never-written garbage is expected and masked), NaN,
    inf or a positive value in g64 (a cumsum of gates <= 0 rounds to <= 0 in any
    order and precision, so a positive g64 is not FLA's), dtypes that are not real
    floating (Aqk and Akk may also be uint16 bf16 bits).
    """
    chunk, tile = _check_chunk_and_tile(chunk, tile)
    shape = _check_fla_matrix("Aqk", Aqk, None, chunk)
    _check_fla_matrix("Akk", Akk, shape, chunk)
    B, T, H, _ = shape
    expect_rank("g64", g64, 4, "[B, T, H, K]")
    if tuple(g64.shape[:3]) != (B, T, H):
        raise ValueError(f"g64 must have shape (B, T, H, K) = ({B}, {T}, {H}, K) like Aqk, "
                         f"got {tuple(g64.shape)}")
    real_dtype_arg("g64", g64)
    if _is_bf16(np.dtype(g64.dtype)):
        raise ValueError("g64 must be float32 or float64 (FLA keeps it in fp32), got bfloat16")
    cu = sequence_offsets(B, T, cu_seqlens)

    xp = array_module(Aqk)
    gate_arg(xp, g64, "g64", "FLA's chunk-local cumsum of a decay gate / ln 2: exp2(g64) in (0, 1]")
    block, row, before = _tile_rows(cu, chunk, tile)
    lower = xp.asarray(np.arange(tile)[None, :] <= row[:, None]).reshape(B, T, 1, tile)
    mqk_blocks, inv_blocks = _blocks(Aqk, block, chunk, tile), _blocks(Akk, block, chunk, tile)
    mqk = xp.where(lower, mqk_blocks, xp.zeros((), dtype=mqk_blocks.dtype))
    inv = xp.where(lower, inv_blocks, xp.zeros((), dtype=inv_blocks.dtype))
    _check_read_blocks(xp, "Aqk", mqk, block, tile)
    _check_read_blocks(xp, "Akk", inv, block, tile)

    K = g64.shape[3]
    flat = g64.reshape(B * T, H, K)
    has_base = xp.asarray(block > 0)[:, None, None]                 # not the chunk's first tile
    base = xp.where(has_base, flat[xp.asarray(np.maximum(before, 0))], xp.zeros((), dtype=flat.dtype))
    gc = (flat - base).reshape(B, T, H, K)
    return gc, mqk, inv
