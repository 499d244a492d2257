// kernel/token_gradients/cuda/token_gradients_loads.cuh -- Kernel B's arguments and its tile loads:
// what every thread copies of a tile (Copies, fixed for the walk) and the cp.async of one tile's
// inputs into a stage (load_tile).
#pragma once
#include "cp_async.cuh"
#include "token_gradients_layout.cuh"

namespace kdb {

// q, k and their rstd have H heads, everything else HV (FLA's grouped value heads: value head h reads q,
// k and their rstd at head qk_head(h, HV, H); HV = H without them). dq and dk are per value head: with
// HV > H the caller sums each group (kernel.kda_backward).
struct Args {
    const unsigned short* q;      // bf16 [tokens, H, 128]: as the forward used them (KDB_QK_RSTD: before its l2norm)
    const unsigned short* k;
    const unsigned short* v;      // bf16 [tokens, HV, 128]
    const unsigned short* dout;   // do
    const float* g;               // fp32 [tokens, HV, 128]: FLA's 64-chunk-local cumsum of the gate / ln 2, or each
                                  // token's natural-log gate (KDB_TOKEN_GATE)
    const float* beta;            // fp32 [tokens, HV]
    const unsigned short* aqk;    // bf16 [tokens, HV, 64]
    const unsigned short* akk;    // bf16 [tokens, HV, 64]
    const unsigned short* ds;     // bf16 [tiles, HV, 128, 128]: Kernel A's dS after every tile
    const unsigned short* states; // bf16 [chunks, HV, 128, 128]: the state entering every chunk
    void* dq;                     // [tokens, HV, 128]: fp32, or bf16 with dqk_bf16
    void* dk;
    unsigned short* dv;           // bf16 [tokens, HV, 128]
    float* dg;                    // fp32 [tokens, HV, 128]: w.r.t. the per-token natural-log gate
    float* dbeta;                 // fp32 [tokens, HV]
    const float* q_rstd;          // fp32 [tokens, H], or null: 1 / |q| of the forward's l2norm (dq, dk then
    const float* k_rstd;          // come out with respect to the raw q, k), as FLA's l2norm_fwd returns it;
                                  // required by the qk_rstd build (KDB_QK_RSTD), whose q and k are the raw rows
    const long long* cu;          // [N + 1] sequence offsets
    const long long* tile_offs;   // [N + 1] first dS snapshot (tile) of each sequence
    const long long* chunk_offs;  // [N + 1] first state (64-chunk) of each sequence
    const int* chunk_seq;         // [chunks] the sequence of each chunk
    const long long* run_chunk0;  // [runs] the first chunk of each run (a CTA's consecutive chunks of one sequence)
    int run_chunks;               // chunks a run (the last of a sequence may have fewer)
    int HV;                       // value heads: the grid's
    int H;                        // query / key heads
    float scale;
    int dqk_bf16;                 // dq, dk stored as bf16 (rounded once) instead of fp32
};

// What a thread copies of every tile, fixed for the whole walk: its shared-memory offsets and
// its element offsets within a tile's rows (tok0 = 0), computed once so that a tile costs an add
// per copy. Rows past the tile's end are zero-filled from row 0 (a valid address, 0 bytes read).
struct Copies {
    int row16, col16;        // q, k, v, do and dS1: 16-byte piece col16 of row row16 (+ 16 e for dS1)
    int grow, gcol;          // g: 16-byte piece gcol of row grow (+ 8 for the second)
    long long off16, offg;   // element offsets of those pieces in [tokens, HV, 128] from (tok0, h)
    long long qk_off16;      // ... and of q's and k's in [tokens, H, 128] from (tok0, qk head)
    int beta_row;            // threads 32..47: beta of row beta_row
    int blk_row, blk_half;   // threads 48..111: the Aqk (blk_which 0) or Akk (1) block's row, half
    int blk_which;
};

__device__ __forceinline__ Copies copies_of(int tid, long long RS, long long QK_RS) {
    Copies c;
    c.row16 = tid >> 4;
    c.col16 = tid & 15;
    c.grow = tid >> 5;
    c.gcol = tid & 31;
    c.off16 = c.row16 * RS + c.col16 * 8;
    c.qk_off16 = c.row16 * QK_RS + c.col16 * 8;
    c.offg = c.grow * RS + c.gcol * 4;
    c.beta_row = tid - 32;
    const int x = tid - 48;
    c.blk_which = x >> 5;
    c.blk_row = (x & 31) >> 1;
    c.blk_half = x & 1;
    return c;
}

// cp.async the inputs of a tile into stage `st`: `it` is its place in its 64-token chunk (0..3), which
// sets g's base and its column block of Aqk and Akk; with `state_chunk` >= 0, also that chunk's
// entry state S0 (the run's first tile). row0: element offset of (token tok0, head h) in [tokens, HV,
// 128]; RS = HV * 128; qk_row0: of (token tok0, h's query / key head) in q's and k's [tokens, H, 128].
__device__ __forceinline__ void load_tile(const Args& a, const Copies& cp, unsigned char* smem, int st, int it,
                                          long long row0, long long qk_row0, long long RS, int lt, long long snap,
                                          long long state_chunk, int h, int tid) {
    const u32 base = smem_addr(smem) + st * STAGE;
    const long long HV = a.HV;
    {   // q, k, v, do: 16 rows of 256 bytes, one 16-byte copy per thread and tensor
        const bool ok = cp.row16 < lt;
        const long long off = row0 + (ok ? cp.off16 : cp.col16 * 8);
        const long long qk_off = qk_row0 + (ok ? cp.qk_off16 : cp.col16 * 8);
        const u32 dst = cp.row16 * ROW + cp.col16 * 16;
        const u32 n = ok ? 16u : 0u;
        cp_async_cg16_zfill(base + ST_Q + dst, a.q + qk_off, n);
        cp_async_cg16_zfill(base + ST_K + dst, a.k + qk_off, n);
        cp_async_cg16_zfill(base + ST_V + dst, a.v + off, n);
        cp_async_cg16_zfill(base + ST_DO + dst, a.dout + off, n);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {   // g: 16 rows of 512 bytes, rows grow and grow + 8
        const int r = cp.grow + 8 * e;
        const bool ok = r < lt;
        const long long off = row0 + (ok ? cp.offg + 8 * e * RS : cp.gcol * 4);
        cp_async_cg16_zfill(base + ST_G + r * HEAD_DIM * 4 + cp.gcol * 16, a.g + off, ok ? 16u : 0u);
    }
    if (tid < 32) {   // g at the token before the tile: the tile's base, within the same 64-chunk
#if !KDB_TOKEN_GATE   // (each token's own gate needs none)
        const bool ok = it > 0;
        cp_async_cg16_zfill(base + ST_GB + tid * 16, a.g + row0 - (ok ? RS : 0) + tid * 4, ok ? 16u : 0u);
#endif
    } else if (tid < 48) {   // beta, 4 bytes a token (its tokens are HV * 4 bytes apart)
        const int r = cp.beta_row;
        const bool ok = r < lt;
        cp_async_ca_zfill<4>(base + ST_BETA + r * 4, a.beta + row0 / HEAD_DIM + (ok ? r * HV : 0), ok ? 4u : 0u);
    } else if (tid < 112) {   // the diagonal blocks of Aqk and Akk: row r keeps elements 0..r
        const int r = cp.blk_row, half = cp.blk_half;
        const bool ok = r < lt;
        int bytes = 2 * (r + 1) - 16 * half;
        bytes = ok ? (bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes)) : 0;
        const unsigned short* src = (cp.blk_which ? a.akk : a.aqk) + (row0 / HEAD_DIM + (ok ? r * HV : 0)) * CHUNK_TOKENS
                                    + TILE_TOKENS * it + 8 * half;
        cp_async_cg16_zfill(base + (cp.blk_which ? ST_INV : ST_MQK) + r * 32 + half * 16, src,
                            static_cast<u32>(bytes));
    }
#if KDB_QK_RSTD
    else if (tid < 112 + 2 * TILE_TOKENS) {   // q's (threads 112..127) and k's rstd, 4 bytes a token (H * 4 apart)
        const int which = (tid - 112) / TILE_TOKENS, r = (tid - 112) % TILE_TOKENS;
        const bool ok = r < lt;
        const float* src = (which ? a.k_rstd : a.q_rstd) + qk_row0 / HEAD_DIM + (ok ? r * a.H : 0);
        cp_async_ca_zfill<4>(smem_addr(smem) + SM_RSTD + st * RSTD_STAGE + (which * TILE_TOKENS + r) * 4, src,
                             ok ? 4u : 0u);
    }
#endif
    {   // dS1: 128 rows of 256 bytes, rows row16 + 16 e
        const unsigned short* src = a.ds + (snap * HV + h) * (HEAD_DIM * HEAD_DIM) + cp.row16 * HEAD_DIM
                                    + cp.col16 * 8;
        const u32 dst = base + ST_DS + cp.row16 * ROW + cp.col16 * 16;
#pragma unroll
        for (int e = 0; e < 8; ++e) cp_async_cg16(dst + 16 * e * ROW, src + 16 * e * HEAD_DIM);
    }
    if (state_chunk >= 0) {   // S0 at the run's start
        const unsigned short* src = a.states + (state_chunk * HV + h) * (HEAD_DIM * HEAD_DIM) + cp.row16 * HEAD_DIM
                                    + cp.col16 * 8;
        const u32 dst = smem_addr(smem) + SM_S + cp.row16 * ROW + cp.col16 * 16;
#pragma unroll
        for (int e = 0; e < 8; ++e) cp_async_cg16(dst + 16 * e * ROW, src + 16 * e * HEAD_DIM);
    }
    cp_async_commit();
}

}  // namespace kdb
