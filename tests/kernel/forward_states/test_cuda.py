"""kernel/forward_states/cuda on the CPU: the tile step's fragment layouts run through ptx_lab's exact
CPU model of the instructions, and every variant's compile (where nvcc is on PATH)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kernel import forward_states as fs
from ptx_lab import model
from ptx_lab.fragments import x4_lane_row_col

from ..forward_states_cases import bf16

D = 128


# ----------------------------------------------------------------------------
# one warp's tile step through ptx_lab.model: the .cu's addresses and registers, lane by lane
# ----------------------------------------------------------------------------
# Shared-memory images with the .cu's strides (elements): Kd, Kr [16][136], INV [16][24], the
# staging tile [128][24]; every address below is the one the .cu computes from X4Lane.
OP_STRIDE, INV_STRIDE, SNAP_STRIDE = D + 8, 16 + 8, 16 + 8
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
    rc = order
    return 2 * ((row0 + rc[:, 0]) * stride + col0 + rc[:, 1])


def _acc_of(St):
    """S^T [16 v x 128 k] as the .cu's acc[16][4] per lane."""
    acc = np.zeros((32, 16, 4), dtype=np.float32)
    for nt in range(16):
        k0 = 8 * nt + 2 * TQ
        acc[:, nt] = np.stack([St[GR, k0], St[GR, k0 + 1], St[GR + 8, k0], St[GR + 8, k0 + 1]], axis=1)
    return acc


def _pack_a(lo, hi):
    return np.stack([model.pack_bf16x2(lo[:, 0], lo[:, 1]), model.pack_bf16x2(lo[:, 2], lo[:, 3]),
                     model.pack_bf16x2(hi[:, 0], hi[:, 1]), model.pack_bf16x2(hi[:, 2], hi[:, 3])],
                    axis=1).astype(np.uint32)


@pytest.mark.parametrize("g6_split", fs.G6_SPLITS)
def test_the_tile_step_fragments_compute_the_tile_algebra(g6_split):
    rng = np.random.default_rng(7)
    S = rng.standard_normal((D, 16)).astype(np.float32)        # this warp's 16 v columns of S [K, V]
    Kd, Kr = bf16(rng.standard_normal((16, D))), bf16(rng.standard_normal((16, D)))
    v = bf16(rng.standard_normal((16, 16)))                     # [token][v]
    beta = rng.uniform(0.2, 1.0, 16).astype(np.float32)
    INV = bf16(np.tril(rng.standard_normal((16, 16))))
    gamma = rng.uniform(0.3, 1.0, D).astype(np.float32)
    acc = _acc_of(S.T)

    kd_img, kr_img = _image(Kd, OP_STRIDE), _image(Kr, OP_STRIDE)
    inv_img = _image(INV, INV_STRIDE)
    snap = np.zeros(D * SNAP_STRIDE * 2, dtype=np.uint8)
    # P^T = S^T Kd^T in g6_split accumulator pairs (k-step ks into pair ks % g6_split, then the
    # pairwise sums), and the snapshot's stmatrix .trans of the same A fragments
    pp = np.zeros((g6_split, 2, 32, 4), np.float32)
    for ks in range(8):
        a = _pack_a(acc[:, 2 * ks], acc[:, 2 * ks + 1])
        snap = model.stmatrix(snap, _addr(COLS_FIRST, 16 * ks, 0, SNAP_STRIDE), a, trans=True)
        b = model.ldmatrix(kd_img, _addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        q = pp[ks % g6_split]
        q[0] = model.mma_m16n8k16(a, b[:, :2], q[0], "bfloat16")
        q[1] = model.mma_m16n8k16(a, b[:, 2:], q[1], "bfloat16")
    w_ = 1
    while w_ < g6_split:
        for sp in range(0, g6_split, 2 * w_):
            pp[sp] += pp[sp + w_]
        w_ *= 2
    p = [pp[0, 0], pp[0, 1]]
    staged = (snap.view(np.uint16).reshape(D, SNAP_STRIDE)[:, :16].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(staged, bf16(S))             # the staging tile is S [k][v], rounded
    # W^T = beta (v^T - P^T)
    w = []
    for nt2 in range(2):
        c0 = 8 * nt2 + 2 * TQ
        w.append(np.stack([beta[c0] * (v[c0, GR] - p[nt2][:, 0]), beta[c0 + 1] * (v[c0 + 1, GR] - p[nt2][:, 1]),
                           beta[c0] * (v[c0, GR + 8] - p[nt2][:, 2]),
                           beta[c0 + 1] * (v[c0 + 1, GR + 8] - p[nt2][:, 3])], axis=1).astype(np.float32))
    # U^T = W^T INV^T
    a = _pack_a(w[0], w[1])
    b = model.ldmatrix(inv_img, _addr(COLS_FIRST, 0, 0, INV_STRIDE), 4, trans=False)
    zero = np.zeros((32, 4), np.float32)
    u = [model.mma_m16n8k16(a, b[:, :2], zero, "bfloat16"), model.mma_m16n8k16(a, b[:, 2:], zero, "bfloat16")]
    # S^T <- gamma S^T + U^T Kr
    a = _pack_a(u[0], u[1])
    for j in range(8):
        b = model.ldmatrix(kr_img, _addr(ROWS_FIRST, 0, 16 * j, OP_STRIDE), 4, trans=True)
        for half in range(2):
            nt = 2 * j + half
            gm = gamma[8 * nt + 2 * TQ], gamma[8 * nt + 2 * TQ + 1]
            s = acc[:, nt] * np.stack([gm[0], gm[1], gm[0], gm[1]], axis=1)
            acc[:, nt] = model.mma_m16n8k16(a, b[:, 2 * half:2 * half + 2], s.astype(np.float32), "bfloat16")

    # the same tile in matrix algebra, with bf16 at the same points
    f64 = np.float64
    P = Kd.astype(f64) @ bf16(S).astype(f64)                    # [token][v]
    W = beta[:, None] * (v - P)
    U = INV.astype(f64) @ bf16(W).astype(f64)
    S1 = gamma[:, None] * S + Kr.T.astype(f64) @ bf16(U).astype(f64)
    got = _acc_of(S1.T)
    # the model sums in float64 like the algebra: measured equal to the last fp32 bit (0.0 relative);
    # a wrong fragment order or .trans gives O(1) (a Kr read without .trans: 1.27)
    assert np.linalg.norm(acc - got) <= 1e-6 * np.linalg.norm(got)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_every_variant_compiles_without_spills_and_holds_its_instructions(tmp_path):
    # what `ptx-lab resources --check` (CI's section 4) judges, for Kernel S's variants alone
    from kernel.tools import resources

    for cfg in fs.all_variants():
        row = resources.compile_variant(fs.BUILD, cfg, tmp_path)
        assert "error" not in row, row.get("error")
        assert row["threads"] == cfg.threads and row["ctas_per_sm"] >= 1
        assert resources.problems(row) == [], (fs.BUILD.label(cfg), resources.problems(row))
        assert row["spill"] == 0 and row["stack"] == 0, row["log"]
        assert row["smem"] == cfg.smem_bytes, (cfg.name(), row["smem"], cfg.smem_bytes)   # Config's sum is the source's
        if row["sass"] is not None:   # the three products and the load: 16 + 2 + 16 HMMA, 8 + 1 + 8 LDSM
            assert (row["sass"]["HMMA"], row["sass"]["LDSM"], row["sass"]["STSM"], row["sass"]["MOVM"]) == (34, 17, 8, 0)
