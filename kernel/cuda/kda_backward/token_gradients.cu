// kernel/cuda/kda_backward/token_gradients.cu -- Kernel B: KDA's per-token gradients.
//
// One CTA per 64-token chunk and head walks the chunk's (up to) four 16-token tiles in
// order. For each tile it has, from global memory, the forward's tensors as FLA's
// chunk_kda forward leaves them (q, k, v, its 64-chunk-local log2 gate cumsum g, beta,
// the 16 x 16 diagonal blocks of Aqk (Mqk) and Akk (INV)), do, and Kernel A's bf16 dS1
// (dL/dS after the tile). The forward state entering the tile, S0, comes from the
// forward-state scan's bf16 state at the chunk start (tile 0) and is carried on chip in
// fp32 across the chunk's tiles (S1 = diag(gamma) S0 + Kr^T U). The math, GEMM by GEMM
// (G1..G17), is kernel/reference/kda.py's _tile_backward; docs/kda_backward.md counts it.
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
#include "cp_async.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "stmatrix.cuh"

using namespace ptx_lab;

namespace kdb {

constexpr int D = 128;           // K = V
constexpr int C = 16;            // tokens per tile
constexpr int FLA_CHUNK = 64;    // tokens per CTA: FLA's chunk, 4 tiles
constexpr int WARPS = 8;
constexpr int THREADS = 32 * WARPS;
constexpr int ROW = 2 * (D + 8); // bytes per padded bf16 row of 128: 272 = 68 words, so the
                                 // 8 rows of an ldmatrix 8x8 matrix hit 8 different bank quads
// One stage of tile inputs (bytes)
constexpr int ST_Q = 0;
constexpr int ST_K = ST_Q + C * ROW;
constexpr int ST_V = ST_K + C * ROW;
constexpr int ST_DO = ST_V + C * ROW;
constexpr int ST_G = ST_DO + C * ROW;        // fp32 [16][128]
constexpr int ST_GB = ST_G + C * D * 4;      // fp32 [128]: g at the token before the tile
constexpr int ST_BETA = ST_GB + D * 4;       // fp32 [16]
constexpr int ST_MQK = ST_BETA + C * 4;      // bf16 [16][16] (32-byte rows)
constexpr int ST_INV = ST_MQK + C * C * 2;
constexpr int ST_DS = ST_INV + C * C * 2;    // bf16 [128][136]: dS1
constexpr int STAGE = ST_DS + D * ROW;
// The rest (bytes from the end of the two stages)
constexpr int SM_S = 2 * STAGE;              // bf16 [128 k][136]: S0, [K][V]
constexpr int SM_KD = SM_S + D * ROW;        // bf16 [16][136] each
constexpr int SM_KR = SM_KD + C * ROW;
constexpr int SM_QE = SM_KR + C * ROW;
constexpr int SM_BKE = SM_QE + C * ROW;
constexpr int SM_U = SM_BKE + C * ROW;
constexpr int SM_DW = SM_U + C * ROW;
constexpr int SM_DV = SM_DW + C * ROW;
constexpr int SM_GT = SM_DV + C * ROW;       // fp32 [128]: gT
constexpr int SM_GAMMA = SM_GT + D * 4;      // fp32 [128]: 2^gT
constexpr int GC_ROW = D + 8;                // fp32 words per row of gc: a float2 per lane, 16 lanes
                                             // over 4 rows, lands in 32 different banks
constexpr int SM_GC = SM_GAMMA + D * 4;      // fp32 [16][136]: the rebased gate gc (rows >= L: gT)
constexpr int PS = 24;                       // fp32 words per row of the 16 x 16 per-warp sums (float2
                                             // stores by (row g, column 2t) lanes without conflicts)
constexpr int SM_PART = SM_GC + C * GC_ROW * 4;   // fp32 [2][8][16][24]: per-warp dMqk, dLkk; later
                                                  // per-warp from_start / from_end [8][2][16][24]
constexpr int SM_FRAG = SM_PART + 2 * WARPS * C * PS * 4;  // u32 [2][4][32 lanes][4]: dMqk, dMqk^T, dLkk,
                                                           // dLkk^T as bf16 A fragments in lane order:
                                                           // their bf16 roundings, then what those left
constexpr int SM_DPART = SM_FRAG + 2 * 4 * 32 * 4 * 4;     // fp32 [8][16] per-warp d
constexpr int SM_URES = SM_FRAG;   // bf16 [8 warps][16][16] (32-byte rows): what U's bf16 rounding left,
                                   // for G9/G10; free then: the reduce step writes the fragments after
constexpr int SM_B1PART = SM_DPART + WARPS * C * 4;        // fp32 [8][16] per-warp rowsum(dW . Vn)
constexpr int SM_B2PART = SM_B1PART + WARPS * C * 4;       // fp32 [8][16] per-warp rowsum(Ke . X)
constexpr int SM_DVEC = SM_B2PART + WARPS * C * 4;         // fp32 [16] d
constexpr int SM_B1 = SM_DVEC + C * 4;                     // fp32 [16] rowsum(dW . Vn)
constexpr int SMEM_BYTES = SM_B1 + C * 4;
static_assert(WARPS * C * C * 2 <= SM_DPART - SM_FRAG, "the U remainders must fit in the fragment area");
static_assert(SMEM_BYTES <= 232448, "more shared memory than an H200 SM lends one CTA");

static_assert(STAGE % 16 == 0 && SM_KD % 16 == 0 && SM_GC % 16 == 0 && SM_PART % 16 == 0 && SM_FRAG % 16 == 0,
              "16-byte alignment");

// ldmatrix / stmatrix x4 addresses: a lane's part of the address of a 16 x 16 block of a bf16 tile,
// in the two orders of X4Lane (x4_lane_bytes_rows_first / _cols_first, ptx_lab/cuda/ldmatrix.cuh),
// is computed once; a block at (row0, col0) is then base + lane part + row0 * stride + col0 * 2, a
// constant the compiler folds into the instruction's immediate offset.
__device__ __forceinline__ constexpr u32 at(int row0, int col0) { return row0 * ROW + col0 * 2; }
// The four fragments an x4 load gives, named by what they are for mma.m16n8k16:
//   a_of(tile) A = tile; b_of(tile) B = tile; b_of_t(tile) B = tile^T; a_of_t(tile) A = tile^T.
__device__ __forceinline__ void a_of(u32 (&a)[4], u32 addr_rows) { ldmatrix_x4(a, addr_rows); }
__device__ __forceinline__ void a_of_t(u32 (&a)[4], u32 addr_cols) { ldmatrix_x4_trans(a, addr_cols); }
__device__ __forceinline__ void b_of(u32 (&b0)[2], u32 (&b1)[2], u32 addr_rows) {
    ldmatrix_x4_trans(b0[0], b0[1], b1[0], b1[1], addr_rows);
}
__device__ __forceinline__ void b_of_t(u32 (&b0)[2], u32 (&b1)[2], u32 addr_cols) {
    ldmatrix_x4(b0[0], b0[1], b1[0], b1[1], addr_cols);
}
__device__ __forceinline__ void zero4(float (&c)[4]) { c[0] = c[1] = c[2] = c[3] = 0.f; }
__device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    mma_m16n8k16_bf16(d, a, b, d);
}
// The sum over the 8 lanes of one t (lanes t, t+4, .., t+28): a sum over the accumulator's rows.
__device__ __forceinline__ float sum_over_g(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    return x;
}

struct Args {
    const unsigned short* q;      // bf16 [tokens, H, 128] (as the forward used them)
    const unsigned short* k;
    const unsigned short* v;
    const unsigned short* dout;   // do
    const float* g;               // fp32 [tokens, H, 128]: FLA's 64-chunk-local cumsum of the gate / ln 2
    const float* beta;            // fp32 [tokens, H]
    const unsigned short* aqk;    // bf16 [tokens, H, 64]
    const unsigned short* akk;    // bf16 [tokens, H, 64]
    const unsigned short* ds;     // bf16 [tiles, H, 128, 128]: Kernel A's dS after every tile
    const unsigned short* states; // bf16 [chunks, H, 128, 128]: the state entering every chunk
    float* dq;                    // fp32 [tokens, H, 128]
    float* dk;
    unsigned short* dv;           // bf16 [tokens, H, 128]
    float* dg;                    // fp32 [tokens, H, 128]: w.r.t. the per-token natural-log gate
    float* dbeta;                 // fp32 [tokens, H]
    const long long* cu;          // [N + 1] sequence offsets
    const long long* tile_offs;   // [N + 1] first dS snapshot (tile) of each sequence
    const long long* chunk_offs;  // [N + 1] first state (64-chunk) of each sequence
    const int* chunk_seq;         // [chunks] the sequence of each chunk
    int H;
    float scale;
};

}  // namespace kdb

using namespace kdb;

extern "C" __constant__ int kdb_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kdb_threads = THREADS;

// What a thread copies of every tile, fixed for the whole walk: its shared-memory offsets and
// its element offsets within a tile's rows (tok0 = 0), computed once so that a tile costs an add
// per copy. Rows past the tile's end are zero-filled from row 0 (a valid address, 0 bytes read).
struct Copies {
    int row16, col16;        // q, k, v, do and dS1: 16-byte piece col16 of row row16 (+ 16 e for dS1)
    int grow, gcol;          // g: 16-byte piece gcol of row grow (+ 8 for the second)
    long long off16, offg;   // element offsets of those pieces in [tokens, H, 128] from (tok0, h)
    int beta_row;            // threads 32..47: beta of row beta_row
    int blk_row, blk_half;   // threads 48..111: the Aqk (blk_which 0) or Akk (1) block's row, half
    int blk_which;
};

__device__ __forceinline__ Copies copies_of(int tid, long long RS) {
    Copies c;
    c.row16 = tid >> 4;
    c.col16 = tid & 15;
    c.grow = tid >> 5;
    c.gcol = tid & 31;
    c.off16 = c.row16 * RS + c.col16 * 8;
    c.offg = c.grow * RS + c.gcol * 4;
    c.beta_row = tid - 32;
    const int x = tid - 48;
    c.blk_which = x >> 5;
    c.blk_row = (x & 31) >> 1;
    c.blk_half = x & 1;
    return c;
}

// cp.async the inputs of tile `it` of this CTA's chunk into stage `st` (and, for tile 0, S0).
// row0: element offset of (token tok0, head h) in [tokens, H, 128]; RS = H * 128.
__device__ __forceinline__ void load_tile(const Args& a, const Copies& cp, unsigned char* smem, int st, int it,
                                          long long row0, long long RS, int lt, long long snap, long long chunk,
                                          int h, int tid) {
    const u32 base = smem_addr(smem) + st * STAGE;
    const long long H = a.H;
    {   // q, k, v, do: 16 rows of 256 bytes, one 16-byte copy per thread and tensor
        const bool ok = cp.row16 < lt;
        const long long off = row0 + (ok ? cp.off16 : cp.col16 * 8);
        const u32 dst = cp.row16 * ROW + cp.col16 * 16;
        const u32 n = ok ? 16u : 0u;
        cp_async_cg16_zfill(base + ST_Q + dst, a.q + off, n);
        cp_async_cg16_zfill(base + ST_K + dst, a.k + off, n);
        cp_async_cg16_zfill(base + ST_V + dst, a.v + off, n);
        cp_async_cg16_zfill(base + ST_DO + dst, a.dout + off, n);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {   // g: 16 rows of 512 bytes, rows grow and grow + 8
        const int r = cp.grow + 8 * e;
        const bool ok = r < lt;
        const long long off = row0 + (ok ? cp.offg + 8 * e * RS : cp.gcol * 4);
        cp_async_cg16_zfill(base + ST_G + r * D * 4 + cp.gcol * 16, a.g + off, ok ? 16u : 0u);
    }
    if (tid < 32) {   // g at the token before the tile: the tile's base, within the same 64-chunk
        const bool ok = it > 0;
        cp_async_cg16_zfill(base + ST_GB + tid * 16, a.g + row0 - (ok ? RS : 0) + tid * 4, ok ? 16u : 0u);
    } else if (tid < 48) {   // beta, 4 bytes a token (its tokens are H * 4 bytes apart)
        const int r = cp.beta_row;
        const bool ok = r < lt;
        cp_async_ca_zfill<4>(base + ST_BETA + r * 4, a.beta + row0 / D + (ok ? r * H : 0), ok ? 4u : 0u);
    } else if (tid < 112) {   // the diagonal blocks of Aqk and Akk: row r keeps elements 0..r
        const int r = cp.blk_row, half = cp.blk_half;
        const bool ok = r < lt;
        int bytes = 2 * (r + 1) - 16 * half;
        bytes = ok ? (bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes)) : 0;
        const unsigned short* src = (cp.blk_which ? a.akk : a.aqk) + (row0 / D + (ok ? r * H : 0)) * FLA_CHUNK
                                    + C * it + 8 * half;
        cp_async_cg16_zfill(base + (cp.blk_which ? ST_INV : ST_MQK) + r * 32 + half * 16, src,
                            static_cast<u32>(bytes));
    }
    {   // dS1: 128 rows of 256 bytes, rows row16 + 16 e
        const unsigned short* src = a.ds + (snap * H + h) * (D * D) + cp.row16 * D + cp.col16 * 8;
        const u32 dst = base + ST_DS + cp.row16 * ROW + cp.col16 * 16;
#pragma unroll
        for (int e = 0; e < 8; ++e) cp_async_cg16(dst + 16 * e * ROW, src + 16 * e * D);
    }
    if (it == 0) {   // S0 at the chunk's start
        const unsigned short* src = a.states + (chunk * H + h) * (D * D) + cp.row16 * D + cp.col16 * 8;
        const u32 dst = smem_addr(smem) + SM_S + cp.row16 * ROW + cp.col16 * 16;
#pragma unroll
        for (int e = 0; e < 8; ++e) cp_async_cg16(dst + 16 * e * ROW, src + 16 * e * D);
    }
    cp_async_commit();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) kda_token_gradients(
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,
        const float* gate, const float* beta, const unsigned short* aqk, const unsigned short* akk,
        const unsigned short* ds, const unsigned short* states, float* dq, float* dk, unsigned short* dv,
        float* dg, float* dbeta, const long long* cu, const long long* tile_offs, const long long* chunk_offs,
        const int* chunk_seq, int H_, float scale) {
    const Args a{q, k, v, dout, gate, beta, aqk, akk, ds, states, dq, dk, dv, dg, dbeta, cu, tile_offs,
                 chunk_offs, chunk_seq, H_, scale};
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const X4Lane xl = x4_lane(lane);
    const int h = blockIdx.y;
    const long long chunk = blockIdx.x;
    const int n = a.chunk_seq[chunk];
    const long long j = chunk - a.chunk_offs[n];
    const long long len = a.cu[n + 1] - a.cu[n];
    const long long tok_chunk = a.cu[n] + FLA_CHUNK * j;
    const int l64 = static_cast<int>(min(static_cast<long long>(FLA_CHUNK), len - FLA_CHUNK * j));
    const int ntile = (l64 + C - 1) / C;
    const long long snap0 = a.tile_offs[n] + 4 * j;
    const long long H = a.H, RS = H * D;   // RS: elements from one token's row of a head to the next token's
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

    const int v0 = 16 * warp;   // V phase: this warp's v rows
    const int k0 = 16 * warp;   // K phase: this warp's k columns
    // lane parts of the ldmatrix / stmatrix addresses (rows first / cols first, 272- and 32-byte rows),
    // with this warp's v columns (V phase) and k rows or columns (K phase) folded in
    const u32 lr = x4_lane_bytes_rows_first(ROW, xl), lc = x4_lane_bytes_cols_first(ROW, xl);
    const u32 lr32 = x4_lane_bytes_rows_first(32, xl), lc32 = x4_lane_bytes_cols_first(32, xl);
    const u32 nr = sb + lr, nc = sb + lc, nc32 = sb + lc32;
    const u32 ncv = nc + 2 * v0, nrv = nr + 2 * v0, nck = nc + k0 * ROW, nrk = nr + 2 * k0;
    float S[16][4];             // S0^T [v0..v0+15][all k], fp32, 16 n-tiles of 8 k

    const Copies cps = copies_of(tid, RS);
    load_tile(a, cps, smem, 0, 0, (tok_chunk * H + h) * D, RS, min(C, l64), snap0, chunk, h, tid);

    for (int it = 0; it < ntile; ++it) {
        const int st = it & 1;
        const long long tok0 = tok_chunk + C * it;
        const long long row0 = (tok0 * H + h) * D;   // element offset of (token tok0, head h) in [tokens, H, D]
        const int lt = min(C, l64 - C * it);
        if (it + 1 < ntile) {
            load_tile(a, cps, smem, st ^ 1, it + 1, row0 + C * RS, RS, min(C, l64 - C * (it + 1)), snap0 + it + 1,
                      chunk, h, tid);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();   // tile it's inputs (and S0) are in; the previous tile is done with everything

        unsigned char* const stg = smem + st * STAGE;
        const u32 stb = sb + st * STAGE;
        const u32 sr = stb + lr, sc = stb + lc, sr32 = stb + lr32, sc32 = stb + lc32;
        const u32 scv = sc + 2 * v0, srv = sr + 2 * v0, sck = sc + k0 * ROW;
        const float* const gs = reinterpret_cast<const float*>(stg + ST_G);
        const float* const gbs = reinterpret_cast<const float*>(stg + ST_GB);
        const float* const betas = reinterpret_cast<const float*>(stg + ST_BETA);
        const unsigned short* const qs = reinterpret_cast<const unsigned short*>(stg + ST_Q);
        const unsigned short* const ks = reinterpret_cast<const unsigned short*>(stg + ST_K);

        // ---- R1: the gate-weighted operands, in fp32, rounded once to bf16; gc kept in fp32 ----
        {   // a thread keeps a pair of columns and every 4th row: 4-byte bf16 pairs, 8-byte gate pairs
            const int kk = 2 * (tid & 63), i0 = tid >> 6;
            const float2 base = *reinterpret_cast<const float2*>(gbs + kk);
            const float2 last = *reinterpret_cast<const float2*>(gs + (lt - 1) * D + kk);
            const float gT[2] = {last.x - base.x, last.y - base.y};
            if (i0 == 0) {
                *reinterpret_cast<float2*>(gt_s + kk) = make_float2(gT[0], gT[1]);
                *reinterpret_cast<float2*>(gamma_s + kk) = make_float2(exp2f(gT[0]), exp2f(gT[1]));
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = i0 + 4 * e, o = i * (ROW / 2) + kk;
                const float2 graw = *reinterpret_cast<const float2*>(gs + i * D + kk);
                const float gc[2] = {i < lt ? graw.x - base.x : gT[0], i < lt ? graw.y - base.y : gT[1]};
                const u32 q2 = *reinterpret_cast<const u32*>(qs + o), k2 = *reinterpret_cast<const u32*>(ks + o);
                const float qv[2] = {bf16_lo(q2), bf16_hi(q2)}, kv[2] = {bf16_lo(k2), bf16_hi(k2)};
                const float be = betas[i];
                float kd[2], kr[2], qe[2], bke[2];
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float fu = exp2f(gc[c] - gT[c]);
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
        }
        if (it == 0) {   // this warp's S0^T rows, fp32 from the bf16 state
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                u32 x[4];
                a_of_t(x, ncv + SM_S + at(16 * b, 0));
                a_to_acc(S[2 * b], S[2 * b + 1], x);
            }
        }
        __syncthreads();   // R1 is in

        // ================= V phase: v rows v0..v0+15, tokens as N =================
        float U[2][4];
        {
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
                            dpart[warp * C + 8 * nt + 2 * t + e] = dd;
                            b1part[warp * C + 8 * nt + 2 * t + e] = bb;
                        }
                    }
            }
        }
        __syncwarp();   // this warp's U and dW columns are in shared memory

        // G9 / G10 partials over this warp's v: dMqk = do U^T, dW U^T   [i][j], U in two parts
        {
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
            float* const pm = part + warp * C * PS;
            float* const pl = part + (WARPS + warp) * C * PS;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const int jj = 8 * nt + 2 * t;
                *reinterpret_cast<float2*>(pm + g * PS + jj) = make_float2(M[nt][0], M[nt][1]);
                *reinterpret_cast<float2*>(pm + (g + 8) * PS + jj) = make_float2(M[nt][2], M[nt][3]);
                *reinterpret_cast<float2*>(pl + g * PS + jj) = make_float2(Lk[nt][0], Lk[nt][1]);
                *reinterpret_cast<float2*>(pl + (g + 8) * PS + jj) = make_float2(Lk[nt][2], Lk[nt][3]);
            }
        }

        // G8: S1^T = gamma S0^T + U^T Kr, kept in registers until the K phase has read S0
        if (it + 1 < ntile) {
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
        __syncthreads();   // partials, U, dW complete

        // The partial sums over v, added in a fixed order (deterministic). dMqk and dLkk (strictly
        // lower) go out as bf16 A fragments, each element written to its (lane, register, half)
        // of the fragment of the matrix and of its transpose (mma.cuh's A layout). Each goes as
        // two: its bf16 rounding and the bf16 rounding of the remainder, so that G14-G17 see
        // them to about 2^-17 (in one bf16 fragment they carry about a tenth of dq's and dk's error).
        {
            const int i = tid >> 4, jj = tid & 15;
            float m = 0.f, l = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                m += part[w * C * PS + i * PS + jj];
                l += part[(WARPS + w) * C * PS + i * PS + jj];
            }
            const float mv = jj < i ? m : 0.f, lv = jj < i ? -l : 0.f;
            const unsigned short mb = f32_to_bf16(mv), lb = f32_to_bf16(lv);
            const unsigned short mr = f32_to_bf16(mv - bf16_to_f32(mb)), lr = f32_to_bf16(lv - bf16_to_f32(lb));   // exact differences
            const int plain = (4 * (i & 7) + ((jj & 7) >> 1)) * 8 + ((i >> 3) + 2 * (jj >> 3)) * 2 + (jj & 1);
            const int trans = (4 * (jj & 7) + ((i & 7) >> 1)) * 8 + ((jj >> 3) + 2 * (i >> 3)) * 2 + (i & 1);
            frag16[0 * 256 + plain] = mb;    // dMqk
            frag16[1 * 256 + trans] = mb;    // dMqk^T
            frag16[2 * 256 + plain] = lb;    // dLkk
            frag16[3 * 256 + trans] = lb;    // dLkk^T
            frag16[4 * 256 + plain] = mr;    // the remainders, in the same order
            frag16[5 * 256 + trans] = mr;
            frag16[6 * 256 + plain] = lr;
            frag16[7 * 256 + trans] = lr;
            if (tid < C) {
                float d = 0.f;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) d += dpart[w * C + tid];
                dvec[tid] = d;
            } else if (tid < 2 * C) {
                float x = 0.f;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) x += b1part[w * C + tid - C];
                b1[tid - C] = x;
            }
        }
        __syncthreads();

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
            // G14-G17: the C x C gradients against Kr, Qe and beta Ke
            {
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
            // back to q, k and the gate, with fp32 factors from gc (as R1). The gate's products
            // pair each gated operand an MMA read (Kd, Qe, beta Ke, Kr) with its gradient at the
            // bf16 value that MMA used: the cancellations between a tile's gated halves then hold
            // in rounding too. (With the fp32 values, fp32 - bf16 times the gradient is left over,
            // large against dg under strong gates and large states: kernel/studies/gradient_rounding.)
            // Qd feeds no MMA here and keeps its fp32 value.
            float* const fsb = part + warp * 2 * C * PS;   // this warp's from_start [16 i][16 k]
            float* const feb = fsb + C * PS;               // and from_end
            float b2[2] = {0.f, 0.f};
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
                    float dq2[2], dk2[2], fs2[2], fe2[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float fs = exp2f(gcv[e]), fu = exp2f(gcv[e] - gTv[e]), fd = exp2f(gTv[e] - gcv[e]);
                        const float dQd = Qd[nt][x + e], dKd = -be * WS[nt][x + e], dQe = Qe[nt][x + e];
                        const float dKe = be * X[nt][x + e], dKr = Kr[nt][x + e];
                        dq2[e] = s * (fs * dQd + fu * dQe + dd * kv[e]);
                        dk2[e] = fs * dKd + fu * dKe + fd * dKr + s * dd * qv[e];
                        fs2[e] = s * qv[e] * fs * dQd + kdb[e] * dKd;
                        fe2[e] = qeb[e] * dQe + beb[e] * X[nt][x + e] - krb[e] * dKr;   // Ke dKe = (beta Ke) X
                        b2[r] += kv[e] * fu * X[nt][x + e];
                    }
                    *reinterpret_cast<float2*>(fsb + i * PS + cl) = make_float2(fs2[0], fs2[1]);
                    *reinterpret_cast<float2*>(feb + i * PS + cl) = make_float2(fe2[0], fe2[1]);
                    if (i < lt) {
                        const long long off = row0 + i * RS + kk;
                        *reinterpret_cast<float2*>(a.dq + off) = make_float2(dq2[0], dq2[1]);
                        *reinterpret_cast<float2*>(a.dk + off) = make_float2(dk2[0], dk2[1]);
                    }
                }
            }
            // rowsum(Ke . X) over this warp's 16 k: the 4 lanes of a row, then one store per row
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float x = b2[r];
                x += __shfl_xor_sync(0xffffffffu, x, 1);
                x += __shfl_xor_sync(0xffffffffu, x, 2);
                if (t == 0) b2part[warp * C + g + 8 * r] = x;
            }
            __syncwarp();
            // dg[i] = sum_{c >= i} from_start[c] - sum_{c < i} from_end[c] + gamma dgamma
            {
                if (lane < C) {
                    const int kk = k0 + lane;
                    const float tail = gamma_s[kk] * dgc;
                    float rev[C];
                    float acc = 0.f;
#pragma unroll
                    for (int i = C - 1; i >= 0; --i) { acc += fsb[i * PS + lane]; rev[i] = acc; }
                    float ex = 0.f;
#pragma unroll
                    for (int i = 0; i < C; ++i) {
                        if (i < lt) a.dg[row0 + i * RS + kk] = rev[i] - ex + tail;
                        ex += feb[i * PS + lane];
                    }
                }
            }
        }
        __syncthreads();   // the K phase has read S0, dS1, U, dW; the dbeta partials are in

        if (tid < lt) {
            float x = b1[tid];
#pragma unroll
            for (int w = 0; w < WARPS; ++w) x += b2part[w * C + tid];
            a.dbeta[(tok0 + tid) * H + h] = x;
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
    }
}
