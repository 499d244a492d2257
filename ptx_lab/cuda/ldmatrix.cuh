// ptx_lab/cuda/ldmatrix.cuh -- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
//
// Loads 1, 2 or 4 8x8 matrices of 16-bit elements from shared memory.
// Addresses: lanes 8i..8i+7 supply the 16-byte-aligned addresses of rows 0..7
// of matrix i (x1 reads lanes 0-7, x2 lanes 0-15; the other lanes' addresses
// are ignored but must still be valid operands).
// Register ri of lane l receives two elements of matrix i (lower col/row in the
// low half), with g = l / 4, t = l % 4:
//   plain:  { M_i[g][2t],  M_i[g][2t+1] }
//   .trans: { M_i[2t][g],  M_i[2t+1][g] }
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ void ldmatrix_x1(u32& r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                 : "=r"(r0) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x1_trans(u32& r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
                 : "=r"(r0) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// Array forms, convenient for fragments held as u32[4] / u32[2].
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) { ldmatrix_x4(r[0], r[1], r[2], r[3], addr); }
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) { ldmatrix_x4_trans(r[0], r[1], r[2], r[3], addr); }

}  // namespace ptx_lab
