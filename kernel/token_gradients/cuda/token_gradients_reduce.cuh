// kernel/token_gradients/cuda/token_gradients_reduce.cuh -- Kernel B's reduce step between its V and
// K phases: the 8 warps' partial sums over v added in a fixed order (two runs give the same bits),
// dMqk and dLkk written out as bf16 A fragments in lane order for G14-G17.
#pragma once
#include "fragments.cuh"
#include "token_gradients_layout.cuh"

namespace kdb {

// The u16 position of element (i, jj) of a 16 x 16 matrix in its A fragment in lane order (mma.cuh's A
// layout, [32 lanes][4 registers][2 halves]); its transpose's is frag_position(jj, i).
__device__ __forceinline__ int frag_position(int i, int jj) {
    return (4 * (i & 7) + ((jj & 7) >> 1)) * 8 + ((i >> 3) + 2 * (jj >> 3)) * 2 + (jj & 1);
}

// Every thread: element (i, jj) = (tid / 16, tid % 16) of dMqk and dLkk (strictly lower), written
// to its (lane, register, half) of the A fragment of the matrix and of its transpose (mma.cuh's A
// layout) in frag16, in two parts (the bf16 rounding, then the rounding of what it left; the
// remainders' four fragments after the roundings'). Threads 0..15 add d, 16..31 rowsum(dW . Vn).
__device__ __forceinline__ void reduce_partials(unsigned short* frag16, const float* part, const float* dpart,
                                                const float* b1part, float* dvec, float* b1, int tid) {
    const int i = tid >> 4, jj = tid & 15;
    float m = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        m += part[w * TILE_TOKENS * PS + i * PS + jj];
        l += part[(WARPS + w) * TILE_TOKENS * PS + i * PS + jj];
    }
    const float mv = jj < i ? m : 0.f, lv = jj < i ? -l : 0.f;
    const unsigned short mb = f32_to_bf16(mv), lb = f32_to_bf16(lv);
    const unsigned short mr = f32_to_bf16(mv - bf16_to_f32(mb)), lr = f32_to_bf16(lv - bf16_to_f32(lb));   // exact differences
    const int plain = frag_position(i, jj), trans = frag_position(jj, i);
    frag16[0 * 256 + plain] = mb;    // dMqk
    frag16[1 * 256 + trans] = mb;    // dMqk^T
    frag16[2 * 256 + plain] = lb;    // dLkk
    frag16[3 * 256 + trans] = lb;    // dLkk^T
    frag16[4 * 256 + plain] = mr;    // the remainders, in the same order
    frag16[5 * 256 + trans] = mr;
    frag16[6 * 256 + plain] = lr;
    frag16[7 * 256 + trans] = lr;
    if (tid < TILE_TOKENS) {
        float d = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) d += dpart[w * TILE_TOKENS + tid];
        dvec[tid] = d;
    } else if (tid < 2 * TILE_TOKENS) {
        float x = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) x += b1part[w * TILE_TOKENS + tid - TILE_TOKENS];
        b1[tid - TILE_TOKENS] = x;
    }
}

}  // namespace kdb
