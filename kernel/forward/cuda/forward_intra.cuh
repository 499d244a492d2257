// kernel/forward/cuda/forward_intra.cuh -- a tile's state-free products, built after R1 by two of the
// producer warps or by the product warps: Mqk = strict_tril(Qe Kr^T) + diag(s q . k) for F2, and INV = (I + diag(beta) Akk)^-1,
// Akk = strict_tril(Ke Kr^T), for G7; in training mode also written to FLA's Aqk and Akk layout.
//
// A tile whose gates span more than SPAN_LIMIT (kernel/shapes.cuh) in some channel has Qe overflow or Kr
// flushed below fp32's normal range, although every entry it forms is bounded: entry (i, j < i) pairs
// the rows through 2^(gc_i - gc_j) <= 1. There each entry's decay is formed pairwise in fp32 (Kernel
// B's way, kernel/token_gradients/cuda/token_gradients_pairwise.cuh), decided on the device per tile.
// Included by forward.cu after its configuration (namespace kf).
#pragma once
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "forward_layout.cuh"
#include "forward_solve.cuh"

namespace kf {

constexpr int LOWER = TILE_TOKENS * (TILE_TOKENS - 1) / 2;   // 120 entries strictly below the diagonal

// Entry e of the strict lower triangle, row by row: (1, 0), (2, 0), (2, 1), (3, 0), ...
__device__ __forceinline__ void lower_entry(int e, int& i, int& j) {
    i = 1;
#pragma unroll 1
    while ((i + 1) * i / 2 <= e) ++i;
    j = e - i * (i - 1) / 2;
}

// X Kr^T [16 x 16] in fp32 by mma (X = Qe or Ke of the scratch): acc[nt] holds columns 8 nt ..,
// c0 = [gr][8nt+2t], c1 = [gr][8nt+2t+1], c2 = [gr+8][8nt+2t], c3 = [gr+8][8nt+2t+1].
__device__ __forceinline__ void tile_product(float (&acc)[2][4], const u16 (*x)[OP_STRIDE], const Stage& st,
                                             int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
        u32 a[4], b[4];
        ldmatrix_x4(a, x4_addr_rows_first(&x[0][0], OP_STRIDE, 0, 16 * ks, lane));        // A = X
        ldmatrix_x4(b, x4_addr_cols_first(&st.kr[0][0], OP_STRIDE, 0, 16 * ks, lane));    // B = Kr^T
        const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_m16n8k16_bf16(acc[0], a, b0, acc[0]);
        mma_m16n8k16_bf16(acc[1], a, b1, acc[1]);
    }
}

// Pairwise: sum_d x_i[d] k_j[d] 2^(gc_i[d] - gc_j[d]) for a real row i > j, gc as R1 forms it: g - gbase from
// the chunk cumsum, or in the token-gate build (st.g each token's own gate, no gbase loaded) the tile's running
// sum, formed again here row by row from the first in R1's order (kda_gate::token_sums), so the same bits. The
// producers keep their sums in registers; this path is taken by the rare tile past SPAN_LIMIT alone.
__device__ __forceinline__ float pairwise_entry(const Stage& st, const u16 (*x)[HEAD_DIM], int i, int j) {
    float sum = 0.f;
#pragma unroll 4
    for (int d = 0; d < HEAD_DIM; ++d) {
        float f;
        if constexpr (TOKEN_GATE) {
            float run = 0.f, gj = 0.f;
#pragma unroll 1
            for (int r = 0; r <= i; ++r) {
                run = add_token_gate(run, st.g[r][d]);
                if (r == j) gj = run;
            }
            f = exp2f(run - gj);
        } else {
            const float b = st.gbase[0][d];
            f = exp2f((st.g[i][d] - b) - (st.g[j][d] - b));
        }
        sum += bf16_to_f32(x[i][d]) * bf16_to_f32(st.k[j][d]) * f;
    }
    return sum;
}

// Its 16 x 16 block (row stride BLK_STRIDE) to FLA's [tokens, HV, 64] layout at the tile's columns:
// rows < L, 32 bytes a row, one 16-byte half a lane.
__device__ __forceinline__ void store_block(u16* __restrict__ out, const u16 (*blk)[BLK_STRIDE], long long tok0,
                                           int L, int i, int HV, int h, int lane) {
    const int row = lane / 2, half = lane % 2;
    if (row < L)
        *reinterpret_cast<uint4*>(out + ((tok0 + row) * HV + h) * CHUNK_TOKENS + (i % TILES_PER_CHUNK) * TILE_TOKENS
                                  + 8 * half) = *reinterpret_cast<const uint4*>(&blk[row][8 * half]);
}

// Mqk of the tile into st.mqk (bf16, zero above the diagonal), by one warp.
__device__ __forceinline__ void build_mqk(Stage& st, const Scratch& sc, int parity, bool pairwise, int L, float s,
                                          int lane, const float* rq, const float* rk) {
    if (!pairwise) {
        float acc[2][4];
        tile_product(acc, sc.qe[parity], st, lane);
        const int gr = lane / 4, t = lane % 4;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = gr + 8 * (e / 2), j = 8 * nt + 2 * t + e % 2;
                const float val = j < i ? acc[nt][e] : (j == i ? st.diag[i] : 0.f);
                st.mqk[i][j] = f32_to_bf16(val);
            }
        return;
    }
#pragma unroll 1
    for (int e = lane; e < LOWER; e += 32) {
        int i, j;
        lower_entry(e, i, j);
        const float rows = QK_RSTD ? rq[i] * rk[j] : 1.f;   // the qk_rstd build's raw rows' rstd
        st.mqk[i][j] = f32_to_bf16(i < L ? s * pairwise_entry(st, st.q, i, j) * rows : 0.f);
    }
#pragma unroll 1
    for (int e = lane; e < TILE_TOKENS * TILE_TOKENS; e += 32) {
        const int i = e / TILE_TOKENS, j = e % TILE_TOKENS;
        if (j >= i) st.mqk[i][j] = f32_to_bf16(j == i ? st.diag[i] : 0.f);
    }
}

// INV of the tile into st.inv (bf16, zero above the diagonal), by one warp: Lkk = diag(beta)
// strict_tril(Akk) in fp32 to the scratch, then forward substitution, lane j < 16 solving column j
// in registers (forward_solve.cuh).
__device__ __forceinline__ void build_inv(Stage& st, Scratch& sc, int parity, bool pairwise, int L, int lane,
                                          const float* rk) {
    if (!pairwise) {
        float acc[2][4];
        tile_product(acc, sc.ke[parity], st, lane);
        const int gr = lane / 4, t = lane % 4;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = gr + 8 * (e / 2), j = 8 * nt + 2 * t + e % 2;
                if (j < i) sc.lkk[i][j] = st.beta[i] * acc[nt][e];
            }
    } else {
#pragma unroll 1
        for (int e = lane; e < LOWER; e += 32) {
            int i, j;
            lower_entry(e, i, j);
            const float rows = QK_RSTD ? rk[i] * rk[j] : 1.f;   // the qk_rstd build's raw rows' rstd
            sc.lkk[i][j] = i < L ? st.beta[i] * pairwise_entry(st, st.k, i, j) * rows : 0.f;
        }
    }
    __syncwarp();
    if (lane < TILE_TOKENS) {
        const int j = lane;
        float x[TILE_TOKENS];
        kda_solve::unit_lower_column(x, [&](int i, int m) { return sc.lkk[i][m]; }, j);
#pragma unroll
        for (int i = 0; i < TILE_TOKENS; ++i) st.inv[i][j] = f32_to_bf16(x[i]);
    }
    __syncwarp();   // the scratch's Lkk is read before the next tile's is written
}

// Tile i's products once R1 of its every row is in (its stage, and the scratch of its parity): warp
// MQK_WARP forms Mqk and stores Aqk's block, warp INV_WARP forms Akk and INV and stores Akk's block (one
// warp does both where they are the same); pw counts among the warps that form them, the producers or
// the product warps. Every warp reads the span flags of all producers: one row past SPAN_LIMIT takes
// the whole tile pairwise. The blocks go out from the CTA of the first v group alone (null: not written).
__device__ __forceinline__ void tile_products(Stage& st, Scratch& sc, int parity, int L, float scale, long long bos,
                                              int i, u16* __restrict__ aqk, u16* __restrict__ akk, int vg, int HV,
                                              int h, int pw, int lane, const float* rq, const float* rk) {
    if (pw == MQK_WARP || pw == INV_WARP) {
        bool pairwise = false;
#pragma unroll
        for (int w = 0; w < PRODUCERS; ++w) pairwise |= sc.past[parity][w] != 0;
        const long long tok0 = bos + (long long)TILE_TOKENS * i;
        if (pw == MQK_WARP) {
            build_mqk(st, sc, parity, pairwise, L, scale, lane, rq, rk);
            __syncwarp();
            if (aqk != nullptr && vg == 0) store_block(aqk, st.mqk, tok0, L, i, HV, h, lane);
        }
        if (pw == INV_WARP) {
            build_inv(st, sc, parity, pairwise, L, lane, rk);
            if (akk != nullptr && vg == 0) store_block(akk, st.inv, tok0, L, i, HV, h, lane);
        }
    }
}

}  // namespace kf
