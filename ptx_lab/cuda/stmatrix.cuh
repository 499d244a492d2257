// ptx_lab/cuda/stmatrix.cuh -- stmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 (sm_90)
//
// The inverse of ldmatrix: stores 1, 2 or 4 8x8 matrices of 16-bit elements.
// Addresses: lanes 8i..8i+7 supply the 16-byte-aligned addresses of rows 0..7
// of matrix i in shared memory (x1: lanes 0-7, x2: lanes 0-15).
// Register ri of lane l holds two elements of matrix i (low half first), with
// g = l / 4, t = l % 4:
//   plain:  { M_i[g][2t],  M_i[g][2t+1] }   -> row g of the memory matrix
//   .trans: { M_i[2t][g],  M_i[2t+1][g] }   i.e. the fragment of M_i^T is stored
//           so that memory row r holds column r of the fragment's matrix.
// ldmatrix[.trans] of the same addresses reads back exactly these registers.
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ void stmatrix_x1(u32 addr, u32 r0) {
    asm volatile("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};"
                 :: "r"(addr), "r"(r0) : "memory");
}
__device__ __forceinline__ void stmatrix_x2(u32 addr, u32 r0, u32 r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};"
                 :: "r"(addr), "r"(r0), "r"(r1) : "memory");
}
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
__device__ __forceinline__ void stmatrix_x1_trans(u32 addr, u32 r0) {
    asm volatile("stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%0], {%1};"
                 :: "r"(addr), "r"(r0) : "memory");
}
__device__ __forceinline__ void stmatrix_x2_trans(u32 addr, u32 r0, u32 r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};"
                 :: "r"(addr), "r"(r0), "r"(r1) : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

}  // namespace ptx_lab
