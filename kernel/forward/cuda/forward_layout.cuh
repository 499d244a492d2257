// kernel/forward/cuda/forward_layout.cuh -- the forward's shared memory: the ring's stages (a tile's
// inputs as copied and every operand the producers build for it), the producers' own scratch, the
// consumers' staging tiles, and the barriers.
// Included by forward.cu after its configuration (namespace kf: the knobs and the shape that
// follows from them).
#pragma once
#include "ring.cuh"

namespace kf {

// Row strides (elements) of the tiles ldmatrix / stmatrix address: 8 rows of 16 bytes must fall on
// 8 different 4-bank groups (as Kernel S's).
constexpr int OP_STRIDE = HEAD_DIM + 8;        // Kd, Kr, Qd, Qe, Ke rows: 272 B, 68 words = 4 mod 32
constexpr int BLK_STRIDE = TILE_TOKENS + 8;    // INV, Mqk rows: 48 B
constexpr int SNAP_STRIDE = 16 + 8;            // staging rows (16 v): 48 B
constexpr int AMAT_STRIDE = TILE_TOKENS + 1;   // the fp32 Lkk of the solve

// One tile: its inputs as copied (rows past the tile's L are zero-filled) and what the producers build.
struct Stage {
    float g[TILE_TOKENS][HEAD_DIM];     // FLA's chunk-local g (log2), fp32; the token-gate build: each token's gate
    float glast[PRODUCERS][HEAD_DIM];   // per producer warp: g at the tile's last real row (not the token-gate build's)
    float gbase[PRODUCERS][HEAD_DIM];   // per producer warp: g at the row before the tile; zeros at a 64-chunk's start
                                        // (not the token-gate build's)
    u16 q[TILE_TOKENS][HEAD_DIM];       // bf16
    u16 k[TILE_TOKENS][HEAD_DIM];       // bf16
    u16 kd[TILE_TOKENS][OP_STRIDE];     // R1: bf16 k 2^gc
    u16 kr[TILE_TOKENS][OP_STRIDE];     // R1: bf16 k 2^(gT-gc)
    u16 qd[TILE_TOKENS][OP_STRIDE];     // R1: bf16 s q 2^gc
    float gamma[HEAD_DIM];              // R1: 2^gT
    u16 v[TILE_TOKENS][VW];             // bf16, this CTA's v columns
    u16 inv[TILE_TOKENS][BLK_STRIDE];   // bf16 (I + diag(beta) Akk)^-1, zero above the diagonal
    u16 mqk[TILE_TOKENS][BLK_STRIDE];   // bf16 strict_tril(Qe Kr^T) + diag(s q . k), zero above the diagonal
    float beta[TILE_TOKENS];
    float diag[TILE_TOKENS];            // R1: s q_c . k_c, Mqk's diagonal (it holds no gate)
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");

// The producers' scratch between R1 and the intra-tile products, by tile parity. Without product warps
// tile i + 2's R1 starts only after every producer passed tile i + 1's barrier, so after tile i's
// products; with them, only after PRODUCTS_DONE of the parity (below).
struct alignas(16) Scratch {
    u16 qe[2][TILE_TOKENS][OP_STRIDE];   // R1: bf16 s q 2^(gc-gT) (meaningless where the tile is past SPAN_LIMIT)
    u16 ke[2][TILE_TOKENS][OP_STRIDE];   // R1: bf16 k 2^(gc-gT)
    float lkk[TILE_TOKENS][AMAT_STRIDE]; // the solve's diag(beta) strict_tril(Akk), fp32 (one warp's alone)
    int past[2][PRODUCERS];              // per producer warp: a channel of its rows spans past SPAN_LIMIT
};

struct Shared {
    Stage stage[NSTAGE];
    Scratch scratch;
    u16 snap[WARPS][HEAD_DIM][SNAP_STRIDE];   // per consumer warp: its 16 v columns of S [K][V], bf16;
                                              // rows 0..15 then stage its o [token][v]
};
static_assert(sizeof(Shared) % 16 == 0, "the checking build's mbarriers follow Shared");

// The checking build's hand-offs (KF_MBARRIER_RING): the same as the named barriers below, on mbarriers,
// whose arrivals and waits are memory operations that compute-sanitizer's racecheck follows (it misreads
// named-barrier hand-offs of cp.async data: kernel/tools/racecheck_probes.cu). Every thread arrives for
// itself. They lie after Shared, so that a build without them keeps its layout.
//     ring              FULL(s): the producers' and the product warps' threads; EMPTY(s): the consumers'
//     r1_done[p]        the producers' threads a phase; tile i is use i / 2 of its parity's
//     products_done[p]  the product warps' threads a phase
//     producers         the producers' threads: a phase after R1 (without product warps), and one
//                       before it in the token-gate build
struct Mbarriers {
    MbarrierRing<NSTAGE, PRODUCER_THREADS + PRODUCT_THREADS, CONSUMER_THREADS> ring;
    u64 r1_done[2];
    u64 products_done[2];
    u64 producers;

    // One thread, before any other use; then a CTA barrier.
    __device__ __forceinline__ void init() {
        ring.init();
        for (int p = 0; p < 2; ++p) {
            mbarrier_init(smem_addr(&r1_done[p]), PRODUCER_THREADS);
            mbarrier_init(smem_addr(&products_done[p]), PRODUCT_THREADS > 0 ? PRODUCT_THREADS : 1);
        }
        mbarrier_init(smem_addr(&producers), PRODUCER_THREADS);
    }
};
// The qk_rstd build's rstd of each stage's rows of q and of k, copied with the tile's inputs (rows past the
// tile's L zero-filled). They lie after Shared and the checking build's mbarriers, so that the other builds keep
// their layout.
struct RstdStages {
    float q[NSTAGE][TILE_TOKENS];
    float k[NSTAGE][TILE_TOKENS];
};
constexpr int RSTD_OFFSET = (int)sizeof(Shared) + (MBARRIER_RING ? (int)sizeof(Mbarriers) : 0);
constexpr int SMEM_BYTES = RSTD_OFFSET + (QK_RSTD ? (int)sizeof(RstdStages) : 0);

// The stages' hand-off (ptx_lab's ring.cuh): FULL(s) and EMPTY(s) take named barriers 1 .. 2 NSTAGE.
// FULL counts every thread of the CTA. EMPTY counts the consumers and the producers: the product warps
// only add Mqk and INV to a stage, and they reach a stage's next tile only through R1_DONE from the
// producers, who waited on EMPTY for it; on EMPTY they would wait for the consumers too, and R1 could
// not run a tile ahead of them.
// The producers' own barrier (R1 done, the products may read every row; in the token-gate build also
// every row's gate copied, before R1) takes the next id. With
// product warps the scratch goes between them and the producers by tile parity p on two more pairs:
//     R1_DONE(p)       producers arrive once R1 of a tile of parity p is in the scratch and its
//                      stage; the product warps sync before they read it
//     PRODUCTS_DONE(p) the product warps arrive once done reading that scratch; the producers sync
//                      before R1 of the tile two later writes it
// Both count the producers and the product warps. The product warps of tile i arrive on
// PRODUCTS_DONE only where tile i + 2 exists and the producers of tile i sync only where i >= 2, so
// every phase gets all its arrivals, whatever the number of tiles.
using Ring = BarrierRing<NSTAGE, THREADS, 1, CONSUMER_THREADS + PRODUCER_THREADS>;
constexpr u32 PRODUCER_BARRIER = Ring::END_ID;
constexpr u32 R1_DONE_BARRIER = PRODUCER_BARRIER + 1;         // + the tile's parity
constexpr u32 PRODUCTS_DONE_BARRIER = R1_DONE_BARRIER + 2;    // + the tile's parity
constexpr u32 HANDOFF_THREADS = PRODUCER_THREADS + PRODUCT_THREADS;
constexpr u32 END_BARRIER = PRODUCT_WARPS > 0 ? PRODUCTS_DONE_BARRIER + 2 : PRODUCER_BARRIER + 1;
static_assert(END_BARRIER <= 16, "a CTA has named barriers 0..15: with product warps KF_NSTAGE must be at most 5");

}  // namespace kf
