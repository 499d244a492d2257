// kernel/token_gradients/cuda/token_gradients_layout.cuh -- Kernel B's fixed shape and its shared
// memory: two stages of tile inputs, the on-chip operands and the per-warp partial sums, as byte
// offsets (tests/kernel/token_gradients_model.py reads every constexpr line here and in the shapes
// header).
#pragma once

#ifndef KDB_TOKEN_GATE
#error "KDB_TOKEN_GATE must be defined: 0 (g: FLA's 64-chunk-local cumsum of the log2 gate) or 1 (each token's own)"
#endif
#include "../../shapes.cuh"   // HEAD_DIM (K = V), TILE_TOKENS, CHUNK_TOKENS (a CTA's tokens), TILES_PER_CHUNK,
                              // SPAN_LIMIT (R1's choice of the pairwise G14-G17)
#include "common.cuh"

namespace kdb {
using namespace ptx_lab;

constexpr int WARPS = 8;
constexpr int THREADS = 32 * WARPS;
constexpr int ROW = 2 * (HEAD_DIM + 8);   // bytes per padded bf16 row of 128: 272 = 68 words, so the
                                          // 8 rows of an ldmatrix 8x8 matrix hit 8 different bank quads
// One stage of tile inputs (bytes)
constexpr int ST_Q = 0;
constexpr int ST_K = ST_Q + TILE_TOKENS * ROW;
constexpr int ST_V = ST_K + TILE_TOKENS * ROW;
constexpr int ST_DO = ST_V + TILE_TOKENS * ROW;
constexpr int ST_G = ST_DO + TILE_TOKENS * ROW;                   // fp32 [16][128]
constexpr int ST_GB = ST_G + TILE_TOKENS * HEAD_DIM * 4;          // fp32 [128]: g at the token before the tile
constexpr int ST_BETA = ST_GB + HEAD_DIM * 4;                     // fp32 [16]
constexpr int ST_MQK = ST_BETA + TILE_TOKENS * 4;                 // bf16 [16][16] (32-byte rows)
constexpr int ST_INV = ST_MQK + TILE_TOKENS * TILE_TOKENS * 2;
constexpr int ST_DS = ST_INV + TILE_TOKENS * TILE_TOKENS * 2;     // bf16 [128][136]: dS1
constexpr int STAGE = ST_DS + HEAD_DIM * ROW;
// The rest (bytes from the end of the two stages)
constexpr int SM_S = 2 * STAGE;                     // bf16 [128 k][136]: S0, [K][V]
constexpr int SM_KD = SM_S + HEAD_DIM * ROW;        // bf16 [16][136] each
constexpr int SM_KR = SM_KD + TILE_TOKENS * ROW;
constexpr int SM_QE = SM_KR + TILE_TOKENS * ROW;
constexpr int SM_BKE = SM_QE + TILE_TOKENS * ROW;
constexpr int SM_U = SM_BKE + TILE_TOKENS * ROW;
constexpr int SM_DW = SM_U + TILE_TOKENS * ROW;
constexpr int SM_DV = SM_DW + TILE_TOKENS * ROW;
constexpr int SM_GT = SM_DV + TILE_TOKENS * ROW;    // fp32 [128]: gT
constexpr int SM_GAMMA = SM_GT + HEAD_DIM * 4;      // fp32 [128]: 2^gT
constexpr int GC_ROW = HEAD_DIM + 8;                // fp32 words per row of gc: a float2 per lane, 16 lanes
                                                    // over 4 rows, lands in 32 different banks
constexpr int SM_GC = SM_GAMMA + HEAD_DIM * 4;      // fp32 [16][136]: the rebased gate gc (rows >= L: gT)
constexpr int PS = 24;                              // fp32 words per row of the 16 x 16 per-warp sums (float2
                                                    // stores by (row g, column 2t) lanes without conflicts)
constexpr int SM_PART = SM_GC + TILE_TOKENS * GC_ROW * 4;   // fp32 [2][8][16][24]: per-warp dMqk, dLkk; later
                                                            // per-warp from_start / from_end [8][2][16][24]
constexpr int SM_FRAG = SM_PART + 2 * WARPS * TILE_TOKENS * PS * 4;   // u32 [2][4][32 lanes][4]: dMqk, dMqk^T,
                                                                      // dLkk, dLkk^T as bf16 A fragments in lane
                                                                      // order: their bf16 roundings, then what
                                                                      // those left
constexpr int SM_DPART = SM_FRAG + 2 * 4 * 32 * 4 * 4;     // fp32 [8][16] per-warp d
constexpr int SM_URES = SM_FRAG;   // bf16 [8 warps][16][16] (32-byte rows): what U's bf16 rounding left,
                                   // for G9/G10; free then: the reduce step writes the fragments after
constexpr int SM_B1PART = SM_DPART + WARPS * TILE_TOKENS * 4;    // fp32 [8][16] per-warp rowsum(dW . Vn)
constexpr int SM_B2PART = SM_B1PART + WARPS * TILE_TOKENS * 4;   // fp32 [8][16] per-warp rowsum(Ke . X)
constexpr int SM_DVEC = SM_B2PART + WARPS * TILE_TOKENS * 4;     // fp32 [16] d
constexpr int SM_B1 = SM_DVEC + TILE_TOKENS * 4;                 // fp32 [16] rowsum(dW . Vn)
constexpr int SM_L2PART = SM_B1 + TILE_TOKENS * 4;              // fp32 [2][8][16] per-warp y . dy of q, k rows
// The qk_rstd build's (KDB_QK_RSTD) stage of the tile's rstd rows, fp32 [2 stages][q, k][16], past the rest: the
// other builds' offsets and shared memory stay as they are
constexpr int RSTD_STAGE = 2 * TILE_TOKENS * 4;
constexpr int SM_RSTD = SM_L2PART + 2 * WARPS * TILE_TOKENS * 4;
constexpr int SMEM_BYTES = SM_RSTD + 2 * RSTD_STAGE * KDB_QK_RSTD;
static_assert(WARPS * TILE_TOKENS * TILE_TOKENS * 2 <= SM_DPART - SM_FRAG,
              "the U remainders must fit in the fragment area");
static_assert(SMEM_BYTES <= 232448, "more shared memory than an H200 SM lends one CTA");

static_assert(STAGE % 16 == 0 && SM_KD % 16 == 0 && SM_GC % 16 == 0 && SM_PART % 16 == 0 && SM_FRAG % 16 == 0,
              "16-byte alignment");

}  // namespace kdb
