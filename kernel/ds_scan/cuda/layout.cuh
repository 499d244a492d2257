// kernel/ds_scan/cuda/layout.cuh -- Kernel A's shared memory: the ring's stages, their tile
// layouts (strides, operand tiles, tensor-copy boxes), the consumers' staging and exchange
// tiles, the tensor maps the host encodes, and the ring's named barriers.
#pragma once
#include "config.cuh"
#include "ring.cuh"
#include "tma.cuh"

extern __shared__ __align__(16) unsigned char smem_raw[];   // the launch requests kda_smem_bytes

namespace kda {

// The tensor maps the host encodes (kernel.ds_scan.launch, ptx_lab.tensormap), one kernel
// parameter. Only those the configuration uses are encoded; the rest are zeros. q and k have their own
// H heads, the others HV (work.cuh's Params).
struct TmaMaps {
    TensorMap q, k;       // [tokens][H * HEAD_DIM] bf16: boxes TILE_TOKENS x HEAD_DIM
    TensorMap gc;         // [tokens][HV * HEAD_DIM] fp32: boxes TILE_TOKENS x GC_BOX_COLS
    TensorMap dO;         // [tokens][HV * HEAD_DIM] bf16: boxes TILE_TOKENS x DO_BOX_COLS, swizzled DO_SWZ
    TensorMap mqk, inv;   // [tokens][HV * TILE_TOKENS] bf16: boxes TILE_TOKENS x TILE_TOKENS, swizzled 32
    TensorMap snap;       // [snapshots * HV * HEAD_DIM][HEAD_DIM]: boxes KW x BAND, swizzled SNAP_SWZ
};

// Row strides (in elements) of the shared tiles that ldmatrix reads. One 8x8
// ldmatrix phase reads 8 rows x 16 B; a row stride of 16 B modulo 128 B puts the
// 8 rows in 8 distinct 4-bank groups, i.e. conflict-free.
constexpr int OP_STRIDE = HEAD_DIM + 8;   // qd/kd/kr rows: 272 B = 2*128 + 16
// WGMMA: qd/kd/kr as core matrices (8 c x 8 k, 128 contiguous bytes), the layout a wgmma
// descriptor names (wgmma.cuh): byte of X[c][k] = (c % 8) 16 + (k % 8) 2 + (c / 8) OP_CBLOCK
// + (k / 8) OP_KBLOCK. One tile is both qd as G4's N-major B (lbo OP_CBLOCK, sbo OP_KBLOCK)
// and kr^T as a K-major B. Core matrices 144 bytes apart along k (not 128): R1's warp writes
// one c row, 16 core matrices, and 144 = 9 x 16 puts them in 8 distinct bank groups
// (at 128 all 16 would share one: 16-way). ldmatrix reads whole core matrices either way.
constexpr int OP_KBLOCK = 144;
constexpr int OP_CBLOCK = (HEAD_DIM / 8) * OP_KBLOCK;   // 2304
constexpr int OP_TILE_ELEMS = WGMMA ? (TILE_TOKENS / 8) * OP_CBLOCK / 2 : TILE_TOKENS * OP_STRIDE;
// element offset of X[c][k] in an operand tile
__host__ __device__ constexpr int op_offset(int c, int k) {
    return WGMMA ? ((c % 8) * 16 + (k % 8) * 2 + (c / 8) * OP_CBLOCK + (k / 8) * OP_KBLOCK) / 2 : c * OP_STRIDE + k;
}
// What bf16 rounding left of qd (qd - bf16(qd)), G4's second B operand: the consumers add
// do^T @ rest to dS so that dh0 carries qd to about 16 bits instead of 8 (its rounding was
// nearly all of the scan's own error). It needs no shared memory of its own: row c goes in
// the stage's raw q row c, which only the producer warp that owns token c reads, and only
// before R1 writes the rest. The 16-byte chunks of a row are XOR-swizzled by c % 8, so the
// 8 rows (256 B apart) one ldmatrix phase reads sit in 8 distinct bank groups.
__host__ __device__ constexpr int qd_rest_offset(int c, int k) {   // element offset in Stage::q
    return c * HEAD_DIM + (((k / 8) ^ (c % 8)) * 8) + k % 8;
}

constexpr int DO_STRIDE = DV + 8;         // do rows: 2*DV + 16 B (DV = 128..16 all conflict-free)
constexpr int SMALL_STRIDE = TILE_TOKENS + 8;   // Mqk/INV rows: 48 B (a 32 B row would be 2-way)
constexpr int SNAP_STRIDE = 16 * MT + 8;  // bf16 snapshot staging rows: 48 B (MT 1) or 80 B (MT 2), an odd
                                          // number of 16-byte bank groups: 8 rows, 8 distinct groups
constexpr int SNAPF_STRIDE = 16 * MT + 4; // fp32 staging rows: 80 B or 144 B, so the 4 k rows one fragment
                                          // store touches (k = 8j + 2t) start 8 banks apart: conflict-free


// Tensor-copy layouts (LOADS 2). A tensor copy lands its box densely, row after row,
// or swizzled (tma.cuh: tma_swizzle). Dense 256-byte do rows would put the 8 rows one
// ldmatrix phase reads in the same banks (8-way), so do comes in boxes of 32, 64 or
// 128-byte rows swizzled by their row length (8 rows, 8 distinct 16-byte bank groups),
// Mqk/INV (32-byte rows) swizzled by 32 bytes. q, k and gc, read by R1 a whole row per
// warp instruction, stay dense; gc comes in two boxes of 64 floats (256-byte rows; the
// driver accepts longer fp32 box rows too, ptx_lab.tensormap's probe says, so one would do).
constexpr int DO_BOX_COLS = DV < 64 ? DV : 64;     // bf16 columns per do box row
constexpr int DO_SWZ = 2 * DO_BOX_COLS;            // its bytes = its swizzle: 32, 64 or 128
constexpr int DO_BOXES = DV / DO_BOX_COLS;
constexpr int SMALL_SWZ = 2 * TILE_TOKENS;         // Mqk/INV box rows: 32 bytes
constexpr int GC_BOX_COLS = 64;
constexpr int GC_BOXES = HEAD_DIM / GC_BOX_COLS;
constexpr int TMA_ALIGN = 1024;                    // 8 rows of the widest swizzle (128 B)
// q k gc do mqk inv
constexpr u32 TILE_TX_BYTES = TILE_TOKENS * (2 * HEAD_DIM * 2 + HEAD_DIM * 4 + DV * 2 + 2 * TILE_TOKENS * 2);

// One ring stage: the raw inputs of one tile and the operands R1 builds from them.
// The tensor-copy destinations come first, each a multiple of 512 bytes, so that
// with a 1024-aligned stage every box starts at the alignment its swizzle needs.
struct __align__(TMA_LOADS ? TMA_ALIGN : 16) Stage {
    unsigned short dO[TILE_TOKENS * (TMA_LOADS ? DV : DO_STRIDE)];              // do[c][v] for this CTA's DV columns
    unsigned short mqk[TILE_TOKENS * (TMA_LOADS ? TILE_TOKENS : SMALL_STRIDE)];   // Mqk[c'][c]
    unsigned short inv[TILE_TOKENS * (TMA_LOADS ? TILE_TOKENS : SMALL_STRIDE)];   // INV[c'][c]
    unsigned short q[TILE_TOKENS * HEAD_DIM];   // raw bf16 q rows (producers only); after R1, qd's rest
                                                // (qd_rest_offset)
    unsigned short k[TILE_TOKENS * HEAD_DIM];   // raw bf16 k rows (producers only)
    float gc[TILE_TOKENS * HEAD_DIM];           // tile-local cumulative gate, log2 (TMA: [GC_BOXES][TILE_TOKENS][64])
    float gT[TMA_LOADS ? 1 : NUM_PRODUCERS][HEAD_DIM];   // cp.async: gc of the tile's last real token, a copy
                                                         // per producer warp (TMA: read from gc, unused)
    float beta[TILE_TOKENS];
    unsigned short qd[OP_TILE_ELEMS];     // s * q * exp2(gc)      [c][k] bf16 (at op_offset)
    unsigned short kd[OP_TILE_ELEMS];     // k * exp2(gc)          [c][k] bf16
    unsigned short kr[OP_TILE_ELEMS];     // k * exp2(gT - gc)     [c][k] bf16
    float egT[HEAD_DIM];                  // exp2(gT) per k
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");
#ifndef __CUDACC_RTC__   // NVRTC has no offsetof; CI's nvcc builds check it
static_assert(!TMA_LOADS || (__builtin_offsetof(Stage, dO) == 0 && __builtin_offsetof(Stage, mqk) % 512 == 0 &&
                             __builtin_offsetof(Stage, inv) % 512 == 0 && __builtin_offsetof(Stage, q) % 128 == 0 &&
                             __builtin_offsetof(Stage, k) % 128 == 0 && __builtin_offsetof(Stage, gc) % 128 == 0 &&
                             ((TILE_TOKENS * DO_SWZ) % TMA_ALIGN == 0 || DO_BOXES == 1)),
              "every tensor-copy box starts where its swizzle needs it (do boxes 1024, Mqk/INV 256, dense 128)");
#endif

// Per consumer warp; SNAP_TMA: [KW][BAND] swizzled by its row length (BAND * 2 or 4 bytes:
// 32, 64 or 128), 1024-aligned. The padded tiles are larger, and dh0 uses them.
constexpr int SNAP_STAGING_BYTES_PADDED = SNAP_BF16 ? KW * SNAP_STRIDE * 2 : KW * SNAPF_STRIDE * 4;
constexpr int SNAP_STAGING_BYTES = TMA_SNAP ? (SNAP_STAGING_BYTES_PADDED + TMA_ALIGN - 1) / TMA_ALIGN * TMA_ALIGN
                                            : SNAP_STAGING_BYTES_PADDED;
constexpr int SNAP_ESIZE = SNAP_BF16 ? 2 : 4;
constexpr int SNAP_SWZ = BAND * SNAP_ESIZE;        // 32, 64 or 128
static_assert(!TMA_SNAP || KW * BAND * SNAP_ESIZE <= SNAP_STAGING_BYTES, "a snapshot box fits the staging tile");
// KSPLIT 2: each consumer warp's G2 partial dU^T (its 2 accumulator n-tiles, 8 floats a
// lane, as float4 [2][32]: every 16-byte access is lane-contiguous, conflict-free),
// double-buffered by tile parity: buffer i & 1 is rewritten at tile i + 2, after the
// pair barrier of tile i + 1, which the partner reaches only after reading it.
constexpr int XCHG_FLOAT4 = MT * 2 * 32;  // per warp and buffer
constexpr int XCHG_BYTES = KSPLIT > 1 ? 2 * NUM_CONSUMERS * XCHG_FLOAT4 * 16 : 0;
constexpr bool ALIGN_SMEM = TMA_LOADS || TMA_SNAP;
constexpr int STAGING_OFFSET = ALIGN_SMEM ? (NSTAGE * (int)sizeof(Stage) + TMA_ALIGN - 1) / TMA_ALIGN * TMA_ALIGN
                                          : NSTAGE * (int)sizeof(Stage);
constexpr int XCHG_OFFSET = STAGING_OFFSET + NUM_CONSUMERS * SNAP_STAGING_BYTES;
constexpr int MBAR_OFFSET = XCHG_OFFSET + XCHG_BYTES;   // TMA loads: one mbarrier (8 B) per stage
// FLA_INPUTS: per stage and producer warp, g at the token before the tile (zeros for a 64-token
// chunk's first tile): R1 subtracts it, which makes FLA's chunk-local gate tile-local. A copy per
// warp, like gT, so that R1 waits for its own warp's copies only.
constexpr int GBASE_OFFSET = MBAR_OFFSET + (TMA_LOADS ? NSTAGE * 8 : 0);
constexpr int GBASE_BYTES = FLA_INPUTS && !TOKEN_GATE ? NSTAGE * NUM_PRODUCERS * HEAD_DIM * 4 : 0;
// TOKEN_GATE: the producers' mbarrier (every producer thread arrives once a tile, after its copies landed), so
// that R1 may read every warp's gate rows. An mbarrier, not a named barrier: compute-sanitizer's racecheck
// follows its arrivals and waits (a producers-only named barrier made it report the ring's hand-offs)
constexpr int PRODUCERS_MBAR_OFFSET = GBASE_OFFSET + GBASE_BYTES;
constexpr int SMEM_BYTES = PRODUCERS_MBAR_OFFSET + (TOKEN_GATE ? 8 : 0)
                         + (ALIGN_SMEM ? TMA_ALIGN : 0);   // slack to align the dynamic shared base
__device__ __forceinline__ float* gate_base(unsigned char* smem, int s, int pw) {
    return reinterpret_cast<float*>(smem + GBASE_OFFSET) + (s * NUM_PRODUCERS + pw) * HEAD_DIM;
}


// The stages' hand-off (ptx_lab's ring.cuh): FULL(s) and EMPTY(s) take named barriers
// 1 .. 2 NSTAGE (0 is __syncthreads) and count every thread of the CTA. KSPLIT 2's pair
// barriers (64 threads: one band's two consumer warps) follow them.
using Ring = BarrierRing<NSTAGE, THREADS>;
__device__ __forceinline__ u32 pair_bar(int band) { return Ring::END_ID + band; }

}  // namespace kda
