"""The three-pass forward's precision against float64, beside the one pass's, on the same inputs.

    python -m kernel.studies.three_pass_forward            # every recipe (about a minute on one core)
    python -m kernel.studies.three_pass_forward --recipes ragged,long

Run from a checkout (the models and the cases are the forwards' test helpers, tests/kernel/forward_cases.py
and tests/kernel/three_pass_model.py). Each recipe is one case of ``make_case``: the inputs rounded as
``kernel.forward`` takes them, the float64 outputs of ``kernel.reference.kda_forward_reference``. Printed:
the relative Frobenius error of o, the final state and the states (every 64 tokens) for the one pass's
model (``forward_cases.emulate``, the kernel's arithmetic) and for the three passes' (``three_pass_model.emulate``),
with u stored in each of ``three_pass_model.U_FORMATS``: bf16 (the kernels' before log 49), fp16 with a
power-of-two scale a chunk and head (the kernels' since), fp32.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tests.kernel.three_pass_model import RECIPES, U_FORMATS, case_of

OUTPUTS = ("o", "final", "states")


def parse_args(argv: Sequence[str] | None):
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.three_pass_forward",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    args = ap.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown or not args.recipes:
        ap.error(f"--recipes: expected names from {', '.join(RECIPES)}, got {', '.join(unknown) or 'none'}")
    return args


def compare(case: dict) -> dict:
    """{output: (one pass's error, then the three passes' with u stored in each of U_FORMATS)} against the
    case's float64 outputs, and the pairwise tiles and blocks."""
    from tests.kernel.forward_cases import emulate as one_pass, rel
    from tests.kernel.three_pass_model import case_inputs
    from tests.kernel.three_pass_model import emulate as three_passes

    a = one_pass(case)
    args = case_inputs(case)
    three = [three_passes(*args, scale=case["scale"], initial_state=case["initial_state"], u_format=f)
             for f in U_FORMATS]
    out = {name: (rel(a[name], case[name]), *(rel(b[name].reshape(a[name].shape), case[name]) for b in three))
           for name in OUTPUTS}
    out["pairwise"] = (a["pairwise_tiles"], three[0]["pairwise_blocks"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    formats = ", ".join(f"three (u {f})" for f in U_FORMATS)
    print("| recipe | " + " | ".join(f"{n}: one pass, {formats}" for n in OUTPUTS)
          + " | pairwise tiles / blocks |")
    print("|---|" + "---|" * len(OUTPUTS) + "---|")
    for recipe in args.recipes:
        r = compare(case_of(recipe))
        cells = " | ".join(" / ".join(f"{e:.2e}" for e in r[n]) for n in OUTPUTS)
        print(f"| {recipe} | {cells} | {r['pairwise'][0]} / {r['pairwise'][1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
