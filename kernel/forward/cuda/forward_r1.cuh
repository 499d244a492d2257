// kernel/forward/cuda/forward_r1.cuh -- the forward's R1: a producer warp rebuilds its rows of a
// tile's gate-weighted operands in fp32, each rounded once to bf16: Kernel S's Kd, Kr and gamma
// (kernel/forward_states/cuda/forward_states_r1.cuh), and the forward's Qd for F1, Qe and Ke for the
// intra-tile products, and Mqk's diagonal s q . k.
// Included by forward.cu after its configuration (namespace kf: the knobs and the shape that
// follows from them).
#pragma once
#include "fragments.cuh"
#include "forward_layout.cuh"
#include "../../forward_states/cuda/forward_states_gate.cuh"   // Kernel S's gate ends and gc
#include "forward_l2norm.cuh"   // l2norm_rows, NormOut

namespace kf {

// R1 of producer warp pw for tile rows c0 .. c0 + ROWS_PER_PRODUCER - 1 (lane l: columns 4l .. 4l+3),
// gamma from warp 0; Qe and Ke go to the scratch of the tile's parity. The token-gate build sums each
// token's gate over the tile first (kda_gate::token_sums: it reads every producer's rows, which a
// producers' barrier before R1 lets in); the l2norm build normalises q and k first (forward_l2norm.cuh's
// l2norm_rows, into ``norm``); the qk_rstd build folds each row's rstd (``rq``, ``rk``: the stage's) into the
// factors the row already takes: k by rk once, s by rq (Qd, Qe and the diagonal), with no bf16 rounding of the
// normalised row between (the producers bind the one pass: rounding and writing the rows back cost it 14% on
// an H100, docs/log/60); the pairwise products scale their entries instead. Returns whether a channel of the
// warp's rows spans past SPAN_LIMIT (kernel/shapes.cuh, which says why it is 110, not fp32's 126; the same in
// every lane; NaN counts as past).
__device__ __forceinline__ bool rebuild(Stage& st, Scratch& sc, int parity, int L, float s, int pw, int lane,
                                       const kda_l2norm::NormOut& norm, const float* rq, const float* rk) {
    const int col = 4 * lane, c0 = pw * ROWS_PER_PRODUCER;
    if constexpr (L2NORM)
        kda_l2norm::l2norm_rows<ROWS_PER_PRODUCER>(st.q, st.k, c0, col, L, lane, norm);
    float gT[4];
    float4 base, row[ROWS_PER_PRODUCER];
    float sums[ROWS_PER_PRODUCER][4];   // the token-gate build's gc
    if constexpr (TOKEN_GATE) kda_gate::token_sums<ROWS_PER_PRODUCER>(st, pw, col, gT, sums);   // and gamma
    else base = kda_gate::ends(st, pw, col, gT);                                             // and gamma
    uint2 kb[ROWS_PER_PRODUCER], qb[ROWS_PER_PRODUCER];
    float kn[ROWS_PER_PRODUCER], qn[ROWS_PER_PRODUCER];   // the qk_rstd build's rstd of each row
#pragma unroll
    for (int r = 0; r < ROWS_PER_PRODUCER; ++r) {
        if constexpr (!TOKEN_GATE) row[r] = *reinterpret_cast<const float4*>(&st.g[c0 + r][col]);
        kb[r] = *reinterpret_cast<const uint2*>(&st.k[c0 + r][col]);
        qb[r] = *reinterpret_cast<const uint2*>(&st.q[c0 + r][col]);
        // read here with the rows, before the loop below stores: the compiler cannot move a float load past
        // those stores, so each row would otherwise wait on its own shared-memory load
        if constexpr (QK_RSTD) {
            kn[r] = rk[c0 + r];
            qn[r] = rq[c0 + r];
        }
    }
    bool past = false;
#pragma unroll
    for (int r = 0; r < ROWS_PER_PRODUCER; ++r) {
        const int c = c0 + r;
        const bool real = c < L;
        float gc[4];
        if constexpr (TOKEN_GATE) {
#pragma unroll
            for (int e = 0; e < 4; ++e) gc[e] = sums[r][e];
        } else {
            kda_gate::chunk_local(gc, row[r], base, gT, real);
        }
        // the qk_rstd build: k's row times its rstd, q's folded into s
        const float kn_r = QK_RSTD ? kn[r] : 1.f, sq = QK_RSTD ? s * qn[r] : s;
        const float kf[4] = {bf16_lo(kb[r].x) * kn_r, bf16_hi(kb[r].x) * kn_r, bf16_lo(kb[r].y) * kn_r,
                             bf16_hi(kb[r].y) * kn_r};
        const float qf[4] = {bf16_lo(qb[r].x), bf16_hi(qb[r].x), bf16_lo(qb[r].y), bf16_hi(qb[r].y)};
        float kd[4], kr[4], qd[4], qe[4], ke[4], dot = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float start = exp2f(gc[e]), up = exp2f(gc[e] - gT[e]);
            kd[e] = kf[e] * start;
            kr[e] = kf[e] * exp2f(gT[e] - gc[e]);
            qd[e] = sq * qf[e] * start;
            qe[e] = sq * qf[e] * up;
            ke[e] = kf[e] * up;
            dot += qf[e] * kf[e];
            past |= !(gc[e] - gT[e] <= SPAN_LIMIT);
        }
        *reinterpret_cast<uint2*>(&st.kd[c][col]) = make_uint2(pack_bf16x2(kd[0], kd[1]), pack_bf16x2(kd[2], kd[3]));
        *reinterpret_cast<uint2*>(&st.kr[c][col]) = make_uint2(pack_bf16x2(kr[0], kr[1]), pack_bf16x2(kr[2], kr[3]));
        *reinterpret_cast<uint2*>(&st.qd[c][col]) = make_uint2(pack_bf16x2(qd[0], qd[1]), pack_bf16x2(qd[2], qd[3]));
        *reinterpret_cast<uint2*>(&sc.qe[parity][c][col]) = make_uint2(pack_bf16x2(qe[0], qe[1]), pack_bf16x2(qe[2], qe[3]));
        *reinterpret_cast<uint2*>(&sc.ke[parity][c][col]) = make_uint2(pack_bf16x2(ke[0], ke[1]), pack_bf16x2(ke[2], ke[3]));
        // s q . k over the row: the lanes' partial sums in a fixed butterfly (the same bits every call)
#pragma unroll
        for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (lane == 0) st.diag[c] = sq * dot;
    }
    return __any_sync(0xffffffffu, past);
}

}  // namespace kf
