// kernel/forward_states/cuda/forward_states_r1.cuh -- Kernel S's R1: a producer warp rebuilds its
// rows of a tile's Kd = k 2^gc and Kr = k 2^(gT - gc) in fp32, rounded once to bf16, in the stage.
// Included by forward_states.cu after its configuration (namespace fs: the knobs and the shape
// that follows from them).
#pragma once
#include "fragments.cuh"
#include "forward_states_gate.cuh"
#include "forward_states_layout.cuh"

namespace fs {

// R1 of producer warp pw: Kd, Kr of its rows (lane l: columns 4l .. 4l+3), gamma from warp 0.
// All rows are read before any is computed (independent shared loads in flight together).
__device__ __forceinline__ void rebuild(Stage& st, int L, int pw, int lane) {
    const int col = 4 * lane, c0 = pw * ROWS_PER_PRODUCER;
    float gT[4];
    const float4 base = kda_gate::ends(st, pw, col, gT);   // and gamma, from warp 0
    float4 row[ROWS_PER_PRODUCER];
    uint2 kb[ROWS_PER_PRODUCER];
#pragma unroll
    for (int r = 0; r < ROWS_PER_PRODUCER; ++r) {
        row[r] = *reinterpret_cast<const float4*>(&st.g[c0 + r][col]);
        kb[r] = *reinterpret_cast<const uint2*>(&st.k[c0 + r][col]);
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_PRODUCER; ++r) {
        const int c = c0 + r;
        const bool real = c < L;
        float gc[4];
        kda_gate::chunk_local(gc, row[r], base, gT, real);
        const float kf[4] = {bf16_lo(kb[r].x), bf16_hi(kb[r].x), bf16_lo(kb[r].y), bf16_hi(kb[r].y)};
        float kd[4], kr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            kd[e] = kf[e] * exp2f(gc[e]);
            kr[e] = kf[e] * exp2f(gT[e] - gc[e]);
        }
        *reinterpret_cast<uint2*>(&st.kd[c][col]) = make_uint2(pack_bf16x2(kd[0], kd[1]), pack_bf16x2(kd[2], kd[3]));
        *reinterpret_cast<uint2*>(&st.kr[c][col]) = make_uint2(pack_bf16x2(kr[0], kr[1]), pack_bf16x2(kr[2], kr[3]));
    }
}

}  // namespace fs
