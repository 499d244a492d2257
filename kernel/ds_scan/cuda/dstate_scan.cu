// kernel/ds_scan/cuda/dstate_scan.cu -- Kernel A: the backward dstate scan of KDA.
//
// Math (docs/kernel_a.md), per sequence and head, tiles of TILE_TOKENS = 16 tokens walked from the
// last to the first:
//     snapshot[n] = dS
//     dU     = Mqk^T @ do + kr @ dS          G1 + G2   [TILE_TOKENS, V]
//     dvcorr = INV^T @ dU                    G3        [TILE_TOKENS, V]
//     T1     = qd^T @ do - kd^T @ (beta*dvcorr)   G4 + G5   [K, V]
//     dS     = exp2(gT)[:, None] * dS + T1   combine   [K, V]
//
// Design: everything is computed transposed, with the v axis as the MMA's M.
//     dU^T     = do^T @ Mqk + dS^T @ kr^T     (M = v, N = c, K = c' / k)
//     dvcorr^T = dU^T @ INV
//     dS^T     = exp2(gT) * dS^T + do^T @ qd + (-beta*dvcorr)^T @ kd   (M = v, N = k)
// A consumer warp owns a band of 16 * MT v columns and keeps its dS^T band [16 MT v x 128 k]
// (with KSPLIT 2: half of it, [16 MT v x 64 k], the other half in a second warp)
// in fp32 mma accumulators for the whole scan. Because the C fragments of two
// adjacent n-tiles, packed to bf16 pairwise, ARE the A fragment of one k-step
// (see ptx_lab/cuda/mma.cuh), dS^T (for G2), dU^T (for G3) and bdv^T (for G5)
// feed the next MMA straight from registers: no movmatrix, no shared-memory
// round trip, no barrier on the dS-dependent path, and dS never drops to bf16
// between tiles (only G2's operand copy is rounded, as in FLA).
//
// Warp roles: warps [0, NUM_CONSUMERS) are consumers (one v band each); NUM_PRODUCERS
// producer warps prefetch tile inputs into a ring of NSTAGE stages (loads.cuh) and rebuild
// qd/kd/kr on chip in fp32 (r1.cuh: R1), so the loads, R1 and the snapshot stores
// (snapshots.cuh) run ahead of / beside the serial chain (consumer.cuh, operands.cuh).
// Hand-off: the named-barrier ring of ptx_lab's ring.cuh, FULL(s) (producers arrive,
// consumers sync) and EMPTY(s) (consumers arrive, producers sync).
//
// The rooms: config.cuh (the knobs, every one set by kernel/ds_scan/config.py, and what follows from
// them), layout.cuh (shared memory, stages, tensor maps, the ring), work.cuh (the
// arguments, a CTA's work), timing.cuh (clock64 accounting), loads.cuh and r1.cuh (the
// producers' steps), operands.cuh (operand addresses, G4/G5's accumulate),
// consumer.cuh (the consumers' steps), snapshots.cuh. This file holds the kernel: it sets
// up shared memory and runs each role's walk over the tiles. The two walks, and G2 and G3,
// are written out here rather than as __forceinline__ functions of their own: NVVM
// optimises a function before inlining it, and as functions they compiled to different
// SASS; this split keeps the SASS of every build the same as the single file's.
#include "ring.cuh"
#include "cp_async.cuh"
#include "setmaxnreg.cuh"
#include "config.cuh"
#include "layout.cuh"

using namespace kda;

// Dynamic shared memory the launch must request (read by the host through the module).
extern "C" __constant__ int kda_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kda_threads = THREADS;
extern "C" __constant__ int kda_reg_split = REG_SPLIT;   // 1: setmaxnreg moved registers to the consumers
extern "C" __constant__ int kda_wgmma = WGMMA;           // 1: G4 and G5 are warpgroup MMAs
// The tensor-map boxes (kernel.ds_scan.launch encodes the maps from these): do box columns and
// swizzle, gc box columns, snapshot box rows (KW) and columns (BAND) and swizzle.
extern "C" __constant__ int kda_tma_dims[6] = {DO_BOX_COLS, DO_SWZ, GC_BOX_COLS, KW, BAND, SNAP_SWZ};
#include "timing.cuh"      // kda_timing_dims and kda_timing follow the constants above
#include "work.cuh"
#include "loads.cuh"
#include "r1.cuh"
#include "operands.cuh"
#include "snapshots.cuh"
#include "consumer.cuh"

extern "C" __global__ void __launch_bounds__(THREADS, 1)
kda_dstate_scan(const unsigned short* q, const unsigned short* k, const float* gc, const float* beta,
                const unsigned short* mqk, const unsigned short* inv, const unsigned short* dO,
                const float* dht, void* snapshots, float* dh0, const long long* cu_seqlens,
                const long long* snap_offsets, const int* order, int HV, int H, float scale,
                const __grid_constant__ TmaMaps maps) {
    const Params p{q, k, gc, beta, mqk, inv, dO, dht, snapshots, dh0, cu_seqlens, snap_offsets, order, HV, H, scale, &maps};
    // tensor copies: swizzled boxes need 1024-aligned addresses (SMEM_BYTES has the slack)
    unsigned char* const smem = ALIGN_SMEM ? smem_raw + (TMA_ALIGN - smem_addr(smem_raw) % TMA_ALIGN) % TMA_ALIGN : smem_raw;
    Stage* stages = reinterpret_cast<Stage*>(smem);
    const u32 mbar0 = smem_addr(smem + MBAR_OFFSET);   // LOADS 2: stage s's mbarrier at mbar0 + 8 s

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    PhaseTimer timer;
    const long long t_start = PhaseTimer::now();
    const u32 producers_mbar = smem_addr(smem + PRODUCERS_MBAR_OFFSET);   // TOKEN_GATE's
    if constexpr (TMA_LOADS) {
        if (threadIdx.x == 0) {
#pragma unroll 1
            for (int s = 0; s < NSTAGE; ++s) mbarrier_init(mbar0 + 8 * s, 1);   // one arrive (with the bytes) per use
            fence_mbarrier_init();
        }
        __syncthreads();
    }
    if constexpr (TOKEN_GATE) {
        if (threadIdx.x == 0) {
            mbarrier_init(producers_mbar, PRODUCER_THREADS);
            fence_mbarrier_init();
        }
        __syncthreads();
    }

    if (warp >= NUM_CONSUMERS) {
        // ---------------- producers: loads.cuh, r1.cuh ----------------
        // REGSPLIT: give registers back before anything is computed (a value live across the
        // change would be spilled); the consumers' inc below waits for them.
        if constexpr (REG_SPLIT) setmaxnreg_dec<PRODUCER_REGS>();
        const CtaWork w = cta_work(p);
        const int vs = w.vs, h = w.h, qh = w.qh, len = w.len, nt = w.nt;
        const long long seq_start = w.seq_start;
        const int pw = warp - NUM_CONSUMERS;
        const int ptid = threadIdx.x - NUM_CONSUMERS * 32;
        // Tile i of the walk is tile n = nt - 1 - i of the sequence. Loads run PREFETCH =
        // NSTAGE - 1 tiles ahead of R1: one tile ahead is not enough, a tile's loads then
        // wait out a whole global-memory latency per tile (logs 1 and 2).
        auto tile_len = [&](int n) { return min(TILE_TOKENS, len - n * TILE_TOKENS); };
        // Iteration i waits on EMPTY before refilling a stage with walk tile i + PREFETCH, if that
        // tile exists and the stage held an earlier one.
        // (Ring::refill_waits(i + PREFETCH, nt) written out: through the function the producer
        // loop's registers are allocated differently)
        auto empty_wait_at = [&](int i) { return i + PREFETCH < nt && i + PREFETCH >= NSTAGE; };
        // GT_SHARED: walk tile j (>= 1: whole) reads gT from the owner's gc rows when iteration
        // j - 1 passes that barrier, before which the owner waits for them
        constexpr int GT_OWNER = (TILE_TOKENS - 1) / TOKENS_PER_PRODUCER;
        auto gt_shared = [&](int j) { return GT_SHARED && j >= 1 && empty_wait_at(j - 1); };
        if (TMA_LOADS && ptid == 0) {
            prefetch_tensormap(&maps.q); prefetch_tensormap(&maps.k); prefetch_tensormap(&maps.gc);
            prefetch_tensormap(&maps.dO); prefetch_tensormap(&maps.mqk); prefetch_tensormap(&maps.inv);
        }
        auto issue = [&](int j) {   // loads of walk tile j into stage j % NSTAGE, if it exists
            if (j < nt) {
                const int n = nt - 1 - j;
                const long long tok0 = seq_start + (long long)n * TILE_TOKENS;
                const int L = tile_len(n);
                const int do_rows = SUMMARY && w.role ? 0 : L;   // M's scan: do = 0
                if constexpr (TMA_LOADS) {
                    if (ptid == 0) issue_tile_tma(stages[j % NSTAGE], p, mbar0 + 8 * (j % NSTAGE), tok0, h, qh, vs);
                    copy_beta(stages[j % NSTAGE], p, tok0, L, h, ptid);
                } else {
#if FLA_INPUTS && TOKEN_GATE   // (a preprocessor branch: the lambda of the other builds captures exactly what it did)
                    issue_tile_loads(stages[j % NSTAGE], p, tok0, L, do_rows, h, qh, vs, pw, lane, ptid,
                                     false, n);   // no gT copy: R1 sums gT over the tile's rows
#elif FLA_INPUTS
                    issue_tile_loads(stages[j % NSTAGE], p, tok0, L, do_rows, h, qh, vs, pw, lane, ptid, !gt_shared(j),
                                     n, smem_addr(gate_base(smem, j % NSTAGE, pw)));
#else
                    issue_tile_loads(stages[j % NSTAGE], p, tok0, L, do_rows, h, qh, vs, pw, lane, ptid, !gt_shared(j));
#endif
                }
            }
            cp_async_commit();      // one group per tile slot, possibly empty: uniform wait counts
        };
#pragma unroll 1
        for (int j = 0; j < PREFETCH; ++j) issue(j);
#pragma unroll 1
        for (int i = 0; i < nt; ++i) {
            const int s = i % NSTAGE;
            const long long t0 = PhaseTimer::now();
            cp_async_wait<PREFETCH - 1>();   // this thread's copies for tile i landed
            if constexpr (TMA_LOADS) mbarrier_wait_parity(mbar0 + 8 * s, (i / NSTAGE) & 1);   // the tile's tensor copies
            __syncwarp();                    // ... and its warp's: the rows this warp's R1 reads
            if constexpr (TOKEN_GATE) {      // ... and every producer warp's: R1 sums all the tile's gate rows
                mbarrier_arrive(producers_mbar);
                mbarrier_wait_parity(producers_mbar, i & 1);
            }
            timer.add(T_P_WAIT_LOADS, t0);
            const long long t1 = PhaseTimer::now();
            const int L = tile_len(nt - 1 - i);
            // before this warp's FULL arrive
            if (TMA_LOADS && L < TILE_TOKENS && pw == 0) zero_tail_rows(stages[s], L, lane);
#if FLA_INPUTS && TOKEN_GATE
            rebuild_operands(stages[s], L, p.scale, pw, lane, false);
#elif FLA_INPUTS
            rebuild_operands(stages[s], L, p.scale, pw, lane, gt_shared(i), gate_base(smem, s, pw));
#else
            rebuild_operands(stages[s], L, p.scale, pw, lane, gt_shared(i));
#endif
            Ring::publish(s);                // release tile i to the consumers
            timer.add(T_P_R1, t1);
            // Refill the stage of tile i - 1 with tile i + PREFETCH once the consumers left it.
            // (After R1 and the arrive, so the wait never delays tile i.)
            const int j = i + PREFETCH;
            const long long t2 = PhaseTimer::now();
            // GT_SHARED: tile i + 1's rows (of PREFETCH + i groups, all but the last PREFETCH - 2)
            if (pw == GT_OWNER && gt_shared(i + 1)) cp_async_wait<(PREFETCH >= 2 ? PREFETCH - 2 : 0)>();
            if (empty_wait_at(i)) Ring::wait_empty(j % NSTAGE);
            timer.add(T_P_WAIT_EMPTY, t2);
            const long long t3 = PhaseTimer::now();
            issue(j);
            timer.add(T_P_ISSUE, t3);
        }
        timer.add(T_TOTAL, t_start);
        timer.flush(warp, lane);
        return;
    }

    // ---------------- consumers: consumer.cuh, operands.cuh, snapshots.cuh ----------------
    if constexpr (REG_SPLIT) setmaxnreg_inc<CONSUMER_REGS>();
    const CtaWork w = cta_work(p);
    const int vs = w.vs, h = w.h, seq = w.seq, nt = w.nt;
    const long long snap_base = w.snap_base;
    const int t = lane & 3;
    const int band = warp % NUM_BANDS;       // the two warps of a band sit on different
    const int kh = warp / NUM_BANDS;         // sub-partitions wherever NUM_BANDS is 1 or 2
    const int k0 = kh * KW;                  // this warp's k columns: k0 .. k0 + KW - 1
    const int vb = band * BAND;              // band start inside this CTA's DV columns
    const int v0 = vs * DV + vb;             // band start in [0, HEAD_DIM); m-tile m starts at v0 + 16m
    // this warp's snapshot staging tile (bf16 [KW][SNAP_STRIDE] or fp32 [KW][SNAPF_STRIDE])
    unsigned char* staging = smem + STAGING_OFFSET + warp * SNAP_STAGING_BYTES;

    // KSPLIT 2: the band's other warp, and the tile their partial sums meet in
    const int partner = band + (1 - kh) * NUM_BANDS;
    float4* const xchg = reinterpret_cast<float4*>(smem + XCHG_OFFSET);

    // dS^T band (its k0 .. k0 + KW - 1 part), fp32, for the whole scan (init_band: the layout)
    float dS[MT][NJ][4];
    init_band(dS, p, seq, h, k0, v0, lane, w.role);

    // Not unrolled: an unrolled body (the compiler likes to unroll by SNAP_EVERY to
    // make the snapshot test static) interleaves tiles and runs out of registers.
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int n = nt - 1 - i;
        const int s = i % NSTAGE;

        // snapshot[n] = dS at entry of tile n; written before waiting for the
        // tile's operands so the stores overlap the producers' work.
        const long long t0 = PhaseTimer::now();
        const bool snap_now = !SUMMARY && (SNAP_EVERY == 1 || (n % SNAP_EVERY) == SNAP_EVERY - 1 || n == nt - 1);
        const long long snap_idx = snap_base + n / SNAP_EVERY;
        // the tensor map's row of this band's first k: where store_band_tma stages and issue_band_tma sends
        const int snap_row = (int)((snap_idx * p.HV + h) * HEAD_DIM + k0);
        if (snap_now) store_snapshot(p, maps, snap_idx, snap_row, h, k0, v0, dS, staging, lane);
        timer.add(T_C_SNAPSHOT, t0);
        const long long t1 = PhaseTimer::now();
        Ring::wait_full(s);
        timer.add(T_C_WAIT_FULL, t1);
        const long long t2 = PhaseTimer::now();
        const Stage& st = stages[s];

        u32 doT[MT][4];
        float acc[MT][G2_SPLIT][2][4];
        g1(acc, doT, st, kh, vb, lane);

        // G2: dU^T += dS^T @ kr^T  (B[k][c] = kr[c][k], pairs along k -> plain ldmatrix),
        // over this warp's k columns; dS^T's A operand is packed from the accumulators
        // (k-step ks uses n-tiles 2ks, 2ks+1), and each B fragment serves all MT m-tiles.
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            u32 bk[4];
            ldmatrix_x4(bk, op_addr_cols_first(st.kr, 0, k0 + 16 * ks, lane));
            // matrices: (c 0-7, k lo), (c 0-7, k hi), (c 8-15, k lo), (c 8-15, k hi)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                u32 a[4];
                pack_pair(a, dS, m, ks);
                mma_bf16(acc[m][ks % G2_SPLIT][0], a, bk[0], bk[1]);
                mma_bf16(acc[m][ks % G2_SPLIT][1], a, bk[2], bk[3]);
            }
        }
        decay_and_g4(dS, doT, st, k0, lane);

        // G3: dvcorr^T = dU^T @ INV; dU^T's accumulators are G3's A operand.
        // (G2 and G3 stay written out here: as functions of their own the compiler orders
        // the dS^T accumulators' registers differently, and the SASS is no longer the same.)
        float dU[MT][2][4];
        sum_partials(dU, acc);
        if constexpr (KSPLIT > 1) add_partner_sum(dU, xchg, i, warp, partner, band, lane, timer);
        u32 bi[4];
        ldmatrix_x4_trans(bi, small_addr_rows_first(st.inv, lane));
        // bdv^T = -beta[c] * dvcorr^T (column c = 8nn + 2t, +1), straight into G5's A operand.
        const float2 b0 = *reinterpret_cast<const float2*>(&st.beta[2 * t]);
        const float2 b1 = *reinterpret_cast<const float2*>(&st.beta[8 + 2 * t]);
        u32 aB[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            u32 aU[4];
            acc_to_a(aU, dU[m][0], dU[m][1]);
            float dv[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            mma_bf16(dv[0], aU, bi[0], bi[1]);
            mma_bf16(dv[1], aU, bi[2], bi[3]);
            aB[m][0] = pack_bf16x2(-b0.x * dv[0][0], -b0.y * dv[0][1]);
            aB[m][1] = pack_bf16x2(-b0.x * dv[0][2], -b0.y * dv[0][3]);
            aB[m][2] = pack_bf16x2(-b1.x * dv[1][0], -b1.y * dv[1][1]);
            aB[m][3] = pack_bf16x2(-b1.x * dv[1][2], -b1.y * dv[1][3]);
        }

        g5(dS, doT, aB, st, k0, lane);

        timer.add(T_C_CHAIN, t2);
        // the producer reloads stage s (Ring::releases(i, nt) written out: through the function
        // the vs8 builds with a snapshot every tile compile to other SASS)
        if (i + NSTAGE < nt) Ring::release(s);
        if constexpr (TMA_SNAP && SNAP_LATE_ISSUE) {
            if (snap_now) issue_band_tma(&maps.snap, snap_row, v0, staging, lane);
        }
    }
    timer.add(T_TOTAL, t_start);
    timer.flush(warp, lane);
    store_dh0(p, seq, h, k0, v0, dS, staging, lane, w.role);
}
