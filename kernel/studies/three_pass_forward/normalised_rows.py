"""The three passes' o and final state with q and k normalised and rounded to bf16 (the products pass today)
against normalised in fp32 with no rounding (each row's rstd folded into the fp32 operands, as the one pass does).

    python -m kernel.studies.three_pass_forward.normalised_rows                  # 1 x 8192, 2 heads, seeds 0 1
    python -m kernel.studies.three_pass_forward.normalised_rows --T 2048 --recipes unit --seeds 0

Run from a checkout (the model is tests/kernel/three_pass_model.py). The inputs are kda-precision's recipes
(``kernel.tools.kda_precision.recipe_inputs``: the same draws, so seed 0 at 1 x 8192 is its table's case),
rounded to bf16 as that table rounds them; the float64 reference (``kernel.reference.kda_forward_reference``)
normalises the rounded raw rows itself. The products pass normalises q and k rows in shared memory, in bf16, as
FLA's l2norm writes them, and every operand it forms starts from those rounded rows; this asks how much of o's
error that one rounding makes. ``trained-layer`` needs torch (its gate is drawn by torch on the CPU).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from kernel.shapes import HEAD_DIM

RECIPES = ("unit", "random_inputs", "trained-layer")
FORMS = ("rows normalised in bf16", "rstd folded (fp32)")


def errors(recipe: str, T: int, H: int, seed: int) -> dict:
    """{form: (o's relative error, the final state's)} against float64 for one recipe and seed at 1 x T. The model
    takes each token's gate and sums it over the chunk itself (``token_gate``), as ``kernel.chunk_kda`` has the
    products pass do on these recipes."""
    from kernel.reference import kda_forward_reference, l2norm
    from kernel.tools.kda_precision import recipe_inputs, rel_fro
    from tests.kernel.three_pass_model import bf16, emulate

    x = recipe_inputs(recipe, 1, T, H, HEAD_DIM, HEAD_DIM, None, seed)
    q, k, v, g, beta = (bf16(x[n][0]) for n in ("q", "k", "v", "g", "beta"))
    scale = HEAD_DIM ** -0.5
    o_ref, final_ref, _ = kda_forward_reference(*(a[None].astype(np.float64) for a in (q, k, v, g, beta)),
                                                scale=scale, qk_l2norm=True)
    q_n, k_n = l2norm(np, q), l2norm(np, k)   # fp32, as the kernels take each row's rstd
    out = {}
    for form, (qq, kk) in zip(FORMS, ((bf16(q_n), bf16(k_n)), (q_n, k_n))):
        r = emulate(qq, kk, v, g, beta, [T], scale=scale, token_gate=True)
        out[form] = (rel_fro(r["o"], o_ref[0]), rel_fro(r["final"], final_ref))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.three_pass_forward.normalised_rows",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=8192, help="tokens of the one sequence (default 8192)")
    ap.add_argument("--heads", type=int, default=2, help="H (default 2, kda-precision's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    args = ap.parse_args(argv)
    if args.T < 1 or args.heads < 1:
        ap.error("--T and --heads must be at least 1")
    print(f"| recipe | seed | o: {FORMS[0]} | o: {FORMS[1]} | ratio | final: {FORMS[0]} | final: {FORMS[1]} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for recipe in args.recipes:
        for seed in args.seeds:
            try:
                e = errors(recipe, args.T, args.heads, seed)
            except ImportError as exc:
                print(f"| {recipe} | {seed} | not run: {exc} | | | | |", flush=True)
                continue
            (o_r, f_r), (o_f, f_f) = e[FORMS[0]], e[FORMS[1]]
            print(f"| {recipe} | {seed} | {o_r:.3e} | {o_f:.3e} | {o_f / o_r:.2f} | {f_r:.3e} | {f_f:.3e} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
