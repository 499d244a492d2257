// kernel/token_gradients/cuda/token_gradients_v_phase.cuh -- Kernel B's V phase: a warp's 16 v rows,
// transposed (v as the MMA's M, tokens as N), from S0^T in its accumulators to U, dW and dv in
// shared memory and its partial sums of d and rowsum(dW . Vn).
#pragma once
#include "fragments.cuh"
#include "stmatrix.cuh"
#include "token_gradients_operands.cuh"

namespace kdb {

// G6: Vn^T = v^T - S0^T Kd^T; G7: U^T = (beta Vn)^T INV^T; G1 + G2: dU^T = do^T Mqk + dS1^T Kr^T;
// G3: dW^T = dU^T INV. In this orientation every accumulator pair is the next MMA's A fragment
// (fragments.cuh's acc_to_a), so the chain never leaves registers. U (fp32 accumulators) is
// returned for G8 and the G9 / G10 partials. The lane parts of the addresses: nc, ncv, nc32 in
// the shared tiles (ncv: this warp's v columns), scv, sr32, sc32 in the stage's.
__device__ __forceinline__ void v_phase(float (&U)[2][4], const float (&S)[16][4], const float* betas, u32 nc,
                                        u32 ncv, u32 nc32, u32 scv, u32 sr32, u32 sc32, float* dpart,
                                        float* b1part, int warp, int g, int t) {
    // beta of this lane's token columns 2t, 2t+1, 8+2t, 9+2t
    const float bet[2][2] = {{betas[2 * t], betas[2 * t + 1]}, {betas[8 + 2 * t], betas[9 + 2 * t]}};
    // G6: P^T = S0^T Kd^T, then Vn^T = v^T - P^T
    float P0[2][4], P1[2][4];
    zero4(P0[0]); zero4(P0[1]); zero4(P1[0]); zero4(P1[1]);
#pragma unroll
    for (int ks2 = 0; ks2 < 8; ++ks2) {
        u32 sa[4], b0[2], b1f[2];
        acc_to_a(sa, S[2 * ks2], S[2 * ks2 + 1]);
        b_of_t(b0, b1f, nc + SM_KD + at(0, 16 * ks2));
        if (ks2 & 1) { mma(P1[0], sa, b0); mma(P1[1], sa, b1f); }
        else         { mma(P0[0], sa, b0); mma(P0[1], sa, b1f); }
    }
    u32 vt[4];
    a_of_t(vt, scv + ST_V);
    float Vn[2][4];
    Vn[0][0] = bf16_lo(vt[0]) - (P0[0][0] + P1[0][0]);
    Vn[0][1] = bf16_hi(vt[0]) - (P0[0][1] + P1[0][1]);
    Vn[0][2] = bf16_lo(vt[1]) - (P0[0][2] + P1[0][2]);
    Vn[0][3] = bf16_hi(vt[1]) - (P0[0][3] + P1[0][3]);
    Vn[1][0] = bf16_lo(vt[2]) - (P0[1][0] + P1[1][0]);
    Vn[1][1] = bf16_hi(vt[2]) - (P0[1][1] + P1[1][1]);
    Vn[1][2] = bf16_lo(vt[3]) - (P0[1][2] + P1[1][2]);
    Vn[1][3] = bf16_hi(vt[3]) - (P0[1][3] + P1[1][3]);

    // G7: U^T = (beta Vn)^T INV^T (beta scales the token columns). beta Vn goes in two
    // bf16 parts, its rounding and what that left: its one rounding was the largest
    // single share of dq's and dk's error (kernel/studies/gradient_rounding)
    {
        float bV[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            bV[nt][0] = bet[nt][0] * Vn[nt][0]; bV[nt][1] = bet[nt][1] * Vn[nt][1];
            bV[nt][2] = bet[nt][0] * Vn[nt][2]; bV[nt][3] = bet[nt][1] * Vn[nt][3];
        }
        u32 aa[4], ar[4], b0[2], b1f[2];
        acc_to_a_two_parts(aa, ar, bV[0], bV[1]);
        b_of_t(b0, b1f, sc32 + ST_INV);
        zero4(U[0]); zero4(U[1]);
        mma(U[0], aa, b0); mma(U[1], aa, b1f);
        mma(U[0], ar, b0); mma(U[1], ar, b1f);
    }

    // G1 + G2: dU^T = do^T Mqk + dS1^T Kr^T
    float dU0[2][4], dU1[2][4];
    zero4(dU0[0]); zero4(dU0[1]); zero4(dU1[0]); zero4(dU1[1]);
    u32 dot[4];
    a_of_t(dot, scv + ST_DO);
    {
        u32 b0[2], b1f[2];
        b_of(b0, b1f, sr32 + ST_MQK);
        mma(dU0[0], dot, b0); mma(dU0[1], dot, b1f);
    }
#pragma unroll
    for (int ks2 = 0; ks2 < 8; ++ks2) {
        u32 aa[4], b0[2], b1f[2];
        a_of_t(aa, scv + ST_DS + at(16 * ks2, 0));
        b_of_t(b0, b1f, nc + SM_KR + at(0, 16 * ks2));
        if (ks2 & 1) { mma(dU1[0], aa, b0); mma(dU1[1], aa, b1f); }
        else         { mma(dU0[0], aa, b0); mma(dU0[1], aa, b1f); }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dU0[nt][e] += dU1[nt][e];

    // G3: dW^T = dU^T INV. dU goes in two bf16 parts, as beta Vn does into G7: its one
    // rounding was most of dv's and dbeta's on-chip error (kernel/studies/gradient_rounding)
    float W[2][4];
    {
        u32 aa[4], ar[4], b0[2], b1f[2];
        acc_to_a_two_parts(aa, ar, dU0[0], dU0[1]);
        b_of(b0, b1f, sr32 + ST_INV);
        zero4(W[0]); zero4(W[1]);
        mma(W[0], aa, b0); mma(W[1], aa, b1f);
        mma(W[0], ar, b0); mma(W[1], ar, b1f);
    }

    // U, dW and dv = beta dW to shared memory as [token][v] (stmatrix .trans of the
    // transposed fragments), for the K phase, G9/G10 and the dv store; U also as what its
    // bf16 rounding left, so that G9/G10 read U in two parts (U's one rounding there was a
    // third of dg's on-chip error: kernel/studies/gradient_rounding)
    {
        u32 x[4], xr[4];
        acc_to_a_two_parts(x, xr, U[0], U[1]);
        stmatrix_x4_trans(ncv + SM_U, x[0], x[1], x[2], x[3]);
        stmatrix_x4_trans(nc32 + SM_URES + 512 * warp, xr[0], xr[1], xr[2], xr[3]);
        acc_to_a(x, W[0], W[1]);
        stmatrix_x4_trans(ncv + SM_DW, x[0], x[1], x[2], x[3]);
        float bW[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            bW[nt][0] = bet[nt][0] * W[nt][0]; bW[nt][1] = bet[nt][1] * W[nt][1];
            bW[nt][2] = bet[nt][0] * W[nt][2]; bW[nt][3] = bet[nt][1] * W[nt][3];
        }
        acc_to_a(x, bW[0], bW[1]);
        stmatrix_x4_trans(ncv + SM_DV, x[0], x[1], x[2], x[3]);
    }

    // d = rowsum(do . U) and rowsum(dW . Vn), this warp's 16 v; column = token
    {
        float dol[2][4];
        a_to_acc(dol[0], dol[1], dot);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float dd = sum_over_g(dol[nt][e] * U[nt][e] + dol[nt][e + 2] * U[nt][e + 2]);
                const float bb = sum_over_g(W[nt][e] * Vn[nt][e] + W[nt][e + 2] * Vn[nt][e + 2]);
                if (g == 0) {
                    dpart[warp * TILE_TOKENS + 8 * nt + 2 * t + e] = dd;
                    b1part[warp * TILE_TOKENS + 8 * nt + 2 * t + e] = bb;
                }
            }
    }
}

// G9 and G10, this warp's partial sums over its 16 v of dMqk = do U^T and dLkk's dW U^T [i][j],
// U in two parts (its bf16 rounding, then what that left), to `part` (fp32 [2][8 warps][16][PS]).
__device__ __forceinline__ void g9_g10_partials(float* part, u32 srv, u32 nrv, u32 ncv, u32 nc32, int warp, int g,
                                                int t) {
    u32 ad[4], aw[4], b0[2], b1f[2];
    a_of(ad, srv + ST_DO);
    a_of(aw, nrv + SM_DW);
    b_of_t(b0, b1f, ncv + SM_U);
    float M[2][4], Lk[2][4];
    zero4(M[0]); zero4(M[1]); zero4(Lk[0]); zero4(Lk[1]);
    mma(M[0], ad, b0); mma(M[1], ad, b1f);
    mma(Lk[0], aw, b0); mma(Lk[1], aw, b1f);
    b_of_t(b0, b1f, nc32 + SM_URES + 512 * warp);
    mma(M[0], ad, b0); mma(M[1], ad, b1f);
    mma(Lk[0], aw, b0); mma(Lk[1], aw, b1f);
    float* const pm = part + warp * TILE_TOKENS * PS;
    float* const pl = part + (WARPS + warp) * TILE_TOKENS * PS;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        const int jj = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(pm + g * PS + jj) = make_float2(M[nt][0], M[nt][1]);
        *reinterpret_cast<float2*>(pm + (g + 8) * PS + jj) = make_float2(M[nt][2], M[nt][3]);
        *reinterpret_cast<float2*>(pl + g * PS + jj) = make_float2(Lk[nt][0], Lk[nt][1]);
        *reinterpret_cast<float2*>(pl + (g + 8) * PS + jj) = make_float2(Lk[nt][2], Lk[nt][3]);
    }
}

// G8: S1^T = gamma S0^T + U^T Kr in this warp's accumulators (S), the state of the next tile.
__device__ __forceinline__ void next_state(float (&S)[16][4], const float (&U)[2][4], u32 nr, const float* gamma_s,
                                           int t) {
    u32 ua[4];
    acc_to_a(ua, U[0], U[1]);
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        u32 b0[2], b1f[2];
        b_of(b0, b1f, nr + SM_KR + at(0, 16 * b));
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const float2 ga = *reinterpret_cast<const float2*>(gamma_s + 16 * b + 8 * hf + 2 * t);
            float (&c)[4] = S[2 * b + hf];
            c[0] *= ga.x; c[1] *= ga.y; c[2] *= ga.x; c[3] *= ga.y;
        }
        mma(S[2 * b], ua, b0);
        mma(S[2 * b + 1], ua, b1f);
    }
}

}  // namespace kdb
