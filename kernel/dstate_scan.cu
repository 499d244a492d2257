// kernel/dstate_scan.cu -- Kernel A: the backward dstate scan of KDA.
//
// Math (../shared/spec/kernel_a.md, section 3), per sequence and head, tiles of
// C = 16 tokens walked from the last to the first:
//     snapshot[n] = dS
//     dU     = Mqk^T @ do + kr @ dS          G1 + G2   [C, V]
//     dvcorr = INV^T @ dU                    G3        [C, V]
//     T1     = qd^T @ do - kd^T @ (beta*dvcorr)   G4 + G5   [K, V]
//     dS     = exp2(gT)[:, None] * dS + T1   combine   [K, V]
//
// Design: everything is computed transposed, with the v axis as the MMA's M.
//     dU^T     = do^T @ Mqk + dS^T @ kr^T     (M = v, N = c, K = c' / k)
//     dvcorr^T = dU^T @ INV
//     dS^T     = exp2(gT) * dS^T + do^T @ qd + (-beta*dvcorr)^T @ kd   (M = v, N = k)
// A consumer warp owns a 16-wide band of v and keeps its dS^T band [16 v x 128 k]
// in fp32 mma accumulators for the whole scan. Because the C fragments of two
// adjacent n-tiles, packed to bf16 pairwise, ARE the A fragment of one k-step
// (see ptx_lab/cuda/mma.cuh), dS^T (for G2), dU^T (for G3) and bdv^T (for G5)
// feed the next MMA straight from registers: no movmatrix, no shared-memory
// round trip, no barrier on the dS-dependent path, and dS never drops to bf16
// between tiles (only G2's operand copy is rounded, as in FLA).
//
// Warp roles: warps [0, NUM_CONSUMERS) are consumers (one v band each);
// NUM_PRODUCERS producer warps prefetch tile inputs with cp.async into a ring of
// NSTAGE stages and rebuild qd/kd/kr on chip in fp32 (the seed's "R1"), so the
// loads, R1 and the snapshot stores run ahead of / beside the serial chain.
// Hand-off: named barriers FULL(s) (producers arrive, consumers sync) and
// EMPTY(s) (consumers arrive, producers sync).
//
// Compile-time configuration (-D...):
//   VSPLIT      1, 2, 4, 8   CTAs per (sequence, head), each owning D/VSPLIT v columns
//   NSTAGE      2 .. 4       depth of the input ring (loads run NSTAGE-1 tiles ahead)
//   SNAP_BF16   0 / 1        snapshot dtype fp32 / bf16
//   SNAP_EVERY  1 / 4        snapshot every tile / every 4th tile (FLA's 64-token dh)
//   HAS_DHT     0 / 1        initial dS from dht (else zeros)
//   L2NORM      0 / 1        l2-normalise q and k rows in R1
//   G2_SPLIT    1, 2, 4      independent accumulator chains in G2 (shorter dS path)
//   PRODUCERS   2, 4, 8      producer warps (fewer leave consumers more registers)
//   KDA_TIMING  0 / 1        clock64 accounting per warp and phase into kda_timing[]
//                            (kernel.profile; off in every build the API launches)
#include "common.cuh"
#include "mma.cuh"
#include "ldmatrix.cuh"
#include "stmatrix.cuh"
#include "cp_async.cuh"
#include "barrier.cuh"

using namespace ptx_lab;

#ifndef VSPLIT
#define VSPLIT 1
#endif
#ifndef NSTAGE
#define NSTAGE 4
#endif
#ifndef SNAP_BF16
#define SNAP_BF16 0
#endif
#ifndef SNAP_EVERY
#define SNAP_EVERY 1
#endif
#ifndef HAS_DHT
#define HAS_DHT 0
#endif
#ifndef L2NORM
#define L2NORM 1
#endif
#ifndef G2_SPLIT
#define G2_SPLIT 4
#endif
#ifndef KDA_TIMING
#define KDA_TIMING 0
#endif
#ifndef PRODUCERS   // as build.Config's auto rule
#if VSPLIT == 1 && !SNAP_BF16
#define PRODUCERS 2     // 4 spill here: 384 threads cap registers at 168
#else
#define PRODUCERS 4
#endif
#endif

namespace kda {

constexpr int D = 128;                    // K = V = D
constexpr int C = 16;                     // tokens per tile
constexpr int DV = D / VSPLIT;            // v columns per CTA
constexpr int NUM_CONSUMERS = DV / 16;    // one warp per 16-wide v band
constexpr int NUM_PRODUCERS = PRODUCERS;
constexpr int TOKENS_PER_PRODUCER = C / NUM_PRODUCERS;   // R1 rows per producer warp
constexpr int PRODUCER_THREADS = NUM_PRODUCERS * 32;
constexpr int THREADS = (NUM_CONSUMERS + NUM_PRODUCERS) * 32;

static_assert(D % VSPLIT == 0 && DV % 16 == 0, "VSPLIT must be 1, 2, 4 or 8");
static_assert(NSTAGE >= 2 && 2 * NSTAGE <= 15, "named barrier ids run out");
static_assert(NSTAGE - 1 <= 7, "cp.async.wait_group takes 0..7");
static_assert(PRODUCERS == 2 || PRODUCERS == 4 || PRODUCERS == 8, "PRODUCERS must be 2, 4 or 8");
static_assert(G2_SPLIT == 1 || G2_SPLIT == 2 || G2_SPLIT == 4, "G2_SPLIT must be 1, 2 or 4");

// Row strides (in elements) of the shared tiles that ldmatrix reads. One 8x8
// ldmatrix phase reads 8 rows x 16 B; a row stride of 16 B modulo 128 B puts the
// 8 rows in 8 distinct 4-bank groups, i.e. conflict-free.
constexpr int OP_STRIDE = D + 8;          // qd/kd/kr rows: 272 B = 2*128 + 16
constexpr int DO_STRIDE = DV + 8;         // do rows: 2*DV + 16 B (DV = 128..16 all conflict-free)
constexpr int SMALL_STRIDE = C + 8;       // Mqk/INV rows: 48 B (a 32 B row would be 2-way)
constexpr int SNAP_STRIDE = 16 + 8;       // bf16 snapshot staging rows: 48 B
constexpr int SNAPF_STRIDE = 16 + 4;      // fp32 staging rows: 80 B, so the 4 k rows one fragment
                                          // store touches (k = 8j + 2t) start 8 banks apart: conflict-free

// One ring stage: the raw inputs of one tile and the operands R1 builds from them.
struct __align__(16) Stage {
    unsigned short q[C * D];              // raw bf16 q rows (producers only)
    unsigned short k[C * D];              // raw bf16 k rows (producers only)
    float gc[C * D];                      // tile-local cumulative gate, log2
    float gT[NUM_PRODUCERS][D];           // gc of the tile's last real token, one copy per producer warp
    unsigned short dO[C * DO_STRIDE];     // do[c][v] for this CTA's DV columns
    unsigned short mqk[C * SMALL_STRIDE]; // Mqk[c'][c]
    unsigned short inv[C * SMALL_STRIDE]; // INV[c'][c]
    float beta[C];
    unsigned short qd[C * OP_STRIDE];     // s * q * exp2(gc)      [c][k] bf16
    unsigned short kd[C * OP_STRIDE];     // k * exp2(gc)          [c][k] bf16
    unsigned short kr[C * OP_STRIDE];     // k * exp2(gT - gc)     [c][k] bf16
    float egT[D];                         // exp2(gT) per k
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");

constexpr int SNAP_STAGING_BYTES = SNAP_BF16 ? D * SNAP_STRIDE * 2 : D * SNAPF_STRIDE * 4;   // per consumer warp
constexpr int SMEM_BYTES = NSTAGE * (int)sizeof(Stage) + NUM_CONSUMERS * SNAP_STAGING_BYTES;

// Named barrier ids (0 is __syncthreads).
__device__ __forceinline__ u32 full_bar(int s) { return 1 + s; }
__device__ __forceinline__ u32 empty_bar(int s) { return 1 + NSTAGE + s; }
// Where each warp's cycles go (KDA_TIMING=1 only): every thread sums clock64
// deltas per phase in registers; at exit lane 0 of each warp of the first
// TIMING_CTAS CTAs writes them to kda_timing[cta][warp][slot] (no global traffic
// inside the scan). Producer slots: total, wait for own loads + the warp's
// barrier, R1 (+ FULL arrive), wait EMPTY, issue loads. Consumer slots: total,
// snapshot store, wait FULL, G1..G5.
enum TimingSlot { T_TOTAL = 0, T_P_WAIT_LOADS = 1, T_P_R1 = 2, T_P_WAIT_EMPTY = 3, T_P_ISSUE = 4,
                  T_C_SNAPSHOT = 1, T_C_WAIT_FULL = 2, T_C_CHAIN = 3 };
#if KDA_TIMING
constexpr int TIMING_CTAS = 8, TIMING_WARPS = 16, TIMING_SLOTS = 8;
#define KDA_TIMERS long long kda_t[TIMING_SLOTS] = {}
#define KDA_CLOCK(t) const long long t = clock64()
#define KDA_ADD(slot, t0) (kda_t[(slot)] += clock64() - (t0))
#define KDA_FLUSH()                                                                      \
    do {                                                                                 \
        if (blockIdx.x < TIMING_CTAS && lane == 0)                                       \
            for (int s_ = 0; s_ < TIMING_SLOTS; ++s_)                                    \
                kda_timing[(blockIdx.x * TIMING_WARPS + warp) * TIMING_SLOTS + s_] = kda_t[s_]; \
    } while (0)
#else
#define KDA_TIMERS ((void)0)
#define KDA_CLOCK(t) ((void)0)
#define KDA_ADD(slot, t0) ((void)0)
#define KDA_FLUSH() ((void)0)
#endif

struct Params {
    const unsigned short* q;      // [tokens, H, D] bf16
    const unsigned short* k;      // [tokens, H, D] bf16
    const float* gc;              // [tokens, H, D]
    const float* beta;            // [tokens, H]
    const unsigned short* mqk;    // [tokens, H, C] bf16
    const unsigned short* inv;    // [tokens, H, C] bf16
    const unsigned short* dO;     // [tokens, H, D] bf16
    const float* dht;             // [N, H, D, D] or null
    void* snapshots;              // [total_snaps, H, D, D] fp32 or bf16
    float* dh0;                   // [N, H, D, D]
    const long long* cu_seqlens;  // [N + 1] token offsets
    const long long* snap_offsets;// [N + 1] snapshot offsets
    const int* order;             // [N] sequence processed by CTA slot (longest first) or null
    int H;
    float scale;
};

__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// ---------------------------------------------------------------------------
// Producer side
// ---------------------------------------------------------------------------

// cp.async rows [row0, row0 + ROWS) of one tensor's tile, `ROW_BYTES` each
// (16-byte chunks), from global rows `src_row_bytes` apart (`src` = the tile's
// first row) into shared rows `SMEM_ROW_BYTES` apart at `dst`, spread over
// `THREADS` threads: chunk m of thread `tid` is chunk tid + m * THREADS of the
// block, the same row and column every tile, so the compiler keeps the offsets in
// registers and a copy costs a handful of instructions (the generic loop with
// 64-bit index math cost ~20 per copy: ncu, 700 of the producers' 3200
// instructions per tile). Rows at or past `L` are zero-filled (src-size 0:
// global memory is not read; the source address falls back to the tile's first
// row, which always exists, so it stays a valid operand).
template <int ROW_BYTES, int SMEM_ROW_BYTES, int ROWS, int THREADS_>
__device__ __forceinline__ void copy_rows(u32 dst, const char* src, u32 src_row_bytes, int L, int tid, int row0) {
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll
    for (int m = 0; m < (TOTAL + THREADS_ - 1) / THREADS_; ++m) {
        const int idx = tid + m * THREADS_;
        if (TOTAL % THREADS_ == 0 || idx < TOTAL) {
            const int c = row0 + idx / CHUNKS, ch = idx % CHUNKS;
            const bool valid = c < L;
            const u32 off = valid ? c * src_row_bytes + ch * 16 : 0u;
            cp_async_cg16_zfill(dst + c * SMEM_ROW_BYTES + ch * 16, src + off, valid ? 16u : 0u);
        }
    }
}

// A tile's loads. Each producer warp copies the q, k and gc rows of the tokens it
// rebuilds in R1, plus its own copy of gT (gc of the last real token), so R1
// waits only for its own warp's copies (cp.async.wait_group + __syncwarp) and the
// producer warps never wait for each other. (A producers-only barrier here made
// compute-sanitizer racecheck report every FULL hand-off as a hazard: the
// "ring2-producer-bar" probe in kernel.racecheck reproduces that report on a
// race-free three-warp ring.) do, Mqk, INV and beta, read only by the consumers,
// are spread over all producer threads; each waits for its own copies before it
// arrives on FULL.
__device__ __forceinline__ void issue_tile_loads(Stage& st, const Params& p, long long tok0, int L,
                                                 int h, int vs, int pw, int lane, int ptid) {
    constexpr int R = TOKENS_PER_PRODUCER;
    const u32 row_elems = (u32)p.H * D;          // elements between consecutive tokens
    const long long first = (tok0 * p.H + h) * D;
    const char* q = reinterpret_cast<const char*>(p.q + first);
    const char* k = reinterpret_cast<const char*>(p.k + first);
    const char* gc = reinterpret_cast<const char*>(p.gc + first);
    const char* dO = reinterpret_cast<const char*>(p.dO + first + vs * DV);
    copy_rows<D * 2, D * 2, R, 32>(smem_addr(st.q), q, row_elems * 2, L, lane, pw * R);
    copy_rows<D * 2, D * 2, R, 32>(smem_addr(st.k), k, row_elems * 2, L, lane, pw * R);
    copy_rows<D * 4, D * 4, R, 32>(smem_addr(st.gc), gc, row_elems * 4, L, lane, pw * R);
    copy_rows<D * 4, D * 4, 1, 32>(smem_addr(st.gT[pw]), gc + (L - 1) * (row_elems * 4), 0u, 1, lane, 0);
    copy_rows<DV * 2, DO_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.dO), dO, row_elems * 2, L, ptid, 0);
    const long long sfirst = (tok0 * p.H + h) * C;
    const u32 srow_bytes = (u32)p.H * C * 2;
    copy_rows<C * 2, SMALL_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.mqk), reinterpret_cast<const char*>(p.mqk + sfirst),
                                                            srow_bytes, L, ptid, 0);
    copy_rows<C * 2, SMALL_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.inv), reinterpret_cast<const char*>(p.inv + sfirst),
                                                            srow_bytes, L, ptid, 0);
    if (ptid < C) {
        const bool valid = ptid < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[ptid]),
                             p.beta + (tok0 + (valid ? ptid : 0)) * p.H + h, valid ? 4u : 0u);
    }
}

// R1: qd, kd, kr in fp32 from raw q/k and gc, rounded once to bf16.
// Producer warp pw handles tokens TOKENS_PER_PRODUCER*pw + r; lane handles k = 4*lane .. 4*lane+3,
// so every shared read and write is a contiguous row segment (no bank conflicts,
// unlike a fragment-ordered walk where 32 lanes hit 32 tokens of one column).
// Phased (load all rows, reduce all norms together, then compute and store):
// written token by token, each token's 2 x 5 dependent shuffles and its
// sqrt/div ran back to back (the compiler cannot hoist the next token's shared
// loads above this token's shared stores), ~400 cycles a token, and R1 became
// the per-tile bottleneck (ncu: 0.25 IPC per scheduler, time per tile
// proportional to tokens per producer warp: 2.3 us at 4, 4.6 us at 8).
__device__ __forceinline__ void rebuild_operands(Stage& st, int L, float scale, int pw, int lane) {
    constexpr int R = TOKENS_PER_PRODUCER;
    const int k0 = 4 * lane;
    const int c0 = pw * R;
    const float4 gT = *reinterpret_cast<const float4*>(&st.gT[pw][k0]);  // gc stops at the last real token
    if (pw == 0) {
        *reinterpret_cast<float4*>(&st.egT[k0]) = make_float4(exp2f(gT.x), exp2f(gT.y), exp2f(gT.z), exp2f(gT.w));
    }
    const float gt[4] = {gT.x, gT.y, gT.z, gT.w};
    float qv[R][4], kv[R][4], gv[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + r;
        const uint2 qraw = *reinterpret_cast<const uint2*>(&st.q[c * D + k0]);
        const uint2 kraw = *reinterpret_cast<const uint2*>(&st.k[c * D + k0]);
        const float4 g = *reinterpret_cast<const float4*>(&st.gc[c * D + k0]);
        qv[r][0] = bf16_lo(qraw.x); qv[r][1] = bf16_hi(qraw.x); qv[r][2] = bf16_lo(qraw.y); qv[r][3] = bf16_hi(qraw.y);
        kv[r][0] = bf16_lo(kraw.x); kv[r][1] = bf16_hi(kraw.x); kv[r][2] = bf16_lo(kraw.y); kv[r][3] = bf16_hi(kraw.y);
        gv[r][0] = g.x; gv[r][1] = g.y; gv[r][2] = g.z; gv[r][3] = g.w;
    }
    float qs[R], ks[R];
#if L2NORM
    // x / sqrt(sum(x^2) + 1e-6), fp32, as flash-linear-attention's l2norm; the 2R
    // butterfly reductions run interleaved.
#pragma unroll
    for (int r = 0; r < R; ++r) {
        qs[r] = qv[r][0] * qv[r][0] + qv[r][1] * qv[r][1] + qv[r][2] * qv[r][2] + qv[r][3] * qv[r][3];
        ks[r] = kv[r][0] * kv[r][0] + kv[r][1] * kv[r][1] + kv[r][2] * kv[r][2] + kv[r][3] * kv[r][3];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], o);
            ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], o);
        }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        // rsqrtf: one MUFU.RSQ (<= 2 ulp); scale / sqrtf was an IEEE sqrt and divide
        // with slow-path branches (ncu: ~200 BSSY/BSYNC/BRA per tile).
        qs[r] = scale * rsqrtf(qs[r] + 1e-6f);
        ks[r] = rsqrtf(ks[r] + 1e-6f);
    }
#else
#pragma unroll
    for (int r = 0; r < R; ++r) { qs[r] = scale; ks[r] = 1.f; }
#endif
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + r;
        float qd[4], kd[4], kr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float eg = exp2f(gv[r][e]);
            qd[e] = qs[r] * qv[r][e] * eg;
            kd[e] = ks[r] * kv[r][e] * eg;
            kr[e] = ks[r] * kv[r][e] * exp2f(gt[e] - gv[r][e]);   // exp2 of a difference: no overflow for strong gates
        }
        *reinterpret_cast<uint2*>(&st.qd[c * OP_STRIDE + k0]) = make_uint2(pack_bf16x2(qd[0], qd[1]), pack_bf16x2(qd[2], qd[3]));
        *reinterpret_cast<uint2*>(&st.kd[c * OP_STRIDE + k0]) = make_uint2(pack_bf16x2(kd[0], kd[1]), pack_bf16x2(kd[2], kd[3]));
        *reinterpret_cast<uint2*>(&st.kr[c * OP_STRIDE + k0]) = make_uint2(pack_bf16x2(kr[0], kr[1]), pack_bf16x2(kr[2], kr[3]));
    }
}

// ---------------------------------------------------------------------------
// Consumer side
// ---------------------------------------------------------------------------

// ldmatrix.x4 row address for the 16x16 block at (row0, col0) of a row-major
// bf16 tile, matrices ordered (rows lo, cols lo), (rows hi, cols lo),
// (rows lo, cols hi), (rows hi, cols hi): lane l gives row (l & 7) of matrix l >> 3.
__device__ __forceinline__ u32 x4_addr_rows_first(const unsigned short* tile, int stride, int row0, int col0, int lane) {
    const int m = lane >> 3;
    return smem_addr(tile + (row0 + (lane & 7) + 8 * (m & 1)) * stride + col0 + 8 * (m >> 1));
}
// Same block, matrices ordered (rows lo, cols lo), (rows lo, cols hi), (rows hi, cols lo), (rows hi, cols hi).
__device__ __forceinline__ u32 x4_addr_cols_first(const unsigned short* tile, int stride, int row0, int col0, int lane) {
    const int m = lane >> 3;
    return smem_addr(tile + (row0 + (lane & 7) + 8 * (m >> 1)) * stride + col0 + 8 * (m & 1));
}

// Store this warp's dS^T band (fp32 accumulators) as dS[k][v] rows of `out`
// (fp32 [D][D] with this band's first column at v0). Accumulator n-tile j holds
// (v = g, k = 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1). They go to a
// warp-private staging tile [k][16 v] first, then every lane stores 16 bytes: 16
// global stores per lane instead of 64 scattered 4-byte ones (which cost as much
// as the five GEMMs in seed mode: kernel.profile, 2,558 of 5,855 cycles per tile
// at 4 x 8192 vsplit 1).
__device__ __forceinline__ void store_band_f32(float* out, const float (&dS)[16][4], float* staging,
                                               int v0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int k = 8 * j + 2 * t;
        staging[k * SNAPF_STRIDE + g] = dS[j][0];
        staging[(k + 1) * SNAPF_STRIDE + g] = dS[j][1];
        staging[k * SNAPF_STRIDE + g + 8] = dS[j][2];
        staging[(k + 1) * SNAPF_STRIDE + g + 8] = dS[j][3];
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < D / 8; ++it) {    // 8 k rows x 4 chunks of 16 B per instruction
        const int k = 8 * it + (lane >> 2), ch = lane & 3;
        const float4 v = *reinterpret_cast<const float4*>(staging + k * SNAPF_STRIDE + 4 * ch);
        __stcs(reinterpret_cast<float4*>(out + k * D + v0 + 4 * ch), v);
    }
    __syncwarp();
}

// Same as bf16: stmatrix.trans turns the v-major fragments into k-major rows of
// a warp-private staging tile [k][16 v], then 16-byte stores write 32 contiguous
// bytes per k row.
__device__ __forceinline__ void store_band_bf16(unsigned short* out, const float (&dS)[16][4],
                                                unsigned short* staging, int v0, int lane) {
    const int m = lane >> 3;
#pragma unroll
    for (int pr = 0; pr < 8; ++pr) {
        // matrix m: v half (m & 1), k half (m >> 1) of k columns 16pr .. 16pr+15.
        const u32 addr = smem_addr(staging + (16 * pr + 8 * (m >> 1) + (lane & 7)) * SNAP_STRIDE + 8 * (m & 1));
        stmatrix_x4_trans(addr,
                          pack_bf16x2(dS[2 * pr][0], dS[2 * pr][1]),       // v 0-7,  k 16pr+0..7
                          pack_bf16x2(dS[2 * pr][2], dS[2 * pr][3]),       // v 8-15, k 16pr+0..7
                          pack_bf16x2(dS[2 * pr + 1][0], dS[2 * pr + 1][1]),  // v 0-7,  k 16pr+8..15
                          pack_bf16x2(dS[2 * pr + 1][2], dS[2 * pr + 1][3])); // v 8-15, k 16pr+8..15
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < (D * 2) / 32; ++it) {
        const int chunk = it * 32 + lane;
        const int k = chunk >> 1, half = chunk & 1;
        const uint4 v = *reinterpret_cast<const uint4*>(staging + k * SNAP_STRIDE + 8 * half);
        __stcs(reinterpret_cast<uint4*>(out + k * D + v0 + 8 * half), v);
    }
    __syncwarp();
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    const u32 b[2] = {b0, b1};
    mma_m16n8k16_bf16(d, a, b, d);
}

}  // namespace kda

using namespace kda;

// Dynamic shared memory the launch must request (read by the host through the module).
extern "C" __constant__ int kda_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kda_threads = THREADS;
#if KDA_TIMING
extern "C" {
__device__ unsigned long long kda_timing[TIMING_CTAS * TIMING_WARPS * TIMING_SLOTS];
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
kda_dstate_scan(const unsigned short* q, const unsigned short* k, const float* gc, const float* beta,
                const unsigned short* mqk, const unsigned short* inv, const unsigned short* dO,
                const float* dht, void* snapshots, float* dh0, const long long* cu_seqlens,
                const long long* snap_offsets, const int* order, int H, float scale) {
    const Params p{q, k, gc, beta, mqk, inv, dO, dht, snapshots, dh0, cu_seqlens, snap_offsets, order, H, scale};
    extern __shared__ __align__(16) unsigned char smem[];
    Stage* stages = reinterpret_cast<Stage*>(smem);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int vs = blockIdx.x % VSPLIT;
    const int h = (blockIdx.x / VSPLIT) % p.H;
    const int slot = blockIdx.x / (VSPLIT * p.H);
    const int seq = p.order ? p.order[slot] : slot;
    const long long seq_start = p.cu_seqlens[seq];
    const int len = (int)(p.cu_seqlens[seq + 1] - seq_start);
    const int nt = (len + C - 1) / C;
    const long long snap_base = p.snap_offsets[seq];
    constexpr u32 ALL = THREADS;
    KDA_TIMERS;
    KDA_CLOCK(t_start);

    if (warp >= NUM_CONSUMERS) {
        // ----------------------------- producers -----------------------------
        const int pw = warp - NUM_CONSUMERS;
        const int ptid = threadIdx.x - NUM_CONSUMERS * 32;
        // Tile i of the walk is tile n = nt - 1 - i of the sequence. Loads run
        // PREFETCH = NSTAGE - 1 tiles ahead of R1: one tile ahead is not enough, a
        // tile's loads then wait out a whole global-memory latency (~1-2 us under
        // load) per tile (measured: 2.3 us/tile at 1 x 131072, 4.6 us at 32 x 8192).
        constexpr int PREFETCH = NSTAGE - 1;
        auto tile_len = [&](int n) { return min(C, len - n * C); };
        auto issue = [&](int j) {   // loads of walk tile j into stage j % NSTAGE, if it exists
            if (j < nt) {
                const int n = nt - 1 - j;
                issue_tile_loads(stages[j % NSTAGE], p, seq_start + (long long)n * C, tile_len(n), h, vs, pw, lane, ptid);
            }
            cp_async_commit();      // one group per tile slot, possibly empty: uniform wait counts
        };
#pragma unroll 1
        for (int j = 0; j < PREFETCH; ++j) issue(j);
#pragma unroll 1
        for (int i = 0; i < nt; ++i) {
            const int s = i % NSTAGE;
            KDA_CLOCK(t0);
            cp_async_wait<PREFETCH - 1>();   // this thread's copies for tile i landed
            __syncwarp();                    // ... and its warp's: the rows this warp's R1 reads
            KDA_ADD(T_P_WAIT_LOADS, t0);
            KDA_CLOCK(t1);
            rebuild_operands(stages[s], tile_len(nt - 1 - i), p.scale, pw, lane);
            named_barrier_arrive(full_bar(s), ALL);              // release tile i to the consumers
            KDA_ADD(T_P_R1, t1);
            // Refill the stage of tile i - 1 with tile i + PREFETCH once the consumers left it.
            // (After R1 and the arrive, so the wait never delays tile i.)
            const int j = i + PREFETCH;
            KDA_CLOCK(t2);
            if (j < nt && j >= NSTAGE) named_barrier_sync(empty_bar(j % NSTAGE), ALL);
            KDA_ADD(T_P_WAIT_EMPTY, t2);
            KDA_CLOCK(t3);
            issue(j);
            KDA_ADD(T_P_ISSUE, t3);
        }
        KDA_ADD(T_TOTAL, t_start);
        KDA_FLUSH();
        return;
    }

    // ------------------------------- consumers -------------------------------
    const int t = lane & 3;
    const int vb = warp * 16;                // band start inside this CTA's DV columns
    const int v0 = vs * DV + vb;             // band start in [0, D)
    const long long head_mat = (long long)D * D;
    // this warp's snapshot staging tile (bf16 [D][SNAP_STRIDE] or fp32 [D][SNAPF_STRIDE])
    unsigned char* staging = smem + NSTAGE * sizeof(Stage) + warp * SNAP_STAGING_BYTES;

    // dS^T band, fp32, for the whole scan: dS[j] is n-tile j (k = 8j .. 8j+7).
    float dS[16][4];
#if HAS_DHT
    {
        const float* src = p.dht + ((long long)seq * p.H + h) * head_mat;
        const int g = lane >> 2;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int k = 8 * j + 2 * t;
            dS[j][0] = src[k * D + v0 + g];
            dS[j][1] = src[(k + 1) * D + v0 + g];
            dS[j][2] = src[k * D + v0 + g + 8];
            dS[j][3] = src[(k + 1) * D + v0 + g + 8];
        }
    }
#else
#pragma unroll
    for (int j = 0; j < 16; ++j) dS[j][0] = dS[j][1] = dS[j][2] = dS[j][3] = 0.f;
#endif

    // Not unrolled: an unrolled body (the compiler likes to unroll by SNAP_EVERY to
    // make the snapshot test static) interleaves tiles and runs out of registers.
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int n = nt - 1 - i;
        const int s = i % NSTAGE;

        // snapshot[n] = dS at entry of tile n; written before waiting for the
        // tile's operands so the stores overlap the producers' work.
        KDA_CLOCK(t0);
        if (SNAP_EVERY == 1 || (n % SNAP_EVERY) == SNAP_EVERY - 1 || n == nt - 1) {
            const long long idx = snap_base + n / SNAP_EVERY;
#if SNAP_BF16
            store_band_bf16(static_cast<unsigned short*>(p.snapshots) + (idx * p.H + h) * head_mat, dS,
                            reinterpret_cast<unsigned short*>(staging), v0, lane);
#else
            store_band_f32(static_cast<float*>(p.snapshots) + (idx * p.H + h) * head_mat, dS,
                           reinterpret_cast<float*>(staging), v0, lane);
#endif
        }

        KDA_ADD(T_C_SNAPSHOT, t0);
        KDA_CLOCK(t1);
        named_barrier_sync(full_bar(s), ALL);
        KDA_ADD(T_C_WAIT_FULL, t1);
        KDA_CLOCK(t2);
        const Stage& st = stages[s];

        // do^T as the A operand [v, c]: ldmatrix.trans of do[c][v] rows.
        u32 doT[4];
        ldmatrix_x4_trans(doT, x4_addr_cols_first(st.dO, DO_STRIDE, 0, vb, lane));
        // dS^T as the A operand of G2, packed from the accumulators (k-step ks uses n-tiles 2ks, 2ks+1).
        // G1: dU^T = do^T @ Mqk  (B[c'][c] = Mqk[c'][c], pairs along c' -> ldmatrix.trans)
        u32 bm[4];
        ldmatrix_x4_trans(bm, x4_addr_rows_first(st.mqk, SMALL_STRIDE, 0, 0, lane));
        float acc[G2_SPLIT][2][4];
#pragma unroll
        for (int a = 0; a < G2_SPLIT; ++a)
#pragma unroll
            for (int nn = 0; nn < 2; ++nn) acc[a][nn][0] = acc[a][nn][1] = acc[a][nn][2] = acc[a][nn][3] = 0.f;
        mma_bf16(acc[0][0], doT, bm[0], bm[1]);
        mma_bf16(acc[0][1], doT, bm[2], bm[3]);

        // G2: dU^T += dS^T @ kr^T  (B[k][c] = kr[c][k], pairs along k -> plain ldmatrix)
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            const u32 a[4] = {pack_bf16x2(dS[2 * ks][0], dS[2 * ks][1]), pack_bf16x2(dS[2 * ks][2], dS[2 * ks][3]),
                              pack_bf16x2(dS[2 * ks + 1][0], dS[2 * ks + 1][1]), pack_bf16x2(dS[2 * ks + 1][2], dS[2 * ks + 1][3])};
            u32 bk[4];
            ldmatrix_x4(bk, x4_addr_cols_first(st.kr, OP_STRIDE, 0, 16 * ks, lane));
            // matrices: (c 0-7, k lo), (c 0-7, k hi), (c 8-15, k lo), (c 8-15, k hi)
            mma_bf16(acc[ks % G2_SPLIT][0], a, bk[0], bk[1]);
            mma_bf16(acc[ks % G2_SPLIT][1], a, bk[2], bk[3]);
        }

        // combine, first half: dS^T *= exp2(gT) per k column, then G4: dS^T += do^T @ qd.
        // Neither depends on G2, so they fill its latency.
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const float2 e = *reinterpret_cast<const float2*>(&st.egT[8 * j + 2 * t]);
            dS[j][0] *= e.x; dS[j][1] *= e.y; dS[j][2] *= e.x; dS[j][3] *= e.y;
        }
#pragma unroll
        for (int pr = 0; pr < 8; ++pr) {
            u32 bq[4];
            ldmatrix_x4_trans(bq, x4_addr_rows_first(st.qd, OP_STRIDE, 0, 16 * pr, lane));
            mma_bf16(dS[2 * pr], doT, bq[0], bq[1]);
            mma_bf16(dS[2 * pr + 1], doT, bq[2], bq[3]);
        }

        // G3: dvcorr^T = dU^T @ INV; dU^T's accumulators are G3's A operand.
        float dU[2][4];
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = acc[0][nn][e];
#pragma unroll
                for (int a = 1; a < G2_SPLIT; ++a) x += acc[a][nn][e];
                dU[nn][e] = x;
            }
        const u32 aU[4] = {pack_bf16x2(dU[0][0], dU[0][1]), pack_bf16x2(dU[0][2], dU[0][3]),
                           pack_bf16x2(dU[1][0], dU[1][1]), pack_bf16x2(dU[1][2], dU[1][3])};
        u32 bi[4];
        ldmatrix_x4_trans(bi, x4_addr_rows_first(st.inv, SMALL_STRIDE, 0, 0, lane));
        float dv[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        mma_bf16(dv[0], aU, bi[0], bi[1]);
        mma_bf16(dv[1], aU, bi[2], bi[3]);

        // bdv^T = -beta[c] * dvcorr^T (column c = 8nn + 2t, +1), straight into G5's A operand.
        const float2 b0 = *reinterpret_cast<const float2*>(&st.beta[2 * t]);
        const float2 b1 = *reinterpret_cast<const float2*>(&st.beta[8 + 2 * t]);
        const u32 aB[4] = {pack_bf16x2(-b0.x * dv[0][0], -b0.y * dv[0][1]), pack_bf16x2(-b0.x * dv[0][2], -b0.y * dv[0][3]),
                           pack_bf16x2(-b1.x * dv[1][0], -b1.y * dv[1][1]), pack_bf16x2(-b1.x * dv[1][2], -b1.y * dv[1][3])};

        // G5: dS^T += bdv^T @ kd   (the last step of the dS-dependent path)
#pragma unroll
        for (int pr = 0; pr < 8; ++pr) {
            u32 bk[4];
            ldmatrix_x4_trans(bk, x4_addr_rows_first(st.kd, OP_STRIDE, 0, 16 * pr, lane));
            mma_bf16(dS[2 * pr], aB, bk[0], bk[1]);
            mma_bf16(dS[2 * pr + 1], aB, bk[2], bk[3]);
        }

        KDA_ADD(T_C_CHAIN, t2);
        if (i + NSTAGE < nt) named_barrier_arrive(empty_bar(s), ALL);  // the producer reloads stage s
    }
    KDA_ADD(T_TOTAL, t_start);
    KDA_FLUSH();

    store_band_f32(p.dh0 + ((long long)seq * p.H + h) * head_mat, dS, reinterpret_cast<float*>(staging), v0, lane);
}
