"""The chain's step lane by lane on the CPU, what Kernel S's and the forward's kernel/*/cuda tests share:
shared-memory images with the .cu's strides, the accumulators and A fragments as the .cu holds them, and
kda_chain::step (kernel/forward_states/cuda/forward_states_chain.cuh) through ptx_lab's exact CPU model
of the instructions. Every address is the one the .cu computes from X4Lane."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import acc_to_a_two_parts, x4_lane_row_col

from .forward_states_cases import bf16

D = 128
# row strides (elements): Kd, Kr, Qd, Qe [16][136]; INV, Mqk [16][24]; the staging tile [128][24]
OP_STRIDE, BLK_STRIDE, SNAP_STRIDE = D + 8, 16 + 8, 16 + 8
LANE = np.arange(32)
GR, TQ = LANE // 4, LANE % 4
ROWS_FIRST, COLS_FIRST = x4_lane_row_col("rows_first"), x4_lane_row_col("cols_first")


def image(tile, stride: int) -> np.ndarray:
    """bf16 tile [rows][cols] -> byte image with rows `stride` elements apart."""
    rows, cols = tile.shape
    padded = np.zeros((rows, stride), dtype=np.uint16)
    padded[:, :cols] = bf16(tile).astype(np.float32).view(np.uint32) >> 16
    return padded.reshape(-1).view(np.uint8).copy()


def addr(order, row0: int, col0: int, stride: int) -> np.ndarray:
    """Each lane's byte address of an x4 ldmatrix / stmatrix at (row0, col0), lanes in ``order``."""
    return 2 * ((row0 + order[:, 0]) * stride + col0 + order[:, 1])


def acc_of(Mt, ntiles: int = 16) -> np.ndarray:
    """A [16 x 8 ntiles] matrix as the .cu's accumulators acc[ntiles][4] per lane."""
    acc = np.zeros((32, ntiles, 4), dtype=np.float32)
    for nt in range(ntiles):
        c0 = 8 * nt + 2 * TQ
        acc[:, nt] = np.stack([Mt[GR, c0], Mt[GR, c0 + 1], Mt[GR + 8, c0], Mt[GR + 8, c0 + 1]], axis=1)
    return acc


def pack_a(lo, hi) -> np.ndarray:
    """Two adjacent n-tiles' accumulators packed pairwise to bf16: one k-step's A fragment."""
    return np.stack([model.pack_bf16x2(lo[:, 0], lo[:, 1]), model.pack_bf16x2(lo[:, 2], lo[:, 3]),
                     model.pack_bf16x2(hi[:, 0], hi[:, 1]), model.pack_bf16x2(hi[:, 2], hi[:, 3])],
                    axis=1).astype(np.uint32)


def mma(a, b, c) -> np.ndarray:
    return model.mma_m16n8k16(a, b, c.astype(np.float32), "bfloat16")


def chain_step(acc, kd_img, kr_img, inv_img, v, beta, gamma, g6_split: int, *, staging=None,
               each_k_step: Callable = lambda ks, a: None):
    """kda_chain::step on one warp's accumulators ``acc`` (updated in place: S^T <- gamma S^T + U^T Kr):
    P^T = S^T Kd^T in g6_split accumulator pairs (k-step ks into pair ks % g6_split, then the pairwise
    sums), each_k_step(ks, a) on every k-step's A fragment, W^T = beta (v^T - P^T), U^T = W^T INV^T with W^T
    in two bf16 parts (the rest's product first).
    Where ``staging`` (a byte image) is given, S is staged there by stmatrix .trans of the same A
    fragments. Returns (U^T's A fragment, the staging image)."""
    pp = np.zeros((g6_split, 2, 32, 4), np.float32)
    for ks in range(8):
        a = pack_a(acc[:, 2 * ks], acc[:, 2 * ks + 1])
        if staging is not None:
            staging = model.stmatrix(staging, addr(COLS_FIRST, 16 * ks, 0, SNAP_STRIDE), a, trans=True)
        b = model.ldmatrix(kd_img, addr(COLS_FIRST, 0, 16 * ks, OP_STRIDE), 4, trans=False)
        q = pp[ks % g6_split]
        q[0], q[1] = mma(a, b[:, :2], q[0]), mma(a, b[:, 2:], q[1])
        each_k_step(ks, a)
    w_ = 1
    while w_ < g6_split:
        for sp in range(0, g6_split, 2 * w_):
            pp[sp] += pp[sp + w_]
        w_ *= 2
    p = [pp[0, 0], pp[0, 1]]
    # W^T = beta (v^T - P^T)
    w = []
    for nt2 in range(2):
        c0 = 8 * nt2 + 2 * TQ
        w.append(np.stack([beta[c0] * (v[c0, GR] - p[nt2][:, 0]), beta[c0 + 1] * (v[c0 + 1, GR] - p[nt2][:, 1]),
                           beta[c0] * (v[c0, GR + 8] - p[nt2][:, 2]),
                           beta[c0 + 1] * (v[c0 + 1, GR + 8] - p[nt2][:, 3])], axis=1).astype(np.float32))
    # U^T = W^T INV^T, W^T in two bf16 parts, the rest first
    hi, lo = acc_to_a_two_parts(w[0], w[1])
    b = model.ldmatrix(inv_img, addr(COLS_FIRST, 0, 0, BLK_STRIDE), 4, trans=False)
    zero = np.zeros((32, 4), np.float32)
    u = [mma(lo, b[:, :2], zero), mma(lo, b[:, 2:], zero)]
    u = [mma(hi, b[:, :2], u[0]), mma(hi, b[:, 2:], u[1])]
    # S^T <- gamma S^T + U^T Kr
    ua = pack_a(u[0], u[1])
    for j in range(8):
        b = model.ldmatrix(kr_img, addr(ROWS_FIRST, 0, 16 * j, OP_STRIDE), 4, trans=True)
        for half in range(2):
            nt = 2 * j + half
            gm = gamma[8 * nt + 2 * TQ], gamma[8 * nt + 2 * TQ + 1]
            s = acc[:, nt] * np.stack([gm[0], gm[1], gm[0], gm[1]], axis=1)
            acc[:, nt] = mma(ua, b[:, 2 * half:2 * half + 2], s)
    return ua, staging
