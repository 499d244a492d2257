// kernel/token_gradients/cuda/token_gradients_operands.cuh -- Kernel B's MMA operands: the block
// offsets of its 272-byte-row tiles, the four fragments an ldmatrix .x4 gives by what they are
// for mma.m16n8k16, one accumulating mma, and the sum over an accumulator's rows.
#pragma once
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "token_gradients_layout.cuh"

namespace kdb {

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

}  // namespace kdb
