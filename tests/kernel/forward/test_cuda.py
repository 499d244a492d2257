"""kernel/forward/cuda on the CPU: one consumer warp's tile step and a producer warp's intra-tile product,
their addresses and registers lane by lane through ptx_lab's exact CPU model of the instructions, against
the tile algebra (kernel.reference.kda._tile_forward) with bf16 at the same points."""
from __future__ import annotations

import numpy as np
import pytest

from ptx_lab import model
from ptx_lab.fragments import x4_lane_row_col

from ..forward_cases import bf16

D = 128
# Shared-memory images with the .cu's strides (elements): Kd, Kr, Qd, Qe [16][136], INV, Mqk [16][24], the
# staging tile [128][24]; every address below is the one the .cu computes from X4Lane.
OP_STRIDE, BLK_STRIDE, SNAP_STRIDE = D + 8, 16 + 8, 16 + 8
LANE = np.arange(32)
GR, TQ = LANE // 4, LANE % 4
ROWS_FIRST, COLS_FIRST = x4_lane_row_col("rows_first"), x4_lane_row_col("cols_first")


def _image(tile, stride):
    """bf16 tile [rows][cols] -> byte image with rows `stride` elements apart."""
    rows, cols = tile.shape
    padded = np.zeros((rows, stride), dtype=np.uint16)
    padded[:, :cols] = bf16(tile).astype(np.float32).view(np.uint32) >> 16
    return padded.reshape(-1).view(np.uint8).copy()


def _addr(order, row0, col0, stride):
    return 2 * ((row0 + order[:, 0]) * stride + col0 + order[:, 1])


def _acc_of(Mt, ntiles):
    """A [16 x 8 ntiles] matrix as the .cu's accumulators acc[ntiles][4] per lane."""
    acc = np.zeros((32, ntiles, 4), dtype=np.float32)
    for nt in range(ntiles):
        c0 = 8 * nt + 2 * TQ
        acc[:, nt] = np.stack([Mt[GR, c0], Mt[GR, c0 + 1], Mt[GR + 8, c0], Mt[GR + 8, c0 + 1]], axis=1)
    return acc


def _pack_a(lo, hi):
    return np.stack([model.pack_bf16x2(lo[:, 0], lo[:, 1]), model.pack_bf16x2(lo[:, 2], lo[:, 3]),
                     model.pack_bf16x2(hi[:, 0], hi[:, 1]), model.pack_bf16x2(hi[:, 2], hi[:, 3])],
                    axis=1).astype(np.uint32)


def _mma(a, b, c):
    return model.mma_m16n8k16(a, b, c.astype(np.float32), "bfloat16")


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
    acc = _acc_of(S.T, 16)
    kd_img, kr_img, qd_img = _image(Kd, OP_STRIDE), _image(Kr, OP_STRIDE), _image(Qd, OP_STRIDE)
    inv_img, mqk_img = _image(INV, BLK_STRIDE), _image(Mqk, BLK_STRIDE)

    # G6 in g6_split accumulator pairs, and F1 beside it from the same A fragments
    pp = np.zeros((g6_split, 2, 32, 4), np.float32)
    out = np.zeros((2, 32, 4), np.float32)
    for ks in range(8):
        a = _pack_a(acc[:, 2 * ks], acc[:, 2 * ks + 1])
        b = model.ldmatrix(kd_img, _addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        q = pp[ks % g6_split]
        q[0], q[1] = _mma(a, b[:, :2], q[0]), _mma(a, b[:, 2:], q[1])
        bq = model.ldmatrix(qd_img, _addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        out[0], out[1] = _mma(a, bq[:, :2], out[0]), _mma(a, bq[:, 2:], out[1])
    w_ = 1
    while w_ < g6_split:
        for sp in range(0, g6_split, 2 * w_):
            pp[sp] += pp[sp + w_]
        w_ *= 2
    p = [pp[0, 0], pp[0, 1]]
    w = []
    for nt2 in range(2):
        c0 = 8 * nt2 + 2 * TQ
        w.append(np.stack([beta[c0] * (v[c0, GR] - p[nt2][:, 0]), beta[c0 + 1] * (v[c0 + 1, GR] - p[nt2][:, 1]),
                           beta[c0] * (v[c0, GR + 8] - p[nt2][:, 2]),
                           beta[c0 + 1] * (v[c0 + 1, GR + 8] - p[nt2][:, 3])], axis=1).astype(np.float32))
    a = _pack_a(w[0], w[1])
    b = model.ldmatrix(inv_img, _addr(COLS_FIRST, 0, 0, BLK_STRIDE), 4, trans=False)
    zero = np.zeros((32, 4), np.float32)
    u = [_mma(a, b[:, :2], zero), _mma(a, b[:, 2:], zero)]
    # G8, then F2 from U's A fragment; o staged by stmatrix .trans and read back as the .cu's stores read it
    a = _pack_a(u[0], u[1])
    for j in range(8):
        b = model.ldmatrix(kr_img, _addr(ROWS_FIRST, 0, 16 * j, OP_STRIDE), 4, trans=True)
        for half in range(2):
            nt = 2 * j + half
            gm = gamma[8 * nt + 2 * TQ], gamma[8 * nt + 2 * TQ + 1]
            s = acc[:, nt] * np.stack([gm[0], gm[1], gm[0], gm[1]], axis=1)
            acc[:, nt] = _mma(a, b[:, 2 * half:2 * half + 2], s)
    b = model.ldmatrix(mqk_img, _addr(COLS_FIRST, 0, 0, BLK_STRIDE), 4, trans=False)
    out[0], out[1] = _mma(a, b[:, :2], out[0]), _mma(a, b[:, 2:], out[1])
    staging = np.zeros(D * SNAP_STRIDE * 2, dtype=np.uint8)
    staging = model.stmatrix(staging, _addr(COLS_FIRST, 0, 0, SNAP_STRIDE), _pack_a(out[0], out[1]), trans=True)
    o_rows = (staging.view(np.uint16).reshape(D, SNAP_STRIDE)[:16, :16].astype(np.uint32) << 16).view(np.float32)

    # the same tile in matrix algebra, with bf16 at the same points
    f64 = np.float64
    S0 = bf16(S).astype(f64)
    W = beta[:, None] * (v - Kd.astype(f64) @ S0)
    U = bf16(INV.astype(f64) @ bf16(W).astype(f64)).astype(f64)
    S1 = gamma[:, None] * S + Kr.T.astype(f64) @ U
    o = Qd.astype(f64) @ S0 + Mqk.astype(f64) @ U
    # the model sums in float64 like the algebra; a wrong fragment order or .trans gives O(1)
    got = _acc_of(S1.T, 16)
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
    x_img, kr_img = _image(X, OP_STRIDE), _image(Kr, OP_STRIDE)
    acc = np.zeros((2, 32, 4), np.float32)
    for ks in range(8):
        a = model.ldmatrix(x_img, _addr(ROWS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        b = model.ldmatrix(kr_img, _addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        acc[0], acc[1] = _mma(a, b[:, :2], acc[0]), _mma(a, b[:, 2:], acc[1])
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
