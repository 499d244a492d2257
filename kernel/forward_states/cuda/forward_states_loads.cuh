// kernel/forward_states/cuda/forward_states_loads.cuh -- Kernel S's tile loads: a producer warp's
// cp.async copies of one tile into a ring stage.
// Included by forward_states.cu after its configuration (namespace fs: the knobs and the shape
// that follows from them).
#pragma once
#include "cp_async.cuh"
#include "forward_states_copies.cuh"
#include "forward_states_layout.cuh"

namespace fs {

// Tile i's copies into st by producer warp pw (ptid = 32 pw + lane): the copies it shares with the
// forward (forward_states_copies.cuh: its own g and k rows, glast, gbase and its share of v), and INV
// and beta (read by the consumers). k is read at its head kh of H (row stride H HEAD_DIM), everything
// else at value head h of HV.
__device__ __forceinline__ void issue_tile(Stage& st, const u16* __restrict__ k, const u16* __restrict__ v,
                                           const float* __restrict__ g, const float* __restrict__ beta,
                                           const u16* __restrict__ akk, long long tok0, int L, int i,
                                           int HV, int H, int h, int kh, int vg, int pw, int lane, int ptid) {
    const long long row0 = tok0 * HV + h;                // (token, head) row of the tile's first token
    const u32 tok = (u32)HV * HEAD_DIM;                  // elements between tokens of v and g
    const u32 ktok = (u32)H * HEAD_DIM;                  // ... of k
    const u16* kt = k + (tok0 * H + kh) * HEAD_DIM;
    kda_copies::issue_shared<ROWS_PER_PRODUCER, VW, PRODUCER_THREADS, true>(
        st, g, v, row0, tok, L, i, vg, pw, lane, ptid, [&](int c, int ch, bool valid) {
            cp_async_cg16_zfill(smem_addr(&st.k[c][ch * 8]), kt + ((valid ? (u32)c * ktok : 0u) + ch * 8),
                                valid ? 16u : 0u);
        });
    // INV and beta from the last producer warp (warp 0 also copies v's first chunks)
    const int tail = ptid - (PRODUCER_THREADS - 32);
    if (tail >= 0) {
        // row c keeps its elements 0..c (2 (c + 1 - 8 ch) bytes of this chunk, clamped to 0..16);
        // the zero-fill, not a multiply, clears what lies above the diagonal
        static_assert(INV_CHUNKS == 32, "one INV chunk a lane");
        const int c = tail / 2, ch = tail % 2;
        const bool valid = c < L;
        const int keep = min(max(2 * (c + 1 - 8 * ch), 0), 16);
        const u16* at = akk + row0 * CHUNK_TOKENS + (i % TILES_PER_CHUNK) * TILE_TOKENS;   // Akk's rows: a chunk wide
        cp_async_cg16_zfill(smem_addr(&st.inv[c][ch * 8]), at + ((valid ? (u32)c * HV * CHUNK_TOKENS : 0u) + ch * 8),
                            valid ? (u32)keep : 0u);
        if (tail < TILE_TOKENS) {
            const bool bvalid = tail < L;
            cp_async_ca_zfill<4>(smem_addr(&st.beta[tail]), beta + row0 + (bvalid ? (u32)tail * HV : 0u),
                                 bvalid ? 4u : 0u);
        }
    }
}

}  // namespace fs
