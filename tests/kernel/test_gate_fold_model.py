"""The gate formed by its readers (docs/kda_forward.md, section 8, fold A), in the forward's numpy model.

The forward, Kernel A and Kernel B take FLA's 64-token chunk cumsum of the log2 gate and use it within a
16-token tile as ``g - g[row before the tile]``. Folded, each reader takes every token's natural-log gate
and sums it in fp32 within the tile (kernel.shapes.tile_gate_sums; the forward's token-gate build does).
The two round differently; these tests hold the folded form's o, final state and states to the cumsum
form's errors against float64 on every recipe of the three-pass model, so that the fold can be judged on
its time alone. The three passes' products pass folds it too, summing each token's gate over its 64-token
chunk by the same rule: the three-pass model is held the same way.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from . import forward_cases as fc
from .three_pass_model import RECIPES, case_inputs, case_of
from .three_pass_model import emulate as three_passes


def errors(case: dict, token_gate: bool = False) -> np.ndarray:
    e = fc.emulate(case, token_gate=token_gate)
    return np.array([fc.rel(e["o"], case["o"]), fc.rel(e["final"], case["final"]),
                     fc.rel(e["states"], case["states"])])


def test_the_folded_scan_is_the_scan_on_a_gate_of_exact_tile_sums():
    # where every tile's sums are exact in fp32 (gates of -1/8, a multiple of a power of two), today's
    # difference of chunk sums and the folded sum agree to the bit: the two forms differ by rounding only
    gate = np.full((1, 200, 2, fc.D), -0.125 * math.log(2.0))
    case = fc.make_case(lengths=[200], H=2, seed=5, gate=gate)
    today = fc.emulate(case)
    folded = fc.emulate(case, token_gate=True)
    for key in ("o", "final", "states"):
        assert np.array_equal(today[key], folded[key]), key


def three_pass_errors(case: dict, token_gate: bool = False) -> np.ndarray:
    e = three_passes(*case_inputs(case, token_gate), scale=case["scale"], initial_state=case["initial_state"],
                     token_gate=token_gate)
    return np.array([fc.rel(e[name].reshape(case[name].shape), case[name]) for name in ("o", "final", "states")])


# each forward's errors (o, final state, states) against float64, the cumsum form's or the folded gate's
FORWARDS = {"one pass": errors, "three passes": three_pass_errors}


@pytest.mark.parametrize("forward", list(FORWARDS))
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_folded_gate_keeps_todays_errors(recipe, forward):
    if recipe == "trained-layer gate":
        pytest.importorskip("torch", reason="the trained-layer gate is drawn with torch (an optional dependency)")
    case = case_of(recipe)
    today = FORWARDS[forward](case)
    folded = FORWARDS[forward](case, token_gate=True)
    # measured on the CPU, five recipes: every ratio within 0.9996-1.0006 (the one pass, which sums each tile)
    # and 0.9999-1.0004 (the three passes, whose products pass sums each chunk)
    assert np.all(folded <= today * 1.003), (recipe, forward, today, folded)
    assert np.all(folded >= today * 0.997), (recipe, forward, today, folded)
