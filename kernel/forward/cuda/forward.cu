// kernel/forward/cuda/forward.cu -- KDA's chunked forward in one pass over 16-token tiles: o, the final
// state, and in training mode what our backward reads (the bf16 state entering every 64-token chunk,
// and the 16 x 16 diagonal blocks of Aqk and Akk in FLA's layout).
//
// Math per 16-token tile of one sequence and head (rows c < L real, the rest zero):
//     gc = g - g[row before the tile]   (FLA's g restarts every 64 tokens: nothing to subtract
//                                        at a 64-chunk's first tile; in the token-gate build g is
//                                        each token's gate, and gc its sum over the tile's rows so far)
//     gT = gc[L-1];  rows >= L: gc = gT, q = k = v = beta = 0
//     Kd = k 2^gc  Kr = k 2^(gT-gc)  Qd = s q 2^gc  Qe = s q 2^(gc-gT)  Ke = k 2^(gc-gT)  gamma = 2^gT
//     Mqk = strict_tril(Qe Kr^T) + diag(s q . k);  INV = (I + diag(beta) strict_tril(Ke Kr^T))^-1
//     Vn = v - Kd S;  U = INV (beta Vn);  o = Qd S + Mqk U;  S <- diag(gamma) S + Kr^T U
// (kernel/reference/kda.py, _tile_forward). Before every 4th tile's update S goes out as bf16 [K][V]
// (Kernel S's states, FLA's h); Mqk and INV go out as the diagonal blocks of FLA's Aqk and Akk.
//
// Design: Kernel S (kernel/forward_states/cuda/forward_states.cu) plus q, plus Mqk and INV built on
// chip instead of INV read, plus o. S is held transposed, S^T [V x K], in mma.m16n8k16 fp32
// accumulators, one consumer warp per 16 V rows, and the chain G6 -> G7 -> G8 runs exactly as
// Kernel S runs it (the same MMAs in the same order: the states come out bit for bit as Kernel S's
// on this forward's Akk). Off the chain, each consumer warp adds
//     O^T  = S^T Qd^T            A = S^T (the G6 loop's fragments)   B = Qd^T: Qd [token][K], cols first
//     O^T += U^T Mqk^T           A = U^T (G8's fragment)             B = Mqk^T: Mqk [i][j], cols first
// and writes o through a staging tile (stmatrix .trans of O^T's A fragment gives O [token][v]).
//
// The producer warps fill the ring ahead of the chain as in Kernel S (loads FS_NSTAGE - 1 tiles
// ahead, R1 one tile ahead), and also build each tile's state-free products there: after R1, a
// producer-only named barrier (every row's Qe, Ke, Kr is in), then producer warp 0 forms Mqk and the
// last producer warp Akk and INV (forward_intra.cuh), by mma, or pairwise for a tile past SPAN_LIMIT.
// With KF_PRODUCT_WARPS = 2 two warps of their own form them instead, a tile behind R1: the producers
// hand each tile's R1 over by a barrier of its parity and go on to the next tile's R1 while the
// products of this one are formed (forward_layout.cuh names the barriers). Alone on the producers,
// R1 and the products run one after another on every tile; at one sequence a CTA that sum binds.
// KF_MBARRIER_RING = 1 is a checking build: every hand-off between warps on mbarriers instead of named
// barriers (forward_layout.cuh's Mbarriers), so that compute-sanitizer's racecheck can follow them.
//
// The rooms: forward_layout.cuh (stages, scratch, staging, barriers), forward_loads.cuh (a tile's
// copies), forward_r1.cuh (R1), forward_intra.cuh (Mqk, INV), and Kernel S's
// forward_states_chain.cuh (a consumer warp's step of the chain) and forward_states_walk.cuh (the CTA's
// sequence, the producers' ring loop, a consumer's initial state and snapshot store). This file holds
// the knobs and the kernel: each role's walk over the tiles.
#include "../../shapes.cuh"   // HEAD_DIM (K = V), TILE_TOKENS, CHUNK_TOKENS, TILES_PER_CHUNK, qk_head, SPAN_LIMIT
#include "cp_async.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "ring.cuh"
#include "stmatrix.cuh"

// Every knob is set by kernel/forward/config.py (config.Config, options()); none has a default here.
#ifndef KF_WARPS
#error "KF_WARPS is not set: kernel/forward/config.py sets every knob (Config.warps)"
#endif
#ifndef KF_PRODUCERS
#error "KF_PRODUCERS is not set: kernel/forward/config.py sets every knob (Config.producers)"
#endif
#ifndef KF_NSTAGE
#error "KF_NSTAGE is not set: kernel/forward/config.py sets every knob (Config.nstage)"
#endif
#ifndef KF_G6_SPLIT
#error "KF_G6_SPLIT is not set: kernel/forward/config.py sets every knob (Config.g6_split)"
#endif
#ifndef KF_PRODUCT_WARPS
#error "KF_PRODUCT_WARPS is not set: kernel/forward/config.py sets every knob (Config.product_warps)"
#endif
#ifndef KF_MBARRIER_RING
#error "KF_MBARRIER_RING is not set: kernel/forward/config.py sets every knob (Config.mbarrier_ring)"
#endif
#ifndef KF_TOKEN_GATE
#error "KF_TOKEN_GATE is not set: kernel/forward/config.py sets every knob (Config.token_gate)"
#endif
#ifndef KF_L2NORM
#error "KF_L2NORM is not set: kernel/forward/config.py sets every knob (Config.l2norm)"
#endif
#ifndef KF_QK_RSTD
#error "KF_QK_RSTD is not set: kernel/forward/config.py sets every knob (Config.qk_rstd)"
#endif
#ifndef KF_TIMING
#error "KF_TIMING is not set: kernel/forward/config.py sets every knob (Config.timing)"
#endif

namespace kf {
using namespace ptx_lab;
typedef unsigned short u16;

constexpr int WARPS = KF_WARPS;         // consumer warps
constexpr int PRODUCERS = KF_PRODUCERS; // producer warps
constexpr int NSTAGE = KF_NSTAGE;
constexpr int PREFETCH = NSTAGE - 1;    // tiles whose loads are in flight ahead of R1
constexpr int G6_SPLIT = KF_G6_SPLIT;
constexpr int PRODUCT_WARPS = KF_PRODUCT_WARPS;   // warps of Mqk and INV alone, a tile behind R1 (0: the producers')
constexpr bool MBARRIER_RING = KF_MBARRIER_RING != 0;   // the checking build: every hand-off on mbarriers
constexpr bool TOKEN_GATE = KF_TOKEN_GATE != 0;   // g is each token's natural-log gate, summed in R1
constexpr bool L2NORM = KF_L2NORM != 0;           // q and k as the caller has them, l2-normalised in R1
constexpr bool QK_RSTD = KF_QK_RSTD != 0;         // q and k as the caller has them, scaled in R1 by the rstd given
constexpr bool TIMING = KF_TIMING != 0;           // the clock accounting of each role's slots (forward_timing.cuh)
constexpr int CONSUMER_THREADS = 32 * WARPS;
constexpr int PRODUCER_THREADS = 32 * PRODUCERS;
constexpr int PRODUCT_THREADS = 32 * PRODUCT_WARPS;
constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS + PRODUCT_THREADS;
constexpr int ROWS_PER_PRODUCER = TILE_TOKENS / PRODUCERS;
constexpr int VW = 16 * WARPS;          // v rows of S^T per CTA
constexpr int VGROUPS = HEAD_DIM / VW;  // CTAs per (sequence, head)
// the warp that forms Mqk and the one that forms Akk and INV, counted among the product warps where
// there are any, else among the producers (then the last one, which copies beta)
constexpr int MQK_WARP = 0;
constexpr int INV_WARP = (PRODUCT_WARPS > 0 ? PRODUCT_WARPS : PRODUCERS) - 1;
static_assert(WARPS == 1 || WARPS == 2 || WARPS == 4 || WARPS == 8, "KF_WARPS must be 1, 2, 4 or 8");
static_assert(PRODUCERS == 1 || PRODUCERS == 2 || PRODUCERS == 4 || PRODUCERS == 8, "KF_PRODUCERS must be 1, 2, 4 or 8");
static_assert(PRODUCT_WARPS == 0 || PRODUCT_WARPS == 2, "KF_PRODUCT_WARPS must be 0 or 2");
// FULL(s) and EMPTY(s) take ids 1 .. 2 NSTAGE of the 15 named barriers, the producers' barrier the next,
// and with product warps R1_DONE and PRODUCTS_DONE the four after it (forward_layout.cuh)
static_assert(NSTAGE >= 2 && NSTAGE <= (PRODUCT_WARPS > 0 ? 5 : 7),
              "KF_NSTAGE must be 2 .. 7, and 2 .. 5 with product warps");
static_assert(!(L2NORM && QK_RSTD), "KF_L2NORM and KF_QK_RSTD are two forms of raw q and k: at most one");
static_assert(G6_SPLIT == 1 || G6_SPLIT == 2 || G6_SPLIT == 4, "KF_G6_SPLIT must be 1, 2 or 4");

}  // namespace kf

// the roles' headers, built on the configuration above
#include "forward_layout.cuh"
#include "forward_loads.cuh"
#include "forward_r1.cuh"
#include "forward_intra.cuh"
#include "forward_timing.cuh"
#include "../../forward_states/cuda/forward_states_chain.cuh"   // Kernel S's step of the chain
#include "../../forward_states/cuda/forward_states_walk.cuh"    // ... and its walk over the tiles

using namespace kf;

// Dynamic shared memory and threads the launch must use (read by the host through the module).
extern "C" __constant__ int kf_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kf_threads = THREADS;

// Grid: one CTA per (sequence rank, value head, v group), v group fastest; order[rank] is the
// sequence (longest first). q and k have H heads, the other arrays HV (FLA's grouped value heads:
// value head h reads q and k at head qk_head(h, HV, H)). Outputs (a null pointer: not written):
//   o            bf16 [tokens, HV, V]                  always
//   final_state  fp32 [N, HV, K, V]
//   states       bf16 [sum of entries, HV, K, V]       entry snap_offsets[n] + c: the state entering tile 4c
//   aqk, akk     bf16 [tokens, HV, 64]                 only the 16 x 16 diagonal blocks are written
//   q_norm, k_norm  bf16 [tokens, H, 128]             the l2norm build's q and k normalised (null: not written)
//   q_rstd, k_rstd  fp32 [tokens, H]                  ... and each row's 1 / sqrt(sum x^2 + 1e-6); in the qk_rstd
//                                                     build an input: the rstd of the raw q and k it reads
extern "C" __global__ void __launch_bounds__(THREADS, 1)
kda_forward(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
            const float* __restrict__ g, const float* __restrict__ beta, const float* __restrict__ h0, float scale,
            u16* __restrict__ o, float* __restrict__ final_state, u16* __restrict__ states, u16* __restrict__ aqk,
            u16* __restrict__ akk, u16* __restrict__ q_norm, u16* __restrict__ k_norm, float* __restrict__ q_rstd,
            float* __restrict__ k_rstd, const long long* __restrict__ cu_seqlens,
            const long long* __restrict__ snap_offsets, const int* __restrict__ order, int HV, int H) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    Mbarriers& mb = *reinterpret_cast<Mbarriers*>(smem_raw + sizeof(Shared));   // the checking build's alone
    RstdStages& rstd = *reinterpret_cast<RstdStages*>(smem_raw + RSTD_OFFSET);   // the qk_rstd build's alone
    if constexpr (MBARRIER_RING) {
        if (tid == 0) mb.init();
        __syncthreads();
    }
    const kda_walk::Cta cta = kda_walk::cta_of<VGROUPS>(cu_seqlens, order, HV);
    const int vg = cta.vg, h = cta.h, n = cta.n, len = cta.len, ntiles = cta.ntiles;
    const long long bos = cta.bos;

    if constexpr (PRODUCT_WARPS > 0) {
        if (warp >= WARPS + PRODUCERS) {
            // ------- product warps: Mqk (the first) and Akk with INV (the second), a tile behind R1 -------
            const int xw = warp - WARPS - PRODUCERS;   // MQK_WARP or INV_WARP
            WarpTimer timer;
            timer.start();
#pragma unroll 1
            for (int i = 0; i < ntiles; ++i) {
                const int s = i % NSTAGE, parity = i % 2;
                const int L = min(TILE_TOKENS, len - TILE_TOKENS * i);
                // tile i's R1 and copies are in (tile i is its parity's use i / 2)
                if constexpr (MBARRIER_RING) mbarrier_wait_parity(smem_addr(&mb.r1_done[parity]), (i / 2) & 1);
                else named_barrier_sync(R1_DONE_BARRIER + parity, HANDOFF_THREADS);
                timer.lap(T_WAIT);
                tile_products(sh.stage[s], sh.scratch, parity, L, scale, bos, i, aqk, akk, vg, HV, h, xw, lane,
                              rstd.q[s], rstd.k[s]);
                timer.lap(T_WORK);
                // the scratch of this parity is read: R1 of tile i + 2 may write it
                if (i + 2 < ntiles) {
                    if constexpr (MBARRIER_RING) mbarrier_arrive(smem_addr(&mb.products_done[parity]));
                    else named_barrier_arrive(PRODUCTS_DONE_BARRIER + parity, HANDOFF_THREADS);
                }
                // Mqk and INV of tile i are in its stage
                if constexpr (MBARRIER_RING) mb.ring.publish(i);
                else Ring::publish(s);
                timer.lap(T_PASS);
            }
            timer.flush(timing_row(warp), lane);
            return;
        }
    }
    if (warp >= WARPS) {
        // ------- producers: loads PREFETCH tiles ahead; R1 (and without product warps the products) one tile ahead -------
        const int pw = warp - WARPS, ptid = tid - CONSUMER_THREADS;
        const int kh = qk_head(h, HV, H);
        auto issue = [&](int i) {
            issue_tile(sh.stage[i % NSTAGE], q, k, v, g, beta, q_rstd, k_rstd, rstd.q[i % NSTAGE],
                       rstd.k[i % NSTAGE], bos + (long long)TILE_TOKENS * i,
                       min(TILE_TOKENS, len - TILE_TOKENS * i), i, HV, H, h, kh, vg, pw, lane, ptid);
        };
        // the producers' own barrier: after R1 without product warps, and before it in the token-gate build
        // (the checking build counts its phases: one or two a tile)
        u32 producer_phase = 0;
        auto producers_sync = [&]() {
            if constexpr (MBARRIER_RING) {
                mbarrier_arrive(smem_addr(&mb.producers));
                mbarrier_wait_parity(smem_addr(&mb.producers), producer_phase & 1);
                ++producer_phase;
            } else {
                named_barrier_sync(PRODUCER_BARRIER, PRODUCER_THREADS);
            }
        };
        WarpTimer timer;
        timer.start();
        kda_walk::prefetch<PREFETCH>(ntiles, issue);
#pragma unroll 1
        for (int i = 0; i < ntiles; ++i) {   // R1, then Mqk and INV after a barrier of the producers alone, or
                                             // with product warps R1 handed over to them
            const int s = i % NSTAGE, parity = i % 2;
            const int L = min(TILE_TOKENS, len - TILE_TOKENS * i);
            Stage& st = sh.stage[s];
            kda_walk::copies_landed<PREFETCH>();
            if constexpr (TOKEN_GATE) producers_sync();   // every producer's gate rows are in: R1 sums them all
            if constexpr (PRODUCT_WARPS > 0) {   // tile i - 2's products have read the scratch of this parity
                if (i >= 2) {
                    if constexpr (MBARRIER_RING) mbarrier_wait_parity(smem_addr(&mb.products_done[parity]), (i / 2 - 1) & 1);
                    else named_barrier_sync(PRODUCTS_DONE_BARRIER + parity, HANDOFF_THREADS);
                }
            }
            // the l2norm build's outputs at the tile's first row of query head kh, written by v group 0 of the
            // first value head that reads it
            const long long row0 = (bos + (long long)TILE_TOKENS * i) * H + kh;
            const kda_l2norm::NormOut norm{q_norm + row0 * HEAD_DIM, k_norm + row0 * HEAD_DIM, q_rstd + row0,
                                           k_rstd + row0, (long long)H * HEAD_DIM, H,
                                           L2NORM && q_norm != nullptr && vg == 0 && h % (HV / H) == 0};
            timer.lap(T_WAIT);
            const bool past = rebuild(st, sh.scratch, parity, L, scale, pw, lane, norm, rstd.q[s], rstd.k[s]);
            if (lane == 0) sh.scratch.past[parity][pw] = past;
            timer.lap(T_WORK);
            if constexpr (PRODUCT_WARPS > 0) {   // the product warps take over
                if constexpr (MBARRIER_RING) mbarrier_arrive(smem_addr(&mb.r1_done[parity]));
                else named_barrier_arrive(R1_DONE_BARRIER + parity, HANDOFF_THREADS);
            } else {
                producers_sync();   // every row's R1 (and copies) are in
                tile_products(st, sh.scratch, parity, L, scale, bos, i, aqk, akk, vg, HV, h, pw, lane, rstd.q[s],
                              rstd.k[s]);
            }
            timer.lap(T_PASS);
            if constexpr (MBARRIER_RING) {   // kda_walk::hand_over on the mbarrier ring, which counts tiles
                mb.ring.publish(i);
                const int j = i + PREFETCH;
                mb.ring.wait_to_refill(j, ntiles);
                kda_walk::issue_slot(j, ntiles, issue);
            } else {
                kda_walk::hand_over<Ring, PREFETCH>(i, s, ntiles, issue);
            }
            timer.lap(T_REFILL);
        }
        cp_async_wait<0>();
        timer.flush(timing_row(warp), lane);
        return;
    }

    // ---------------- consumers: the chain, one warp per 16 v rows, and o ----------------
    const int gr = lane / 4, t = lane % 4;                 // mma fragment row and column pair
    const long long snap0 = snap_offsets[n];
    const int vrow = 16 * warp;                            // this warp's first v row within the CTA's VW
    const X4Lane xl = x4_lane(lane);

    // S^T [16 v x 128 k] of this warp, in the chain's accumulators (Kernel S's forward_states_walk.cuh)
    float acc[HEAD_DIM / 8][4];
    const long long v0 = vg * VW + vrow + gr;
    WarpTimer timer;
    timer.start();
    kda_walk::load_state(acc, h0, n, HV, h, v0, t);

#pragma unroll 1
    for (int i = 0; i < ntiles; ++i) {
        const int s = i % NSTAGE;
        // tile i's inputs and operands are in stage s
        if constexpr (MBARRIER_RING) mb.ring.wait_full(i);
        else Ring::wait_full(s);
        const Stage& st = sh.stage[s];
        __syncwarp();         // the last tile's o left the staging tile before the snapshot reuses it
        timer.lap(T_WAIT);

        // Kernel S's step of the chain (forward_states_chain.cuh): G6 (every 4th tile staging S for its
        // store first), G7, G8; F1, O^T = S^T Qd^T, beside each G6 k-step on its A fragment
        const bool snap = states != nullptr && i % TILES_PER_CHUNK == 0;
        float out[2][4] = {};
        u32 ua[4];
        kda_chain::step<G6_SPLIT>(ua, acc, st, sh.snap[warp], snap, vrow, gr, t, xl, [&](int ks, const u32 (&a)[4]) {
            u32 bq[4];
            const RowCol p = x4_cols_first(0, 16 * ks, xl);
            ldmatrix_x4(bq, smem_addr(&st.qd[p.row][p.col]));
            const u32 bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]};
            mma_m16n8k16_bf16(out[0], a, bq0, out[0]);
            mma_m16n8k16_bf16(out[1], a, bq1, out[1]);
        });
        // F2, O^T += U^T Mqk^T
        {
            u32 b[4];
            const RowCol p = x4_cols_first(0, 0, xl);
            ldmatrix_x4(b, smem_addr(&st.mqk[p.row][p.col]));
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_m16n8k16_bf16(out[0], ua, b0, out[0]);
            mma_m16n8k16_bf16(out[1], ua, b1, out[1]);
        }
        timer.lap(T_WORK);
        if (Ring::releases(i, ntiles)) {   // the producers refill stage s
            if constexpr (MBARRIER_RING) mb.ring.release(i);
            else Ring::release(s);
        }

        // the staged S goes out while the update's MMAs run (the staging tile is this warp's alone)
        if (snap) {
            kda_walk::store_snapshot(states, sh.snap[warp], snap0, i, HV, h, vg * VW, vrow, lane);
            __syncwarp();
        }
        timer.lap(T_PASS);

        // o [token][v]: O^T's A fragment by stmatrix .trans into the staging tile's first 16 rows,
        // then 16 rows of 32 bytes, one 16-byte half a lane, rows < L
        {
            u32 a[4];
            acc_to_a(a, out[0], out[1]);
            const RowCol p = x4_cols_first(0, 0, xl);
            stmatrix_x4_trans(smem_addr(&sh.snap[warp][p.row][p.col]), a[0], a[1], a[2], a[3]);
            __syncwarp();
            const int L = min(TILE_TOKENS, len - TILE_TOKENS * i);
            const int row = lane / 2, half = lane % 2;
            if (row < L)
                *reinterpret_cast<uint4*>(o + ((bos + (long long)TILE_TOKENS * i + row) * HV + h) * HEAD_DIM
                                          + vg * VW + vrow + half * 8) =
                    *reinterpret_cast<const uint4*>(&sh.snap[warp][row][half * 8]);
        }
        timer.lap(T_REFILL);
    }
    timer.flush(timing_row(warp), lane);

    // the state after the sequence's last token, fp32 [K][V]
    if (final_state != nullptr) {
        float* dst = final_state + ((long long)n * HV + h) * HEAD_DIM * HEAD_DIM;
#pragma unroll
        for (int nt = 0; nt < HEAD_DIM / 8; ++nt) {
            const int k0 = 8 * nt + 2 * t;
            dst[(long long)k0 * HEAD_DIM + v0] = acc[nt][0];
            dst[(long long)(k0 + 1) * HEAD_DIM + v0] = acc[nt][1];
            dst[(long long)k0 * HEAD_DIM + v0 + 8] = acc[nt][2];
            dst[(long long)(k0 + 1) * HEAD_DIM + v0 + 8] = acc[nt][3];
        }
    }
}
