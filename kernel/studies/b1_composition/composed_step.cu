// kernel/studies/b1_composition/composed_step.cu -- the serial step of the composed scan, alone (kernel.studies.b1_composition.composed_step).
//
// At B = 1 Kernel A walks 8,192 tiles of 16 tokens per head one after another.
// kernel.studies.b1_composition.compose shows that 4 tiles compose into one 64-token map,
// diagonal plus rank 64:
//     dS <- D * dS - U (W dS) + B          D [K], U [K, 64], W [64, K], B [K, V]
// so a redesigned kernel would pay one step of two dependent GEMMs per 64 tokens on its serial
// path and build D, U, W, B beside it. This file is that serial step and nothing else: per CTA
// (one head and v-split of 32 columns, as Kernel A at vsplit 4) it walks `nsteps` steps whose
// operands are already in shared memory, so the time it takes is the floor of such a design's
// serial path. Both kernels hold dS^T [32 v x 128 k] in fp32 registers and compute
//     X    = bf16(dS^T) bf16(W^T)                   [32 v x 64 r]    (X = (W dS)^T)
//     dS^T = dS^T diag(D) + B^T - bf16(X) bf16(U^T)                  (= (D dS + B - U W dS)^T)
// with the roundings of kernel.studies.b1_composition.compose.emulate(mode="lowrank").
//
// Operands, per step, in one StepOperands block (host-packed by kernel/composed_step.py):
//   w_rk   W    [64 r][128 k] bf16, rows padded to W_RK_STRIDE: the B operand of X = dS^T W^T
//   negu_kr -U  [128 k][64 r] bf16, rows padded to NEGU_KR_STRIDE: the B operand of dS^T -= X U^T
//   d      D    [128] fp32
//   bt_vk  B^T  [32 v][128 k] fp32 (rows padded): float2 pairs along k, the mma.sync fragments'
//   b_kv   B    [128 k][32 v] fp32 (rows padded): float2 pairs along v, the wgmma fragments'
// flags: STEP_SNAPSHOT stores bf16 dS^T at every step's start (8 KB a CTA, the bytes of fla
// mode's snapshots; in each kernel's own order, decoded on the host); STEP_STREAM copies step s's
// operands from global memory (steps[cta * nsteps + s]) before the step, for the check against
// numpy on real data (slow: the copy is on the serial path); without it the NBUF blocks at
// `steps` are copied once and step s uses block s % NBUF (timing); STEP_A_ONCE (wgmma, timing
// only, wrong results) loads the A fragments once instead of every step: the bound of a step
// whose A operands need no ldmatrix.
// Companions (composed_step_mma, timing only): warps beyond the first 4 run independent
// mma.sync work on the resident operand blocks, flat out until the chain warps are done, as a
// stand-in for the redesign's off-path composition sharing the SM; each counts its HMMAs.
// With STEP_WGMMA_COMPANIONS the 4 companion warps are one warpgroup issuing wgmma m64n128k16
// instead (counted in HMMA equivalents: 64 each), on operands whose values do not matter.
#include "mma.cuh"
#include "ldmatrix.cuh"
#include "stmatrix.cuh"
#include "barrier.cuh"
#include "bulk.cuh"
#include "wgmma.cuh"

using namespace ptx_lab;

#define K_DIM 128            // k (and the v of a whole head)
#define R_DIM 64             // rank of a 4-tile step
#define V_CTA 32             // v columns a CTA holds (vsplit 4)
#define W_RK_STRIDE (K_DIM + 8)      // bf16; 272-byte rows: ldmatrix conflict-free
#define NEGU_KR_STRIDE (R_DIM + 8)   // bf16; 144-byte rows
#define BT_VK_STRIDE (K_DIM + 8)     // fp32
#define B_KV_STRIDE (V_CTA + 8)      // fp32
#ifndef NBUF
#define NBUF 2
#endif
#define STEP_SNAPSHOT 1
#define STEP_STREAM 2
#define STEP_A_ONCE 4
#define STEP_WGMMA_COMPANIONS 8

struct __align__(16) StepOperands {
    unsigned short w_rk[R_DIM * W_RK_STRIDE];
    unsigned short negu_kr[K_DIM * NEGU_KR_STRIDE];
    float d[K_DIM];
    float bt_vk[V_CTA * BT_VK_STRIDE];
    float b_kv[K_DIM * B_KV_STRIDE];
};
constexpr int OPERAND_BYTES = (int)sizeof(StepOperands);
static_assert(OPERAND_BYTES % 16 == 0, "operand blocks are copied 16 bytes at a time");
static_assert(OPERAND_BYTES == 74240, "kernel/composed_step.py packs 74,240-byte blocks (OPERAND_FIELDS)");

// The operand block step s reads: NBUF resident blocks, or step s's own, copied in now.
__device__ __forceinline__ const StepOperands& step_operands(StepOperands* ring, const StepOperands* steps,
                                                              int nsteps, int s, int flags) {
    StepOperands* block = ring + s % NBUF;
    if (flags & STEP_STREAM) {
        // the block was last read in step s - NBUF; every thread is past that step's barriers
        const uint4* src = reinterpret_cast<const uint4*>(steps + (size_t)blockIdx.x * nsteps + s);
        for (int i = threadIdx.x; i < OPERAND_BYTES / 16; i += blockDim.x) reinterpret_cast<uint4*>(block)[i] = src[i];
        __syncthreads();
    }
    return *block;
}

__device__ __forceinline__ void copy_resident(StepOperands* ring, const StepOperands* steps, int flags) {
    if (flags & STEP_STREAM) return;
    for (int i = threadIdx.x; i < NBUF * OPERAND_BYTES / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(ring)[i] = reinterpret_cast<const uint4*>(steps)[i];
    __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// mma.sync, 4 warps: warp w holds v rows 16 (w & 1) .. +16 and the k half kh = w >> 1 (64 k), so
// all four sub-partitions' tensor cores work. X's two k-half partial sums meet in shared memory
// (fragment order, double-buffered by step parity: one 64-thread named barrier a step), added in
// the same order by both warps so that they round X alike.
// Snapshot order: u32 [cta][step][warp][kk 4][e 4][lane 32], a[kk][e] of the step's A fragments.
// ---------------------------------------------------------------------------------------------
// Two adjacent n8 accumulator tiles, packed pairwise to bf16: the A fragment of one k-step
// (mma.cuh's corollary), for mma.sync and for a register-A wgmma alike
__device__ __forceinline__ void pack_a(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16x2(lo[0], lo[1]); a[1] = pack_bf16x2(lo[2], lo[3]);
    a[2] = pack_bf16x2(hi[0], hi[1]); a[3] = pack_bf16x2(hi[2], hi[3]);
}

// dS^T between the m16n8 accumulators (rows v0, v0 + 8; columns k_base + 8 j + 2 t, +1) and
// this CTA's dS^T [32 v][128 k] in global memory
template <bool TO_GLOBAL, typename Ptr>
__device__ __forceinline__ void move_dsT(float (&dsT)[8][4], Ptr rows, int v0, int k_base, int t) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = (v0 + 8 * (e >> 1)) * K_DIM + k_base + 8 * j + 2 * t + (e & 1);
            if constexpr (TO_GLOBAL) rows[i] = dsT[j][e];
            else dsT[j][e] = rows[i];
        }
}

#define CHAIN_WARPS 4
#define MAX_COMPANIONS 8

// A companion warp: 32 independent HMMAs a round (A from -U, B from W: a [16 x 64] x [64 x 64]
// product's worth of ldmatrix and mma.sync), rounds until all chain warps have arrived on
// `chain_done`; its HMMA count goes to hmma_count.
__device__ __forceinline__ void companion_work(const StepOperands* ring, const volatile int* chain_done,
                                               unsigned long long* hmma_count, int lane) {
    const X4Lane xl = x4_lane(lane);   // ldmatrix x4 rows (ldmatrix.cuh): A rows first, B cols first
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    unsigned long long rounds = 0;
    while (*chain_done < CHAIN_WARPS) {
        const StepOperands& op = ring[rounds % NBUF];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            u32 a[4];
            ldmatrix_x4(a, smem_addr(&op.negu_kr[(16 * (rounds % 8) + xl.row + xl.rows_first_mat_row()) * NEGU_KR_STRIDE + 16 * kk +
                                                 xl.rows_first_mat_col()]));
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 b[4];
                ldmatrix_x4(b, smem_addr(&op.w_rk[(16 * np + xl.row + xl.cols_first_mat_row()) * W_RK_STRIDE + 16 * kk + xl.cols_first_mat_col()]));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(acc[2 * np], a, b_lo, acc[2 * np]);
                mma_m16n8k16_bf16(acc[2 * np + 1], a, b_hi, acc[2 * np + 1]);
            }
        }
        ++rounds;
    }
    float keep = 0.f;   // the products stay live: a sum no input makes exactly this value
#pragma unroll
    for (int n = 0; n < 8; ++n) keep += acc[n][0] + acc[n][1] + acc[n][2] + acc[n][3];
    if (lane == 0) *hmma_count = rounds * 32 + (keep == 1.2345678e30f ? 1 : 0);
}

// The companion warpgroup (warps 4-7): rounds of 4 dependent wgmma m64n128k16 (A from registers,
// B any 4 KB of the ring read as K-major core matrices), until the chain is done. wgmma is
// warpgroup-collective, so the warps leave together: one thread samples chain_done into
// stop[round & 1] before a 128-thread barrier, and every warp reads that sample after it.
__device__ __forceinline__ void companion_work_wgmma(const StepOperands* ring, const volatile int* chain_done,
                                                     volatile int* stop, unsigned long long* hmma_count, int warp,
                                                     int lane) {
    const X4Lane xl = x4_lane(lane);   // ldmatrix x4 rows (ldmatrix.cuh): A rows first
    const int cw = warp - CHAIN_WARPS;
    u32 a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        ldmatrix_x4(a[kk], smem_addr(&ring[0].negu_kr[(16 * cw + xl.row + xl.rows_first_mat_row()) * NEGU_KR_STRIDE + 16 * kk +
                                                      xl.rows_first_mat_col()]));
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    const u32 b_base = smem_addr(ring);
    unsigned long long rounds = 0;
    for (;;) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_m64n128k16_bf16_rs<0>(acc, a[kk], wgmma_desc(b_base + 4096 * kk, 128, 256, 0), 1);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        ++rounds;
        if (threadIdx.x == 32 * CHAIN_WARPS) stop[rounds & 1] = (*chain_done >= CHAIN_WARPS);
        named_barrier_sync(3, 128);   // ids 1 and 2 are the chain's warp pairs
        if (stop[rounds & 1]) break;
    }
    float keep = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) keep += acc[i];
    if (lane == 0) *hmma_count = rounds * 4 * 64 / 4 + (keep == 1.2345678e30f ? 1 : 0);   // this warp's quarter
}

extern "C" __global__ void __launch_bounds__(32 * (CHAIN_WARPS + MAX_COMPANIONS)) composed_step_mma(
        const StepOperands* __restrict__ steps, int nsteps, int flags, const float* __restrict__ dsT_in,
        float* __restrict__ dsT_out, u32* __restrict__ snapshots, long long* __restrict__ cycles,
        unsigned long long* __restrict__ companion_hmma) {
    extern __shared__ __align__(16) unsigned char smem[];
    StepOperands* ring = reinterpret_cast<StepOperands*>(smem);
    float4* x_exchange = reinterpret_cast<float4*>(smem + NBUF * OPERAND_BYTES);   // [parity][kh][mv][8][32]
    int* chain_done = reinterpret_cast<int*>(smem + NBUF * OPERAND_BYTES + 2 * 2 * 2 * 8 * 32 * 16);
    if (threadIdx.x == 0) *chain_done = 0;
    if ((flags & STEP_STREAM) && blockDim.x != 32 * CHAIN_WARPS) __trap();   // streaming syncs the chain warps only
    if ((flags & STEP_WGMMA_COMPANIONS) && blockDim.x != 32 * (CHAIN_WARPS + 4)) __trap();   // one warpgroup
    copy_resident(ring, steps, flags);   // (its __syncthreads also publishes chain_done = 0)
    if (flags & STEP_STREAM) __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (warp >= CHAIN_WARPS) {
        unsigned long long* count = companion_hmma + (size_t)blockIdx.x * MAX_COMPANIONS + warp - CHAIN_WARPS;
        if (flags & STEP_WGMMA_COMPANIONS) companion_work_wgmma(ring, chain_done, chain_done + 2, count, warp, lane);
        else companion_work(ring, chain_done, count, lane);
        return;
    }
    const int mv = warp & 1, kh = warp >> 1;
    const int v0 = 16 * mv + g, k_base = 64 * kh;
    const X4Lane xl = x4_lane(lane);   // ldmatrix x4 rows (ldmatrix.cuh): B cols first
    float dsT[8][4];   // dS^T: rows v0, v0 + 8; columns k_base + 8 j + 2 t (+1)
    move_dsT<false>(dsT, dsT_in + (size_t)blockIdx.x * V_CTA * K_DIM, v0, k_base, t);
    const long long c0 = clock64();
    for (int s = 0; s < nsteps; ++s) {
        const StepOperands& op = step_operands(ring, steps, nsteps, s, flags);
        u32 a[4][4];   // bf16(dS^T) as the A operand of X's 4 k-steps (accumulator pairs = A fragment)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) pack_a(a[kk], dsT[2 * kk], dsT[2 * kk + 1]);
        if (flags & STEP_SNAPSHOT) {
            u32* out = snapshots + ((size_t)(blockIdx.x * nsteps + s) * 4 + warp) * 16 * 32 + lane;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int e = 0; e < 4; ++e) out[(4 * kk + e) * 32] = a[kk][e];
        }
        float x[8][4];   // X partial over this warp's k half: rows v0 (+8), columns r = 8 n + 2 t (+1)
#pragma unroll
        for (int n = 0; n < 8; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 b[4];
                ldmatrix_x4(b, smem_addr(&op.w_rk[(16 * np + xl.row + xl.cols_first_mat_row()) * W_RK_STRIDE + k_base + 16 * kk +
                                                  xl.cols_first_mat_col()]));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(x[2 * np], a[kk], b_lo, x[2 * np]);
                mma_m16n8k16_bf16(x[2 * np + 1], a[kk], b_hi, x[2 * np + 1]);
            }
        float4* mine = x_exchange + ((((s & 1) * 2 + kh) * 2 + mv) * 8) * 32 + lane;
        const float4* partner = x_exchange + ((((s & 1) * 2 + (kh ^ 1)) * 2 + mv) * 8) * 32 + lane;
#pragma unroll
        for (int n = 0; n < 8; ++n) mine[n * 32] = make_float4(x[n][0], x[n][1], x[n][2], x[n][3]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {   // dS^T diag(D) + B^T, while the partner finishes its half
            const int k = k_base + 8 * j + 2 * t;
            const float2 dk = *reinterpret_cast<const float2*>(&op.d[k]);
            const float2 b0 = *reinterpret_cast<const float2*>(&op.bt_vk[v0 * BT_VK_STRIDE + k]);
            const float2 b1 = *reinterpret_cast<const float2*>(&op.bt_vk[(v0 + 8) * BT_VK_STRIDE + k]);
            dsT[j][0] = fmaf(dsT[j][0], dk.x, b0.x); dsT[j][1] = fmaf(dsT[j][1], dk.y, b0.y);
            dsT[j][2] = fmaf(dsT[j][2], dk.x, b1.x); dsT[j][3] = fmaf(dsT[j][3], dk.y, b1.y);
        }
        named_barrier_sync(1 + mv, 64);
#pragma unroll
        for (int n = 0; n < 8; ++n) {   // k half 0's partial sum first, in both warps
            const float4 o = partner[n * 32];
            if (kh == 0) { x[n][0] += o.x; x[n][1] += o.y; x[n][2] += o.z; x[n][3] += o.w; }
            else { x[n][0] = o.x + x[n][0]; x[n][1] = o.y + x[n][1]; x[n][2] = o.z + x[n][2]; x[n][3] = o.w + x[n][3]; }
        }
        u32 xa[4][4];   // bf16(X) as the A operand of the 4 r-steps
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) pack_a(xa[kk], x[2 * kk], x[2 * kk + 1]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 b[4];
                ldmatrix_x4(b, smem_addr(&op.negu_kr[(k_base + 16 * np + xl.row + xl.cols_first_mat_row()) * NEGU_KR_STRIDE +
                                                     16 * kk + xl.cols_first_mat_col()]));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(dsT[2 * np], xa[kk], b_lo, dsT[2 * np]);
                mma_m16n8k16_bf16(dsT[2 * np + 1], xa[kk], b_hi, dsT[2 * np + 1]);
            }
    }
    const long long c1 = clock64();
    if (lane == 0) {
        cycles[blockIdx.x * 4 + warp] = c1 - c0;
        atomicAdd(chain_done, 1);   // the companions stop when all chain warps are here
    }
    move_dsT<true>(dsT, dsT_out + (size_t)blockIdx.x * V_CTA * K_DIM, v0, k_base, t);
}

// ---------------------------------------------------------------------------------------------
// wgmma, one warpgroup: dS [128 k x 32 v] in the accumulators of two m64 blocks (kb) of two n16
// pieces (p); warp w holds k rows 64 kb + 16 w + g (+8), v columns 16 p + 8 j + 2 t (+1). Both
// GEMMs take their B (bf16 dS, then bf16 X^T) from shared memory as N-major core matrices that
// stmatrix writes, and their A (W [r x k], then -U [k x r]) from registers (ldmatrix).
// Snapshot: one 8 KB bulk store a step of the bf16 dS tile GEMM1 reads (core-matrix order:
// byte of (k, v) = (v / 8) DS_SBO + (k / 8) 128 + (k % 8) 16 + (v % 8) 2), double-buffered.
// Phase clocks (thread 0, summed over steps): pack + stmatrix + diag(D) + B; barrier 1;
// GEMM1; stmatrix of X^T + barrier 2; GEMM2 -> cycles[4 * gridDim.x + 5 * cta + i].
// ---------------------------------------------------------------------------------------------
#define DS_SBO 2048   // bytes between 8-v blocks of the bf16 dS tile (16 k blocks of 128 B)
#define XT_SBO 1024   // bytes between 8-v blocks of the bf16 X^T tile (8 r blocks of 128 B)

// (k, v) of accumulator element e of block kb, piece p, in warp `warp` (wgmma.cuh's D layout)
__device__ __forceinline__ int wg_k(int kb, int warp, int g, int e) { return 64 * kb + 16 * warp + g + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int wg_v(int p, int t, int e) { return 16 * p + 8 * (e >> 2) + 2 * t + (e & 1); }

// dS between the accumulators and this CTA's dS^T [32 v][128 k] in global memory
template <bool TO_GLOBAL, typename Ptr>
__device__ __forceinline__ void move_ds(float (&ds)[2][2][8], Ptr dsT, int warp, int g, int t) {
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int i = wg_v(p, t, e) * K_DIM + wg_k(kb, warp, g, e);
                if constexpr (TO_GLOBAL) dsT[i] = ds[kb][p][e];
                else ds[kb][p][e] = dsT[i];
            }
}

extern "C" __global__ void __launch_bounds__(128) composed_step_wgmma(
        const StepOperands* __restrict__ steps, int nsteps, int flags, const float* __restrict__ dsT_in,
        float* __restrict__ dsT_out, u32* __restrict__ snapshots, long long* __restrict__ cycles) {
    extern __shared__ __align__(16) unsigned char smem[];
    StepOperands* ring = reinterpret_cast<StepOperands*>(smem);
    unsigned char* ds_tiles = smem + NBUF * OPERAND_BYTES;   // [2][8192]
    unsigned char* xt_tile = ds_tiles + 2 * 8192;            // [4096]
    copy_resident(ring, steps, flags);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const X4Lane xl = x4_lane(lane);   // ldmatrix / stmatrix x4 rows (ldmatrix.cuh), rows first
    float ds[2][2][8];
    move_ds<false>(ds, dsT_in + (size_t)blockIdx.x * V_CTA * K_DIM, warp, g, t);
    u32 a_w[8][4], a_negu[2][4][4];
    long long phase[5] = {0, 0, 0, 0, 0};
    const long long c0 = clock64();
    for (int s = 0; s < nsteps; ++s) {
        const StepOperands& op = step_operands(ring, steps, nsteps, s, flags);
        unsigned char* ds_tile = ds_tiles + (s & 1) * 8192;
        const long long ta = clock64();
        if (!(flags & STEP_A_ONCE) || s == 0) {
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)   // W rows r = 16 w .., k = 16 kk ..
                ldmatrix_x4(a_w[kk], smem_addr(&op.w_rk[(16 * warp + xl.row + xl.rows_first_mat_row()) * W_RK_STRIDE + 16 * kk +
                                                       xl.rows_first_mat_col()]));
#pragma unroll
            for (int kb = 0; kb < 2; ++kb)
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)   // -U rows k = 64 kb + 16 w .., r = 16 kk ..
                    ldmatrix_x4(a_negu[kb][kk], smem_addr(&op.negu_kr[(64 * kb + 16 * warp + xl.row + xl.rows_first_mat_row()) *
                                                                      NEGU_KR_STRIDE + 16 * kk + xl.rows_first_mat_col()]));
        }
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const int k = 64 * kb + 16 * warp + xl.row + xl.rows_first_mat_row(), v = 16 * p + xl.rows_first_mat_col();
                stmatrix_x4(smem_addr(ds_tile + (v / 8) * DS_SBO + (k / 8) * 128 + (k % 8) * 16),
                            pack_bf16x2(ds[kb][p][0], ds[kb][p][1]), pack_bf16x2(ds[kb][p][2], ds[kb][p][3]),
                            pack_bf16x2(ds[kb][p][4], ds[kb][p][5]), pack_bf16x2(ds[kb][p][6], ds[kb][p][7]));
            }
        // diag(D) dS + B here, before GEMM1 is issued, not while it runs: ptxas makes a warpgroup
        // wait for every wgmma before it touches registers a wgmma once wrote (its C7517 note)
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
#pragma unroll
            for (int p = 0; p < 2; ++p)
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const int k = wg_k(kb, warp, g, e), v = wg_v(p, t, e);   // v even: the pair (v, v + 1)
                    const float dk = op.d[k];
                    const float2 b = *reinterpret_cast<const float2*>(&op.b_kv[k * B_KV_STRIDE + v]);
                    ds[kb][p][e] = fmaf(ds[kb][p][e], dk, b.x);
                    ds[kb][p][e + 1] = fmaf(ds[kb][p][e + 1], dk, b.y);
                }
        const long long tb = clock64();
        fence_proxy_async_shared();   // stmatrix's generic writes before the wgmma's (and the bulk store's) reads
        __syncthreads();
        const long long tc = clock64();
        if ((flags & STEP_SNAPSHOT) && tid == 0) {
            cp_async_bulk_s2g(snapshots + (size_t)(blockIdx.x * nsteps + s) * 2048, smem_addr(ds_tile), 8192);
            cp_async_bulk_commit();
        }
        float xt[2][8];   // X^T = W bf16(dS): rows r = 16 w + g (+8), columns v = 16 p + 8 j + 2 t (+1)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
#pragma unroll
            for (int p = 0; p < 2; ++p)
                wgmma_m64n16k16_bf16_rs<1>(xt[p], a_w[kk], wgmma_desc(smem_addr(ds_tile + 256 * kk + 2 * DS_SBO * p), 128,
                                                                      DS_SBO, 0), kk > 0);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        const long long td = clock64();
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int r = 16 * warp + xl.row + xl.rows_first_mat_row(), v = 16 * p + xl.rows_first_mat_col();
            stmatrix_x4(smem_addr(xt_tile + (v / 8) * XT_SBO + (r / 8) * 128 + (r % 8) * 16),
                        pack_bf16x2(xt[p][0], xt[p][1]), pack_bf16x2(xt[p][2], xt[p][3]),
                        pack_bf16x2(xt[p][4], xt[p][5]), pack_bf16x2(xt[p][6], xt[p][7]));
        }
        // the bulk store of step s - 1 must have read its tile before step s + 1 overwrites it
        if ((flags & STEP_SNAPSHOT) && tid == 0) cp_async_bulk_wait_read<1>();
        fence_proxy_async_shared();
        __syncthreads();
        const long long te = clock64();
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int p = 0; p < 2; ++p)
                    wgmma_m64n16k16_bf16_rs<1>(ds[kb][p], a_negu[kb][kk],
                                               wgmma_desc(smem_addr(xt_tile + 256 * kk + 2 * XT_SBO * p), 128, XT_SBO, 0), 1);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        const long long tf = clock64();
        phase[0] += tb - ta; phase[1] += tc - tb; phase[2] += td - tc; phase[3] += te - td; phase[4] += tf - te;
    }
    if ((flags & STEP_SNAPSHOT) && tid == 0) cp_async_bulk_wait<0>();
    const long long c1 = clock64();
    if (lane == 0) cycles[blockIdx.x * 4 + warp] = c1 - c0;
    if (tid == 0)
        for (int i = 0; i < 5; ++i) cycles[4 * gridDim.x + 5 * blockIdx.x + i] = phase[i];
    move_ds<true>(ds, dsT_out + (size_t)blockIdx.x * V_CTA * K_DIM, warp, g, t);
}
