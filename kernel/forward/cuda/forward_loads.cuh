// kernel/forward/cuda/forward_loads.cuh -- the forward's tile loads: a producer warp's cp.async copies
// of one tile into a ring stage. Kernel S's copies (kernel/forward_states/cuda/forward_states_loads.cuh)
// with q beside k and no Akk: the forward builds INV itself.
// Included by forward.cu after its configuration (namespace kf: the knobs and the shape that
// follows from them).
#pragma once
#include "cp_async.cuh"
#include "forward_layout.cuh"
#include "../../forward_states/cuda/forward_states_copies.cuh"   // Kernel S's shared copies

namespace kf {

// Tile i's copies into st by producer warp pw (ptid = 32 pw + lane): Kernel S's shared copies
// (forward_states_copies.cuh: its own g rows and, chunk by chunk, q's beside k's, glast, gbase and its
// share of v), and beta; in the qk_rstd build its rows' rstd of q and k into rq, rk (a row a lane). q, k
// and their rstd are read at their head kh of H (row stride H HEAD_DIM, H), everything else at value head h
// of HV.
__device__ __forceinline__ void issue_tile(Stage& st, const u16* __restrict__ q, const u16* __restrict__ k,
                                           const u16* __restrict__ v, const float* __restrict__ g,
                                           const float* __restrict__ beta, const float* __restrict__ q_rstd,
                                           const float* __restrict__ k_rstd, float* rq, float* rk, long long tok0,
                                           int L, int i, int HV, int H, int h, int kh, int vg, int pw, int lane,
                                           int ptid) {
    const long long row0 = tok0 * HV + h;                // (token, head) row of the tile's first token
    const u32 tok = (u32)HV * HEAD_DIM;                  // elements between tokens of v and g
    const u32 ktok = (u32)H * HEAD_DIM;                  // ... of q and k
    const long long qk0 = (tok0 * H + kh) * HEAD_DIM;
    const u16* qt = q + qk0;
    const u16* kt = k + qk0;
    kda_copies::issue_shared<ROWS_PER_PRODUCER, VW, PRODUCER_THREADS, !TOKEN_GATE>(
        st, g, v, row0, tok, L, i, vg, pw, lane, ptid, [&](int c, int ch, bool valid) {
            const u32 off = (valid ? (u32)c * ktok : 0u) + ch * 8;
            cp_async_cg16_zfill(smem_addr(&st.k[c][ch * 8]), kt + off, valid ? 16u : 0u);
            cp_async_cg16_zfill(smem_addr(&st.q[c][ch * 8]), qt + off, valid ? 16u : 0u);
        });
    // beta from the last producer warp, which also solves for INV when there is more than one producer
    // warp and no product warps
    const int tail = ptid - (PRODUCER_THREADS - 32);
    if (tail >= 0 && tail < TILE_TOKENS) {
        const bool bvalid = tail < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[tail]), beta + row0 + (bvalid ? (u32)tail * HV : 0u),
                             bvalid ? 4u : 0u);
    }
    if constexpr (QK_RSTD) {
        // each producer warp copies the rstd of the rows its R1 scales: copies_landed() opens a warp's own
        // copies to it, and R1 has no barrier between the producer warps (the plain-gate builds)
        if (lane < 2 * ROWS_PER_PRODUCER) {
            const bool of_k = lane >= ROWS_PER_PRODUCER;
            const int c = pw * ROWS_PER_PRODUCER + lane % ROWS_PER_PRODUCER;
            const bool valid = c < L;
            const float* src = (of_k ? k_rstd : q_rstd) + tok0 * H + kh + (valid ? (u32)c * H : 0u);
            cp_async_ca_zfill<4>(smem_addr(of_k ? &rk[c] : &rq[c]), src, valid ? 4u : 0u);
        }
    }
}

}  // namespace kf
