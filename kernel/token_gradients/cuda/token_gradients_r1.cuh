// kernel/token_gradients/cuda/token_gradients_r1.cuh -- R1 of Kernel B: a tile's gate-weighted
// operands Kd = k 2^gc, Kr = k 2^(gT - gc), Qe = s q 2^(gc - gT) and beta Ke = beta k 2^(gc - gT),
// computed in fp32 from the stage's raw q, k, g and beta and rounded once to bf16 into their
// 272-byte-row tiles; the rebased gate gc stays in fp32 (SM_GC), gT and gamma = 2^gT per k column.
// Qe and beta Ke hold 2^(gc - gT) >= 1 and Kr 2^(gT - gc) <= 1: exact while a channel's tile span
// |gc - gT| is within SPAN_LIMIT (kernel/shapes.cuh). Past it the small k of Kr are flushed to zero
// (-ftz=true), past 126 Qe overflows too, and the K phase forms G14-G17's products pairwise instead
// (docs/kda_backward.md, "Gates of any size"). In the qk_rstd build (KDB_QK_RSTD) the stage holds q and k
// before the l2norm: R1 normalises its pairs with the stage's rstd first, in place.
#pragma once
#include "fragments.cuh"
#include "token_gradients_layout.cuh"

namespace kdb {

// Every thread: a pair of columns kk = 2 (tid & 63) and every 4th row from tid >> 6 (4-byte bf16
// pairs, 8-byte gate pairs). gs, gbs, betas, qs, ks: the stage's g, g before the tile (not read with
// KDB_TOKEN_GATE), beta, q, k; rows at or past lt take gc = gT (their q and k are zero-filled). rstds: the
// stage's rstd of q's and k's rows ([q, k][16], read by the qk_rstd build only). Returns whether one of this
// thread's rows and columns spans more than SPAN_LIMIT.
__device__ __forceinline__ bool rebuild_operands(unsigned char* smem, const float* gs, const float* gbs,
                                                 const float* betas, unsigned short* qs, unsigned short* ks,
                                                 const float* rstds, float* gt_s, float* gamma_s, float* gcs,
                                                 int lt, float s, int tid) {
    const int kk = 2 * (tid & 63), i0 = tid >> 6;
#if KDB_TOKEN_GATE
    // gs holds each token's natural-log gate: the thread sums its column pair over all of the tile's
    // rows, in order (kernel/shapes.cuh's add_token_gate, the step every reader sums by), and keeps the
    // sums at its own rows. Rows past lt were zero-filled and add nothing, so they end at gT as the
    // cumsum form sets them
    float run[2] = {0.f, 0.f}, mine[4][2];
#pragma unroll
    for (int i = 0; i < TILE_TOKENS; ++i) {
        const float2 x = *reinterpret_cast<const float2*>(gs + i * HEAD_DIM + kk);
        run[0] = add_token_gate(run[0], x.x);
        run[1] = add_token_gate(run[1], x.y);
        if ((i & 3) == i0) {
            mine[i >> 2][0] = run[0];
            mine[i >> 2][1] = run[1];
        }
    }
    const float gT[2] = {run[0], run[1]};
#else
    const float2 base = *reinterpret_cast<const float2*>(gbs + kk);
    const float2 last = *reinterpret_cast<const float2*>(gs + (lt - 1) * HEAD_DIM + kk);
    const float gT[2] = {last.x - base.x, last.y - base.y};
#endif
    if (i0 == 0) {
        *reinterpret_cast<float2*>(gt_s + kk) = make_float2(gT[0], gT[1]);
        *reinterpret_cast<float2*>(gamma_s + kk) = make_float2(exp2f(gT[0]), exp2f(gT[1]));
    }
    bool past = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int i = i0 + 4 * e, o = i * (ROW / 2) + kk;
#if KDB_TOKEN_GATE
        const float gc[2] = {mine[e][0], mine[e][1]};
#else
        const float2 graw = *reinterpret_cast<const float2*>(gs + i * HEAD_DIM + kk);
        const float gc[2] = {i < lt ? graw.x - base.x : gT[0], i < lt ? graw.y - base.y : gT[1]};
#endif
#if KDB_QK_RSTD
        // q and k are the raw rows: their l2norm's output y = bf16(x rstd), an fp32 product rounded once (FLA's
        // l2norm_fwd: the bits the plain build reads for the same rstd), written back over the pairs this thread
        // read, so that the K phase, the pairwise path and the l2norm's backward read y after R1's barrier
        const float rq = rstds[i], rk = rstds[TILE_TOKENS + i];
        const u32 qx = *reinterpret_cast<const u32*>(qs + o), kx = *reinterpret_cast<const u32*>(ks + o);
        const u32 q2 = pack_bf16x2(bf16_lo(qx) * rq, bf16_hi(qx) * rq);
        const u32 k2 = pack_bf16x2(bf16_lo(kx) * rk, bf16_hi(kx) * rk);
        *reinterpret_cast<u32*>(qs + o) = q2;
        *reinterpret_cast<u32*>(ks + o) = k2;
#else
        const u32 q2 = *reinterpret_cast<const u32*>(qs + o), k2 = *reinterpret_cast<const u32*>(ks + o);
#endif
        const float qv[2] = {bf16_lo(q2), bf16_hi(q2)}, kv[2] = {bf16_lo(k2), bf16_hi(k2)};
        const float be = betas[i];
        float kd[2], kr[2], qe[2], bke[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const float fu = exp2f(gc[c] - gT[c]);
            past |= !(fabsf(gc[c] - gT[c]) <= SPAN_LIMIT);   // NaN counts as past
            kd[c] = kv[c] * exp2f(gc[c]);
            kr[c] = kv[c] * exp2f(gT[c] - gc[c]);
            qe[c] = s * qv[c] * fu;
            bke[c] = be * kv[c] * fu;
        }
        *reinterpret_cast<u32*>(smem + SM_KD + 2 * o) = pack_bf16x2(kd[0], kd[1]);
        *reinterpret_cast<u32*>(smem + SM_KR + 2 * o) = pack_bf16x2(kr[0], kr[1]);
        *reinterpret_cast<u32*>(smem + SM_QE + 2 * o) = pack_bf16x2(qe[0], qe[1]);
        *reinterpret_cast<u32*>(smem + SM_BKE + 2 * o) = pack_bf16x2(bke[0], bke[1]);
        *reinterpret_cast<float2*>(gcs + i * GC_ROW + kk) = make_float2(gc[0], gc[1]);
    }
    return past;
}

}  // namespace kdb
