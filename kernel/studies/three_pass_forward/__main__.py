"""The three-pass forward's precision against float64, beside the one pass's, on the same inputs.

    python -m kernel.studies.three_pass_forward            # every recipe (about a minute on one core)
    python -m kernel.studies.three_pass_forward --recipes ragged,long

Run from a checkout (the one pass's model and the cases are the forward's test helpers,
tests/kernel/forward_cases.py). Each recipe is one case of ``make_case``: the inputs rounded as
``kernel.forward`` takes them, the float64 outputs of ``kernel.reference.kda_forward_reference``. Printed:
the relative Frobenius error of o, the final state and the states (every 64 tokens) for the one pass's
model (``forward_cases.emulate``, the kernel's arithmetic) and for the three passes' (``emulate.py``),
with u stored in bf16 and in fp32.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

RECIPES = {
    "ragged": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200], H=2, seed=4, initial_state=True),
    "long": dict(B=1, T=2048, H=2, seed=6),
    "strong gates": dict(B=2, T=512, H=2, seed=7, gate_strength=3.0),
    "past fp32's range": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200, 300], H=2, seed=5, out_of_range=True),
    "trained-layer gate": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200, 300, 1000], H=2, seed=5, initial_state=True),
}
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


def case_of(recipe: str) -> dict:
    from tests.kernel.forward_cases import make_case

    kw = dict(RECIPES[recipe])
    if recipe == "trained-layer gate":
        from kernel.tools.trained_layer_gate import trained_layer_gate

        kw["gate"] = trained_layer_gate(None, None, kw["H"], kw["H"], lengths=kw["lengths"], seed=3,
                                        hidden=256)["g"].float().numpy()
    return make_case(**kw)


def compare(case: dict) -> dict:
    """{output: (one pass's error, three passes' error, three passes' error with u in fp32)} against the
    case's float64 outputs, and the pairwise tiles and blocks."""
    from tests.kernel.forward_cases import D, emulate as one_pass, rel

    from kernel.ds_scan.launch import bits_to_f32

    from .emulate import emulate as three_passes

    H = case["H"]
    a = one_pass(case)
    args = (*(bits_to_f32(case[n]).reshape(-1, H, D) for n in ("q_repeated", "k_repeated", "v")),
            case["g"].reshape(-1, H, D), case["beta_values"].reshape(-1, H), case["lengths"])
    b, c = (three_passes(*args, scale=case["scale"], initial_state=case["initial_state"], u_fp32=u32)
            for u32 in (False, True))
    out = {name: (rel(a[name], case[name]), rel(b[name].reshape(a[name].shape), case[name]),
                  rel(c[name].reshape(a[name].shape), case[name])) for name in OUTPUTS}
    out["pairwise"] = (a["pairwise_tiles"], b["pairwise_blocks"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print("| recipe | " + " | ".join(f"{n}: one pass, three, three with u fp32" for n in OUTPUTS)
          + " | pairwise tiles / blocks |")
    print("|---|" + "---|" * len(OUTPUTS) + "---|")
    for recipe in args.recipes:
        r = compare(case_of(recipe))
        cells = " | ".join(" / ".join(f"{e:.2e}" for e in r[n]) for n in OUTPUTS)
        print(f"| {recipe} | {cells} | {r['pairwise'][0]} / {r['pairwise'][1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
