// kernel/forward_states/cuda/forward_states_copies.cuh -- the copies of a tile that Kernel S's loads
// (forward_states_loads.cuh) and the forward's (kernel/forward/cuda/forward_loads.cuh) share: a
// producer warp's own g rows and bf16 rows, glast and gbase, and its share of v. Each kernel's loads
// add what only it reads (Kernel S: INV; the forward: q beside k) and beta.
// Included after a kernel's configuration; every name it uses is a parameter or ptx_lab's.
#pragma once
#include "../../shapes.cuh"
#include "cp_async.cuh"

namespace kda_copies {
using namespace ptx_lab;

constexpr int ROW_CHUNKS = HEAD_DIM * 2 / 16;   // 16: a bf16 row of k (or q), 16 bytes a lane

// Tile i's shared copies into st by producer warp pw (ptid = 32 pw + lane of the ProducerThreads): the
// warp's own g rows and bf16 rows, glast and gbase (lane l: columns 4l .. 4l+3 of g, the rows' 16-byte
// chunks: copy_row_chunk(c, ch, valid) copies chunk ch of row c, zero-filled where not valid, c >= L),
// and its share of the tile's v columns vg VW ... (Ends false: no glast and gbase, for a reader that sums
// each token's gate over the tile itself, kernel/shapes.cuh's add_token_gate). Addresses are the tile's
// first (token, value head) row0 plus 32-bit element offsets (row c at c tok, tok = HV HEAD_DIM): the
// per-row parts stay in registers across tiles, so a copy costs a select, one 64-bit add and the LDGSTS.
template <int RowsPerProducer, int VW, int ProducerThreads, bool Ends, class StageT, class CopyRowChunk>
__device__ __forceinline__ void issue_shared(StageT& st, const float* __restrict__ g,
                                             const unsigned short* __restrict__ v, long long row0, u32 tok, int L,
                                             int i, int vg, int pw, int lane, int ptid,
                                             CopyRowChunk&& copy_row_chunk) {
    static_assert(RowsPerProducer * ROW_CHUNKS % 32 == 0 || RowsPerProducer * ROW_CHUNKS < 32, "row copy split");
    constexpr int V_CHUNKS = TILE_TOKENS * VW * 2 / 16;   // 16-byte chunks of the tile's v columns: 32 WARPS
    const float* gt = g + row0 * HEAD_DIM;
    const int c0 = pw * RowsPerProducer;
#pragma unroll
    for (int r = 0; r < RowsPerProducer; ++r) {
        const int c = c0 + r;
        const bool valid = c < L;
        cp_async_cg16_zfill(smem_addr(&st.g[c][4 * lane]), gt + ((valid ? (u32)c * tok : 0u) + 4 * lane),
                            valid ? 16u : 0u);
    }
    constexpr int KC = RowsPerProducer * ROW_CHUNKS;
#pragma unroll
    for (int m = 0; m < (KC + 31) / 32; ++m) {
        const int idx = lane + 32 * m;
        if (KC % 32 == 0 || idx < KC) {
            const int c = c0 + idx / ROW_CHUNKS, ch = idx % ROW_CHUNKS;
            copy_row_chunk(c, ch, c < L);
        }
    }
    if constexpr (Ends) {
        cp_async_cg16(smem_addr(&st.glast[pw][4 * lane]), gt + ((u32)(L - 1) * tok + 4 * lane));
        const bool rebase = i % TILES_PER_CHUNK != 0;   // the token before is in the same 64-chunk
        cp_async_cg16_zfill(smem_addr(&st.gbase[pw][4 * lane]), (rebase ? gt - tok : gt) + 4 * lane,
                            rebase ? 16u : 0u);
    }
    const unsigned short* vt = v + row0 * HEAD_DIM + vg * VW;
#pragma unroll
    for (int m = 0; m < (V_CHUNKS + ProducerThreads - 1) / ProducerThreads; ++m) {
        const int idx = ptid + m * ProducerThreads;
        if (V_CHUNKS % ProducerThreads == 0 || idx < V_CHUNKS) {
            const int c = idx / (VW / 8), ch = idx % (VW / 8);
            const bool valid = c < L;
            cp_async_cg16_zfill(smem_addr(&st.v[c][ch * 8]), vt + ((valid ? (u32)c * tok : 0u) + ch * 8),
                                valid ? 16u : 0u);
        }
    }
}

}  // namespace kda_copies
