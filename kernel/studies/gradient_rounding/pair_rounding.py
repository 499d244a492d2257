"""Kernel B with dS stored after every second tile: what the one extra rounding costs each gradient.

    python -m kernel.studies.gradient_rounding.pair_rounding            # T = 1024, H = 2, both recipes
    python -m kernel.studies.gradient_rounding.pair_rounding --T 256    # quicker

No GPU. Kernel A writes dS (bf16) after every 16-token tile today, 2,048 of Kernel B's 5,448 B a token and head
and as many of Kernel A's writes. docs/kda_backward.md (section 9, "Kernel B's next design") counts a walk in
32-token pairs: Kernel A writes dS after the second tile of each pair only, and Kernel B forms the first tile's
dS1, the gradient entering the second tile, from the second tile's own quantities,

    dS1(first) = diag(gamma) dS1(second) + Qd^T do - Kd^T diag(beta) dW        (Kernel A's G4 and G5)

with the stored bf16 dS1(second), its MMA operands Qd, Kd and beta dW in bf16 (Qd in one bf16, or in two parts as
Kernel A's G4 takes it), in fp32 sums, and rounds the result to bf16 for its own MMAs. This runs
gradient_rounding.rounding's tile backward, in the kernel's rounding (KERNEL_NOW), once with every tile's dS1 as
Kernel A stores it and once with the pairs' first tiles' dS1 formed so; each row gives every gradient's relative
Frobenius error against the unrounded float64 tile backward.
"""
from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from kernel.tools.kda_precision import rel_fro

from .rounding import GRADS, KERNEL_NOW, bf16, tile_backward, tiles_of


def entering(blk: dict, r: dict, t: int, dS1_after, qd_two_parts: bool, rounded: bool = True) -> np.ndarray:
    """The gradient entering tile ``t`` (its dS0, the tile before's dS1) from tile t's quantities and its stored
    dS1 (``dS1_after``, rounded to bf16 here as Kernel A stores it), in Kernel B's roundings: dU and dW as G3's
    operand and result, Qd, Kd and beta dW as the MMAs' operands. ``rounded`` False: in float64 throughout."""
    T = lambda x: np.swapaxes(x, -1, -2)   # noqa: E731
    rb = bf16 if rounded else (lambda x: x)   # noqa: E731
    ds = rb(dS1_after)
    mqk, inv, do, beta = blk["mqk"][t], blk["inv"][t], blk["do"][t], blk["beta"][t][..., None]
    Kr, Kd, Qd = rb(r["Kr"][t]), rb(r["Kd"][t]), r["Qd"][t]
    Qd = rb(Qd) + rb(Qd - rb(Qd)) if qd_two_parts else rb(Qd)
    dU = T(mqk) @ do + Kr @ ds                           # G1 + G2
    dW = T(inv) @ rb(dU)                                 # G3
    return r["gamma"][t][..., :, None] * ds + T(Qd) @ do - T(Kd) @ rb(beta * dW)


def pair_dS1(blk: dict, r: dict, dS1: np.ndarray, qd_two_parts: bool) -> np.ndarray:
    """Each tile's dS1 as the pair walk has it: stored after a pair's second tile (and after a sequence's last
    tile), formed by :func:`entering` for a pair's first."""
    out = dS1.copy()
    for t in range(0, dS1.shape[0] - 1, 2):
        out[t] = entering(blk, r, t + 1, dS1[t + 1], qd_two_parts)
    return out


def rows_for(recipe: str, T: int, H: int) -> dict:
    blk, r, S0, dS1 = tiles_of(recipe, T, H)
    exact = tile_backward(blk, r, S0, dS1, frozenset())
    sides = {"dS1 after every tile (today)": dS1,
             "after every second tile, Qd in one bf16": pair_dS1(blk, r, dS1, False),
             "after every second tile, Qd in two parts": pair_dS1(blk, r, dS1, True)}
    out = {}
    for name, ds in sides.items():
        got = tile_backward(blk, r, S0, ds, KERNEL_NOW)
        out[name] = {g: rel_fro(got[g], exact[g]) for g in GRADS}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.gradient_rounding.pair_rounding",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=1024, help="tokens of the one sequence (a multiple of 32)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--recipes", nargs="+", choices=("unit", "random_inputs"), default=["unit", "random_inputs"])
    a = ap.parse_args(argv)
    if a.T < 32 or a.T % 32 or a.heads < 1:
        ap.error("need --T a multiple of 32 (>= 32) and --heads >= 1")
    for recipe in a.recipes:
        print(f"\n{recipe}, 1x{a.T}, H = {a.heads}: relative Frobenius error vs the unrounded float64 tile backward")
        print(f"| {'dS1':44s} | " + " | ".join(f"{g:>8s}" for g in GRADS) + " |")
        print("|" + "-" * 46 + "|" + "|".join("-" * 10 for _ in GRADS) + "|")
        for name, errs in rows_for(recipe, a.T, a.heads).items():
            print(f"| {name:44s} | " + " | ".join(f"{errs[g]:.2e}" for g in GRADS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
