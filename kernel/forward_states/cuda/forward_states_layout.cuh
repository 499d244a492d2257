// kernel/forward_states/cuda/forward_states_layout.cuh -- Kernel S's shared memory: the ring's
// stages (a tile's inputs as copied and the operands R1 builds), the consumers' snapshot staging
// tiles, and the ring's named barriers.
// Included by forward_states.cu after its configuration (namespace fs: the knobs and the shape
// that follows from them).
#pragma once
#include "ring.cuh"

namespace fs {

// Row strides (elements) of the tiles ldmatrix / stmatrix address: 8 rows of 16 bytes must
// fall on 8 different 4-bank groups.
constexpr int OP_STRIDE = HEAD_DIM + 8;      // Kd, Kr rows: 272 B, 68 words = 4 mod 32
constexpr int INV_STRIDE = TILE_TOKENS + 8;   // INV rows: 48 B, 12 words a row apart
constexpr int SNAP_STRIDE = 16 + 8;     // staging rows (16 v of one k): 48 B likewise

// 16-byte chunks of INV, which the last producer warp copies (v's: forward_states_copies.cuh)
constexpr int INV_CHUNKS = TILE_TOKENS * TILE_TOKENS * 2 / 16;   // 32

// One tile: its inputs as copied (rows past the tile's L are zero-filled) and what R1 builds.
struct Stage {
    float g[TILE_TOKENS][HEAD_DIM];     // FLA's chunk-local g (log2), fp32; producer warp pw's rows only it reads
    float glast[PRODUCERS][HEAD_DIM];   // per producer warp: g at the tile's last real row
    float gbase[PRODUCERS][HEAD_DIM];   // per producer warp: g at the row before the tile; zeros at a 64-chunk's start
    u16 k[TILE_TOKENS][HEAD_DIM];       // bf16
    u16 kd[TILE_TOKENS][OP_STRIDE];     // R1: bf16 k 2^gc
    u16 kr[TILE_TOKENS][OP_STRIDE];     // R1: bf16 k 2^(gT-gc)
    float gamma[HEAD_DIM];              // R1: 2^gT
    u16 v[TILE_TOKENS][VW];             // bf16, this CTA's v columns
    u16 inv[TILE_TOKENS][INV_STRIDE];   // bf16, Akk's diagonal block, zero above the diagonal
    float beta[TILE_TOKENS];
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");

struct Shared {
    Stage stage[NSTAGE];
    u16 snap[WARPS][HEAD_DIM][SNAP_STRIDE];   // per consumer warp: its 16 v columns of S [K][V], bf16
};
constexpr int SMEM_BYTES = (int)sizeof(Shared);

// The stages' hand-off (ptx_lab's ring.cuh): FULL(s) and EMPTY(s) take named barriers
// 1 .. 2 NSTAGE (0 is __syncthreads) and count every thread of the CTA.
using Ring = BarrierRing<NSTAGE, THREADS>;

}  // namespace fs
