// kernel/ds_scan/cuda/loads.cuh -- the producers' tile loads: cp.async rows (LOADS 1) or
// tensor copies on a per-stage mbarrier (LOADS 2), into one ring stage.
#pragma once
#include "cp_async.cuh"
#include "work.cuh"

namespace kda {

// ptid renumbered so that warp w's threads come first (copies of fewer than 33 chunks)
__device__ __forceinline__ int from_warp(int ptid, int w) {
    return w == 0 ? ptid : (ptid + PRODUCER_THREADS - 32 * w) % PRODUCER_THREADS;   // (ptid >= 0: not provable)
}

// cp.async rows [row0, row0 + ROWS) of one tensor's tile, `ROW_BYTES` each
// (16-byte chunks), from global rows `src_row_bytes` apart (`src` = the tile's
// first row) into shared rows `SMEM_ROW_BYTES` apart at `dst`, spread over
// `THREADS` threads: chunk m of thread `tid` is chunk tid + m * THREADS of the
// block, the same row and column every tile, so the compiler keeps the offsets in
// registers and a copy costs a handful of instructions (the generic loop's 64-bit
// index math was a large share of the producers' instructions: log 5). Rows at or past `L` are zero-filled (src-size 0:
// global memory is not read; the source address falls back to the tile's first
// row, which always exists, so it stays a valid operand).
// LOWER (16 bf16 a row: FLA's Aqk / Akk blocks): row c keeps its elements 0..c and the copy
// zero-fills the rest (src-size 2 (c + 1 - 8 ch), clamped to 0..16: experiment cp_async shows
// every src-size 0..16 lands its bytes and zeros the rest), so what FLA left above the
// diagonal (inf, NaN) never reaches shared memory.
template <int ROW_BYTES, int SMEM_ROW_BYTES, int ROWS, int THREADS_, bool LOWER = false>
__device__ __forceinline__ void copy_rows(u32 dst, const char* src, u32 src_row_bytes, int L, int tid, int row0) {
    static_assert(!LOWER || ROW_BYTES == 32, "LOWER copies 16 x 16 bf16 blocks");
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll
    for (int m = 0; m < (TOTAL + THREADS_ - 1) / THREADS_; ++m) {
        const int idx = tid + m * THREADS_;
        if (TOTAL % THREADS_ == 0 || idx < TOTAL) {
            const int c = row0 + idx / CHUNKS, ch = idx % CHUNKS;
            const bool valid = c < L;
            const u32 off = valid ? c * src_row_bytes + ch * 16 : 0u;
            const int keep = LOWER ? min(max(2 * (c + 1 - 8 * ch), 0), 16) : 16;
            cp_async_cg16_zfill(dst + c * SMEM_ROW_BYTES + ch * 16, src + off, valid ? (u32)keep : 0u);
        }
    }
}

// beta of a tile's tokens: one 4-byte cp.async per token from the first TILE_TOKENS producer
// threads (a 16-byte .cg copy, or a tensor-copy box row, would be wider than a token's
// beta); tokens past L are zero-filled.
__device__ __forceinline__ void copy_beta(Stage& st, const Params& p, long long tok0, int L, int h, int ptid) {
    if (ptid < TILE_TOKENS) {
        const bool valid = ptid < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[ptid]),
                             p.beta + (tok0 + (valid ? ptid : 0)) * p.HV + h, valid ? 4u : 0u);
    }
}

// A tile's loads. Each producer warp copies the q, k and gc rows of the tokens it
// rebuilds in R1, plus its own copy of gT (gc of the last real token), so R1
// waits only for its own warp's copies (cp.async.wait_group + __syncwarp) and the
// producer warps never wait for each other. (A producers-only barrier here made
// compute-sanitizer racecheck report every FULL hand-off as a hazard: the
// "ring2-producer-bar" probe in kernel.racecheck reproduces that report on a
// race-free three-warp ring.) do, Mqk, INV and beta, read only by the consumers,
// are spread over all producer threads; each waits for its own copies before it
// arrives on FULL. GT_SHARED: own_gt false for tiles whose gT is read from the owner
// warp's gc rows (published by an EMPTY barrier all producer warps pass, not a
// producers-only one).
// FLA_INPUTS: tile n of its sequence (FLA's 64-token chunks restart at every sequence start) reads
// the diagonal block at column 16 (n mod 4) of the 64-wide Aqk / Akk rows, lower triangle only,
// and this warp's copy of g at the token before the tile into gbase (zeros at a chunk's start; not with
// TOKEN_GATE, whose R1 sums each token's gate over the tile, nor gT: the caller passes own_gt false).
// do and Mqk rows at or past do_rows are zero-filled (L, or 0 for a SUMMARY build's M: Mqk only
// ever multiplies do, so neither is read from global memory there). q and k are read at head qh, rows
// of their own H heads apart; everything else at head h, rows of HV heads apart.
__device__ __forceinline__ void issue_tile_loads(Stage& st, const Params& p, long long tok0, int L, int do_rows,
                                                 int h, int qh, int vs, int pw, int lane, int ptid, bool own_gt,
                                                 int n = 0, u32 gbase = 0u) {
    constexpr int R = TOKENS_PER_PRODUCER;
    const u32 row_elems = (u32)p.HV * HEAD_DIM;      // elements between consecutive tokens
    const u32 qk_row_elems = (u32)p.H * HEAD_DIM;    // ... of q and k
    const long long first = (tok0 * p.HV + h) * HEAD_DIM;
    const long long qk_first = (tok0 * p.H + qh) * HEAD_DIM;
    const char* q = reinterpret_cast<const char*>(p.q + qk_first);
    const char* k = reinterpret_cast<const char*>(p.k + qk_first);
    const char* gc = reinterpret_cast<const char*>(p.gc + first);
    const char* dO = reinterpret_cast<const char*>(p.dO + first + vs * DV);
    copy_rows<HEAD_DIM * 2, HEAD_DIM * 2, R, 32>(smem_addr(st.q), q, qk_row_elems * 2, L, lane, pw * R);
    copy_rows<HEAD_DIM * 2, HEAD_DIM * 2, R, 32>(smem_addr(st.k), k, qk_row_elems * 2, L, lane, pw * R);
    copy_rows<HEAD_DIM * 4, HEAD_DIM * 4, R, 32>(smem_addr(st.gc), gc, row_elems * 4, L, lane, pw * R);
    if (own_gt)
        copy_rows<HEAD_DIM * 4, HEAD_DIM * 4, 1, 32>(smem_addr(st.gT[pw]), gc + (L - 1) * (row_elems * 4), 0u, 1, lane, 0);
    copy_rows<DV * 2, DO_STRIDE * 2, TILE_TOKENS, PRODUCER_THREADS>(smem_addr(st.dO), dO, row_elems * 2, do_rows,
                                                                    ptid, 0);
    const int block_col = FLA_INPUTS ? (n % TILES_PER_CHUNK) * TILE_TOKENS : 0;
    const long long sfirst = (tok0 * p.HV + h) * SMALL_COLS + block_col;
    const u32 srow_bytes = (u32)p.HV * SMALL_COLS * 2;
    copy_rows<TILE_TOKENS * 2, SMALL_STRIDE * 2, TILE_TOKENS, PRODUCER_THREADS, FLA_INPUTS>(
        smem_addr(st.mqk), reinterpret_cast<const char*>(p.mqk + sfirst), srow_bytes, do_rows, from_warp(ptid, MQK_WARP), 0);
    copy_rows<TILE_TOKENS * 2, SMALL_STRIDE * 2, TILE_TOKENS, PRODUCER_THREADS, FLA_INPUTS>(
        smem_addr(st.inv), reinterpret_cast<const char*>(p.inv + sfirst), srow_bytes, L, from_warp(ptid, INV_WARP), 0);
    if constexpr (FLA_INPUTS && !TOKEN_GATE) {
        const bool chunk_start = n % TILES_PER_CHUNK == 0;
        copy_rows<HEAD_DIM * 4, HEAD_DIM * 4, 1, 32>(gbase, chunk_start ? gc : gc - row_elems * 4, 0u,
                                                     chunk_start ? 0 : 1, lane, 0);
    }
    copy_beta(st, p, tok0, L, h, from_warp(ptid, BETA_WARP));
}

// LOADS 2: a tile's loads as tensor copies. One thread arms the stage's mbarrier
// with the tile's bytes and issues one copy per tensor and box (8 at vsplit 1, 7 at
// the others, instead of dozens of warp-wide LDGSTS: the SM's global-memory queue was the
// producers' and the snapshot stores' common stall, log 12). Measured slower all the same,
// for reasons not yet found (log 15), so config.Config keeps cp.async. A box starting at a partial
// tile's first token also reads the rows after the sequence's end (the next
// sequence's tokens, or zeros past the tensor): R1 masks q/k/gc rows >= L, and
// zero_tail_rows clears those of do/Mqk/INV. beta (a 4-byte row, under the 16-byte
// box minimum) still comes by cp.async, zero-filled. q and k at column qh * HEAD_DIM of their maps'
// H heads, the others at h * HEAD_DIM of HV.
__device__ __forceinline__ void issue_tile_tma(Stage& st, const Params& p, u32 mbar, long long tok0, int h, int qh,
                                               int vs) {
    const TmaMaps& m = *p.maps;
    const int row = (int)tok0;
    fence_proxy_async_shared();   // this stage's earlier generic writes (tail zeroing) before the async proxy's
    mbarrier_arrive_expect_tx(mbar, TILE_TX_BYTES);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.q), &m.q, qh * HEAD_DIM, row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.k), &m.k, qh * HEAD_DIM, row, mbar);
#pragma unroll
    for (int b = 0; b < GC_BOXES; ++b)
        cp_async_bulk_tensor_2d_g2s(smem_addr(st.gc + b * TILE_TOKENS * GC_BOX_COLS), &m.gc,
                                    h * HEAD_DIM + b * GC_BOX_COLS, row, mbar);
#pragma unroll
    for (int b = 0; b < DO_BOXES; ++b)
        cp_async_bulk_tensor_2d_g2s(smem_addr(st.dO + b * TILE_TOKENS * DO_BOX_COLS), &m.dO,
                                    h * HEAD_DIM + vs * DV + b * DO_BOX_COLS, row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.mqk), &m.mqk, h * TILE_TOKENS, row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.inv), &m.inv, h * TILE_TOKENS, row, mbar);
}

// Zeros rows [L, TILE_TOKENS) of do, Mqk and INV after a partial tile's tensor copies landed
// (one warp). A swizzle permutes the 16-byte chunks within a box row only, so whole
// rows are cleared without it.
__device__ __forceinline__ void zero_tail_rows(Stage& st, int L, int lane) {
    constexpr int DO_CH = DO_SWZ / 16, SMALL_CH = SMALL_SWZ / 16;   // 16-byte chunks per box row
    const int rows = TILE_TOKENS - L;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    for (int idx = lane; idx < DO_BOXES * rows * DO_CH; idx += 32) {
        const int b = idx / (rows * DO_CH), r = L + (idx / DO_CH) % rows, ch = idx % DO_CH;
        reinterpret_cast<uint4*>(st.dO)[(b * TILE_TOKENS + r) * DO_CH + ch] = z;
    }
    for (int idx = lane; idx < rows * SMALL_CH; idx += 32) {
        const int r = L + idx / SMALL_CH, ch = idx % SMALL_CH;
        reinterpret_cast<uint4*>(st.mqk)[r * SMALL_CH + ch] = z;
        reinterpret_cast<uint4*>(st.inv)[r * SMALL_CH + ch] = z;
    }
}

}  // namespace kda
