// ptx_lab/cuda/mma.cuh -- mma.sync.aligned.m16n8k16.row.col, f32 accumulate.
//
// D[16x8] = A[16x16] @ B[16x8] + C[16x8], one warp, g = lane / 4, t = lane % 4:
//   A (4 b32, two 16-bit elements each, lower column in the low half):
//     a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]
//     a2 = A[g][2t+8..2t+9] a3 = A[g+8][2t+8..2t+9]
//   B (2 b32, pairs run along k, lower k in the low half):
//     b0 = B[2t..2t+1][g]   b1 = B[2t+8..2t+9][g]
//   C, D (4 f32):
//     c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// Corollary used by Kernel A: the C fragments of two adjacent n-tiles, packed
// pairwise (c0,c1) and (c2,c3), are exactly the A fragment of one k-step.
#pragma once
#include "common.cuh"

namespace ptx_lab {

// d = a @ b + c, bf16 inputs. d may alias c.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const u32 (&a)[4],
                                                  const u32 (&b)[2], const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// d = a @ b + c, f16 inputs. d may alias c.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const u32 (&a)[4],
                                                 const u32 (&b)[2], const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

}  // namespace ptx_lab
