// kernel/forward/cuda/forward_loads.cuh -- the forward's tile loads: a producer warp's cp.async copies
// of one tile into a ring stage. Kernel S's copies (kernel/forward_states/cuda/forward_states_loads.cuh)
// with q beside k and no Akk: the forward builds INV itself.
// Included by forward.cu after its configuration (namespace kf: the knobs and the shape that
// follows from them).
#pragma once
#include "cp_async.cuh"
#include "forward_layout.cuh"

namespace kf {

// Tile i's copies into st by producer warp pw (ptid = 32 pw + lane): the warp's own g, q and k rows,
// glast and gbase (lane l: columns 4l .. 4l+3 of g, the row's 16-byte chunks of q and k), and its
// share of v and beta. q and k are read at their head kh of H (row stride H HEAD_DIM), everything
// else at value head h of HV.
__device__ __forceinline__ void issue_tile(Stage& st, const u16* __restrict__ q, const u16* __restrict__ k,
                                           const u16* __restrict__ v, const float* __restrict__ g,
                                           const float* __restrict__ beta, long long tok0, int L, int i,
                                           int HV, int H, int h, int kh, int vg, int pw, int lane, int ptid) {
    const long long row0 = tok0 * HV + h;                // (token, head) row of the tile's first token
    const u32 tok = (u32)HV * HEAD_DIM;                  // elements between tokens of v and g
    const u32 ktok = (u32)H * HEAD_DIM;                  // ... of q and k
    const float* gt = g + row0 * HEAD_DIM;
    const long long qk0 = (tok0 * H + kh) * HEAD_DIM;
    const u16* qt = q + qk0;
    const u16* kt = k + qk0;
    const int c0 = pw * ROWS_PER_PRODUCER;
#pragma unroll
    for (int r = 0; r < ROWS_PER_PRODUCER; ++r) {
        const int c = c0 + r;
        const bool valid = c < L;
        cp_async_cg16_zfill(smem_addr(&st.g[c][4 * lane]), gt + ((valid ? (u32)c * tok : 0u) + 4 * lane),
                            valid ? 16u : 0u);
    }
    constexpr int KC = ROWS_PER_PRODUCER * K_ROW_CHUNKS;
#pragma unroll
    for (int m = 0; m < (KC + 31) / 32; ++m) {
        const int idx = lane + 32 * m;
        if (KC % 32 == 0 || idx < KC) {
            const int c = c0 + idx / K_ROW_CHUNKS, ch = idx % K_ROW_CHUNKS;
            const bool valid = c < L;
            const u32 off = (valid ? (u32)c * ktok : 0u) + ch * 8;
            cp_async_cg16_zfill(smem_addr(&st.k[c][ch * 8]), kt + off, valid ? 16u : 0u);
            cp_async_cg16_zfill(smem_addr(&st.q[c][ch * 8]), qt + off, valid ? 16u : 0u);
        }
    }
    cp_async_cg16(smem_addr(&st.glast[pw][4 * lane]), gt + ((u32)(L - 1) * tok + 4 * lane));
    {
        const bool rebase = i % TILES_PER_CHUNK != 0;   // the token before is in the same 64-chunk
        cp_async_cg16_zfill(smem_addr(&st.gbase[pw][4 * lane]), (rebase ? gt - tok : gt) + 4 * lane,
                            rebase ? 16u : 0u);
    }
    const u16* vt = v + row0 * HEAD_DIM + vg * VW;
#pragma unroll
    for (int m = 0; m < (V_CHUNKS + PRODUCER_THREADS - 1) / PRODUCER_THREADS; ++m) {
        const int idx = ptid + m * PRODUCER_THREADS;
        if (V_CHUNKS % PRODUCER_THREADS == 0 || idx < V_CHUNKS) {
            const int c = idx / (VW / 8), ch = idx % (VW / 8);
            const bool valid = c < L;
            cp_async_cg16_zfill(smem_addr(&st.v[c][ch * 8]), vt + ((valid ? (u32)c * tok : 0u) + ch * 8),
                                valid ? 16u : 0u);
        }
    }
    // beta from the last producer warp, which also solves for INV when there is more than one
    const int tail = ptid - (PRODUCER_THREADS - 32);
    if (tail >= 0 && tail < TILE_TOKENS) {
        const bool bvalid = tail < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[tail]), beta + row0 + (bvalid ? (u32)tail * HV : 0u),
                             bvalid ? 4u : 0u);
    }
}

}  // namespace kf
