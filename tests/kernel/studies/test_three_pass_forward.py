"""The three-pass forward's model (kernel/studies/three_pass_forward): its pieces against float64, and the
whole against float64 beside the one pass's model, on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.studies.three_pass_forward.__main__ import compare, parse_args

from ..three_pass_model import BT, C, case_of, chunk_products, unit_lower_inverse

from ..forward.test_model import BOUNDS


def test_the_blocked_inverse_is_the_inverse():
    rng = np.random.default_rng(0)
    lkk = np.tril(rng.standard_normal((BT, BT)) * 0.1, -1).astype(np.float32)
    want = np.linalg.inv(np.eye(BT) + lkk.astype(np.float64))
    got = unit_lower_inverse(lkk)
    assert np.allclose(np.triu(got, 1), 0) and np.allclose(np.diag(got), 1)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6


@pytest.mark.parametrize("span", [20.0, 400.0], ids=["factorised", "a block past the span limit"])
def test_the_chunks_products_are_the_pairwise_sums(span):
    # gates falling by `span` (log2) over the chunk: at 400 every diagonal block spans ~100, one past 110
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((BT, 128)).astype(np.float32) / 11.3 for _ in range(2))
    steps = rng.uniform(0, 2 * span / BT, (BT, 128))
    steps[3 * C:, 0] *= 1.2                                   # the last block's first channel spans the most
    gc = -np.cumsum(steps, axis=0).astype(np.float32)
    beta = rng.uniform(0, 1, BT).astype(np.float32)
    aqk, akk, pairwise = chunk_products(q, k, gc, beta, BT, 0.5)
    d = np.exp2(np.minimum(gc[:, None, :].astype(np.float64) - gc[None, :, :], 0.0))   # [i, j, d], i >= j
    low = np.tril(np.ones((BT, BT), dtype=bool))
    want_q = np.where(low, 0.5 * np.einsum("id,jd,ijd->ij", q, k, d), 0)
    want_k = np.where(np.tril(low, -1), beta[:, None] * np.einsum("id,jd,ijd->ij", k, k, d), 0)
    for got, want in ((aqk, want_q), (akk, want_k)):
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2   # bf16 operands
    assert (pairwise > 0) == (span > 200)


@pytest.mark.parametrize("recipe", ["ragged", "past fp32's range", "trained-layer gate"])
def test_three_passes_keep_the_one_pass_precision(recipe):
    # measured (README): every output within 1.17x the one pass's error, within 1.03x with u in fp32, and the
    # pairwise blocks where the one pass's tiles are
    pytest.importorskip("torch")   # the trained-layer gate is drawn with torch
    r = compare(case_of(recipe))
    for name in ("o", "final", "states"):
        one, three, three_u32 = r[name]
        assert three < 1.25 * one and three < BOUNDS[name], (name, one, three)
        assert three_u32 < 1.06 * one and three_u32 < three, (name, one, three_u32)
    assert r["pairwise"][0] == r["pairwise"][1]


def test_unknown_recipes_are_named():
    assert parse_args(["--recipes", "long"]).recipes == ["long"]
    with pytest.raises(SystemExit):
        parse_args(["--recipes", "long,short"])
