// kernel/ds_scan/cuda/consumer.cuh -- the steps of a consumer warp's tile, G1 to G5 and the
// combine, on the dS^T band it holds in fp32 accumulators for the whole scan. The walk that
// runs them (snapshot, FULL wait, the chain, EMPTY) is the kernel's consumer branch
// (dstate_scan.cu); G2 and G3, on the dS-dependent path, are written out there.
#pragma once
#include "barrier.cuh"
#include "operands.cuh"
#include "timing.cuh"

namespace kda {

// A consumer warp's dS^T band at the walk's start: its part of dht, or zeros. dS[m][j] is
// m-tile m (v = v0 + 16m ..), n-tile j (k = k0 + 8j .. k0 + 8j + 7).
__device__ __forceinline__ void init_band(float (&dS)[MT][NJ][4], const Params& p, int seq, int h, int k0, int v0, int lane,
                                          int role) {
#if SUMMARY
    // role 1 scans the identity (dS[k][v] = 1 where k == v), role 0 starts from zeros
    (void)p; (void)seq; (void)h;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int k = k0 + 8 * j + 2 * t, v = v0 + 16 * m + g;
            dS[m][j][0] = role && k == v ? 1.f : 0.f;
            dS[m][j][1] = role && k + 1 == v ? 1.f : 0.f;
            dS[m][j][2] = role && k == v + 8 ? 1.f : 0.f;
            dS[m][j][3] = role && k + 1 == v + 8 ? 1.f : 0.f;
        }
#elif HAS_DHT
    {
        const float* src = p.dht + ((long long)seq * p.HV + h) * ((long long)HEAD_DIM * HEAD_DIM);
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int k = k0 + 8 * j + 2 * t, v = v0 + 16 * m + g;
                dS[m][j][0] = src[k * HEAD_DIM + v];
                dS[m][j][1] = src[(k + 1) * HEAD_DIM + v];
                dS[m][j][2] = src[k * HEAD_DIM + v + 8];
                dS[m][j][3] = src[(k + 1) * HEAD_DIM + v + 8];
            }
    }
#else
    (void)p; (void)seq; (void)h; (void)k0; (void)v0; (void)lane; (void)role;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j) dS[m][j][0] = dS[m][j][1] = dS[m][j][2] = dS[m][j][3] = 0.f;
#endif
}

// do^T as the A operand [v, c] (ldmatrix.trans of do[c][v] rows, one per m-tile; G4 reuses
// it), then G1: dU^T = do^T @ Mqk into partial sum 0 of acc (G2 adds dS^T @ kr^T to all
// G2_SPLIT of them).
__device__ __forceinline__ void g1(float (&acc)[MT][G2_SPLIT][2][4], u32 (&doT)[MT][4], const Stage& st,
                                   int kh, int vb, int lane) {
#pragma unroll
    for (int m = 0; m < MT; ++m) ldmatrix_x4_trans(doT[m], do_addr_cols_first(st, vb + 16 * m, lane));
    // G1: dU^T = do^T @ Mqk  (B[c'][c] = Mqk[c'][c], pairs along c' -> ldmatrix.trans)
    u32 bm[4];
    ldmatrix_x4_trans(bm, small_addr_rows_first(st.mqk, lane));
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int a = 0; a < G2_SPLIT; ++a)
#pragma unroll
            for (int nn = 0; nn < 2; ++nn) acc[m][a][nn][0] = acc[m][a][nn][1] = acc[m][a][nn][2] = acc[m][a][nn][3] = 0.f;
    if (KSPLIT == 1 || kh == 0) {        // G1 once per band: in the k0 = 0 warp's partial sum
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            mma_bf16(acc[m][0][0], doT[m], bm[0], bm[1]);
            mma_bf16(acc[m][0][1], doT[m], bm[2], bm[3]);
        }
    }
}

// The combine's first half, dS^T *= exp2(gT) per k column, then G4: dS^T += do^T @ qd, qd's
// bf16 rounding and what it left (the rounding as a warpgroup MMA with G4_WITH_G5: issued with
// G5 instead). None of it depends on G2, so it fills G2's and G3's latency.
__device__ __forceinline__ void decay_and_g4(float (&dS)[MT][NJ][4], const u32 (&doT)[MT][4], const Stage& st,
                                             int k0, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const float2 e = *reinterpret_cast<const float2*>(&st.egT[k0 + 8 * j + 2 * t]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            dS[m][j][0] *= e.x; dS[m][j][1] *= e.y; dS[m][j][2] *= e.x; dS[m][j][3] *= e.y;
        }
    }
    // qd's rounding rest on mma.sync: off the dS chain's critical path (it waits for G3 here)
    accumulate_qd_rest(dS, doT, st, k0, lane);
#if WGMMA && !G4_WITH_G5
    wgmma_fence();   // dS (just scaled) and doT were written by ordinary instructions
    accumulate_band_wgmma(dS, doT, st.qd);
    wgmma_commit_group();   // runs while G3 computes bdv^T
#elif WGMMA
    // G4 is issued with G5
#else
    accumulate_band(dS, doT, st.qd, k0, lane);
#endif
}

// G3's operand dU^T: the sum of G1 + G2's G2_SPLIT partial sums.
__device__ __forceinline__ void sum_partials(float (&dU)[MT][2][4], const float (&acc)[MT][G2_SPLIT][2][4]) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = acc[m][0][nn][e];
#pragma unroll
                for (int a = 1; a < G2_SPLIT; ++a) x += acc[m][a][nn][e];
                dU[m][nn][e] = x;
            }
}

// KSPLIT 2: dU^T = the two warps' partial sums, through the exchange tile (buffer i & 1).
// Both add them in the same order (a + b is commutative in IEEE arithmetic), so both run
// G3 on identical operands.
__device__ __forceinline__ void add_partner_sum(float (&dU)[MT][2][4], float4* xchg, int i, int warp, int partner,
                                                int band, int lane, PhaseTimer& timer) {
    float4* mine = xchg + ((i & 1) * NUM_CONSUMERS + warp) * XCHG_FLOAT4;
    const float4* theirs = xchg + ((i & 1) * NUM_CONSUMERS + partner) * XCHG_FLOAT4;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
            mine[(2 * m + nn) * 32 + lane] = make_float4(dU[m][nn][0], dU[m][nn][1], dU[m][nn][2], dU[m][nn][3]);
    const long long tp = PhaseTimer::now();
    named_barrier_sync(pair_bar(band), 64);
    timer.add(T_C_PAIR, tp);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
            const float4 o = theirs[(2 * m + nn) * 32 + lane];
            dU[m][nn][0] += o.x; dU[m][nn][1] += o.y; dU[m][nn][2] += o.z; dU[m][nn][3] += o.w;
        }
}

// G5: dS^T += bdv^T @ kd, the last step of the dS-dependent path (WGMMA with G4_WITH_G5:
// G4's warpgroup MMA goes out with it); the combine's second half is these accumulations.
__device__ __forceinline__ void g5(float (&dS)[MT][NJ][4], const u32 (&doT)[MT][4], const u32 (&aB)[MT][4],
                                   const Stage& st, int k0, int lane) {
#if WGMMA
    wgmma_fence();   // aB written by ordinary instructions
    if constexpr (G4_WITH_G5) accumulate_band_wgmma(dS, doT, st.qd);
    accumulate_band_wgmma(dS, aB, st.kd);
    wgmma_commit_group();
    wgmma_wait_group<0>();   // dS is read next tile (snapshot, G2); qd/kd are read before EMPTY
    (void)k0; (void)lane;
#else
    (void)doT;
    accumulate_band(dS, aB, st.kd, k0, lane);
#endif
}

}  // namespace kda
