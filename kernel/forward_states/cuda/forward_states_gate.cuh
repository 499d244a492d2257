// kernel/forward_states/cuda/forward_states_gate.cuh -- the tile's gate as R1 reads it, shared by Kernel
// S's R1 (forward_states_r1.cuh) and the forward's (kernel/forward/cuda/forward_r1.cuh): a producer
// warp's gT and gamma, and a row's chunk-local gc, for its lane's 4 columns; or the same from each
// token's own gate (token_sums: the forward's token-gate build).
// Included after a kernel's configuration; every name it uses is a parameter or ptx_lab's.
#pragma once

namespace kda_gate {

// gamma = 2^gT at columns col .. col + 3 (producer warp 0 writes it)
template <class StageT>
__device__ __forceinline__ void write_gamma(StageT& st, int col, const float (&gT)[4]) {
    *reinterpret_cast<float4*>(&st.gamma[col]) = make_float4(exp2f(gT[0]), exp2f(gT[1]), exp2f(gT[2]), exp2f(gT[3]));
}

// Producer warp pw's gate ends at columns col .. col + 3: base (g at the row before the tile, zeros at
// a 64-chunk's start) and gT = g at the tile's last real row - base; warp 0 writes gamma = 2^gT.
template <class StageT>
__device__ __forceinline__ float4 ends(StageT& st, int pw, int col, float (&gT)[4]) {
    const float4 base = *reinterpret_cast<const float4*>(&st.gbase[pw][col]);
    const float4 last = *reinterpret_cast<const float4*>(&st.glast[pw][col]);
    gT[0] = last.x - base.x;
    gT[1] = last.y - base.y;
    gT[2] = last.z - base.z;
    gT[3] = last.w - base.w;
    if (pw == 0) write_gamma(st, col, gT);
    return base;
}

// A row's chunk-local gate gc = g - base from its g (row); a row past the tile's L (not real) takes gT.
__device__ __forceinline__ void chunk_local(float (&gc)[4], float4 row, float4 base, const float (&gT)[4], bool real) {
    gc[0] = real ? row.x - base.x : gT[0];
    gc[1] = real ? row.y - base.y : gT[1];
    gc[2] = real ? row.z - base.z : gT[2];
    gc[3] = real ? row.w - base.w : gT[3];
}

// From each token's natural-log gate in st.g (every row of the tile, all producer warps' copies in): gT
// and gc of producer warp pw's Rows rows, summed by each lane over the tile's rows in order from the
// first (kernel/shapes.cuh's add_token_gate and tile_rows_in_order); warp 0 writes gamma = 2^gT. Rows past
// the tile's L were zero-filled and add nothing: they and gT end at the last real row's sum, as
// chunk_local sets them.
template <int Rows, class StageT>
__device__ __forceinline__ void token_sums(StageT& st, int pw, int col, float (&gT)[4], float (&gc)[Rows][4]) {
    const int c0 = pw * Rows;
    float run[4] = {0.f, 0.f, 0.f, 0.f};
    auto add = [&](int c) { add_token_gates(run, *reinterpret_cast<const float4*>(&st.g[c][col])); };
    tile_rows_in_order<Rows>(c0, add, [&](int r) {
        add(c0 + r);
#pragma unroll
        for (int e = 0; e < 4; ++e) gc[r][e] = run[e];
    });
#pragma unroll
    for (int e = 0; e < 4; ++e) gT[e] = run[e];
    if (pw == 0) write_gamma(st, col, gT);
}

}  // namespace kda_gate
