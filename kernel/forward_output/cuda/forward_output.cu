// kernel/forward_output/cuda/forward_output.cu -- o from the chain's states and v_new: the third pass of the
// three-pass forward (docs/kda_forward.md, section 3, "three passes").
//
// Per 64-token chunk c and value head hv, from the first pass's qg and Aqk and the chain's states and v_new
// (all bf16; Aqk in two parts, hi = bf16(Aqk) and lo = bf16(Aqk - hi)):
//     o = bf16(qg S + Aqk_hi v_new + Aqk_lo v_new)   [64 x V]   qg [64 x K], S [K x V] (the state entering
//                                                   the chunk), Aqk_hi, Aqk_lo [64 x 64] (lower triangular),
//                                                   v_new [64 x V]
// in fp32 accumulators, its rows < L written (L: the chunk's real rows, 64 but at a sequence's last
// chunk). Aqk goes in two parts (about 16 bits) because in one bf16 its rounding makes 13% of o's error in
// the model. o_pass of tests/kernel/three_pass_model.py is the arithmetic; it sums qg S and (hi + lo) v_new
// apart and in float64, the MMAs here one after the other into one fp32 accumulator, so the two agree to
// fp32 rounding before the one bf16 rounding of o.
//
// Design: nothing is carried from chunk to chunk, so one CTA a (chunk, value head), in the operands'
// chunk-major order: CTA c HV + hv reads the contiguous 16 + 32 + 8 + 8 + 16 KB of that index (qg, S,
// Aqk_hi, Aqk_lo, v_new) and writes 16 KB. The pass is bound by those bytes (4 MFLOP a CTA), so the design is
// the copies': every thread issues 16-byte cp.async copies into row-padded tiles, in two commit groups (qg
// and S, then Aqk's two parts and v_new), and the first product runs while the second group lands; the 86 KB
// of tiles leave room for two CTAs an SM, one's copies beside the other's MMAs and stores.
// Warps (FO_WARPS, 4 or 8): warp w owns o rows 16 (w % 4) .. +15 and v columns VW (w / 4) .. +VW - 1
// (VW = 128 with 4 warps, 64 with 8), in m16n8k16 fp32 accumulators:
//     O  = qg S             A: qg rows (ldmatrix, rows first)    B[k][v] = S's rows (ldmatrix .trans)
//     O += Aqk_hi v_new     A: Aqk_hi rows                       B[r][v] = v_new's rows (.trans)
//     O += Aqk_lo v_new     A: Aqk_lo rows                       B[r][v] = v_new's rows (.trans)
// every element's k-steps in one order in every variant (qg S's 8, then Aqk_hi v_new's 4, then Aqk_lo
// v_new's 4, all of Aqk as given), so both variants give the same bits.
// Out: each warp packs its O to bf16 A fragments and writes them by stmatrix into its own part of the qg
// tile (free once every warp is past the first product: the barrier before the second), then stores its
// rows < L, 16 bytes a lane, whole 128-byte lines.
//
// Tensors (chunk-major: a sequence's chunks one after another, sequence after sequence):
//     qg           bf16 [chunks * HV * 64, 128]    (rows: (c HV + hv) 64 + r)
//     states       bf16 [chunks * HV * 128, 128] = [chunks, HV, K, V]
//     aqk, aqk_lo  bf16 [chunks * HV * 64, 64]    (Aqk's hi and lo parts)
//     v_new        bf16 [chunks * HV * 64, 128]
//     table        int32 [chunks][2]: chunk c's first token and its real rows L (the products pass's table)
//     o            bf16 [tokens, HV, 128] (FLA's layout: chunk c's row r is token table[c][0] + r)
#include "../../shapes.cuh"   // HEAD_DIM (K = V), CHUNK_TOKENS, TILE_TOKENS
#include "cp_async.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "stmatrix.cuh"

// Every knob is set by kernel/forward_output/config.py (config.Config, options()); none has a default here.
#ifndef FO_WARPS
#error "FO_WARPS is not set: kernel/forward_output/config.py sets every knob (Config.warps)"
#endif

using namespace ptx_lab;

namespace fo {
typedef unsigned short u16;

constexpr int WARPS = FO_WARPS;
constexpr int THREADS = 32 * WARPS;
constexpr int R = CHUNK_TOKENS;                 // rows of a chunk: o's, qg's, Aqk's, v_new's
constexpr int ROW_BLOCKS = R / TILE_TOKENS;     // 4 warps' rows, 16 (one MMA's m) each
constexpr int VW = HEAD_DIM * ROW_BLOCKS / WARPS;   // v columns of a warp
constexpr int NT = VW / 8;                      // its accumulators' n-tiles
static_assert(WARPS == 4 || WARPS == 8, "FO_WARPS must be 4 or 8");

// Rows padded by 8 bf16 (16 bytes): the 16-byte pieces that an ldmatrix or stmatrix reaches at one column of
// 8 rows in a row then sit 16 bytes apart in the banks, all 32 banks once (272- and 144-byte rows)
constexpr int PAD = 8;
constexpr int WIDE = HEAD_DIM + PAD;            // qg, S, v_new
constexpr int NARROW = R + PAD;                 // Aqk's parts

struct Shared {
    u16 qg[R][WIDE];          // and, after the first product, the staging tile of o
    u16 s[HEAD_DIM][WIDE];
    u16 aqk[R][NARROW];
    u16 aqk_lo[R][NARROW];
    u16 vn[R][WIDE];
};

// A contiguous [ROWS][COLS] bf16 tile into a padded one, 16 bytes a copy, the CTA's threads side by side
// (a warp's 32 copies 512 contiguous bytes)
template <int ROWS, int COLS, int STRIDE>
__device__ __forceinline__ void copy_tile(u16 (*dst)[STRIDE], const u16* __restrict__ src, int tid) {
    constexpr int PIECES = COLS / 8;            // 16-byte pieces a row
    static_assert(ROWS * PIECES % THREADS == 0, "a tile is a whole number of copies a thread");
#pragma unroll
    for (int j = 0; j < ROWS * PIECES / THREADS; ++j) {
        const int i = tid + THREADS * j, row = i / PIECES, col = 8 * (i % PIECES);
        cp_async_cg16(smem_addr(&dst[row][col]), src + 8 * i);
    }
}

// acc += A B over one k range: A's rows m0 .. m0 + 15 from a [m][k] tile, B[k][v] from a [k][v] tile's
// columns v0 .. v0 + VW - 1, 16 k a step
template <int KSTEPS, int A_STRIDE>
__device__ __forceinline__ void product(float (&acc)[NT][4], const u16 (*a_tile)[A_STRIDE], const u16 (*b_tile)[WIDE],
                                        int m0, int v0, X4Lane xl) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 a[4];
        const RowCol pa = x4_rows_first(m0, 16 * kk, xl);
        ldmatrix_x4(a, smem_addr(&a_tile[pa.row][pa.col]));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 b[4];
            const RowCol pb = x4_rows_first(16 * kk, v0 + 16 * np, xl);
            ldmatrix_x4_trans(b, smem_addr(&b_tile[pb.row][pb.col]));
            const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma_m16n8k16_bf16(acc[2 * np], a, b_lo, acc[2 * np]);
            mma_m16n8k16_bf16(acc[2 * np + 1], a, b_hi, acc[2 * np + 1]);
        }
    }
}

}  // namespace fo

extern "C" __constant__ int fo_smem_bytes = static_cast<int>(sizeof(fo::Shared));
extern "C" __constant__ int fo_threads = fo::THREADS;

// Grid: one CTA per (chunk, value head), blockIdx.x = c HV + hv. Two CTAs an SM: their tiles fit twice.
extern "C" __global__ void __launch_bounds__(fo::THREADS, 2) kda_forward_output(
        const fo::u16* __restrict__ qg, const fo::u16* __restrict__ states, const fo::u16* __restrict__ aqk,
        const fo::u16* __restrict__ aqk_lo, const fo::u16* __restrict__ v_new, const int* __restrict__ table, int HV,
        fo::u16* __restrict__ o) {
    using namespace fo;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long long ch = blockIdx.x;                       // (chunk, value head)
    const int c = static_cast<int>(ch / HV), hv = static_cast<int>(ch % HV);
    // read before the copies: the asm statements below (memory clobbers) would keep it after them
    const int tok0 = table[2 * c], L = table[2 * c + 1];

    copy_tile<R, HEAD_DIM, WIDE>(sh.qg, qg + ch * R * HEAD_DIM, tid);
    copy_tile<HEAD_DIM, HEAD_DIM, WIDE>(sh.s, states + ch * HEAD_DIM * HEAD_DIM, tid);
    cp_async_commit();
    copy_tile<R, R, NARROW>(sh.aqk, aqk + ch * R * R, tid);
    copy_tile<R, R, NARROW>(sh.aqk_lo, aqk_lo + ch * R * R, tid);
    copy_tile<R, HEAD_DIM, WIDE>(sh.vn, v_new + ch * R * HEAD_DIM, tid);
    cp_async_commit();

    const int m0 = TILE_TOKENS * (warp % ROW_BLOCKS), v0 = VW * (warp / ROW_BLOCKS);
    const X4Lane xl = x4_lane(lane);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    cp_async_wait<1>();   // this thread's copies of qg and S landed
    __syncthreads();      // ... and every thread's
    product<HEAD_DIM / 16, WIDE>(acc, sh.qg, sh.s, m0, v0, xl);
    cp_async_wait<0>();
    __syncthreads();      // Aqk and v_new are in, and every warp is past its reads of qg: the qg tile stages o
    product<R / 16, NARROW>(acc, sh.aqk, sh.vn, m0, v0, xl);
    product<R / 16, NARROW>(acc, sh.aqk_lo, sh.vn, m0, v0, xl);

    // o: two adjacent n-tiles' accumulators packed are the A fragment of their 16 x 16 block, which
    // stmatrix (rows first, plain) writes as O [row][v]
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
        u32 a[4];
        acc_to_a(a, acc[2 * j], acc[2 * j + 1]);
        const RowCol p = x4_rows_first(m0, v0 + 16 * j, xl);
        stmatrix_x4(smem_addr(&sh.qg[p.row][p.col]), a[0], a[1], a[2], a[3]);
    }
    __syncwarp();         // the warp's part of the staging tile is whole (no other warp touches it)
    constexpr int PIECES = VW / 8;                         // 16-byte pieces of a warp's row
#pragma unroll
    for (int j = 0; j < TILE_TOKENS * PIECES / 32; ++j) {
        const int i = lane + 32 * j, row = m0 + i / PIECES, col = v0 + 8 * (i % PIECES);
        if (row < L)
            *reinterpret_cast<uint4*>(o + (static_cast<long long>(tok0 + row) * HV + hv) * HEAD_DIM + col) =
                *reinterpret_cast<const uint4*>(&sh.qg[row][col]);
    }
}
