"""Errors and costs of re-referencing a tile's gated products at sub-tile boundaries (README.md).

    python -m kernel.studies.sub_tile_reference               # T = 32768, 16 heads, scales 1 2 4 8
    python -m kernel.studies.sub_tile_reference --T 4096      # quicker

No GPU. Prints two markdown tables: per case, each product's relative error against float64 with
today's plan and with the hierarchy (and the depth it used); per recipe, the fraction of tiles at
each depth and what the hierarchy costs in MMAs.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from kernel.shapes import HEAD_DIM, TILE_TOKENS

from . import cases

SCALES = (1.0, 2.0, 4.0, 8.0)    # the trained-layer recipe's projection scales


def subsets(name: str, gc: np.ndarray, n_eval: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A recipe's tiles to evaluate: up to n_eval of those past the limit (at random), and the n_eval in
    range with the largest spans (where today's plan is nearest its limit)."""
    d = cases.depths(gc.astype(np.float32))
    past, inside = np.flatnonzero(d > 0), np.flatnonzero(d == 0)
    span = (gc[inside, 0] - gc[inside, -1]).max(axis=-1)
    out = {f"{name}, in range (largest spans)": inside[np.argsort(span)[::-1][:n_eval]]}
    if past.size:
        out[f"{name}, past the limit"] = np.sort(rng.choice(past, min(n_eval, past.size), replace=False))
    return out


def error_row(case: str, gc: np.ndarray, rng: np.random.Generator) -> dict:
    """The worst error over the tiles of gc [n, 16, K] float64, per product and plan; today's plan fails
    on a tile where a product is not finite or passes the bound."""
    evals = [cases.evaluate(g, *cases.tile_inputs(gc.shape[-1], rng)) for g in gc]
    fails = [any(e[p]["today"] > e[p]["bound"] for p in cases.PRODUCTS) for e in evals]   # inf > bound too
    row = {"case": case, "tiles": len(evals), "depth": max(e["depth"] for e in evals), "today_fails": sum(fails)}
    for p in cases.PRODUCTS:
        for key in ("today", "hierarchy", "gc"):
            row[(p, key)] = max(e[p][key] for e in evals)
        row[(p, "of_bound")] = max(e[p]["hierarchy"] / e[p]["bound"] for e in evals)
    return row


def _e(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.1e}"


def print_errors(rows: list[dict]) -> None:
    print("| case | tiles | depth | today fails | " + " | ".join(f"{p}: today / hierarchy" for p in cases.PRODUCTS)
          + " | hierarchy / bound | fp32 gc alone |")
    print("|---|---:|---:|---:|" + "---:|" * (len(cases.PRODUCTS) + 2))
    for r in rows:
        cells = [f"{_e(r[(p, 'today')])} / {_e(r[(p, 'hierarchy')])}" for p in cases.PRODUCTS]
        worst = max(r[(p, "of_bound")] for p in cases.PRODUCTS)
        gc = max(r[(p, "gc")] for p in cases.PRODUCTS)
        print(f"| {r['case']} | {r['tiles']} | {r['depth']} | {r['today_fails']} | " + " | ".join(cells)
              + f" | {worst:.3f} | {_e(gc)} |")


def print_costs(recipes: dict[str, np.ndarray]) -> None:
    print("| recipe | tiles | depth 0 | 1 | 2 | 3 | 4 | G14-G17 MMAs: one per reference | one per sub-block "
          "| 16-channel groups past | one per reference, per group | Mqk/Akk MMAs: one per sub-block "
          "| one per reference and n8 |")
    print("|---|---:|" + "---:|" * 11)
    for name, gc in recipes.items():
        c = cases.costs(gc)
        frac = " | ".join(f"{f:.3g}" for f in c["depth_fraction"])
        mm = lambda k: f"{c[k][0]:.4g}x (max {c[k][1]:g}x)"   # noqa: E731
        print(f"| {name} | {c['tiles']} | {frac} | {mm('channels_by_ref_ratio')} | {mm('channels_by_block_ratio')} "
              f"| {c['group_past']:.3g} | {mm('group_channels_by_ref')} | {mm('tokens_by_block_ratio')} "
              f"| {mm('tokens_by_ref_ratio')} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.sub_tile_reference",
                                 description="a tile's gated products re-referenced at sub-tile boundaries (CPU)")
    ap.add_argument("--T", type=int, default=32768, help="tokens of the trained-layer recipe (default 32768)")
    ap.add_argument("--heads", type=int, default=16, help="value heads (default 16)")
    ap.add_argument("--seed", type=int, default=0, help="the layer's draw and the inputs' (default 0)")
    ap.add_argument("--eval", type=int, default=32, dest="n_eval",
                    help="tiles evaluated per recipe: this many past the limit, this many in range (default 32)")
    a = ap.parse_args(argv)
    if a.T < TILE_TOKENS or a.T % TILE_TOKENS or min(a.heads, a.n_eval) < 1 or a.seed < 0:
        ap.error(f"--T must be a positive multiple of {TILE_TOKENS}; --heads, --eval >= 1; --seed >= 0")
    try:   # the trained-layer recipe is FLA's layer's draw, made with torch (an optional dependency)
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"this study draws the trained-layer gate with torch, which cannot be imported here ({exc}); "
              "pip install torch", file=sys.stderr)
        return 2

    recipes = {f"trained-layer {s:g}x": cases.tile_gc(cases.trained_layer_tiles(a.T, a.heads, s, a.seed))
               for s in SCALES}
    synthetic = {name: cases.tile_gc(g)[None] for name, g in cases.synthetic(HEAD_DIM, a.seed).items()}
    print(f"K = {HEAD_DIM}, {TILE_TOKENS}-token tiles; trained-layer: {a.T} tokens x {a.heads} heads, seed {a.seed}\n")
    print("Relative Frobenius error against float64 (worst over the tiles evaluated); inf: the fp32 result "
          "holds an inf or NaN\n")
    rng = np.random.default_rng(a.seed)
    rows = [error_row(case, gc[idx], rng) for name, gc in recipes.items()
            for case, idx in subsets(name, gc, a.n_eval, rng).items()]
    rows += [error_row(name, gc, rng) for name, gc in synthetic.items()]
    print_errors(rows)
    print("\nFraction of tiles at each depth, and MMAs against today's (mean over tiles, worst tile)\n")
    print_costs({**recipes, **synthetic})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
