// kernel/cuda/kda_backward/forward_states.cu -- Kernel S: KDA's forward state scan, the state
// entering every 64-token chunk (FLA's h), for the backward to read.
//
// Math per 16-token tile of one sequence and head (rows c < L real, the rest zero):
//     gc = g - g[row before the tile]   (FLA's g restarts every 64 tokens: nothing to subtract
//                                        at a 64-chunk's first tile)
//     gT = gc[L-1];  rows >= L: gc = gT, k = v = beta = 0
//     Kd = k 2^gc    Kr = k 2^(gT-gc)    gamma = 2^gT          (once per tile, for every warp)
//     Vn = v - Kd S;  U = INV (beta Vn);  S <- diag(gamma) S + Kr^T U
// INV = the 16 x 16 diagonal block of Akk at columns 16 (tile mod 4), lower triangle only.
// Before every 4th tile's update S goes out as bf16 [K][V] (FLA's h layout, state_v_first False).
//
// Design: S is held transposed, S^T [V x K], in mma.m16n8k16 fp32 accumulators, one warp per
// 16 V rows (16 n-tiles of 8 K columns: 64 registers a thread) for the whole scan. Then every
// product takes its A operand from registers (mma.cuh's corollary: two adjacent n-tiles' C
// fragments, packed pairwise to bf16, are one k-step's A fragment) and its B operand from
// shared memory by ldmatrix, with no transpose anywhere:
//     P^T  = S^T Kd^T            A = S^T (accumulators)  B = Kd^T: Kd [token][K], cols first, plain
//     W^T  = beta (v^T - P^T)    per token column, in registers
//     U^T  = W^T INV^T           A = W^T                 B = INV^T: INV [i][j], cols first, plain
//     S^T <- gamma S^T + U^T Kr  A = U^T                 B = Kr: Kr [token][K], rows first, .trans
// and the snapshot's stmatrix .trans of S^T's A fragments writes S [K][V] rows to a staging tile.
//
// A CTA owns (sequence, head, VW = 16 FS_WARPS v rows). Tile inputs come by cp.async into a
// ring of FS_NSTAGE stages, FS_NSTAGE - 1 tiles ahead. Per tile: barrier, issue the next loads,
// every thread rebuilds a share of Kd, Kr, gamma, barrier, every warp runs its chain.
#include "cp_async.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "stmatrix.cuh"

// Every knob is set by kernel/forward_states.py (forward_states.Config, options()); none has a
// default here.
#ifndef FS_WARPS
#error "FS_WARPS is not set: kernel/forward_states.py sets every knob (Config.warps)"
#endif
#ifndef FS_NSTAGE
#error "FS_NSTAGE is not set: kernel/forward_states.py sets every knob (Config.nstage)"
#endif

namespace fs {
using namespace ptx_lab;
typedef unsigned short u16;

constexpr int D = 128;                  // K = V
constexpr int C = 16;                   // tokens per tile
constexpr int TILES_PER_CHUNK = 4;      // FLA's chunk of 64 tokens
constexpr int AKK_COLS = C * TILES_PER_CHUNK;
constexpr int WARPS = FS_WARPS;
constexpr int NSTAGE = FS_NSTAGE;
constexpr int THREADS = 32 * WARPS;
constexpr int VW = 16 * WARPS;          // v rows of S^T per CTA
constexpr int VGROUPS = D / VW;         // CTAs per (sequence, head)
static_assert(WARPS == 1 || WARPS == 2 || WARPS == 4 || WARPS == 8, "FS_WARPS must be 1, 2, 4 or 8");
static_assert(NSTAGE >= 2 && NSTAGE <= 4, "FS_NSTAGE must be 2, 3 or 4");

// Row strides (elements) of the tiles ldmatrix / stmatrix address: 8 rows of 16 bytes must
// fall on 8 different 4-bank groups.
constexpr int OP_STRIDE = D + 8;        // Kd, Kr rows: 272 B, 68 words = 4 mod 32
constexpr int INV_STRIDE = C + 8;       // INV rows: 48 B, 12 words a row apart
constexpr int SNAP_STRIDE = 16 + 8;     // staging rows (16 v of one k): 48 B likewise

// 16-byte chunks a tile's copies consist of
constexpr int K_CHUNKS = C * D * 2 / 16;        // 256
constexpr int G_CHUNKS = C * D * 4 / 16;        // 512
constexpr int GBASE_CHUNKS = D * 4 / 16;        // 32
constexpr int V_CHUNKS = C * VW * 2 / 16;       // 32 WARPS = THREADS
constexpr int INV_CHUNKS = C * C * 2 / 16;      // 32
static_assert(K_CHUNKS % THREADS == 0 && G_CHUNKS % THREADS == 0 && V_CHUNKS == THREADS, "copy split");
static_assert(GBASE_CHUNKS <= THREADS && INV_CHUNKS <= THREADS && C <= THREADS, "copy split");

// One tile's inputs as copied (rows past the tile's L are zero-filled).
struct Stage {
    float g[C][D];                  // FLA's chunk-local g (log2), fp32
    float gbase[D];                 // g at the token before the tile; zeros at a 64-chunk's start
    u16 k[C][D];                    // bf16
    u16 v[C][VW];                   // bf16, this CTA's v columns
    u16 inv[C][INV_STRIDE];         // bf16, Akk's diagonal block, zero above the diagonal
    float beta[C];
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");

struct Shared {
    Stage stage[NSTAGE];
    u16 kd[C][OP_STRIDE];           // bf16 k 2^gc
    u16 kr[C][OP_STRIDE];           // bf16 k 2^(gT-gc)
    float gamma[D];                 // 2^gT
    u16 snap[WARPS][D][SNAP_STRIDE];  // per warp: its 16 v columns of S [K][V], bf16
};
constexpr int SMEM_BYTES = (int)sizeof(Shared);

__device__ __forceinline__ float bf16_to_f32(u16 bits) { return __uint_as_float((u32)bits << 16); }

// The A fragment of k-step ks (16 K columns) from n-tiles 2 ks and 2 ks + 1 (mma.cuh).
__device__ __forceinline__ void pack_a(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16x2(lo[0], lo[1]);
    a[1] = pack_bf16x2(lo[2], lo[3]);
    a[2] = pack_bf16x2(hi[0], hi[1]);
    a[3] = pack_bf16x2(hi[2], hi[3]);
}

// Tile i's copies into st. Row index of (token, head) pairs: tok * H + h.
__device__ __forceinline__ void issue_tile(Stage& st, const u16* __restrict__ k, const u16* __restrict__ v,
                                           const float* __restrict__ g, const float* __restrict__ beta,
                                           const u16* __restrict__ akk, long long tok0, int L, int i,
                                           int H, int h, int vg, int tid) {
    const long long row0 = tok0 * H + h;
#pragma unroll
    for (int m = 0; m < K_CHUNKS / THREADS; ++m) {
        const int idx = tid + m * THREADS, c = idx / (D / 8), ch = idx % (D / 8);
        const bool valid = c < L;
        cp_async_cg16_zfill(smem_addr(&st.k[c][ch * 8]), k + (row0 + (valid ? c : 0) * (long long)H) * D + ch * 8,
                            valid ? 16u : 0u);
    }
#pragma unroll
    for (int m = 0; m < G_CHUNKS / THREADS; ++m) {
        const int idx = tid + m * THREADS, c = idx / (D / 4), ch = idx % (D / 4);
        const bool valid = c < L;
        cp_async_cg16_zfill(smem_addr(&st.g[c][ch * 4]), g + (row0 + (valid ? c : 0) * (long long)H) * D + ch * 4,
                            valid ? 16u : 0u);
    }
    if (tid < GBASE_CHUNKS) {
        const bool rebase = i % TILES_PER_CHUNK != 0;   // the token before is in the same 64-chunk
        cp_async_cg16_zfill(smem_addr(&st.gbase[tid * 4]), g + (rebase ? row0 - H : row0) * D + tid * 4,
                            rebase ? 16u : 0u);
    }
    {
        const int c = tid / (VW / 8), ch = tid % (VW / 8);
        const bool valid = c < L;
        cp_async_cg16_zfill(smem_addr(&st.v[c][ch * 8]),
                            v + (row0 + (valid ? c : 0) * (long long)H) * D + vg * VW + ch * 8, valid ? 16u : 0u);
    }
    if (tid < INV_CHUNKS) {
        // row c keeps its elements 0..c (2 (c + 1 - 8 ch) bytes of this chunk, clamped to 0..16);
        // the zero-fill, not a multiply, clears what lies above the diagonal
        const int c = tid / 2, ch = tid % 2;
        const bool valid = c < L;
        const int keep = min(max(2 * (c + 1 - 8 * ch), 0), 16);
        cp_async_cg16_zfill(smem_addr(&st.inv[c][ch * 8]),
                            akk + (row0 + (valid ? c : 0) * (long long)H) * AKK_COLS + (i % TILES_PER_CHUNK) * C + ch * 8,
                            valid ? (u32)keep : 0u);
    }
    if (tid < C) {
        const bool valid = tid < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[tid]), beta + row0 + (valid ? tid : 0) * (long long)H, valid ? 4u : 0u);
    }
}

// Kd, Kr and gamma of one tile, from its stage; every thread a share of 4-column groups.
__device__ __forceinline__ void rebuild(Shared& sh, const Stage& st, int L, int tid) {
#pragma unroll
    for (int m = 0; m < C * D / 4 / THREADS; ++m) {
        const int idx = tid + m * THREADS, c = idx / (D / 4), col = (idx % (D / 4)) * 4;
        const float4 base = *reinterpret_cast<const float4*>(&st.gbase[col]);
        const float4 last = *reinterpret_cast<const float4*>(&st.g[L - 1][col]);
        const float4 row = *reinterpret_cast<const float4*>(&st.g[c][col]);
        const float gT[4] = {last.x - base.x, last.y - base.y, last.z - base.z, last.w - base.w};
        const bool real = c < L;
        const float gc[4] = {real ? row.x - base.x : gT[0], real ? row.y - base.y : gT[1],
                             real ? row.z - base.z : gT[2], real ? row.w - base.w : gT[3]};
        const uint2 kb = *reinterpret_cast<const uint2*>(&st.k[c][col]);
        const float kf[4] = {bf16_to_f32((u16)(kb.x & 0xffffu)), bf16_to_f32((u16)(kb.x >> 16)),
                             bf16_to_f32((u16)(kb.y & 0xffffu)), bf16_to_f32((u16)(kb.y >> 16))};
        float kd[4], kr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            kd[e] = kf[e] * exp2f(gc[e]);
            kr[e] = kf[e] * exp2f(gT[e] - gc[e]);
        }
        *reinterpret_cast<uint2*>(&sh.kd[c][col]) = make_uint2(pack_bf16x2(kd[0], kd[1]), pack_bf16x2(kd[2], kd[3]));
        *reinterpret_cast<uint2*>(&sh.kr[c][col]) = make_uint2(pack_bf16x2(kr[0], kr[1]), pack_bf16x2(kr[2], kr[3]));
        if (c == 0)
            *reinterpret_cast<float4*>(&sh.gamma[col]) = make_float4(exp2f(gT[0]), exp2f(gT[1]), exp2f(gT[2]), exp2f(gT[3]));
    }
}

}  // namespace fs

using namespace fs;

// Dynamic shared memory and threads the launch must use (read by the host through the module).
extern "C" __constant__ int fs_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int fs_threads = THREADS;

// Grid: one CTA per (sequence rank, head, v group), v group fastest; order[rank] is the
// sequence (longest first). states: bf16 [sum of entries, H, K, V], entry snap_offsets[n] + c
// of sequence n is the state entering its tile 4c.
extern "C" __global__ void __launch_bounds__(THREADS)
kda_forward_states(const u16* __restrict__ k, const u16* __restrict__ v, const float* __restrict__ g,
                   const float* __restrict__ beta, const u16* __restrict__ akk, const float* __restrict__ h0,
                   u16* __restrict__ states, const long long* __restrict__ cu_seqlens,
                   const long long* __restrict__ snap_offsets, const int* __restrict__ order, int H) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int gr = lane / 4, t = lane % 4;                 // mma fragment row and column pair
    const int vg = blockIdx.x % VGROUPS;
    const int h = (blockIdx.x / VGROUPS) % H;
    const int n = order[blockIdx.x / VGROUPS / H];
    const long long bos = cu_seqlens[n];
    const int len = (int)(cu_seqlens[n + 1] - bos);
    const int ntiles = (len + C - 1) / C;
    const long long snap0 = snap_offsets[n];
    const int vrow = 16 * warp;                            // this warp's first v row within the CTA's VW
    const X4Lane xl = x4_lane(lane);

    // S^T [16 v x 128 k] of this warp: acc[nt] holds n-tile nt (k = 8 nt ..); c0 = S^T[gr][8nt+2t],
    // c1 = [gr][8nt+2t+1], c2 = [gr+8][8nt+2t], c3 = [gr+8][8nt+2t+1]
    float acc[D / 8][4];
    {
        const long long v0 = vg * VW + vrow + gr;
        const float* s0 = h0 ? h0 + ((long long)n * H + h) * D * D : nullptr;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            const int k0 = 8 * nt + 2 * t;
            acc[nt][0] = s0 ? s0[(long long)k0 * D + v0] : 0.f;
            acc[nt][1] = s0 ? s0[(long long)(k0 + 1) * D + v0] : 0.f;
            acc[nt][2] = s0 ? s0[(long long)k0 * D + v0 + 8] : 0.f;
            acc[nt][3] = s0 ? s0[(long long)(k0 + 1) * D + v0 + 8] : 0.f;
        }
    }

    auto issue = [&](int i) {
        if (i < ntiles)
            issue_tile(sh.stage[i % NSTAGE], k, v, g, beta, akk, bos + (long long)C * i, min(C, len - C * i), i, H, h,
                       vg, tid);
        cp_async_commit();   // one group per tile slot, empty past the end: the wait count stays fixed
    };
#pragma unroll
    for (int s = 0; s < NSTAGE - 1; ++s) issue(s);

    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < ntiles; ++i) {
        const int L = min(C, len - C * i);
        const Stage& st = sh.stage[i % NSTAGE];
        cp_async_wait<NSTAGE - 2>();
        __syncthreads();   // tile i landed for all; every warp is done with tile i-1's stage and operands
        issue(i + NSTAGE - 1);
        rebuild(sh, st, L, tid);
        __syncthreads();   // Kd, Kr, gamma

        // P^T = S^T Kd^T [16 v x 16 tokens]; before the update, every 4th tile stores S
        const bool snap = i % TILES_PER_CHUNK == 0;
        float p[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            u32 a[4], b[4];
            pack_a(a, acc[2 * ks], acc[2 * ks + 1]);
            if (snap)   // cols first, .trans: A = tile^T, so the tile is S [k][v] (ldmatrix.cuh)
                stmatrix_x4_trans(smem_addr(&sh.snap[warp][16 * ks + xl.row + xl.cols_first_mat_row()]
                                                       [xl.cols_first_mat_col()]),
                                  a[0], a[1], a[2], a[3]);
            ldmatrix_x4(b, smem_addr(&sh.kd[xl.row + xl.cols_first_mat_row()][16 * ks + xl.cols_first_mat_col()]));
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_m16n8k16_bf16(p[0], a, b0, p[0]);
            mma_m16n8k16_bf16(p[1], a, b1, p[1]);
        }
        if (snap) {
            __syncwarp();
            u16* dst = states + ((snap0 + i / TILES_PER_CHUNK) * H + h) * (long long)(D * D) + vg * VW + vrow;
#pragma unroll
            for (int m = 0; m < D * 2 / 32; ++m) {   // 128 rows of 32 bytes, 16 bytes a lane
                const int idx = lane + 32 * m, row = idx / 2, half = idx % 2;
                *reinterpret_cast<uint4*>(dst + (long long)row * D + half * 8) =
                    *reinterpret_cast<const uint4*>(&sh.snap[warp][row][half * 8]);
            }
        }

        // W^T = beta (v^T - P^T): column = token 8 nt2 + 2t (+1), rows gr, gr + 8
        float w[2][4];
#pragma unroll
        for (int nt2 = 0; nt2 < 2; ++nt2) {
            const int c0 = 8 * nt2 + 2 * t;
            const float b0 = st.beta[c0], b1 = st.beta[c0 + 1];
            w[nt2][0] = b0 * (bf16_to_f32(st.v[c0][vrow + gr]) - p[nt2][0]);
            w[nt2][1] = b1 * (bf16_to_f32(st.v[c0 + 1][vrow + gr]) - p[nt2][1]);
            w[nt2][2] = b0 * (bf16_to_f32(st.v[c0][vrow + gr + 8]) - p[nt2][2]);
            w[nt2][3] = b1 * (bf16_to_f32(st.v[c0 + 1][vrow + gr + 8]) - p[nt2][3]);
        }

        // U^T = W^T INV^T [16 v x 16 tokens]
        float u[2][4];
        {
            u32 a[4], b[4];
            pack_a(a, w[0], w[1]);
            ldmatrix_x4(b, smem_addr(&st.inv[xl.row + xl.cols_first_mat_row()][xl.cols_first_mat_col()]));
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_m16n8k16_bf16(u[0], a, b0, zero);
            mma_m16n8k16_bf16(u[1], a, b1, zero);
        }

        // S^T <- gamma S^T + U^T Kr
        u32 a[4];
        pack_a(a, u[0], u[1]);
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {
            u32 b[4];
            ldmatrix_x4_trans(b, smem_addr(&sh.kr[xl.row + xl.rows_first_mat_row()][16 * j + xl.rows_first_mat_col()]));
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float (&s)[4] = acc[2 * j + half];
                const float2 gm = *reinterpret_cast<const float2*>(&sh.gamma[8 * (2 * j + half) + 2 * t]);
                s[0] *= gm.x;
                s[1] *= gm.y;
                s[2] *= gm.x;
                s[3] *= gm.y;
                const u32 bb[2] = {b[2 * half], b[2 * half + 1]};
                mma_m16n8k16_bf16(s, a, bb, s);
            }
        }
    }
    cp_async_wait<0>();
}
