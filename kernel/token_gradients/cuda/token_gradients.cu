// kernel/token_gradients/cuda/token_gradients.cu -- Kernel B: KDA's per-token gradients.
//
// One CTA per run of consecutive 64-token chunks of one sequence (run_chunks of them, fewer at the
// sequence's end) and (value) head walks the run's 16-token tiles in order (FLA's grouped value heads:
// q, k and their rstd are read at the head qk_head gives, in place).
// For each tile it has, from global memory, the forward's tensors as FLA's
// chunk_kda forward leaves them (q, k, v, its 64-chunk-local log2 gate cumsum g, beta,
// the 16 x 16 diagonal blocks of Aqk (Mqk) and Akk (INV)), do, and Kernel A's bf16 dS1
// (dL/dS after the tile). The forward state entering the tile, S0, comes from the
// forward's bf16 state at the run's start (its first tile) and is carried on chip in fp32
// across the run's tiles (S1 = diag(gamma) S0 + Kr^T U), chunk boundaries included: a run
// pays one CTA's start (its first loads, with S0's 32 KB, wait with nothing else on the SM)
// for run_chunks chunks, and the next chunk's first tile is prefetched like any other. The
// math, GEMM by GEMM (G1..G17), is kernel/reference/kda.py's _tile_backward;
// docs/kda_backward.md counts it.
//
// Two phases per tile, 8 warps:
//   V phase: warp w owns v rows 16w..16w+15 and computes, transposed (v as the MMA's M),
//     Vn^T = v^T - S0^T Kd^T (G6), U^T = (beta Vn)^T INV^T (G7), dU^T = do^T Mqk + dS1^T Kr^T
//     (G1 + G2), dW^T = dU^T INV (G3), then its partial sums over its 16 v of dMqk = do U^T
//     (G9), dLkk = dW U^T (G10), d = rowsum(do . U) and rowsum(dW . Vn), and the next
//     state S1^T = gamma S0^T + U^T Kr (G8) in its fp32 accumulators. In this orientation
//     every accumulator pair is the next MMA's A fragment (ptx_lab/cuda/mma.cuh), so the
//     chain G6 -> G7 and G1/G2 -> G3 -> G8 never leaves registers.
//   K phase: warp w owns k columns 16w..16w+15: dQd = do S0^T (G11), dW S0^T (G12),
//     dKr = U dS1^T + dMqk^T Qe + dLkk^T (beta Ke) (G13 + G15 + G17), dQe = dMqk Kr (G14),
//     X = dLkk Kr (G16), dgamma = rowsum(S0 . dS1), then dq, dk and dg's in-tile cumsums.
// The partial sums over v meet in shared memory and are added in a fixed order, so two
// runs give the same bits. Inputs of the next tile are prefetched by cp.async into the
// second of two stages while this tile computes.
//
// The qk_rstd build (KDB_QK_RSTD=1) reads q and k as they were before the forward's l2norm, so that no pass
// writes normalised copies: each tile's rstd rows are staged with its other inputs, R1 normalises its rows in
// the stage (bf16(x rstd), the bits of FLA's l2norm_fwd) and the rest reads them as the other builds read the
// rows they are given.
//
// The rooms: token_gradients_layout.cuh (the shape, the shared-memory layout),
// token_gradients_loads.cuh (the arguments, the tile loads), token_gradients_operands.cuh (block
// offsets, the fragments an ldmatrix .x4 gives, mma), token_gradients_r1.cuh (R1),
// token_gradients_v_phase.cuh (the V phase, G9 / G10 and G8), token_gradients_reduce.cuh (the
// fixed-order sums between the phases), token_gradients_pairwise.cuh (G14-G17 of a tile whose gates
// span past fp32's range), token_gradients_gate.cuh (the gate build's epilogue, KDB_GATE=1: the gate
// activation's backward where dg is formed), token_gradients_timing.cuh (the clock accounting of a tile's
// phases, KDB_TIMING=1, empty otherwise); ptx_lab's fragments.cuh packs accumulators into operands.
// This file holds the kernel: the prologue, the walk over the run's tiles, and the K phase,
// written out here: as a function of its own it compiled to other SASS.
#ifndef KDB_QK_RSTD
#error "KDB_QK_RSTD must be defined: 0 (q and k as the forward used them) or 1 (raw q and k, normalised in R1 by rstd)"
#endif
#include "fragments.cuh"
#include "stmatrix.cuh"
#include "token_gradients_gate.cuh"
#include "token_gradients_layout.cuh"
#include "token_gradients_loads.cuh"
#include "token_gradients_operands.cuh"
#include "token_gradients_pairwise.cuh"
#include "token_gradients_r1.cuh"
#include "token_gradients_reduce.cuh"
#include "token_gradients_timing.cuh"
#include "token_gradients_v_phase.cuh"

using namespace kdb;

constexpr bool QK_RSTD = KDB_QK_RSTD;   // raw q and k: the rstd is required, and staged with the tile

extern "C" __constant__ int kdb_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kdb_threads = THREADS;

extern "C" __global__ void __launch_bounds__(THREADS, 1) kda_token_gradients(
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,
        const float* gate, const float* beta, const unsigned short* aqk, const unsigned short* akk,
        const unsigned short* ds, const unsigned short* states, void* dq, void* dk, unsigned short* dv,
        float* dg, float* dbeta, const float* q_rstd, const float* k_rstd, const long long* cu,
        const long long* tile_offs, const long long* chunk_offs, const int* chunk_seq, const long long* run_chunk0,
        int run_chunks, int HV_, int H_,
        float scale, int dqk_bf16, const unsigned short* g_raw, const float* a_log, const float* dt_bias,
        unsigned short* dg_raw, float* da_part, float* ddt_part, int gate_form, float lower_bound) {
    const Args a{q, k, v, dout, gate, beta, aqk, akk, ds, states, dq, dk, dv, dg, dbeta, q_rstd, k_rstd, cu,
                 tile_offs, chunk_offs, chunk_seq, run_chunk0, run_chunks, HV_, H_, scale, dqk_bf16};
#if KDB_GATE
    const GateArgs ga{g_raw, a_log, dt_bias, dg_raw, da_part, ddt_part, gate_form, lower_bound};
    float gate_dt = 0.f, gate_da = 0.f;   // this thread's partial sums over the run: its channel's rows (GATE_ROWS)
#endif
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const X4Lane xl = x4_lane(lane);
    const int h = blockIdx.y;
#if KDB_GATE
    const float gate_a = gate_scale(ga, h);   // exp(A_log), once a CTA
#endif
    const int qh = qk_head(h, a.HV, a.H);   // q's and k's head
    const long long run = blockIdx.x;
    const long long chunk0 = a.run_chunk0[run];   // the run's first chunk
    const int n = a.chunk_seq[chunk0];
    const long long j0 = chunk0 - a.chunk_offs[n];   // ... within its sequence
    const long long len = a.cu[n + 1] - a.cu[n];
    const long long tok_run = a.cu[n] + CHUNK_TOKENS * j0;
    const int run_len = static_cast<int>(min(static_cast<long long>(CHUNK_TOKENS) * a.run_chunks,
                                             len - CHUNK_TOKENS * j0));   // tokens
    const int ntile = (run_len + TILE_TOKENS - 1) / TILE_TOKENS;
    const long long snap0 = a.tile_offs[n] + TILES_PER_CHUNK * j0;
    const long long HV = a.HV, RS = HV * HEAD_DIM;   // RS: elements from one token's row of a head to the next
                                                     // token's
    const long long H = a.H, QK_RS = H * HEAD_DIM;   // ... of q and k
    const float s = a.scale;
    const u32 sb = smem_addr(smem);
    float* const gt_s = reinterpret_cast<float*>(smem + SM_GT);
    float* const gamma_s = reinterpret_cast<float*>(smem + SM_GAMMA);
    float* const gcs = reinterpret_cast<float*>(smem + SM_GC);
    float* const part = reinterpret_cast<float*>(smem + SM_PART);
    unsigned short* const frag16 = reinterpret_cast<unsigned short*>(smem + SM_FRAG);
    const uint4* const frag = reinterpret_cast<const uint4*>(smem + SM_FRAG);
    float* const dpart = reinterpret_cast<float*>(smem + SM_DPART);
    float* const b1part = reinterpret_cast<float*>(smem + SM_B1PART);
    float* const b2part = reinterpret_cast<float*>(smem + SM_B2PART);
    float* const dvec = reinterpret_cast<float*>(smem + SM_DVEC);
    float* const b1 = reinterpret_cast<float*>(smem + SM_B1);
    float* const l2part = reinterpret_cast<float*>(smem + SM_L2PART);

    const int v0 = 16 * warp;   // V phase: this warp's v rows
    const int k0 = 16 * warp;   // K phase: this warp's k columns
#if KDB_GATE
    // the gate's rows split between the warp's halves (GATE_ROWS): this lane's channel and first row
    const int gk = k0 + (lane & 15), gi0 = GATE_ROWS * (lane >> 4);
    const float gate_b = gate_bias(ga, h * HEAD_DIM + gk);   // dt_bias, once a CTA
#endif
    // lane parts of the ldmatrix / stmatrix addresses (rows first / cols first, 272- and 32-byte rows),
    // with this warp's v columns (V phase) and k rows or columns (K phase) folded in
    const u32 lr = x4_lane_bytes_rows_first(ROW, xl), lc = x4_lane_bytes_cols_first(ROW, xl);
    const u32 lr32 = x4_lane_bytes_rows_first(32, xl), lc32 = x4_lane_bytes_cols_first(32, xl);
    const u32 nr = sb + lr, nc = sb + lc, nc32 = sb + lc32;
    const u32 ncv = nc + 2 * v0, nrv = nr + 2 * v0, nck = nc + k0 * ROW, nrk = nr + 2 * k0;
    float S[16][4];             // S0^T [v0..v0+15][all k], fp32, 16 n-tiles of 8 k

    TileTimer timer;
    timer.start();
    const Copies cps = copies_of(tid, RS, QK_RS);
    load_tile(a, cps, smem, 0, 0, (tok_run * HV + h) * HEAD_DIM, (tok_run * H + qh) * HEAD_DIM, RS,
              min(TILE_TOKENS, run_len), snap0, chunk0, h, tid);

    for (int it = 0; it < ntile; ++it) {   // it: the tile within the run
        const int st = it & 1;
        const long long tok0 = tok_run + TILE_TOKENS * it;
        const long long row0 = (tok0 * HV + h) * HEAD_DIM;   // element offset of (token tok0, head h) in
                                                             // [tokens, HV, HEAD_DIM]
        const long long qk_row0 = (tok0 * H + qh) * HEAD_DIM;   // ... of (tok0, qh) in q's [tokens, H, HEAD_DIM]
        const int lt = min(TILE_TOKENS, run_len - TILE_TOKENS * it);
        // the l2norm's rstd of this thread's two rows (rows g and g + 8), for the K phase's last step. Loaded
        // here, before this tile's barriers, so that R1, the V phase and the K phase's products hide their
        // latency: loaded after the K phase's barrier, every warp of the SM's one CTA waited on them at once
        // (the qk_rstd build reads them from the stage, where R1 found them)
        float rq[2] = {0.f, 0.f}, rk[2] = {0.f, 0.f};
        if (!QK_RSTD && a.q_rstd != nullptr) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = g + 8 * r;
                if (i < lt) {
                    rq[r] = a.q_rstd[(tok0 + i) * H + qh];
                    rk[r] = a.k_rstd[(tok0 + i) * H + qh];
                }
            }
        }
#if KDB_GATE
        unsigned short graw[GATE_ROWS];   // g_raw of this lane's channel and rows, for the epilogue (as rq, rk)
        gate_raw_rows(ga, row0 + gi0 * RS + gk, RS, lt - gi0, graw);
#endif
        if (it + 1 < ntile) {
            load_tile(a, cps, smem, st ^ 1, (it + 1) % TILES_PER_CHUNK, row0 + TILE_TOKENS * RS,
                      qk_row0 + TILE_TOKENS * QK_RS, RS, min(TILE_TOKENS, run_len - TILE_TOKENS * (it + 1)),
                      snap0 + it + 1, -1, h, tid);
            timer.lap(T_ISSUE);
            cp_async_wait<1>();
        } else {
            timer.lap(T_ISSUE);
            cp_async_wait<0>();
        }
        __syncthreads();   // tile it's inputs (and S0) are in; the previous tile is done with everything
        if (it == 0) timer.lap(T_WAIT_FIRST);   // what a run of more chunks pays once for all of them
        else timer.lap(T_WAIT_LOADS);

        unsigned char* const stg = smem + st * STAGE;
        const u32 stb = sb + st * STAGE;
        const u32 sr = stb + lr, sc = stb + lc, sr32 = stb + lr32, sc32 = stb + lc32;
        const u32 scv = sc + 2 * v0, srv = sr + 2 * v0, sck = sc + k0 * ROW;
        const float* const gs = reinterpret_cast<const float*>(stg + ST_G);
        const float* const gbs = reinterpret_cast<const float*>(stg + ST_GB);
        const float* const betas = reinterpret_cast<const float*>(stg + ST_BETA);
        unsigned short* const qs = reinterpret_cast<unsigned short*>(stg + ST_Q);
        unsigned short* const ks = reinterpret_cast<unsigned short*>(stg + ST_K);
        const float* const rstds = reinterpret_cast<const float*>(smem + SM_RSTD + st * RSTD_STAGE);

        // ---- R1: the gate-weighted operands, in fp32, rounded once to bf16; gc kept in fp32 ----
        const bool past = rebuild_operands(smem, gs, gbs, betas, qs, ks, rstds, gt_s, gamma_s, gcs, lt, s, tid);
        if (it == 0) {   // this warp's S0^T rows, fp32 from the bf16 state (the run's first tile only)
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                u32 x[4];
                a_of_t(x, ncv + SM_S + at(16 * b, 0));
                a_to_acc(S[2 * b], S[2 * b + 1], x);
            }
        }
        // R1 is in; a tile with a channel past SPAN_LIMIT takes the pairwise G14-G17 (the same for
        // every thread: the branch below never diverges)
        const bool pairwise = __syncthreads_or(past);
        timer.lap(T_R1);

        // ================= V phase: v rows v0..v0+15, tokens as N =================
        float U[2][4];
        v_phase(U, S, betas, nc, ncv, nc32, scv, sr32, sc32, dpart, b1part, warp, g, t);
        __syncwarp();   // this warp's U and dW columns are in shared memory

        // G9 / G10 partials over this warp's v: dMqk = do U^T, dW U^T   [i][j], U in two parts
        g9_g10_partials(part, srv, nrv, ncv, nc32, warp, g, t);

        // G8: S1^T = gamma S0^T + U^T Kr, kept in registers until the K phase has read S0
        if (it + 1 < ntile) next_state(S, U, nr, gamma_s, t);
        timer.lap(T_V_PHASE);
        __syncthreads();   // partials, U, dW complete
        timer.lap(T_V_BARRIER);

        // The partial sums over v, added in a fixed order (deterministic). dMqk and dLkk (strictly
        // lower) go out as bf16 A fragments, each element written to its (lane, register, half)
        // of the fragment of the matrix and of its transpose (mma.cuh's A layout). Each goes as
        // two: its bf16 rounding and the bf16 rounding of the remainder, so that G14-G17 see
        // them to about 2^-17 (in one bf16 fragment they carry about a tenth of dq's and dk's error).
        reduce_partials(frag16, part, dpart, b1part, dvec, b1, tid);
        __syncthreads();
        timer.lap(T_REDUCE);

        // ================= K phase: k columns k0..k0+15, tokens as M =================
        {
            float Qd[2][4], WS[2][4], Kr[2][4], Qe[2][4], X[2][4], Gm[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                zero4(Qd[nt]); zero4(WS[nt]); zero4(Kr[nt]); zero4(Qe[nt]); zero4(X[nt]); zero4(Gm[nt]);
            }
            // G11, G12, G13 over v, and S0 dS1^T on this warp's 16 k rows, whose diagonal is
            // dgamma = rowsum(S0 . dS1) (the dS1 fragments are G13's)
#pragma unroll
            for (int ks2 = 0; ks2 < 8; ++ks2) {
                u32 bs0[2], bs1[2], bd0[2], bd1[2], ad[4], aw[4], au[4], as[4];
                b_of_t(bs0, bs1, nck + SM_S + at(0, 16 * ks2));
                b_of_t(bd0, bd1, sck + ST_DS + at(0, 16 * ks2));
                a_of(ad, sr + ST_DO + at(0, 16 * ks2));
                a_of(aw, nr + SM_DW + at(0, 16 * ks2));
                a_of(au, nr + SM_U + at(0, 16 * ks2));
                a_of(as, nr + SM_S + at(k0, 16 * ks2));
                mma(Qd[0], ad, bs0); mma(Qd[1], ad, bs1);
                mma(WS[0], aw, bs0); mma(WS[1], aw, bs1);
                mma(Kr[0], au, bd0); mma(Kr[1], au, bd1);
                mma(Gm[0], as, bd0); mma(Gm[1], as, bd1);
            }
            // G14-G17: the TILE_TOKENS x TILE_TOKENS gradients against Kr, Qe and beta Ke (a tile past
            // SPAN_LIMIT forms them pairwise below; Kr then holds G13 alone)
            if (!pairwise) {
                const uint4 fm = frag[0 * 32 + lane], fmt = frag[1 * 32 + lane];
                const uint4 fl = frag[2 * 32 + lane], flt = frag[3 * 32 + lane];
                const u32 am[4] = {fm.x, fm.y, fm.z, fm.w}, amt[4] = {fmt.x, fmt.y, fmt.z, fmt.w};
                const u32 al[4] = {fl.x, fl.y, fl.z, fl.w}, alt[4] = {flt.x, flt.y, flt.z, flt.w};
                u32 bk0[2], bk1[2], bq0[2], bq1[2], be0[2], be1[2];
                b_of(bk0, bk1, nrk + SM_KR);
                b_of(bq0, bq1, nrk + SM_QE);
                b_of(be0, be1, nrk + SM_BKE);
                mma(Qe[0], am, bk0); mma(Qe[1], am, bk1);     // G14
                mma(X[0], al, bk0); mma(X[1], al, bk1);       // G16
                mma(Kr[0], amt, bq0); mma(Kr[1], amt, bq1);   // G15
                mma(Kr[0], alt, be0); mma(Kr[1], alt, be1);   // G17
                const uint4 rm = frag[4 * 32 + lane], rmt = frag[5 * 32 + lane];   // the remainders
                const uint4 rl = frag[6 * 32 + lane], rlt = frag[7 * 32 + lane];
                const u32 bm[4] = {rm.x, rm.y, rm.z, rm.w}, bmt[4] = {rmt.x, rmt.y, rmt.z, rmt.w};
                const u32 bl[4] = {rl.x, rl.y, rl.z, rl.w}, blt[4] = {rlt.x, rlt.y, rlt.z, rlt.w};
                mma(Qe[0], bm, bk0); mma(Qe[1], bm, bk1);
                mma(X[0], bl, bk0); mma(X[1], bl, bk1);
                mma(Kr[0], bmt, bq0); mma(Kr[1], bmt, bq1);
                mma(Kr[0], blt, be0); mma(Kr[1], blt, be1);
            }
            // dgamma of row r of this warp's k: Gm's diagonal, in lane 4 (r mod 8) + (r mod 8) / 2:
            // r < 8 in n-tile 0's register (r mod 2), r >= 8 in n-tile 1's register 2 + (r mod 2)
            float dgc;
            {
                const float lo = (g & 1) ? Gm[0][1] : Gm[0][0], hi = (g & 1) ? Gm[1][3] : Gm[1][2];
                const int c = lane & 7, src = 4 * c + (c >> 1);
                const float from_lo = __shfl_sync(0xffffffffu, lo, src), from_hi = __shfl_sync(0xffffffffu, hi, src);
                dgc = (lane & 8) ? from_hi : from_lo;   // lanes 0..15: column k0 + lane
            }
            timer.lap(T_K_PRODUCTS);
            // back to q, k and the gate, with fp32 factors from gc (as R1). The gate's products
            // pair each gated operand an MMA read (Kd, Qe, beta Ke, Kr) with its gradient at the
            // bf16 value that MMA used: the cancellations between a tile's gated halves then hold
            // in rounding too. (With the fp32 values, fp32 - bf16 times the gradient is left over,
            // large against dg under strong gates and large states: kernel/studies/gradient_rounding.)
            // Qd feeds no MMA here and keeps its fp32 value.
            float* const fsb = part + warp * 2 * TILE_TOKENS * PS;   // this warp's from_start [16 i][16 k]
            float* const feb = fsb + TILE_TOKENS * PS;                 // and from_end
            float b2[2] = {0.f, 0.f};
            float dqo[2][2][2], dko[2][2][2];   // [n-tile][row half][pair]: dq, dk, stored after the loop
            float yq[2] = {0.f, 0.f}, yk[2] = {0.f, 0.f};   // y . dy of each row over this lane's 4 columns
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const int cl = 8 * nt + 2 * t, kk = k0 + cl;
                const float2 gT = *reinterpret_cast<const float2*>(gt_s + kk);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = g + 8 * r, x = 2 * r;
                    const float be = betas[i], dd = dvec[i];
                    const float2 gc = *reinterpret_cast<const float2*>(gcs + i * GC_ROW + kk);
                    const u32 q2 = *reinterpret_cast<const u32*>(qs + i * (ROW / 2) + kk);
                    const u32 k2 = *reinterpret_cast<const u32*>(ks + i * (ROW / 2) + kk);
                    const float gcv[2] = {gc.x, gc.y}, gTv[2] = {gT.x, gT.y};
                    const float qv[2] = {bf16_lo(q2), bf16_hi(q2)}, kv[2] = {bf16_lo(k2), bf16_hi(k2)};
                    const int so = i * ROW + 2 * kk;   // the pair's byte in R1's operand tiles
                    const u32 kd2 = *reinterpret_cast<const u32*>(smem + SM_KD + so);
                    const u32 kr2 = *reinterpret_cast<const u32*>(smem + SM_KR + so);
                    const u32 qe2 = *reinterpret_cast<const u32*>(smem + SM_QE + so);
                    const u32 be2 = *reinterpret_cast<const u32*>(smem + SM_BKE + so);
                    const float kdb[2] = {bf16_lo(kd2), bf16_hi(kd2)}, krb[2] = {bf16_lo(kr2), bf16_hi(kr2)};
                    const float qeb[2] = {bf16_lo(qe2), bf16_hi(qe2)}, beb[2] = {bf16_lo(be2), bf16_hi(be2)};
                    float* const dq2 = dqo[nt][r];
                    float* const dk2 = dko[nt][r];
                    float fs2[2], fe2[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float fs = exp2f(gcv[e]), fu = exp2f(gcv[e] - gTv[e]), fd = exp2f(gTv[e] - gcv[e]);
                        const float dQd = Qd[nt][x + e], dKd = -be * WS[nt][x + e], dKr = Kr[nt][x + e];
                        fs2[e] = s * qv[e] * fs * dQd + kdb[e] * dKd;
                        if (!pairwise) {
                            const float dQe = Qe[nt][x + e], dKe = be * X[nt][x + e];
                            dq2[e] = s * (fs * dQd + fu * dQe + dd * kv[e]);
                            dk2[e] = fs * dKd + fu * dKe + fd * dKr + s * dd * qv[e];
                            fe2[e] = qeb[e] * dQe + beb[e] * X[nt][x + e] - krb[e] * dKr;   // Ke dKe = (beta Ke) X
                            b2[r] += kv[e] * fu * X[nt][x + e];
                        } else {   // the same sums with each row's factor inside: Qe dQe = s q (fu dQe), ...
                            const PairwiseRow p = pairwise_row(frag16, gcs, qs, ks, betas, s, i, kk + e);
                            dq2[e] = s * (fs * dQd + p.below_m + dd * kv[e]);
                            dk2[e] = fs * dKd + be * p.below_l + fd * dKr + p.above + s * dd * qv[e];
                            fe2[e] = s * qv[e] * p.below_m + be * kv[e] * p.below_l - krb[e] * dKr - kv[e] * p.above;
                            b2[r] += kv[e] * p.below_l;
                        }
                    }
                    *reinterpret_cast<float2*>(fsb + i * PS + cl) = make_float2(fs2[0], fs2[1]);
                    *reinterpret_cast<float2*>(feb + i * PS + cl) = make_float2(fe2[0], fe2[1]);
                    yq[r] += qv[0] * dq2[0] + qv[1] * dq2[1];
                    yk[r] += kv[0] * dk2[0] + kv[1] * dk2[1];
                }
            }
            timer.lap(T_K_ELEMENTWISE);
            // dq and dk out. Where the op normalised q and k (their rstd given), through the l2norm's
            // backward first: dx = rstd (dy - y (y . dy)), y the normalised row this kernel read. A row's
            // y . dy over its 128 columns: this warp's 16 (the row's 4 lanes), then the 8 warps' in
            // shared memory, added in a fixed order.
            if (QK_RSTD || a.q_rstd != nullptr) {
#if KDB_QK_RSTD
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    rq[r] = rstds[g + 8 * r];
                    rk[r] = rstds[TILE_TOKENS + g + 8 * r];
                }
#endif
#pragma unroll
                for (int r = 0; r < 2; ++r) {
#pragma unroll
                    for (int m = 1; m <= 2; m <<= 1) {
                        yq[r] += __shfl_xor_sync(0xffffffffu, yq[r], m);
                        yk[r] += __shfl_xor_sync(0xffffffffu, yk[r], m);
                    }
                    if (t == 0) {
                        l2part[warp * TILE_TOKENS + g + 8 * r] = yq[r];
                        l2part[(WARPS + warp) * TILE_TOKENS + g + 8 * r] = yk[r];
                    }
                }
                __syncthreads();   // every warp's row sums are in
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = g + 8 * r;
                    float dot_q = 0.f, dot_k = 0.f;
#pragma unroll
                    for (int w = 0; w < WARPS; ++w) {
                        dot_q += l2part[w * TILE_TOKENS + i];
                        dot_k += l2part[(WARPS + w) * TILE_TOKENS + i];
                    }
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt) {
                        const int kk = k0 + 8 * nt + 2 * t;
                        const u32 q2 = *reinterpret_cast<const u32*>(qs + i * (ROW / 2) + kk);
                        const u32 k2 = *reinterpret_cast<const u32*>(ks + i * (ROW / 2) + kk);
                        const float qv[2] = {bf16_lo(q2), bf16_hi(q2)}, kv[2] = {bf16_lo(k2), bf16_hi(k2)};
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            dqo[nt][r][e] = rq[r] * (dqo[nt][r][e] - qv[e] * dot_q);
                            dko[nt][r][e] = rk[r] * (dko[nt][r][e] - kv[e] * dot_k);
                        }
                    }
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = g + 8 * r;
                    if (i < lt) {
                        const long long off = row0 + i * RS + k0 + 8 * nt + 2 * t;
                        if (a.dqk_bf16) {   // rounded once, where the caller's gradients are bf16
                            reinterpret_cast<u32*>(a.dq)[off / 2] = pack_bf16x2(dqo[nt][r][0], dqo[nt][r][1]);
                            reinterpret_cast<u32*>(a.dk)[off / 2] = pack_bf16x2(dko[nt][r][0], dko[nt][r][1]);
                        } else {
                            reinterpret_cast<float2*>(a.dq)[off / 2] = make_float2(dqo[nt][r][0], dqo[nt][r][1]);
                            reinterpret_cast<float2*>(a.dk)[off / 2] = make_float2(dko[nt][r][0], dko[nt][r][1]);
                        }
                    }
                }
            }
            // rowsum(Ke . X) over this warp's 16 k: the 4 lanes of a row, then one store per row
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float x = b2[r];
                x += __shfl_xor_sync(0xffffffffu, x, 1);
                x += __shfl_xor_sync(0xffffffffu, x, 2);
                if (t == 0) b2part[warp * TILE_TOKENS + g + 8 * r] = x;
            }
            __syncwarp();
            timer.lap(T_L2NORM_STORES);
            // dg[i] = sum_{c >= i} from_start[c] - sum_{c < i} from_end[c] + gamma dgamma
            {
#if KDB_GATE
                float gx[GATE_ROWS];
                gate_inputs(graw, gate_b, gx);
                float dgv[TILE_TOKENS] = {};   // lanes 0..15: dg of their channel's 16 rows
#endif
                if (lane < TILE_TOKENS) {
                    const int kk = k0 + lane;
                    const float tail = gamma_s[kk] * dgc;
                    float rev[TILE_TOKENS];
                    float acc = 0.f;
#pragma unroll
                    for (int i = TILE_TOKENS - 1; i >= 0; --i) { acc += fsb[i * PS + lane]; rev[i] = acc; }
                    float ex = 0.f;
#pragma unroll
                    for (int i = 0; i < TILE_TOKENS; ++i) {
#if KDB_GATE
                        dgv[i] = rev[i] - ex + tail;
#else
                        if (i < lt) a.dg[row0 + i * RS + kk] = rev[i] - ex + tail;
#endif
                        ex += feb[i * PS + lane];
                    }
                }
#if KDB_GATE
#pragma unroll
                for (int j = 0; j < GATE_ROWS; ++j) {   // lane l + 16 takes rows 8..15 from lane l
                    const float hi = __shfl_up_sync(0xffffffffu, dgv[GATE_ROWS + j], 16);
                    const int i = gi0 + j;
                    if (i < lt)
                        gate_epilogue(ga, gate_a, gi0 != 0 ? hi : dgv[j], gx[j], row0 + i * RS + gk, gate_dt, gate_da);
                }
#endif
            }
            timer.lap(T_DG);
        }
        __syncthreads();   // the K phase has read S0, dS1, U, dW; the dbeta partials are in

        if (tid < lt) {
            float x = b1[tid];
#pragma unroll
            for (int w = 0; w < WARPS; ++w) x += b2part[w * TILE_TOKENS + tid];
            a.dbeta[(tok0 + tid) * HV + h] = x;
        }
        {   // dv: 16 rows of 256 bytes from the staging tile
            const int r = tid >> 4, c = tid & 15;
            if (r < lt)
                *reinterpret_cast<uint4*>(a.dv + row0 + r * RS + c * 8) =
                    *reinterpret_cast<const uint4*>(smem + SM_DV + r * ROW + c * 16);
        }
        if (it + 1 < ntile) {   // S1 (bf16) for the next tile's K phase
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                u32 x[4];
                acc_to_a(x, S[2 * b], S[2 * b + 1]);
                stmatrix_x4_trans(ncv + SM_S + at(16 * b, 0), x[0], x[1], x[2], x[3]);
            }
        }
        timer.lap(T_END);
    }
    timer.flush(timing_row(warp), lane);
#if KDB_GATE
    // l2part is free: the last tile's K phase read it before that tile's last barrier
    gate_partials(ga, gate_dt, gate_da, run * HV + h, warp, lane, l2part);
#endif
}
