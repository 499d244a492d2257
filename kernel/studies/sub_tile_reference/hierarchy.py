"""A tile's gated products in fp32 with a hierarchy of references, against float64 pairwise sums.

One tile: L rows (tokens), K channels, gc [L, K] the tile-local cumulative gate in log2 (each
channel non-increasing down the rows). Every gated product of Kernel B pairs row i with a row
j <= i through 2^(gc_i - gc_j) <= 1, per channel c (docs/kda_backward.md, section 2):

    pair   P[i, j] = sum_c a_ic b_jc 2^(gc_ic - gc_jc)        j < i     (Mqk with a = s q, b = k; Akk)
    left   R[i, c] = sum_{j <= i} dM_ij b_jc 2^(gc_ic - gc_jc)         (dQe's 2^(gc-gT) dMqk Kr, G14; G16)
    right  T[j, c] = sum_{i >= j} dM_ij a_ic 2^(gc_ic - gc_jc)         (2^(gT-gc) dMqk^T Qe, G15; G17)

The kernels factorise each with one reference row r = L-1 (the tile's end, gT): a_i 2^(gc_i - gc_r)
>= 1 and b_j 2^(gc_r - gc_j) <= 1, and the first overflows fp32 once the tile decays a channel
past 2^-128 (the second loses its bits below 2^-126). A **plan** is a list of :class:`Block`, each
factorised about its own reference row; the entries (i, j), j <= i, of the tile's lower triangle
fall in exactly one block. :func:`today` is the kernels' plan; :func:`plan` splits the tile into
halves at b while the block's span (what its factors see, max_c gc[lo] - gc[hi-1]) passes
:data:`SPAN_LIMIT`: the block (rows >= b, columns < b) takes reference b-1, so both its factors
are <= 1 (what underflows there is truly below fp32), and each diagonal half recurses, down to
single rows, whose only entry (i, i) holds no gate.

:func:`pair`, :func:`left` and :func:`right` run a plan in fp32 (the kernels' fp32 R1 arithmetic
and an fp32 GEMM; the MMAs' bf16 operands have fp32's exponent range, so what overflows here
overflows there); :func:`pair_exact`, :func:`left_exact`, :func:`right_exact` are the float64
pairwise sums of the same fp32 inputs, the oracle. :func:`mma_counts` prices a plan in m16n8k16
MMAs.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

__all__ = ["Block", "SPAN_LIMIT", "U32", "today", "plan", "depth", "pair", "left", "right", "pair_exact",
           "left_exact", "right_exact", "abs_pair", "abs_left", "abs_right", "error_bound", "rel_err",
           "mma_counts", "MMA_M", "MMA_N", "MMA_K"]

# A block's factors hold its span (log2) in fp32 while 2^-span is normal: 2^-126, fp32's smallest
# normal, the bound kernel.chunk_kda checked per tile when this study ran.
# The kernels now use kernel.shapes.SPAN_LIMIT = 110: this study's fp32 keeps subnormals, their -ftz=true flushes Kr.
SPAN_LIMIT = 126.0
U32 = 2.0 ** -24                 # fp32's unit roundoff
MMA_M, MMA_N, MMA_K = 16, 8, 16  # mma.sync m16n8k16: the kernels' tile products


class Block(NamedTuple):
    """Rows [r0, r1) x columns [c0, c1) of the lower triangle, factorised about reference row ``ref``."""
    r0: int
    r1: int
    c0: int
    c1: int
    ref: int


def _check_gc(gc: np.ndarray) -> np.ndarray:
    gc = np.asarray(gc)
    if gc.ndim != 2 or gc.shape[0] < 1:
        raise ValueError(f"gc must be [L, K] with L >= 1, got shape {gc.shape}")
    return gc


def today(L: int) -> list[Block]:
    """The kernels' factorisation: the whole tile about its last row (gT)."""
    if L < 1:
        raise ValueError(f"L must be >= 1, got {L}")
    return [Block(0, L, 0, L, L - 1)]


def _span(gc: np.ndarray, lo: int, hi: int) -> float:
    return float(np.max(gc[lo].astype(np.float64) - gc[hi - 1].astype(np.float64)))


def plan(gc: np.ndarray, limit: float = SPAN_LIMIT) -> list[Block]:
    """The hierarchy of references for one tile's gc [L, K] (log2): today's one block when the tile's
    span is within ``limit``, else halves, recursing into each diagonal half still past it."""
    gc = _check_gc(gc)
    out: list[Block] = []

    def walk(lo: int, hi: int) -> None:
        if hi - lo == 1 or _span(gc, lo, hi) <= limit:
            out.append(Block(lo, hi, lo, hi, hi - 1))
            return
        b = (lo + hi) // 2
        out.append(Block(b, hi, lo, b, b - 1))
        walk(lo, b)
        walk(b, hi)

    walk(0, gc.shape[0])
    return out


def depth(blocks: Sequence[Block]) -> int:
    """How many times the plan halved: 0 for today's single block, 4 when a 16-row tile reaches single rows."""
    L = max(b.r1 for b in blocks)
    smallest = min(b.r1 - b.r0 for b in blocks if b.r0 == b.c0)   # the smallest diagonal block
    return int(round(math.log2(L / smallest))) if smallest < L else 0


# ---------------------------------------------------------------- fp32, as the kernels would run a plan


def _f32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"fp32 inputs expected (the oracle takes the same values), got {x.dtype}")
    return x


def _lower(L: int, strict: bool) -> np.ndarray:
    return np.tril(np.ones((L, L), dtype=bool), -1 if strict else 0)


def pair(a: np.ndarray, b: np.ndarray, gc: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """Strict lower [L, L] of sum_c a_ic b_jc 2^(gc_ic - gc_jc), fp32, one GEMM per block. Entries
    outside the strict triangle are selected away, as the kernels mask them (a NaN there is no harm)."""
    a, b, gc = _f32(a), _f32(b), _f32(gc)
    L = gc.shape[0]
    out = np.zeros((L, L), dtype=np.float32)
    mask = _lower(L, strict=True)
    with np.errstate(all="ignore"):
        for blk in blocks:
            A = a[blk.r0:blk.r1] * np.exp2(gc[blk.r0:blk.r1] - gc[blk.ref])
            B = b[blk.c0:blk.c1] * np.exp2(gc[blk.ref] - gc[blk.c0:blk.c1])
            m = mask[blk.r0:blk.r1, blk.c0:blk.c1]
            out[blk.r0:blk.r1, blk.c0:blk.c1][m] = (A @ B.T)[m]
    return out


def left(dM: np.ndarray, b: np.ndarray, gc: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """[L, K] sum_{j <= i} dM_ij b_jc 2^(gc_ic - gc_jc), fp32: per block dM (masked to j <= i) times
    b about the block's reference, then each row scaled by 2^(gc_i - gc_ref) (today: dMqk Kr, then
    2^(gc - gT))."""
    dM, b, gc = _f32(dM), _f32(b), _f32(gc)
    L = gc.shape[0]
    D = np.where(_lower(L, strict=False), dM, np.float32(0))
    out = np.zeros(b.shape, dtype=np.float32)
    with np.errstate(all="ignore"):
        for blk in blocks:
            B = b[blk.c0:blk.c1] * np.exp2(gc[blk.ref] - gc[blk.c0:blk.c1])
            out[blk.r0:blk.r1] += np.exp2(gc[blk.r0:blk.r1] - gc[blk.ref]) * (D[blk.r0:blk.r1, blk.c0:blk.c1] @ B)
    return out


def right(dM: np.ndarray, a: np.ndarray, gc: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """[L, K] sum_{i >= j} dM_ij a_ic 2^(gc_ic - gc_jc), fp32: per block dM^T times a about the
    block's reference, then each row j scaled by 2^(gc_ref - gc_j) (today: dMqk^T Qe, then 2^(gT - gc))."""
    dM, a, gc = _f32(dM), _f32(a), _f32(gc)
    L = gc.shape[0]
    D = np.where(_lower(L, strict=False), dM, np.float32(0))
    out = np.zeros(a.shape, dtype=np.float32)
    with np.errstate(all="ignore"):
        for blk in blocks:
            A = a[blk.r0:blk.r1] * np.exp2(gc[blk.r0:blk.r1] - gc[blk.ref])
            out[blk.c0:blk.c1] += np.exp2(gc[blk.ref] - gc[blk.c0:blk.c1]) * (D[blk.r0:blk.r1, blk.c0:blk.c1].T @ A)
    return out


# ---------------------------------------------------------------- float64 pairwise: the oracle


def _decay(gc: np.ndarray, strict: bool) -> np.ndarray:
    """[L, L, K] 2^(gc_i - gc_j) where j < i (or <= i), else 0; float64, never formed above the diagonal
    (where it could overflow even float64)."""
    gc = np.asarray(gc, dtype=np.float64)
    L = gc.shape[0]
    m = _lower(L, strict)[..., None]
    return np.where(m, np.exp2(np.where(m, gc[:, None, :] - gc[None, :, :], -np.inf)), 0.0)


def _f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


def pair_exact(a, b, gc) -> np.ndarray:
    a, b = _f64(a, b)
    return np.einsum("ic,jc,ijc->ij", a, b, _decay(gc, strict=True))


def left_exact(dM, b, gc) -> np.ndarray:
    dM, b = _f64(dM, b)
    return np.einsum("ij,jc,ijc->ic", dM, b, _decay(gc, strict=False))


def right_exact(dM, a, gc) -> np.ndarray:
    dM, a = _f64(dM, a)
    return np.einsum("ij,ic,ijc->jc", dM, a, _decay(gc, strict=False))


def abs_pair(a, b, gc) -> np.ndarray:
    """The pairwise sums of the terms' magnitudes: what the rounding error of a sum scales with."""
    return pair_exact(np.abs(a), np.abs(b), gc)


def abs_left(dM, b, gc) -> np.ndarray:
    return left_exact(np.abs(dM), np.abs(b), gc)


def abs_right(dM, a, gc) -> np.ndarray:
    return right_exact(np.abs(dM), np.abs(a), gc)


def error_bound(n: int, limit: float = SPAN_LIMIT) -> float:
    """Relative bound, against the terms' magnitudes (||abs_*||_F), on a plan's fp32 error for a
    reduction of n terms when every block's span is within ``limit``. Per term: the two operand
    products and the row scale (3 roundings), the two exp2 (numpy's fp32 exp2 is within 4 u), the block
    sums' accumulation (at most 5 blocks per entry), n for the GEMM's sum, and the exponents' own
    rounding: fl(gc_i - gc_ref) is off by u |gc_i - gc_ref|, which moves 2^(gc_i - gc_ref) by
    ln2 u |gc_i - gc_ref|, at most ln2 u limit for each of the two factors of a diagonal block (an
    off-diagonal block's factors are both <= 1, so the product's shift is at most u / e)."""
    return (n + 3 + 8 + 5 + 2 * math.log(2.0) * limit) * U32


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want||_F / ||want||_F; inf when got holds an inf or NaN (a failure, never a small number)."""
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    den = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / den if den > 0 else float(np.linalg.norm(got))


# ---------------------------------------------------------------- cost in MMAs


def _gated(blk: Block) -> bool:
    """Whether the block needs a product: a single row's block holds only (i, i), no gate."""
    return blk.r1 - blk.r0 > 1 or blk.c0 != blk.r0


def mma_counts(blocks: Sequence[Block], L: int) -> dict:
    """What a plan costs in m16n8k16 MMAs, against today's plan, per channel tile and reduction step.

    * ``blocks``: products (sub-blocks with a gate).
    * ``tokens_by_block`` (Mqk, Akk: tokens x tokens, reduced over channels): each sub-block its own
      MMAs, rows padded to m16 and columns to n8 (an 8-row half still costs a full m16).
    * ``channels_by_block`` (G14-G17: tokens x channels, reduced over the tile's tokens): each
      sub-block its own m16 x k16 MMA per n8 channel tile.
    * ``channels_by_ref`` (G14-G17 packed): one m16 x k16 MMA per distinct reference, each reading dM
      masked to that reference's entries and the operand re-referenced to it; the rows that reference
      does not own are selected away.
    * ``tokens_by_ref`` (Mqk, Akk packed): per reference, one m16 MMA per n8 tile its columns touch.

    Each is given with its ``*_ratio`` to today's plan (one 16 x 16 product)."""
    gated = [b for b in blocks if _gated(b)]
    ceil = lambda x, m: -(-x // m)   # noqa: E731
    base = today(L)
    def counts(bs):
        refs: dict[int, set] = {}
        for b in bs:
            refs.setdefault(b.ref, set()).update(c // MMA_N for c in range(b.c0, b.c1))
        return {"blocks": len(bs),
                "tokens_by_block": sum(ceil(b.r1 - b.r0, MMA_M) * ceil(b.c1 - b.c0, MMA_N) for b in bs),
                "channels_by_block": sum(ceil(b.r1 - b.r0, MMA_M) * ceil(b.c1 - b.c0, MMA_K) for b in bs),
                "channels_by_ref": len(refs),
                "tokens_by_ref": sum(len(t) for t in refs.values())}
    got, ref = counts(gated), counts(base)
    return {**got, **{f"{k}_ratio": got[k] / ref[k] for k in got}}
