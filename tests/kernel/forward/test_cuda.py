"""kernel/forward/cuda on the CPU: one consumer warp's tile step and a producer warp's intra-tile product,
their addresses and registers lane by lane through ptx_lab's exact CPU model of the instructions, against
the tile algebra (kernel.reference.kda._tile_forward) with bf16 at the same points."""
from __future__ import annotations

import numpy as np
import pytest

from ptx_lab import model

from ..chain_fragments import (BLK_STRIDE, COLS_FIRST, D, GR, OP_STRIDE, ROWS_FIRST, SNAP_STRIDE, TQ, acc_of, addr,
                               bf16, chain_step, image, mma, pack_a)
from ..forward_states_cases import two_parts


@pytest.mark.parametrize("g6_split", [1, 2, 4])
def test_the_consumer_tile_step_computes_the_tile_algebra_and_o(g6_split):
    rng = np.random.default_rng(7)
    S = rng.standard_normal((D, 16)).astype(np.float32)        # this warp's 16 v columns of S [K, V]
    Kd, Kr, Qd = (bf16(rng.standard_normal((16, D))) for _ in range(3))
    v = bf16(rng.standard_normal((16, 16)))                     # [token][v]
    beta = rng.uniform(0.2, 1.0, 16).astype(np.float32)
    INV = bf16(np.tril(rng.standard_normal((16, 16))))
    Mqk = bf16(np.tril(rng.standard_normal((16, 16))))
    gamma = rng.uniform(0.3, 1.0, D).astype(np.float32)
    acc = acc_of(S.T, 16)
    qd_img = image(Qd, OP_STRIDE)

    # Kernel S's chain step, F1 beside each G6 k-step from the same A fragment
    out = np.zeros((2, 32, 4), np.float32)

    def f1(ks, a):
        bq = model.ldmatrix(qd_img, addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        out[0], out[1] = mma(a, bq[:, :2], out[0]), mma(a, bq[:, 2:], out[1])

    ua, _ = chain_step(acc, image(Kd, OP_STRIDE), image(Kr, OP_STRIDE), image(INV, BLK_STRIDE), v, beta, gamma,
                       g6_split, each_k_step=f1)
    # F2 from U's A fragment; o staged by stmatrix .trans and read back as the .cu's stores read it
    b = model.ldmatrix(image(Mqk, BLK_STRIDE), addr(COLS_FIRST, 0, 0, BLK_STRIDE), 4, trans=False)
    out[0], out[1] = mma(ua, b[:, :2], out[0]), mma(ua, b[:, 2:], out[1])
    staging = np.zeros(D * SNAP_STRIDE * 2, dtype=np.uint8)
    staging = model.stmatrix(staging, addr(COLS_FIRST, 0, 0, SNAP_STRIDE), pack_a(out[0], out[1]), trans=True)
    o_rows = (staging.view(np.uint16).reshape(D, SNAP_STRIDE)[:16, :16].astype(np.uint32) << 16).view(np.float32)

    # the same tile in matrix algebra, with bf16 at the same points
    f64 = np.float64
    S0 = bf16(S).astype(f64)
    W = beta[:, None] * (v - Kd.astype(f64) @ S0)
    U = bf16(INV.astype(f64) @ np.add(*two_parts(W)).astype(f64)).astype(f64)   # W in two bf16 parts
    S1 = gamma[:, None] * S + Kr.T.astype(f64) @ U
    o = Qd.astype(f64) @ S0 + Mqk.astype(f64) @ U
    # the model sums in float64 like the algebra; a wrong fragment order or .trans gives O(1)
    got = acc_of(S1.T, 16)
    assert np.linalg.norm(acc - got) <= 1e-6 * np.linalg.norm(got)
    np.testing.assert_array_equal(o_rows, bf16(o))              # o [token][v], rounded once


@pytest.mark.parametrize("which", ["Mqk", "Lkk"])
def test_a_producer_warps_tile_product_lands_on_its_entries(which):
    # tile_product: A = Qe (or Ke) rows first, B = Kr^T cols first; each accumulator element goes to
    # (i, j) = (gr + 8 (e / 2), 8 nt + 2t + e % 2), masked as build_mqk / build_inv mask it
    rng = np.random.default_rng(3)
    X, Kr = bf16(rng.standard_normal((16, D))), bf16(rng.standard_normal((16, D)))
    diag = rng.standard_normal(16).astype(np.float32)
    beta = rng.uniform(0.2, 1.0, 16).astype(np.float32)
    x_img, kr_img = image(X, OP_STRIDE), image(Kr, OP_STRIDE)
    acc = np.zeros((2, 32, 4), np.float32)
    for ks in range(8):
        a = model.ldmatrix(x_img, addr(ROWS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        b = model.ldmatrix(kr_img, addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        acc[0], acc[1] = mma(a, b[:, :2], acc[0]), mma(a, b[:, 2:], acc[1])
    got = np.full((16, 16), np.nan, dtype=np.float32)
    for nt in range(2):
        for e in range(4):
            i, j = GR + 8 * (e // 2), 8 * nt + 2 * TQ + e % 2
            val = acc[nt][:, e]
            if which == "Mqk":
                got[i, j] = np.where(j < i, val, np.where(j == i, diag[i], 0.0))
            else:
                got[i, j] = np.where(j < i, beta[i] * val, 0.0)
    prod = X.astype(np.float64) @ Kr.T.astype(np.float64)
    strict = np.tril(np.ones((16, 16), dtype=bool), -1)
    want = np.where(strict, prod, 0.0)
    want = want + np.diag(diag) if which == "Mqk" else beta[:, None] * want
    assert not np.isnan(got).any(), "an entry is not written"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
