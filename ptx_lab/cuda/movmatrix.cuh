// ptx_lab/cuda/movmatrix.cuh -- movmatrix.sync.aligned.m8n8.trans.b16
//
// In-register transpose of one 8x8 matrix of 16-bit elements held as a
// fragment (lane l holds M[g][2t], M[g][2t+1] with g = l / 4, t = l % 4).
// Lane l receives the fragment of M^T: { M[2t][g], M[2t+1][g] }.
// Equivalent to stmatrix + ldmatrix.trans without touching shared memory.
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ u32 movmatrix_trans(u32 src) {
    u32 dst;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(dst) : "r"(src));
    return dst;
}

}  // namespace ptx_lab
