"""The forward's tile algorithm in the kernel's precision (tests/kernel/forward_cases.emulate: fp32 and
bf16 where kernel/forward/cuda rounds, the pairwise Mqk and Akk where a tile spans past SPAN_LIMIT)
against float64 (kernel.reference.kda_forward_reference and fla_forward_tensors), on the CPU.

Bounds are relative Frobenius errors over a whole output, about 2x what the emulation measured on these
cases (o 3.9e-3, the states and the final state 3.3e-3, Aqk's blocks 2.7e-3, Akk's 2.7e-4): o and the
states are bf16 (2^-9 relative a value) after bf16 MMA operands; Akk's blocks are INV, whose unit
diagonal is exact.
"""
from __future__ import annotations

import numpy as np
import pytest

from ..forward_cases import RAGGED, emulate, folded_rows, intra_products, make_case, rel

BOUNDS = {"o": 8e-3, "final": 6e-3, "states": 6e-3, "Aqk": 6e-3, "Akk": 1e-3}


def _check(case: dict, out: dict, label: str) -> None:
    m = case["blocks"]
    for name, bound in BOUNDS.items():
        got, want = out[name], case[name]
        if name in ("Aqk", "Akk"):
            got, want = np.where(m, got, 0.0), np.where(m, want, 0.0)
        assert np.isfinite(got).all(), f"{label}: {name} has non-finite values"
        e = rel(got, want)
        assert e < bound, f"{label}: {name} rel {e:.3e} >= {bound:g}"


CASES = {
    "ragged, h0": dict(lengths=RAGGED, H=2, seed=4, initial_state=True),
    "equal length": dict(B=2, T=200, H=2, seed=5),
    "GVA 2 per group, h0": dict(lengths=RAGGED, H=4, group=2, seed=12, initial_state=True),
    "bf16 beta": dict(lengths=RAGGED, H=2, seed=7, beta_bf16=True),
    "tiles past fp32's range": dict(lengths=RAGGED + [300], H=2, seed=5, out_of_range=True),
    "scale 0.3": dict(B=1, T=130, H=2, seed=9, scale=0.3),
}


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_the_tile_algorithm_in_the_kernels_precision_matches_float64(kw):
    case = make_case(**kw)
    _check(case, emulate(case), str(kw))


@pytest.mark.parametrize("kw", [dict(lengths=RAGGED + [300], H=2, seed=4, initial_state=True, out_of_range=True),
                                dict(lengths=RAGGED, H=4, group=2, seed=12, initial_state=True)],
                         ids=["past fp32's range", "GVA 2 per group"])
def test_the_qk_rstd_builds_folded_rows_stay_within_the_bounds(kw):
    # The qk_rstd build computes with each raw row times its rstd in fp32, not rounded to bf16 first; the
    # references take the normalised rows rounded to bf16 (the copies path's), so the fold adds about one bf16
    # rounding of q and k against them (measured here: o 4.6e-3 against 4.0e-3, Akk 3.4e-4 against 2.6e-4 on the
    # first case), inside the bounds the kernel's GPU tests hold it to
    case = make_case(**kw, raw_qk=True)
    _check(case, emulate(case, qk_rows=folded_rows(case, kw.get("group", 1))), f"folded rows, {kw}")


def test_tiles_past_fp32s_range_take_the_pairwise_products_and_only_they():
    case = make_case(lengths=RAGGED + [300], H=2, seed=5, out_of_range=True)
    assert emulate(case)["pairwise_tiles"] == 2
    assert emulate(make_case(lengths=RAGGED + [300], H=2, seed=5))["pairwise_tiles"] == 0


def test_the_factorised_products_fail_past_fp32s_range():
    # why the kernel decides per tile: 2^(gc - gT) overflows, so Qe Kr^T is inf * 0 there
    case = make_case(lengths=RAGGED + [300], H=2, seed=5, out_of_range=True)
    out = emulate(case, force_pairwise=False)
    assert not np.isfinite(out["o"]).all() and not np.isfinite(out["states"]).all()


def test_the_pairwise_products_hold_on_every_tile():
    # the pairwise path is the tile algebra too, not a patch for the tiles it serves
    case = make_case(lengths=RAGGED, H=2, seed=4, initial_state=True)
    _check(case, emulate(case, force_pairwise=True), "pairwise everywhere")


def test_one_tile_s_products_are_flas_blocks():
    # a single full tile from the start of a chunk: Mqk and INV are FLA's Aqk and Akk's first block
    case = make_case(B=1, T=16, H=1, seed=3)
    g = case["g"][0, :, 0]
    gc, gT = g, g[-1]
    from ..forward_cases import bits_to_f32

    q, k = bits_to_f32(case["q"])[0, :, 0], bits_to_f32(case["k"])[0, :, 0]
    mqk, inv, past = intra_products(q, k, gc, gT, case["beta_values"][0, :, 0], 16, case["scale"])
    assert not past
    np.testing.assert_allclose(mqk, np.tril(case["Aqk"][0, :, 0, :16]), rtol=0, atol=2e-3)
    np.testing.assert_allclose(inv, case["Akk"][0, :, 0, :16], rtol=0, atol=2e-3)
    np.testing.assert_array_equal(np.triu(inv, 1), 0.0)
    np.testing.assert_array_equal(np.diag(inv), 1.0)


def test_the_trained_layer_gate_matches_float64():
    pytest.importorskip("torch", reason="the trained-layer gate recipe draws with torch")
    from kernel.tools.trained_layer_gate import trained_layer_gate

    gate = trained_layer_gate(None, None, 2, 2, lengths=RAGGED + [300], seed=3, hidden=256)["g"].float().numpy()
    case = make_case(lengths=RAGGED + [300], H=2, seed=5, gate=gate)
    out = emulate(case)
    assert out["pairwise_tiles"] > 0, "the recipe should decay some tile past fp32's range"
    _check(case, out, "trained-layer gate")


def test_a_tile_within_fp32s_range_but_past_the_span_limit_takes_the_pairwise_products():
    # a tile decayed by 2^-124 at its last token: R1's factors stay normal (2^124 < 2^126), but Kr =
    # k 2^-124 of its other rows is flushed to zero (-ftz=true) where |k| < 1/4. At fp32's limit of 126
    # the factorised products lose Mqk's and Akk's entries among those rows; at kernel.shapes' they do not
    from kernel.shapes import SPAN_LIMIT

    assert SPAN_LIMIT == 110.0
    case = make_case(lengths=RAGGED, H=2, seed=4, edge_of_range=True)
    out = emulate(case)
    assert out["pairwise_tiles"] == 1
    _check(case, out, "a tile decayed by 2^-124 at its last token")
    flushed = emulate(case, span_limit=126.0)
    assert flushed["pairwise_tiles"] == 0
    m = case["blocks"]
    assert rel(np.where(m, flushed["Aqk"], 0), np.where(m, case["Aqk"], 0)) > 5e-2
    assert rel(flushed["o"], case["o"]) > 5e-2
