// kernel/row_rstd/cuda/row_rstd.cu -- each row's rstd of q and k, the l2norm's scale alone: the rstd pass.
//
// For every row x (128 bf16) of q and of k:
//     rstd = 1 / sqrt(sum x^2 + 1e-6)     in fp32
// the formula and eps of the op's l2norm (FLA's l2norm_fwd), whose normalised copies the kernels no longer read:
// they take the raw rows and this scale. The squares are summed in another order than FLA's (below), so the two
// agree to fp32 rounding, not bit for bit.
//
// Design: the pass moves bytes and does almost no arithmetic (two flops an element), so the design is its loads.
// Half a warp a row: 16 lanes, one 16-byte load each (8 bf16), a row's 256 bytes in one instruction of theirs;
// the CTA's 16 half-warps take 16 consecutive rows, 4 KB in a piece. Each thread issues RR_DEPTH such loads
// (rows 16 apart) before it uses the first, so that 8 CTAs an SM keep RR_DEPTH x 32 KB of loads in flight, more
// than the DRAM's latency times its bandwidth asks for. No shared memory. The grid is 8 CTAs an SM (the launch
// bounds hold the registers to 32) and walks the rows in steps of 16 RR_DEPTH a CTA; q's rows come first, then
// k's, as one range, so that one launch covers both and no CTA idles at the seam.
//
// Order of the sum (fixed, so every call gives the same bits): each lane adds its 8 squares in column order, the
// first exact (a bf16 square is exact in fp32), each next one by an fma of that exact square; the half-warp's 16
// partial sums then meet by butterfly shuffles over lane distances 8, 4, 2, 1. Each lane holds the same sum at
// the end (fp32 addition commutes) and lane 0 of the half-warp writes the rstd.
//
// Tensors:
//     q, k            bf16 [rows, 128] (any leading shape flattened; 16-byte aligned: the launch checks)
//     rows            the rows of each (int64)
//     q_rstd, k_rstd  fp32 [rows]
#include "../../shapes.cuh"   // HEAD_DIM

// Every knob is set by kernel/row_rstd/config.py (config.Config, options()); none has a default here.
#ifndef RR_DEPTH
#error "RR_DEPTH is not set: kernel/row_rstd/config.py sets every knob (Config.depth)"
#endif

namespace rr {
typedef unsigned int u32;

constexpr int DEPTH = RR_DEPTH;                        // rows in flight a thread
constexpr int THREADS = 256;
constexpr int ROW_LANES = 16;                          // a row's lanes: half a warp
constexpr int ROW_PIECES = HEAD_DIM / 8;               // a row's 16-byte pieces, 8 bf16 each
constexpr int ROWS_PER_SLOT = THREADS / ROW_LANES;     // rows a CTA reads at once: one per half-warp
constexpr int ROWS_PER_STEP = ROWS_PER_SLOT * DEPTH;
// 8 CTAs an SM take every thread an SM holds (2048) with 32 registers a thread; 8 loads of 4 registers each
// do not fit in 32, so depth 8 asks for 4
constexpr int MIN_CTAS = DEPTH == 8 ? 4 : 8;
constexpr float EPS = 1e-6f;                           // FLA's l2norm eps
static_assert(ROW_PIECES == ROW_LANES, "a row is one 16-byte piece a lane of half a warp");
static_assert(DEPTH == 1 || DEPTH == 2 || DEPTH == 4 || DEPTH == 8, "RR_DEPTH must be 1, 2, 4 or 8");

// The sum of the squares of a piece's 8 bf16, in column order: a bf16 is the upper half of its fp32, so each
// square is exact and each fma rounds once, as an add of it would
__device__ __forceinline__ float piece_squares(uint4 piece) {
    const u32 words[4] = {piece.x, piece.y, piece.z, piece.w};
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = __uint_as_float(words[i] << 16), hi = __uint_as_float(words[i] & 0xFFFF0000u);
        sum = fmaf(lo, lo, sum);
        sum = fmaf(hi, hi, sum);
    }
    return sum;
}

}  // namespace rr

extern "C" __constant__ int rr_smem_bytes = 0;
extern "C" __constant__ int rr_threads = rr::THREADS;

// Grid: up to 8 CTAs an SM (kernel/row_rstd/launch.py), each walking the steps blockIdx.x, + gridDim.x, ...
// of the 2 rows rows (q's, then k's).
extern "C" __global__ void __launch_bounds__(rr::THREADS, rr::MIN_CTAS) kda_row_rstd(
        const uint4* __restrict__ q, const uint4* __restrict__ k, long long rows, float* __restrict__ q_rstd,
        float* __restrict__ k_rstd) {
    using namespace rr;
    const int piece = threadIdx.x % ROW_LANES, slot_row = threadIdx.x / ROW_LANES;
    const long long total = 2 * rows;
    // the loop's bound is the CTA's, so every lane of a warp runs every shuffle below
    for (long long base = static_cast<long long>(blockIdx.x) * ROWS_PER_STEP; base < total;
         base += static_cast<long long>(gridDim.x) * ROWS_PER_STEP) {
        uint4 pieces[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {      // every load of the step issued before any is used
            const long long row = base + ROWS_PER_SLOT * d + slot_row;
            pieces[d] = make_uint4(0u, 0u, 0u, 0u);
            if (row < rows)
                pieces[d] = __ldg(q + row * ROW_PIECES + piece);
            else if (row < total)
                pieces[d] = __ldg(k + (row - rows) * ROW_PIECES + piece);
        }
        float sums[DEPTH];                     // the pieces' registers free before any rstd's division
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            sums[d] = piece_squares(pieces[d]);
#pragma unroll
            for (int distance = ROW_LANES / 2; distance >= 1; distance /= 2)   // within the half-warp
                sums[d] += __shfl_xor_sync(0xFFFFFFFFu, sums[d], distance);
        }
        if (piece == 0) {                      // a row's lane 0 writes its rstd
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
                const long long row = base + ROWS_PER_SLOT * d + slot_row;
                if (row >= total)
                    break;
                // 1 / sqrtf, not rsqrtf: rsqrtf (MUFU.RSQ) is an approximation, not correctly rounded, and
                // would add its own error to the sum's; the square root and the division here are IEEE's (the
                // build has no -use_fast_math), each rounded once, as FLA's formula computes them
                const float rstd = 1.f / sqrtf(sums[d] + EPS);
                if (row < rows)
                    q_rstd[row] = rstd;
                else
                    k_rstd[row - rows] = rstd;
            }
        }
    }
}
