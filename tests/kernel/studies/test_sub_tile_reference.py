"""kernel.studies.sub_tile_reference: the hierarchy of references holds a tile's gated products to
fp32 rounding for any gate, today's tile-end factorisation fails past fp32's range and is the
hierarchy itself within it, and the depth and MMA counts of hand-checked plans."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from kernel.studies.sub_tile_reference import cases
from kernel.studies.sub_tile_reference import hierarchy as h
from kernel.studies.sub_tile_reference.__main__ import main
from kernel.tools.trained_layer_gate import TILE_DECAY_FLOOR

K = 128
L = 16
SYNTHETIC = cases.synthetic(K)
PAST = ("one channel 2^-200", "one channel 2^-1000", f"token {cases.HUGE_GATE_TOKEN} gate {cases.HUGE_GATE:g}")
IN_RANGE = ("gates exactly 0", "one channel 2^-120")


def _inputs(seed: int = 0):
    return cases.tile_inputs(K, np.random.default_rng(seed))


def _args(q, k, dM):
    a = (np.float32(K ** -0.5) * q).astype(np.float32)
    return {"Mqk": (a, k), "Akk": (k, k), "dMqk Kr": (dM, k), "dMqk^T Qe": (dM, a)}


def test_the_limit_is_the_tile_floor_the_product_checks():
    assert h.SPAN_LIMIT == pytest.approx(-TILE_DECAY_FLOOR / math.log(2.0), abs=1e-12)


def test_the_oracle_is_the_pairwise_sum():
    rng = np.random.default_rng(3)
    n, c = 4, 3
    a, b = rng.standard_normal((2, n, c))
    dM = rng.standard_normal((n, n))
    gc = np.cumsum(-rng.uniform(0, 3, (n, c)), axis=0)
    e = lambda i, j, ch: 2.0 ** (gc[i, ch] - gc[j, ch])   # noqa: E731
    P = [[sum(a[i, x] * b[j, x] * e(i, j, x) for x in range(c)) if j < i else 0.0 for j in range(n)] for i in range(n)]
    R = [[sum(dM[i, j] * b[j, x] * e(i, j, x) for j in range(i + 1)) for x in range(c)] for i in range(n)]
    T = [[sum(dM[i, j] * a[i, x] * e(i, j, x) for i in range(j, n)) for x in range(c)] for j in range(n)]
    np.testing.assert_allclose(h.pair_exact(a, b, gc), P, rtol=1e-14, atol=0)
    np.testing.assert_allclose(h.left_exact(dM, b, gc), R, rtol=1e-14, atol=0)
    np.testing.assert_allclose(h.right_exact(dM, a, gc), T, rtol=1e-14, atol=0)


@pytest.mark.parametrize("case", sorted(SYNTHETIC))
def test_the_hierarchy_holds_every_synthetic_gate_to_fp32_rounding(case):
    e = cases.evaluate(cases.tile_gc(SYNTHETIC[case]), *_inputs())
    for p in cases.PRODUCTS:
        # the bound: (n + 16 + 2 ln2 126) u times the terms' magnitudes (hierarchy.error_bound)
        assert e[p]["hierarchy"] <= e[p]["bound"], (p, e[p])
        # and against the sum itself, a few 1e-7 K (the magnitudes exceed the sum about 6x here)
        assert e[p]["hierarchy"] < 3e-7 * K, (p, e[p])


@pytest.mark.parametrize("case", PAST)
def test_todays_factorisation_fails_past_the_range(case):
    e = cases.evaluate(cases.tile_gc(SYNTHETIC[case]), *_inputs())
    assert e["depth"] > 0
    for p in cases.PRODUCTS:
        assert not np.isfinite(e[p]["today"]), (p, e[p])


@pytest.mark.parametrize("case", IN_RANGE)
def test_in_range_the_hierarchy_is_todays_factorisation(case):
    gc = cases.tile_gc(SYNTHETIC[case]).astype(np.float32)
    blocks = h.plan(gc)
    assert blocks == h.today(L) and h.depth(blocks) == 0
    for name, (fp32, _, _, _) in cases.PRODUCTS.items():
        x, y = _args(*_inputs())[name]
        got = fp32(x, y, gc, blocks)
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, fp32(x, y, gc, h.today(L)))


def test_the_off_diagonal_blocks_need_their_own_reference():
    """The halving alone does not do it: the same blocks all about the tile's end overflow."""
    gc = cases.tile_gc(SYNTHETIC["one channel 2^-200"]).astype(np.float32)
    blocks = h.plan(gc)
    at_end = [b._replace(ref=L - 1) for b in blocks]
    for name, (fp32, _, _, _) in cases.PRODUCTS.items():
        x, y = _args(*_inputs())[name]
        assert np.all(np.isfinite(fp32(x, y, gc, blocks)))
        assert not np.all(np.isfinite(fp32(x, y, gc, at_end))), name


@pytest.fixture(scope="module")
def trained_8x():
    pytest.importorskip("torch", reason="the trained-layer gate is drawn with torch (an optional dependency)")
    return cases.tile_gc(cases.trained_layer_tiles(1024, 4, 8.0))   # 256 tiles, about 60% past the limit


def test_the_trained_layer_recipe_at_8x(trained_8x):
    gc = trained_8x
    d = cases.depths(gc.astype(np.float32))
    assert 0.3 < (d > 0).mean() < 0.9 and d.max() >= 3
    rng = np.random.default_rng(1)
    past = np.flatnonzero(d > 0)[:16]
    inside = np.flatnonzero(d == 0)[:4]
    for t in np.concatenate([past, inside]):
        e = cases.evaluate(gc[t], *cases.tile_inputs(K, rng))
        span = (gc[t, 0] - gc[t, -1]).max()
        for p in cases.PRODUCTS:
            assert e[p]["hierarchy"] <= e[p]["bound"], (t, p, e[p])
            if e["depth"] == 0:
                assert e[p]["today"] == e[p]["hierarchy"], (t, p)
        if span > 128:      # 2^(gc_0 - gT) overflows: the backward's row 0 is inf x 0
            assert not np.isfinite(e["dMqk Kr"]["today"]) and not np.isfinite(e["dMqk^T Qe"]["today"]), t


def test_the_vectorised_depth_is_the_plans(trained_8x):
    gc = trained_8x.astype(np.float32)
    d = cases.depths(gc)
    assert [h.depth(h.plan(g)) for g in gc] == d.tolist()
    grouped = cases.by_group(gc)
    assert grouped.shape == (gc.shape[0] * K // 16, L, 16)
    np.testing.assert_array_equal(grouped[3], gc[0][:, 48:64])   # tile 0, channel group 3


def test_a_halving_plan_by_hand():
    """One channel decaying 2^-12.5 a token: the tile spans 187.5 > 126, each half 87.5."""
    gc = cases.tile_gc(SYNTHETIC["one channel 2^-200"]).astype(np.float32)
    blocks = h.plan(gc)
    assert blocks == [h.Block(8, 16, 0, 8, 7), h.Block(0, 8, 0, 8, 7), h.Block(8, 16, 8, 16, 15)]
    assert h.depth(blocks) == 1
    c = h.mma_counts(blocks, L)
    # one m16 x k16 per block on G14-G17 (today 1); refs 7 and 15; Mqk per block: 8x8 blocks are
    # one m16 x n8 each (today 16x16 = two n8); packed per reference: ref 7 owns columns 0-7, ref 15 8-15
    assert (c["blocks"], c["channels_by_block"], c["channels_by_ref"], c["tokens_by_block"], c["tokens_by_ref"]) \
        == (3, 3, 2, 3, 2)
    assert (c["channels_by_ref_ratio"], c["tokens_by_block_ratio"], c["tokens_by_ref_ratio"]) == (2.0, 1.5, 1.0)


def test_a_single_huge_gate_by_hand():
    """Token 5's gate splits every block that holds it below its first row: 16, 0-8, 4-8, 4-6."""
    gc = cases.tile_gc(SYNTHETIC[PAST[2]]).astype(np.float32)
    blocks = h.plan(gc)
    assert blocks == [h.Block(8, 16, 0, 8, 7), h.Block(4, 8, 0, 4, 3), h.Block(0, 4, 0, 4, 3),
                      h.Block(6, 8, 4, 6, 5), h.Block(5, 6, 4, 5, 4), h.Block(4, 5, 4, 5, 4),
                      h.Block(5, 6, 5, 6, 5), h.Block(6, 8, 6, 8, 7), h.Block(8, 16, 8, 16, 15)]
    assert h.depth(blocks) == 4
    c = h.mma_counts(blocks, L)
    # the two single rows hold no gate; references 7, 3, 5, 4, 15
    assert (c["blocks"], c["channels_by_ref"], c["tokens_by_block"], c["tokens_by_ref"]) == (7, 5, 7, 5)


def test_costs_over_a_batch_by_hand():
    names = ("gates exactly 0", "one channel 2^-200", "one channel 2^-1000", PAST[2])
    c = cases.costs(np.stack([cases.tile_gc(SYNTHETIC[n]) for n in names]))
    np.testing.assert_array_equal(c["depth_fraction"], [0.25, 0.25, 0, 0.25, 0.25])
    # references: 1, 2, 8 (eight 2-row leaves), 5
    assert c["channels_by_ref_ratio"] == ((1 + 2 + 8 + 5) / 4, 8.0)
    # channel 0's group alone in the one-channel cases; every group at the huge gate
    assert c["group_past"] == (0 + 1 + 1 + 8) / 32
    assert c["group_channels_by_ref"] == ((8 * 1 + (7 + 2) + (7 + 8) + 8 * 5) / 32, 8.0)


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(ValueError, match="gc must be"):
        h.plan(np.zeros(16))
    with pytest.raises(TypeError, match="fp32"):
        h.pair(np.zeros((L, K)), np.zeros((L, K)), np.zeros((L, K)), h.today(L))
    with pytest.raises(SystemExit) as exc:
        main(["--T", "100"])
    assert exc.value.code == 2 and "multiple of 16" in capsys.readouterr().err


def test_main_prints_both_tables(capsys):
    pytest.importorskip("torch", reason="its trained-layer rows draw the gate with torch (an optional dependency)")
    assert main(["--T", "64", "--heads", "2", "--eval", "2"]) == 0
    out = capsys.readouterr().out
    assert "| trained-layer 8x, in range (largest spans) | 2 |" in out
    assert f"| token {cases.HUGE_GATE_TOKEN} gate {cases.HUGE_GATE:g} | 1 | 4 | 1 |" in out
    assert "| one channel 2^-200 | 1 | 0 | 1 | 0 | 0 | 0 | 2x (max 2x) |" in out


def test_main_without_torch_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch raises ImportError
    assert main(["--T", "64", "--heads", "2", "--eval", "2"]) == 2
    assert "draws the trained-layer gate with torch" in capsys.readouterr().err
