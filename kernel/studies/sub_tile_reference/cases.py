"""The study's gates and tiles: the trained-layer recipe's 16-token tiles, synthetic extremes, and one
tile's four gated products evaluated with today's plan and with the hierarchy against float64.

Gates are natural-log per token and channel (what FLA's layer hands the op); a tile's gc is their
cumsum over its rows in log2, held in fp32 as the kernels hold it. The oracle sums the same fp32
values in float64, so that each plan's error is its own; ``gc fp32`` says what holding gc in fp32
costs by itself (the oracle on gc rounded against the oracle on the float64 cumsum).
"""
from __future__ import annotations

import math

import numpy as np

from kernel.shapes import HEAD_DIM, TILE_TOKENS

from . import hierarchy as h

__all__ = ["PRODUCTS", "HUGE_GATE", "HUGE_GATE_TOKEN", "tile_gc", "synthetic", "trained_layer_tiles",
           "tile_inputs", "evaluate", "depths", "by_group", "costs"]

LN2 = math.log(2.0)
HUGE_GATE = -1e4          # natural log: one token's gate far past anything a tile's factors hold
HUGE_GATE_TOKEN = 5       # inside the first half, not at a halving boundary
CHANNEL_GROUP = 16        # k columns per warp in Kernel B's K phase (G14-G17): a plan could be per group
# name -> (its fp32 product, the float64 oracle, the terms' magnitudes, reduction length n of its GEMM)
PRODUCTS = {
    "Mqk": (h.pair, h.pair_exact, h.abs_pair, "K"),
    "Akk": (h.pair, h.pair_exact, h.abs_pair, "K"),
    "dMqk Kr": (h.left, h.left_exact, h.abs_left, "L"),
    "dMqk^T Qe": (h.right, h.right_exact, h.abs_right, "L"),
}


def tile_gc(g: np.ndarray) -> np.ndarray:
    """[..., L, K] natural-log gates -> the tile-local cumulative gate in log2, float64."""
    return np.cumsum(np.asarray(g, dtype=np.float64), axis=-2) / LN2


def synthetic(K: int = HEAD_DIM, seed: int = 0) -> dict[str, np.ndarray]:
    """One 16-token tile's gates [16, K] per case. The background is logsigmoid(N(0, 1)) per token
    and channel (ordinary gates); channel 0 then decays the whole tile by 2^-120 (in range), 2^-200
    or 2^-1000 in equal steps, or every channel of token :data:`HUGE_GATE_TOKEN` takes
    :data:`HUGE_GATE`; and gates of exactly 0."""
    rng = np.random.default_rng(seed)
    back = -np.logaddexp(0.0, -rng.standard_normal((TILE_TOKENS, K)))
    out = {"gates exactly 0": np.zeros((TILE_TOKENS, K))}
    for e in (120, 200, 1000):
        g = back.copy()
        g[:, 0] = -e * LN2 / TILE_TOKENS
        out[f"one channel 2^-{e}"] = g
    g = back.copy()
    g[HUGE_GATE_TOKEN] = HUGE_GATE
    out[f"token {HUGE_GATE_TOKEN} gate {HUGE_GATE:g}"] = g
    return out


def trained_layer_tiles(T: int, heads: int, scale: float, seed: int = 0) -> np.ndarray:
    """The trained-layer recipe's activated gates (kernel.tools.trained_layer_gate, one layer per
    seed, projection output scaled by ``scale``) cut into 16-token tiles: float64 [T / 16 * heads, 16, K]."""
    from kernel.tools.trained_layer_gate import trained_layer_gate

    if T % TILE_TOKENS:
        raise ValueError(f"T must be a multiple of {TILE_TOKENS}, got {T}")
    g = trained_layer_gate(1, T, 1, heads, seed=seed, projection_scale=scale)["g"]
    g = g.double().numpy()[0]                                    # [T, HV, K]
    return g.reshape(T // TILE_TOKENS, TILE_TOKENS, heads, -1).transpose(0, 2, 1, 3).reshape(-1, TILE_TOKENS,
                                                                                            g.shape[-1])


def tile_inputs(K: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp32 q, k [16, K] with unit-norm rows and a N(0, 1) dM [16, 16] (the products read its lower triangle)."""
    q, k = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in rng.standard_normal((2, TILE_TOKENS, K)))
    dM = rng.standard_normal((TILE_TOKENS, TILE_TOKENS))
    return q.astype(np.float32), k.astype(np.float32), dM.astype(np.float32)


def evaluate(gc64: np.ndarray, q: np.ndarray, k: np.ndarray, dM: np.ndarray) -> dict:
    """One tile's four products with today's plan and the hierarchy, against float64.

    Returns ``depth`` and, per product name, ``today`` and ``hierarchy`` (relative Frobenius
    error, inf when the fp32 result is not finite), ``bound`` (:func:`hierarchy.error_bound` in the
    same units: relative to the oracle's norm) and ``gc`` (what gc's own fp32 rounding moves the
    oracle by)."""
    gc32 = gc64.astype(np.float32)
    L, K = gc32.shape
    s = np.float32(K ** -0.5)
    a = (s * q).astype(np.float32)
    args = {"Mqk": (a, k), "Akk": (k, k), "dMqk Kr": (dM, k), "dMqk^T Qe": (dM, a)}
    plans = {"today": h.today(L), "hierarchy": h.plan(gc32)}
    out: dict = {"depth": h.depth(plans["hierarchy"])}
    for name, (fp32, exact, mags, n) in PRODUCTS.items():
        x, y = args[name]
        want = exact(x, y, gc32)
        den = float(np.linalg.norm(want))
        row = {p: h.rel_err(fp32(x, y, gc32, blocks), want) for p, blocks in plans.items()}
        row["bound"] = h.error_bound(K if n == "K" else L) * float(np.linalg.norm(mags(x, y, gc32))) / den
        row["gc"] = h.rel_err(want, exact(x, y, gc64))
        out[name] = row
    return out


def depths(gc: np.ndarray, limit: float = h.SPAN_LIMIT) -> np.ndarray:
    """The hierarchy's depth for each tile of gc [n, L, K] (log2, L a power of two), vectorised: a
    level counts when any of its aligned blocks spans past ``limit`` (a block inside one in range is
    in range: gc is monotone), so this is :func:`hierarchy.depth` of :func:`hierarchy.plan` for every tile."""
    gc = np.asarray(gc, dtype=np.float64)
    n, L, _ = gc.shape
    out = np.zeros(n, dtype=np.int64)
    size = L
    while size >= 2:
        lo = np.arange(0, L, size)
        span = (gc[:, lo, :] - gc[:, lo + size - 1, :]).max(axis=-1)     # [n, blocks]
        out += (span > limit).any(axis=1)
        size //= 2
    return out


def by_group(gc: np.ndarray, group: int = CHANNEL_GROUP) -> np.ndarray:
    """gc [n, L, K] as tiles of ``group`` channels each, [n * K / group, L, group] (tile-major): what one
    warp of Kernel B's K phase would plan on."""
    gc = np.asarray(gc)
    n, L, K = gc.shape
    if K % group:
        raise ValueError(f"K must be a multiple of group={group}, got K={K}")
    return gc.reshape(n, L, K // group, group).transpose(0, 2, 1, 3).reshape(-1, L, group)


# hierarchy.mma_counts' ratios to today's plan
RATIOS = tuple(k + "_ratio" for k in ("blocks", "tokens_by_block", "channels_by_block", "channels_by_ref",
                                      "tokens_by_ref"))


def _ratios(gc32: np.ndarray, d: np.ndarray) -> dict[str, np.ndarray]:
    """Each :func:`hierarchy.mma_counts` ratio per tile: 1 where the tile is in range, else its plan's."""
    n, L, _ = gc32.shape
    out = {k: np.ones(n) for k in RATIOS}
    for t in np.flatnonzero(d):
        c = h.mma_counts(h.plan(gc32[t]), L)
        for k in RATIOS:
            out[k][t] = c[k]
    return out


def costs(gc: np.ndarray) -> dict:
    """Depth fractions and MMA counts over the tiles of gc [n, L, K] (log2).

    ``depth_fraction`` [depth 0, 1, ..]; per :func:`hierarchy.mma_counts` ratio, (mean, max) over
    tiles; ``group_past``, the fraction of (tile, 16-channel group) that need the hierarchy, and
    ``group_channels_by_ref``, G14-G17's MMAs against today's when each group (one warp's n-tiles)
    plans on its own channels."""
    gc32 = np.asarray(gc).astype(np.float32)     # the values the kernels hold, for the depths and the plans alike
    n, L, _ = gc32.shape
    d = depths(gc32)
    r = _ratios(gc32, d)
    grouped = by_group(gc32)
    dg = depths(grouped)
    rg = _ratios(grouped, dg)["channels_by_ref_ratio"]
    return {"tiles": n, "depth_fraction": np.bincount(d, minlength=L.bit_length()) / n,
            **{k: (float(v.mean()), float(v.max())) for k, v in r.items()},
            "group_past": float((dg > 0).mean()), "group_channels_by_ref": (float(rg.mean()), float(rg.max()))}
