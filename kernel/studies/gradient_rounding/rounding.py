"""Kernel B's rounding points, switched on one group at a time, in the float64 tile backward.

    python -m kernel.studies.gradient_rounding.rounding            # T = 1024, H = 2, both recipes
    python -m kernel.studies.gradient_rounding.rounding --T 256    # quicker

No GPU. The float64 reference (kernel.reference.kda) gives each 16-token tile's entry state S0
and the dS after it (Kernel A's dS1), from bf16-rounded q, k, v, do and beta. Then
:func:`tile_backward`, the reference's ``_tile_backward`` written out with a rounding hook,
computes the tile's gradients with the chosen groups of intermediates rounded to bf16, as an MMA
operand or a bf16 hand-off rounds them in token_gradients.cu:

    ops     R1's operands Kd, Kr, Qe, Ke (and Qd) as the MMAs read them; one of them alone:
            Kd, Kr, Qe, bKe (beta Ke)
    S0      the entry state as an MMA operand (G6, G11, G12)
    dS1     Kernel A's dS after the tile (it writes bf16)
    Vn      beta Vn, G7's operand
    U, dU, dW   G7's result, G3's operand, dW and beta dW (shared memory, bf16)
    dA      dMqk and dLkk, the C x C gradients G14-G17 read

and two ways to form the gate's products (from_start, from_end of docs/kda_backward.md, section 2):

    gate-fp32   each gradient times the operand's fp32 value (q, k and gc in fp32)
    gate-bf16   times the bf16 value its MMA read (Kd, Qe, beta Ke, Kr; Qd feeds no MMA: fp32)

Each row prints the relative Frobenius error of every gradient against the unrounded float64
tile backward. Recipes: ``unit`` (kernel.tools.kda_precision's: q, k, v, do ~ N(0, 1), gates
logsigmoid(N(0, 1)) clamped to [-5, 0]) and ``random_inputs`` (kernel.reference's).
"""
from __future__ import annotations

import argparse
from typing import Sequence

import ml_dtypes
import numpy as np

from kernel.reference import dstate_scan_reference
from kernel.reference import kda as ref_kda
from kernel.tools.kda_precision import recipe_inputs, rel_fro

GRADS = ("dq", "dk", "dv", "dg", "dbeta")
GROUPS = ("ops", "S0", "dS1", "Vn", "U", "dU", "dW", "dA")
OPERANDS = ("Kd", "Kr", "Qe", "bKe")      # the parts of "ops" that MMAs read
# what token_gradients.cu rounds: every group; dA once (before log 29) or as two bf16 parts (after);
# then beta Vn (G7's operand) and dU (G3's) in two parts too
KERNEL_BEFORE = frozenset(GROUPS) | {"gate-fp32"}
KERNEL_AFTER = (frozenset(GROUPS) - {"dA"}) | {"gate-bf16"}
KERNEL_NOW = (KERNEL_AFTER - {"ops", "Vn", "dU"}) | frozenset(OPERANDS)


def bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def tile_backward(blk: dict, r: dict, S0, dS1, rounded: frozenset) -> dict:
    """kernel.reference.kda._tile_backward with the groups in ``rounded`` rounded to bf16."""
    rnd = lambda group, x: bf16(x) if group in rounded or (group in OPERANDS and "ops" in rounded) else x  # noqa: E731
    T = lambda x: np.swapaxes(x, -1, -2)                        # noqa: E731
    C = blk["q"].shape[-2]
    beta = blk["beta"][..., None]
    mqk, inv, do, v = blk["mqk"], blk["inv"], blk["do"], blk["v"]
    Qd = rnd("ops", r["Qd"])
    Kd, Qe, Kr = (rnd(n, r[n]) for n in ("Kd", "Qe", "Kr"))
    bKe = rnd("bKe", beta * r["Ke"])
    strict = np.tril(np.ones((C, C)), -1)
    S0m, dS1 = rnd("S0", S0), rnd("dS1", dS1)

    Vn = v - Kd @ S0m                                   # G6
    U = inv @ rnd("Vn", beta * Vn)                      # G7
    Ub = rnd("U", U)
    dU = T(mqk) @ do + Kr @ dS1                         # G1 + G2
    dW = T(inv) @ rnd("dU", dU)                         # G3
    dWb, bdWb = rnd("dW", dW), rnd("dW", beta * dW)
    dv = beta * dW
    dbeta = np.sum(dW * Vn, axis=-1)
    dMqk = strict * (do @ T(Ub))                        # G9
    d = np.sum(do * U, axis=-1)[..., None]
    dLkk = -strict * (dWb @ T(Ub))                      # G10
    dQd, dKd, dKr = do @ T(S0m), -bdWb @ T(S0m), Ub @ T(dS1)   # G11, G12, G13
    dgamma = np.sum(S0 * dS1, axis=-1)
    dMqk, dLkk = rnd("dA", dMqk), rnd("dA", dLkk)
    dQe = dMqk @ Kr                                     # G14
    dKr = dKr + T(dMqk) @ Qe                            # G15
    X = dLkk @ Kr                                       # G16
    dKe = beta * X
    dbeta = dbeta + np.sum(r["Ke"] * X, axis=-1)
    dKr = dKr + T(dLkk) @ bKe                           # G17

    s, q, k = blk["s"], blk["q"], blk["k"]
    dq = s * (r["f_start"] * dQd + r["f_up"] * dQe + d * k)
    dk = r["f_start"] * dKd + r["f_up"] * dKe + r["f_down"] * dKr + s * d * q
    if "gate-bf16" in rounded:
        from_start = r["Qd"] * dQd + Kd * dKd
        from_end = Qe * dQe + bKe * X - Kr * dKr
    else:
        from_start = r["Qd"] * dQd + r["Kd"] * dKd
        from_end = r["Qe"] * dQe + r["Ke"] * dKe - r["Kr"] * dKr
    reverse = np.flip(np.cumsum(np.flip(from_start, axis=-2), axis=-2), axis=-2)
    exclusive = np.concatenate([np.zeros_like(from_end[..., :1, :]),
                                np.cumsum(from_end[..., :-1, :], axis=-2)], axis=-2)
    dg = reverse - exclusive + (r["gamma"] * dgamma)[..., None, :]
    return {"dq": dq, "dk": dk, "dv": dv, "dbeta": dbeta, "dg": dg}


def tiles_of(recipe: str, T: int, H: int, seed: int = 0):
    """(blk, r, S0, dS1) of every tile of one sequence: the reference's blocks and serial scans."""
    K = V = 128
    raw = recipe_inputs(recipe, 1, T, H, K, V, None, seed)
    wide = {n: np.asarray(raw[n], dtype=np.float64) for n in ("q", "k", "v", "g", "beta", "do")}
    for n in ("q", "k", "v", "do", "beta"):
        wide[n] = bf16(wide[n])
    blk = ref_kda.tile_blocks(np, np.array([0, T]), 16, (1, T, H, K, V), wide, scale=None, qk_l2norm=True,
                          cu_seqlens=None)
    r = ref_kda.rebuild(np, blk)
    _, _, S0 = ref_kda.forward_scan(np, blk, r, 1, H, K, V, None)
    gc, mqk, inv = blk["forward"]
    snaps, _ = dstate_scan_reference(wide["q"], wide["k"], gc, wide["beta"], mqk, inv, wide["do"],
                                     tile=16, qk_l2norm=True, snapshot_every=1)
    return blk, r, S0, snaps.reshape(-1, H, K, V)


def rows_for(recipe: str, T: int, H: int, variants: dict) -> dict:
    """{row name: {gradient: error}} for the named sets of rounded groups."""
    blk, r, S0, dS1 = tiles_of(recipe, T, H)
    exact = tile_backward(blk, r, S0, dS1, frozenset())
    out = {}
    for name, rounded in variants.items():
        got = tile_backward(blk, r, S0, dS1, frozenset(rounded))
        out[name] = {g: rel_fro(got[g], exact[g]) for g in GRADS}
    return out


def variants() -> dict:
    v = {f"{g} alone": {g, "gate-fp32"} for g in GROUPS}
    v["the kernel before log 29 (gate-fp32, dA bf16)"] = KERNEL_BEFORE
    v["all groups, gate-bf16, dA bf16"] = frozenset(GROUPS) | {"gate-bf16"}
    v["the kernel after log 29 (gate-bf16, dA two bf16 parts)"] = KERNEL_AFTER
    for g in sorted(KERNEL_AFTER - {"gate-bf16"}):
        v[f"  after, without {g}"] = KERNEL_AFTER - {g}
    v["and beta Vn, dU in two bf16 parts (G7, G3)"] = KERNEL_NOW
    for g in sorted(KERNEL_NOW - {"gate-bf16"}):
        v[f"  then, without {g}"] = KERNEL_NOW - {g}
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.gradient_rounding.rounding",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=1024, help="tokens of the one sequence (a multiple of 16)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--recipes", nargs="+", choices=("unit", "random_inputs"), default=["unit", "random_inputs"])
    a = ap.parse_args(argv)
    if a.T < 16 or a.T % 16 or a.heads < 1:
        ap.error("need --T a multiple of 16 (>= 16) and --heads >= 1")
    for recipe in a.recipes:
        print(f"\n{recipe}, 1x{a.T}, H = {a.heads}: relative Frobenius error vs the unrounded float64 tile backward")
        print(f"| {'rounded':56s} | " + " | ".join(f"{g:>8s}" for g in GRADS) + " |")
        print("|" + "-" * 58 + "|" + "|".join("-" * 10 for _ in GRADS) + "|")
        for name, errs in rows_for(recipe, a.T, a.heads, variants()).items():
            print(f"| {name:56s} | " + " | ".join(f"{errs[g]:.2e}" for g in GRADS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
