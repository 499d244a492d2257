// kernel/forward_states/cuda/forward_states_chain.cuh -- one consumer warp's step of the chain for one
// tile, S0 -> S1 (G6, G7, G8): Kernel S's, and the forward's (kernel/forward/cuda/forward.cu), which
// runs the same chain and adds its o beside it.
//
// The warp holds S^T [16 v x 128 k] in acc (n-tile nt = k 8 nt ..; c0 = S^T[gr][8nt+2t], c1 = [gr][8nt+2t+1],
// c2 = [gr+8][8nt+2t], c3 = [gr+8][8nt+2t+1]). A stage holds kd, kr [token][k] (rows OP_STRIDE apart),
// inv [i][j], v [token][this CTA's v], beta [token] and gamma [k], as forward_states.cu describes.
//     P^T  = S^T Kd^T            A = S^T (accumulators)  B = Kd^T: Kd [token][K], cols first, plain
//     W^T  = beta (v^T - P^T)    per token column, in registers
//     U^T  = W^T INV^T           A = W^T in two bf16     B = INV^T: INV [i][j], cols first, plain
//     S^T <- gamma S^T + U^T Kr  A = U^T                 B = Kr: Kr [token][K], rows first, .trans
// P^T's 8 k-steps go to G6_SPLIT independent accumulator pairs, summed at the end pairwise.
// Included after a kernel's configuration; every name it uses is a parameter or ptx_lab's.
#pragma once
#include "../../shapes.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "stmatrix.cuh"

namespace kda_chain {
using namespace ptx_lab;

// One tile's chain step on stage st. Where snap is set, S (before the update) is staged as bf16 S [k][v]
// in staging (rows SnapStride elements apart). each_k_step(ks, a) sees every k-step's A fragment of S^T
// right after its G6 MMAs (the forward's F1). Leaves U^T's A fragment in ua (the forward's F2).
template <int G6Split, int SnapStride, class StageT, class EachKStep>
__device__ __forceinline__ void step(u32 (&ua)[4], float (&acc)[HEAD_DIM / 8][4], const StageT& st,
                                     unsigned short (*staging)[SnapStride], bool snap, int vrow, int gr, int t,
                                     X4Lane xl, EachKStep&& each_k_step) {
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    // P^T = S^T Kd^T [16 v x 16 tokens] in G6Split independent accumulator pairs; before the
    // update, every 4th tile stages S for its store
    // (Every B fragment of the tile is loaded as soon as the stage is released, Kd's before the
    // products and Kr's before the reduction: the chain then never waits out an ldmatrix.)
    u32 bkd[HEAD_DIM / 16][4], bkr[HEAD_DIM / 16][4];
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
        const RowCol p = x4_cols_first(0, 16 * ks, xl);
        ldmatrix_x4(bkd[ks], smem_addr(&st.kd[p.row][p.col]));
    }
    float pp[G6Split][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
        u32 a[4];
        acc_to_a(a, acc[2 * ks], acc[2 * ks + 1]);
        if (snap) {   // cols first, .trans: A = tile^T, so the tile is S [k][v] (ldmatrix.cuh)
            const RowCol p = x4_cols_first(16 * ks, 0, xl);
            stmatrix_x4_trans(smem_addr(&staging[p.row][p.col]), a[0], a[1], a[2], a[3]);
        }
        const u32 (&b)[4] = bkd[ks];
        const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        float (&q)[2][4] = pp[ks % G6Split];
        mma_m16n8k16_bf16(q[0], a, b0, q[0]);
        mma_m16n8k16_bf16(q[1], a, b1, q[1]);
        each_k_step(ks, a);
    }
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 16; ++j) {
        const RowCol p = x4_rows_first(0, 16 * j, xl);
        ldmatrix_x4_trans(bkr[j], smem_addr(&st.kr[p.row][p.col]));
    }
    // the partial sums, pairwise: (0 + 1) + (2 + 3)
#pragma unroll
    for (int w = 1; w < G6Split; w *= 2)
#pragma unroll
        for (int sp = 0; sp < G6Split; sp += 2 * w)
#pragma unroll
            for (int nt2 = 0; nt2 < 2; ++nt2)
#pragma unroll
                for (int e = 0; e < 4; ++e) pp[sp][nt2][e] += pp[sp + w][nt2][e];
    const float (&p)[2][4] = pp[0];

    // W^T = beta (v^T - P^T): column = token 8 nt2 + 2t (+1), rows gr, gr + 8
    float w[2][4];
#pragma unroll
    for (int nt2 = 0; nt2 < 2; ++nt2) {
        const int c0 = 8 * nt2 + 2 * t;
        const float b0 = st.beta[c0], b1 = st.beta[c0 + 1];
        w[nt2][0] = b0 * (bf16_to_f32(st.v[c0][vrow + gr]) - p[nt2][0]);
        w[nt2][1] = b1 * (bf16_to_f32(st.v[c0 + 1][vrow + gr]) - p[nt2][1]);
        w[nt2][2] = b0 * (bf16_to_f32(st.v[c0][vrow + gr + 8]) - p[nt2][2]);
        w[nt2][3] = b1 * (bf16_to_f32(st.v[c0 + 1][vrow + gr + 8]) - p[nt2][3]);
    }

    // U^T = W^T INV^T [16 v x 16 tokens], W^T in two bf16 parts (fragments.cuh), the rest first: W is a
    // difference computed in fp32, and one bf16 of it was the largest rounding in the final state's error
    float u[2][4];
    {
        u32 hi[4], lo[4], b[4];
        acc_to_a_two_parts(hi, lo, w[0], w[1]);
        const RowCol p = x4_cols_first(0, 0, xl);
        ldmatrix_x4(b, smem_addr(&st.inv[p.row][p.col]));
        const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_m16n8k16_bf16(u[0], lo, b0, zero);
        mma_m16n8k16_bf16(u[1], lo, b1, zero);
        mma_m16n8k16_bf16(u[0], hi, b0, u[0]);
        mma_m16n8k16_bf16(u[1], hi, b1, u[1]);
    }

    // S^T <- gamma S^T + U^T Kr
    acc_to_a(ua, u[0], u[1]);
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 16; ++j) {
        const u32 (&b)[4] = bkr[j];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float (&sv)[4] = acc[2 * j + half];
            const float2 gm = *reinterpret_cast<const float2*>(&st.gamma[8 * (2 * j + half) + 2 * t]);
            sv[0] *= gm.x;
            sv[1] *= gm.y;
            sv[2] *= gm.x;
            sv[3] *= gm.y;
            const u32 bb[2] = {b[2 * half], b[2 * half + 1]};
            mma_m16n8k16_bf16(sv, ua, bb, sv);
        }
    }
}

}  // namespace kda_chain
