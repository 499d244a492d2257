"""Kernel A's rounding points, one group at a time, in the float64 backward dS scan: what makes dh0's error.

    python -m kernel.studies.gradient_rounding.scan_rounding            # T = 4096, H = 2, both recipes
    python -m kernel.studies.gradient_rounding.scan_rounding --T 1024   # quicker

No GPU. :func:`scan` is kernel.reference.dstate_scan_reference's tile step for one sequence
(docs/kernel_a.md, section 3) with a rounding hook; it starts from dht and walks the tiles
backwards to dh0. The groups, as dstate_scan.cu holds them in bf16:

    qd, kd, kr   R1's operands (G4, G5 and G2 read them)
    dS           the state as G2's A operand (packed from the fp32 accumulators each tile)
    dU           G3's A operand
    bdv          -beta dvcorr, G5's A operand
    Mqk/INV      the inputs' own bf16 (FLA's Aqk, Akk)

and "qd in two parts": qd as G4 reads it since log 31, its bf16 rounding plus what that
rounding left, itself rounded to bf16.

Each row prints dh0's relative Frobenius error against the unrounded scan; the q and k are the
exact l2-normalised ones, so the inputs' own rounding (FLA's normalised bf16 q, k) is not in it.
"""
from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from kernel.reference import prepare_tiles
from kernel.reference.checks import l2norm
from kernel.tools.kda_precision import recipe_inputs, rel_fro

from .rounding import bf16

GROUPS = ("qd", "kd", "kr", "dS", "dU", "bdv", "Mqk/INV")
QD_TWO_PARTS = "qd in two parts"
C = 16


def scan(q, k, gc, beta, mqk, inv, do, dht, rounded: frozenset) -> np.ndarray:
    """dh0 [H, K, V] of one sequence (T a multiple of 16): q, k [T, H, K] normalised, gc the
    tile-local log2 gate, beta [T, H], mqk, inv [T, H, 16], do [T, H, V], dht [H, K, V]."""
    rnd = lambda group, x: bf16(x) if group in rounded else x   # noqa: E731
    s = q.shape[-1] ** -0.5
    mqk, inv = rnd("Mqk/INV", mqk), rnd("Mqk/INV", inv)
    dS = dht.copy()
    for n in range(q.shape[0] // C - 1, -1, -1):
        t = slice(C * n, C * n + C)
        gt, gT = gc[t], gc[C * n + C - 1]
        qd = rnd("qd", s * q[t] * np.exp2(gt))
        if QD_TWO_PARTS in rounded:
            qd = bf16(qd) + bf16(qd - bf16(qd))
        kd = rnd("kd", k[t] * np.exp2(gt))
        kr = rnd("kr", k[t] * np.exp2(gT[None] - gt))
        dU = np.einsum("jhc,jhv->chv", mqk[t], do[t]) + np.einsum("chk,hkv->chv", kr, rnd("dS", dS))   # G1 + G2
        dvcorr = np.einsum("chj,chv->jhv", inv[t], rnd("dU", dU))                                       # G3
        bdv = rnd("bdv", beta[t][..., None] * dvcorr)
        dS = (np.exp2(gT)[..., None] * dS + np.einsum("chk,chv->hkv", qd, do[t])                        # G4
              - np.einsum("chk,chv->hkv", kd, bdv))                                                       # G5
    return dS


def scan_inputs(recipe: str, T: int, H: int, seed: int = 0) -> tuple:
    K = V = 128
    raw = recipe_inputs(recipe, 1, T, H, K, V, None, seed)
    x = {n: np.asarray(raw[n], dtype=np.float64)[0] for n in ("q", "k", "g", "beta", "do")}
    for n in ("q", "k", "do", "beta"):
        x[n] = bf16(x[n])
    gc, mqk, inv = (a[0] for a in prepare_tiles(x["q"][None], x["k"][None], x["g"][None], x["beta"][None], tile=C))
    dht = np.asarray(raw["dht"], dtype=np.float64)[0]
    return l2norm(np, x["q"]), l2norm(np, x["k"]), gc, x["beta"], mqk, inv, x["do"], dht


def rows_for(recipe: str, T: int, H: int, variants: dict) -> dict:
    args = scan_inputs(recipe, T, H)
    exact = scan(*args, frozenset())
    return {name: rel_fro(scan(*args, frozenset(r)), exact) for name, r in variants.items()}


def variants() -> dict:
    v = {f"{g} alone": {g} for g in GROUPS}
    v["every group"] = set(GROUPS)
    v["every group but qd"] = set(GROUPS) - {"qd"}
    v["every group, qd in two parts"] = set(GROUPS) - {"qd"} | {QD_TWO_PARTS}
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.gradient_rounding.scan_rounding",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=4096, help="tokens of the one sequence (a multiple of 16)")
    ap.add_argument("--heads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.T < C or a.T % C or a.heads < 1:
        ap.error("need --T a multiple of 16 (>= 16) and --heads >= 1")
    print(f"dh0's relative Frobenius error vs the unrounded scan, 1x{a.T}, H = {a.heads}")
    print(f"| {'rounded':29s} | {'unit':>8s} | {'random_inputs':>13s} |")
    print("|" + "-" * 31 + "|" + "-" * 10 + "|" + "-" * 15 + "|")
    rows = {r: rows_for(r, a.T, a.heads, variants()) for r in ("unit", "random_inputs")}
    for name in variants():
        print(f"| {name:29s} | {rows['unit'][name]:.2e} | {rows['random_inputs'][name]:13.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
