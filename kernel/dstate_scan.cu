// kernel/dstate_scan.cu -- Kernel A: the backward dstate scan of KDA.
//
// Math (../shared/spec/kernel_a.md, section 3), per sequence and head, tiles of
// C = 16 tokens walked from the last to the first:
//     snapshot[n] = dS
//     dU     = Mqk^T @ do + kr @ dS          G1 + G2   [C, V]
//     dvcorr = INV^T @ dU                    G3        [C, V]
//     T1     = qd^T @ do - kd^T @ (beta*dvcorr)   G4 + G5   [K, V]
//     dS     = exp2(gT)[:, None] * dS + T1   combine   [K, V]
//
// Design: everything is computed transposed, with the v axis as the MMA's M.
//     dU^T     = do^T @ Mqk + dS^T @ kr^T     (M = v, N = c, K = c' / k)
//     dvcorr^T = dU^T @ INV
//     dS^T     = exp2(gT) * dS^T + do^T @ qd + (-beta*dvcorr)^T @ kd   (M = v, N = k)
// A consumer warp owns a band of 16 * MT v columns and keeps its dS^T band [16 MT v x 128 k]
// (with KSPLIT 2: half of it, [16 MT v x 64 k], the other half in a second warp)
// in fp32 mma accumulators for the whole scan. Because the C fragments of two
// adjacent n-tiles, packed to bf16 pairwise, ARE the A fragment of one k-step
// (see ptx_lab/cuda/mma.cuh), dS^T (for G2), dU^T (for G3) and bdv^T (for G5)
// feed the next MMA straight from registers: no movmatrix, no shared-memory
// round trip, no barrier on the dS-dependent path, and dS never drops to bf16
// between tiles (only G2's operand copy is rounded, as in FLA).
//
// Warp roles: warps [0, NUM_CONSUMERS) are consumers (one v band each);
// NUM_PRODUCERS producer warps prefetch tile inputs with cp.async into a ring of
// NSTAGE stages and rebuild qd/kd/kr on chip in fp32 (the seed's "R1"), so the
// loads, R1 and the snapshot stores run ahead of / beside the serial chain.
// Hand-off: named barriers FULL(s) (producers arrive, consumers sync) and
// EMPTY(s) (consumers arrive, producers sync).
//
// Compile-time configuration (-D...):
//   VSPLIT      1, 2, 4, 8   CTAs per (sequence, head), each owning D/VSPLIT v columns
//   NSTAGE      2 .. 4       depth of the input ring (loads run NSTAGE-1 tiles ahead)
//   SNAP_BF16   0 / 1        snapshot dtype fp32 / bf16
//   SNAP_EVERY  1 / 4        snapshot every tile / every 4th tile (FLA's 64-token dh)
//   HAS_DHT     0 / 1        initial dS from dht (else zeros)
//   L2NORM      0 / 1        l2-normalise q and k rows in R1
//   G2_SPLIT    1, 2, 4      independent accumulator chains in G2 (shorter dS path)
//   PRODUCERS   2, 4, 8, 16  producer warps (fewer leave consumers more registers)
//   MT          1 / 2        16-wide v m-tiles per consumer warp: with 2, every B fragment
//                            (kr, qd, kd: the same for all bands) serves two MMAs, which
//                            halves the consumers' ldmatrix traffic (shared memory bound
//                            at vsplit 1: ncu, L1 76% busy)
//   LOADS       1 / 2        tile inputs by cp.async, 16 bytes a lane (1), or by tensor copies
//                            (2, tma.cuh: one instruction per tensor and tile, on an mbarrier
//                            per stage; host-built tensor maps; do and Mqk/INV swizzled)
//   SNAP_STORE  1, 2, 3      snapshots: 4-byte stores straight from the accumulators (1, fp32
//                            only), through a warp's staging tile with 16-byte stores (2), or
//                            through a swizzled staging tile with one tensor store per warp (3)
//   KSPLIT      1 / 2        consumer warps per v band: with 2, each holds half of the
//                            band's k columns and the two add their G2 partial sums (1 KB
//                            through shared memory and a 64-thread named barrier per tile)
//   WGMMA       0 / 1        G4 and G5 as warpgroup MMAs (sm_90a, wgmma.cuh): the 4 consumer warps
//                            are one warpgroup, m-tile m of every warp one m64n128k16 with do^T /
//                            bdv^T from registers and qd / kd read from shared memory once per
//                            warpgroup (not by every warp's ldmatrix); needs 4 consumer warps
//                            holding all 128 k (KSPLIT 1). qd/kd/kr then sit in core-matrix tiles
//   REGSPLIT    -1, 0, 1     setmaxnreg (sm_90a): the consumers' warpgroup takes CONSUMER_REGS
//                            registers a thread, the producers' warpgroups give theirs back, so
//                            more producer warps fit beside consumers that hold a 32-wide band
//                            (needs NUM_CONSUMERS and PRODUCERS multiples of 4; -1 = auto)
//   KDA_TIMING  0 / 1        clock64 accounting per warp and phase into kda_timing[]
//                            (kernel.profile; off in every build the API launches)
#include "common.cuh"
#include "mma.cuh"
#include "ldmatrix.cuh"
#include "stmatrix.cuh"
#include "cp_async.cuh"
#include "barrier.cuh"
#include "tma.cuh"
#include "setmaxnreg.cuh"
// Scheduling switches, each measured (BENCHMARKS.md, log 20):
//   G4_WITH_G5       (WGMMA) G4's wgmma is issued beside G5's, after G3, so G3's mma.sync do not
//                    queue behind it on the tensor cores (32 x 8192 fla: 0.965x)
//   SNAP_LATE_ISSUE  (tensor-store snapshots) the staging tile is written at the tile's start,
//                    its proxy fence and tensor store issued at the tile's end, when the stmatrix
//                    have long completed: the fence's MEMBAR has nothing left to wait for (0.971x;
//                    both 0.961x)
#ifndef G4_WITH_G5
#define G4_WITH_G5 1
#endif
#ifndef SNAP_LATE_ISSUE
#define SNAP_LATE_ISSUE 1
#endif
//   GT_SHARED        (cp.async loads) a whole tile's gT (gc of its last token) is read from the gc
//                    rows the last producer warp loads for R1, not from a copy of its own in every
//                    producer warp: 7 of 8 copies (3.5 KB of L2 and shared-memory traffic a tile)
//                    gone. The owner waits for those rows before the EMPTY barrier all producer
//                    warps pass one iteration earlier, which publishes them; tiles that barrier
//                    does not precede (the walk's first, a partial one, the last NSTAGE - 1) keep
//                    the per-warp copies. On for bf16 snapshots at vsplit 1 (32 x 8192 fla 0.964x,
//                    4 x 8192 0.971x, varlen 0.975x); off at vsplit 4 (B = 1: the owner's wait
//                    delays every producer at that barrier, 1.050x), for fp32 snapshots (2
//                    producer warps; 32 x 8192 seed 1.007x) and at vsplit 2 and 8 (untimed)
#ifndef GT_SHARED
#define GT_SHARED (VSPLIT == 1 && SNAP_BF16)
#endif
//   SPREAD_EXTRA     the copies only the consumers read that fit one warp (Mqk, INV, beta) and the
//                    egT row go to producer warps 1, 2, 3 and 4 instead of all to warp 0, which
//                    issued 9 copies a tile to the others' 6. On at vsplit 1 (paired, alternating:
//                    4 x 8192 0.994x, 32 x 8192 0.994x, varlen 0.998x) with bf16 snapshots; off at
//                    vsplit 4 (B = 1: 1.04x slower), untimed at vsplit 2 and 8 and in seed mode
#ifndef SPREAD_EXTRA
#define SPREAD_EXTRA (VSPLIT == 1 && SNAP_BF16)
#endif
// R1_LANES: lanes per token in R1: 32, or 16 with two tokens per warp-wide pass (4 butterfly
// levels per norm instead of 5, 16-byte shared stores; needs an even number of tokens per
// producer warp); -1 = auto (R1_LANE_COUNT): 16 at vsplit 1 with bf16 snapshots (alternating
// A/B, paired: 4 x 8192 0.994x, 32 x 8192 0.992x, varlen 0.994x), 32 elsewhere (B = 1 at 16:
// 1.012-1.020x, log 20)
#ifndef R1_LANES
#define R1_LANES -1
#endif

using namespace ptx_lab;

#ifndef VSPLIT
#define VSPLIT 1
#endif
#ifndef NSTAGE
#define NSTAGE 4
#endif
#ifndef SNAP_BF16
#define SNAP_BF16 0
#endif
#ifndef SNAP_EVERY
#define SNAP_EVERY 1
#endif
#ifndef HAS_DHT
#define HAS_DHT 0
#endif
#ifndef L2NORM
#define L2NORM 1
#endif
#ifndef KDA_TIMING
#define KDA_TIMING 0
#endif
#ifndef REGSPLIT
#define REGSPLIT -1
#endif
// Defaults as build.Config's auto rules (which say why).
#define LOADS_CP_ASYNC 1
#define LOADS_TMA 2
#ifndef LOADS
#define LOADS LOADS_CP_ASYNC
#endif
#define SNAP_DIRECT 1
#define SNAP_STAGED 2
#define SNAP_TMA 3
#ifndef SNAP_STORE
#define SNAP_STORE (SNAP_BF16 ? SNAP_TMA : VSPLIT == 1 ? SNAP_STAGED : SNAP_DIRECT)
#endif
#ifndef MT
#define MT (VSPLIT == 1 ? 2 : 1)
#endif
#ifndef KSPLIT
#define KSPLIT (VSPLIT == 4 && !SNAP_BF16 ? 2 : 1)
#endif
#ifndef G2_SPLIT
#define G2_SPLIT (MT == 1 ? 4 : 2)
#endif
// WGMMA auto: wherever the consumers are one warpgroup holding all 128 k (4 warps: VSPLIT * MT
// == 2, KSPLIT 1). wgmma exists in sm_90a builds only: a plain build (an NVRTC not asked for
// sm_90a) runs G4/G5 on mma.sync (kda_wgmma says which).
#ifndef WGMMA
#define WGMMA (VSPLIT * MT == 2 && KSPLIT == 1)
#endif
#if WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef WGMMA
#define WGMMA 0
#endif
#if WGMMA
#include "wgmma.cuh"
#endif
#ifndef PRODUCERS
#define PRODUCERS (VSPLIT == 4 || (VSPLIT == 1 && SNAP_BF16) ? 8 : VSPLIT == 1 ? 2 : 4)
#endif

namespace kda {

// The tensor maps the host encodes (kernel.api, ptx_lab.tensormap), one kernel
// parameter. Only those the configuration uses are encoded; the rest are zeros.
struct TmaMaps {
    TensorMap q, k, gc;   // [tokens][H * D]: boxes C x D (bf16), C x GC_BOX_COLS (fp32)
    TensorMap dO;         // [tokens][H * D] bf16: boxes C x DO_BOX_COLS, swizzled DO_SWZ
    TensorMap mqk, inv;   // [tokens][H * C] bf16: boxes C x C, swizzled 32
    TensorMap snap;       // [snapshots * H * D][D]: boxes KW x BAND, swizzled SNAP_SWZ
};

constexpr int D = 128;                    // K = V = D
constexpr int C = 16;                     // tokens per tile
constexpr int DV = D / VSPLIT;            // v columns per CTA
constexpr int BAND = 16 * MT;             // v columns per consumer band: MT m-tiles of 16
constexpr int NUM_BANDS = DV / BAND;      // v bands of this CTA
constexpr int NUM_CONSUMERS = NUM_BANDS * KSPLIT;   // KSPLIT warps per band
constexpr int KW = D / KSPLIT;            // k columns of the dS^T band one consumer warp holds
constexpr int NJ = KW / 8;                // its accumulator n-tiles (8 k each)
constexpr int KSTEPS = KW / 16;           // its G2 k-steps
constexpr int NUM_PRODUCERS = PRODUCERS;
constexpr int TOKENS_PER_PRODUCER = C / NUM_PRODUCERS;   // R1 rows per producer warp
constexpr int PRODUCER_THREADS = NUM_PRODUCERS * 32;
constexpr int THREADS = (NUM_CONSUMERS + NUM_PRODUCERS) * 32;
static_assert(R1_LANES == -1 || R1_LANES == 16 || R1_LANES == 32, "R1_LANES must be -1 (auto), 16 or 32");
constexpr int R1_LANE_COUNT = R1_LANES > 0 ? R1_LANES
                            : VSPLIT == 1 && SNAP_BF16 && TOKENS_PER_PRODUCER % 2 == 0 ? 16 : 32;
// The producer warp that copies Mqk, INV and beta and writes egT (SPREAD_EXTRA: four different ones)
constexpr int MQK_WARP = SPREAD_EXTRA ? 1 % NUM_PRODUCERS : 0;
constexpr int INV_WARP = SPREAD_EXTRA ? 2 % NUM_PRODUCERS : 0;
constexpr int BETA_WARP = SPREAD_EXTRA ? 3 % NUM_PRODUCERS : 0;
constexpr int EGT_WARP = SPREAD_EXTRA ? 4 % NUM_PRODUCERS : 0;
// ptid renumbered so that warp w's threads come first (copies of fewer than 33 chunks)
__device__ __forceinline__ int from_warp(int ptid, int w) {
    return w == 0 ? ptid : (ptid + PRODUCER_THREADS - 32 * w) % PRODUCER_THREADS;   // (ptid >= 0: not provable)
}

static_assert(D % VSPLIT == 0 && DV % 16 == 0, "VSPLIT must be 1, 2, 4 or 8");
static_assert(KSPLIT == 1 || KSPLIT == 2, "KSPLIT must be 1 or 2");
static_assert((MT == 1 || MT == 2) && DV % BAND == 0, "MT must be 1 or 2, and D / VSPLIT a multiple of 16 * MT");
static_assert(NSTAGE >= 2 && 2 * NSTAGE + (KSPLIT > 1 ? NUM_BANDS : 0) <= 15,
              "named barrier ids run out (FULL and EMPTY per stage, one per band with KSPLIT 2)");
static_assert(NSTAGE - 1 <= 7, "cp.async.wait_group takes 0..7");
static_assert(PRODUCERS == 2 || PRODUCERS == 4 || PRODUCERS == 8 || PRODUCERS == 16, "PRODUCERS must be 2, 4, 8 or 16");
static_assert(G2_SPLIT == 1 || G2_SPLIT == 2 || G2_SPLIT == 4, "G2_SPLIT must be 1, 2 or 4");
static_assert(LOADS == LOADS_CP_ASYNC || LOADS == LOADS_TMA, "LOADS must be 1 (cp.async) or 2 (tensor copies)");
static_assert(SNAP_STORE == SNAP_STAGED || SNAP_STORE == SNAP_TMA || (SNAP_STORE == SNAP_DIRECT && !SNAP_BF16),
              "SNAP_STORE must be 1 (direct, fp32 only), 2 (staged) or 3 (tensor store)");
// REGSPLIT: the launch gives every thread LAUNCH_REGS (__launch_bounds__(THREADS, 1): the
// register file's 65536 over THREADS, in steps of 8); the consumers raise theirs to
// CONSUMER_REGS (the 32-wide bands' code takes 215 when it may), the producers lower
// theirs to what is left, so the CTA's pool balances. Auto (-1): on wherever it is
// possible (whole warpgroups on both sides) and needed (LAUNCH_REGS < CONSUMER_REGS),
// which is 8 or 16 producer warps beside 4 consumer warps.
constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8 > 255 ? 255 : (65536 / THREADS) / 8 * 8;
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 240
#endif
constexpr int PRODUCER_REGS_RAW = (LAUNCH_REGS * THREADS - CONSUMER_REGS * NUM_CONSUMERS * 32) / PRODUCER_THREADS / 8 * 8;
constexpr int PRODUCER_REGS = PRODUCER_REGS_RAW > 248 ? 248 : PRODUCER_REGS_RAW;
// setmaxnreg exists for sm_90a builds only (an "a" target's feature macro); a plain
// sm_90 build (e.g. an NVRTC that was not asked for sm_90a) runs without the split.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool HAS_SETMAXNREG = true;
#else
constexpr bool HAS_SETMAXNREG = false;
#endif
constexpr bool REGSPLIT_FITS = NUM_CONSUMERS % 4 == 0 && NUM_PRODUCERS % 4 == 0 && PRODUCER_REGS >= 56;
constexpr bool REG_SPLIT = HAS_SETMAXNREG && (REGSPLIT < 0 ? REGSPLIT_FITS && LAUNCH_REGS < CONSUMER_REGS : REGSPLIT != 0);
static_assert(!WGMMA || (NUM_CONSUMERS == 4 && KSPLIT == 1),
              "WGMMA needs the consumers to be one warpgroup (4 warps) that holds all 128 k columns (KSPLIT 1)");
static_assert(!REG_SPLIT || REGSPLIT_FITS,
              "REGSPLIT moves registers between whole warpgroups (consumers and producers in multiples of 4 "
              "warps) and must leave the producers 56 or more");
constexpr bool TMA_LOADS = LOADS == LOADS_TMA;
constexpr bool TMA_SNAP = SNAP_STORE == SNAP_TMA;

// Row strides (in elements) of the shared tiles that ldmatrix reads. One 8x8
// ldmatrix phase reads 8 rows x 16 B; a row stride of 16 B modulo 128 B puts the
// 8 rows in 8 distinct 4-bank groups, i.e. conflict-free.
constexpr int OP_STRIDE = D + 8;          // qd/kd/kr rows: 272 B = 2*128 + 16
// WGMMA: qd/kd/kr as core matrices (8 c x 8 k, 128 contiguous bytes), the layout a wgmma
// descriptor names (wgmma.cuh): byte of X[c][k] = (c % 8) 16 + (k % 8) 2 + (c / 8) OP_CBLOCK
// + (k / 8) OP_KBLOCK. One tile is both qd as G4's N-major B (lbo OP_CBLOCK, sbo OP_KBLOCK)
// and kr^T as a K-major B. Core matrices 144 bytes apart along k (not 128): R1's warp writes
// one c row, 16 core matrices, and 144 = 9 x 16 puts them in 8 distinct bank groups
// (at 128 all 16 would share one: 16-way). ldmatrix reads whole core matrices either way.
constexpr int OP_KBLOCK = 144;
constexpr int OP_CBLOCK = (D / 8) * OP_KBLOCK;   // 2304
constexpr int OP_TILE_ELEMS = WGMMA ? (C / 8) * OP_CBLOCK / 2 : C * OP_STRIDE;
// element offset of X[c][k] in an operand tile
__host__ __device__ constexpr int op_offset(int c, int k) {
    return WGMMA ? ((c % 8) * 16 + (k % 8) * 2 + (c / 8) * OP_CBLOCK + (k / 8) * OP_KBLOCK) / 2 : c * OP_STRIDE + k;
}
constexpr int DO_STRIDE = DV + 8;         // do rows: 2*DV + 16 B (DV = 128..16 all conflict-free)
constexpr int SMALL_STRIDE = C + 8;       // Mqk/INV rows: 48 B (a 32 B row would be 2-way)
constexpr int SNAP_STRIDE = 16 * MT + 8;  // bf16 snapshot staging rows: 48 B (MT 1) or 80 B (MT 2), an odd
                                          // number of 16-byte bank groups: 8 rows, 8 distinct groups
constexpr int SNAPF_STRIDE = 16 * MT + 4; // fp32 staging rows: 80 B or 144 B, so the 4 k rows one fragment
                                          // store touches (k = 8j + 2t) start 8 banks apart: conflict-free

// Tensor-copy layouts (LOADS 2). A tensor copy lands its box densely, row after row,
// or swizzled (tma.cuh: tma_swizzle). Dense 256-byte do rows would put the 8 rows one
// ldmatrix phase reads in the same banks (8-way), so do comes in boxes of 32, 64 or
// 128-byte rows swizzled by their row length (8 rows, 8 distinct 16-byte bank groups),
// Mqk/INV (32-byte rows) swizzled by 32 bytes. q, k and gc, read by R1 a whole row per
// warp instruction, stay dense; gc comes in two boxes of 64 floats (256-byte rows: when
// this was written, the longest fp32 box row seen accepted; ptx_lab.tensormap's driver
// probe has since seen 512 and 1024-byte rows accepted, so one box would do).
constexpr int DO_BOX_COLS = DV < 64 ? DV : 64;     // bf16 columns per do box row
constexpr int DO_SWZ = 2 * DO_BOX_COLS;            // its bytes = its swizzle: 32, 64 or 128
constexpr int DO_BOXES = DV / DO_BOX_COLS;
constexpr int SMALL_SWZ = 2 * C;                   // Mqk/INV box rows: 32 bytes
constexpr int GC_BOX_COLS = 64;
constexpr int GC_BOXES = D / GC_BOX_COLS;
constexpr int TMA_ALIGN = 1024;                    // 8 rows of the widest swizzle (128 B)
constexpr u32 TILE_TX_BYTES = 2 * C * D * 2 + C * D * 4 + C * DV * 2 + 2 * C * C * 2;   // q k gc do mqk inv

// One ring stage: the raw inputs of one tile and the operands R1 builds from them.
// The tensor-copy destinations come first, each a multiple of 512 bytes, so that
// with a 1024-aligned stage every box starts at the alignment its swizzle needs.
struct __align__(TMA_LOADS ? TMA_ALIGN : 16) Stage {
    unsigned short dO[TMA_LOADS ? C * DV : C * DO_STRIDE];      // do[c][v] for this CTA's DV columns
    unsigned short mqk[TMA_LOADS ? C * C : C * SMALL_STRIDE];   // Mqk[c'][c]
    unsigned short inv[TMA_LOADS ? C * C : C * SMALL_STRIDE];   // INV[c'][c]
    unsigned short q[C * D];              // raw bf16 q rows (producers only)
    unsigned short k[C * D];              // raw bf16 k rows (producers only)
    float gc[C * D];                      // tile-local cumulative gate, log2 (TMA: [GC_BOXES][C][64])
    float gT[TMA_LOADS ? 1 : NUM_PRODUCERS][D];   // cp.async: gc of the tile's last real token, a copy
                                                  // per producer warp (TMA: read from gc, unused)
    float beta[C];
    unsigned short qd[OP_TILE_ELEMS];     // s * q * exp2(gc)      [c][k] bf16 (at op_offset)
    unsigned short kd[OP_TILE_ELEMS];     // k * exp2(gc)          [c][k] bf16
    unsigned short kr[OP_TILE_ELEMS];     // k * exp2(gT - gc)     [c][k] bf16
    float egT[D];                         // exp2(gT) per k
};
static_assert(sizeof(Stage) % 16 == 0, "stages must stay 16-byte aligned");
#ifndef __CUDACC_RTC__   // NVRTC has no offsetof; CI's nvcc builds check it
static_assert(!TMA_LOADS || (__builtin_offsetof(Stage, dO) == 0 && __builtin_offsetof(Stage, mqk) % 512 == 0 &&
                             __builtin_offsetof(Stage, inv) % 512 == 0 && __builtin_offsetof(Stage, q) % 128 == 0 &&
                             __builtin_offsetof(Stage, k) % 128 == 0 && __builtin_offsetof(Stage, gc) % 128 == 0 &&
                             ((C * DO_SWZ) % TMA_ALIGN == 0 || DO_BOXES == 1)),
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
constexpr int SMEM_BYTES = MBAR_OFFSET + (TMA_LOADS ? NSTAGE * 8 : 0)
                         + (ALIGN_SMEM ? TMA_ALIGN : 0);   // slack to align the dynamic shared base

// Named barrier ids (0 is __syncthreads).
__device__ __forceinline__ u32 full_bar(int s) { return 1 + s; }
__device__ __forceinline__ u32 empty_bar(int s) { return 1 + NSTAGE + s; }
__device__ __forceinline__ u32 pair_bar(int band) { return 1 + 2 * NSTAGE + band; }   // KSPLIT 2
// Where each warp's cycles go (KDA_TIMING=1 only): every thread sums clock64
// deltas per phase in registers; at exit lane 0 of each warp of the first
// TIMING_CTAS CTAs writes them to kda_timing[cta][warp][slot] (no global traffic
// inside the scan). Producer slots: total, wait for own loads + the warp's
// barrier, R1 (+ FULL arrive), wait EMPTY, issue loads. Consumer slots: total,
// snapshot store, wait FULL, G1..G5 (with the pair exchange), of which the pair barrier.
enum TimingSlot { T_TOTAL = 0, T_P_WAIT_LOADS = 1, T_P_R1 = 2, T_P_WAIT_EMPTY = 3, T_P_ISSUE = 4,
                  T_C_SNAPSHOT = 1, T_C_WAIT_FULL = 2, T_C_CHAIN = 3, T_C_PAIR = 4 };
constexpr int TIMING_CTAS = 8, TIMING_WARPS = 32, TIMING_SLOTS = 8;   // kda_timing's shape
#if KDA_TIMING
#define KDA_TIMERS long long kda_t[TIMING_SLOTS] = {}
#define KDA_CLOCK(t) const long long t = clock64()
#define KDA_ADD(slot, t0) (kda_t[(slot)] += clock64() - (t0))
#define KDA_FLUSH()                                                                      \
    do {                                                                                 \
        if (blockIdx.x < TIMING_CTAS && lane == 0)                                       \
            for (int s_ = 0; s_ < TIMING_SLOTS; ++s_)                                    \
                kda_timing[(blockIdx.x * TIMING_WARPS + warp) * TIMING_SLOTS + s_] = kda_t[s_]; \
    } while (0)
#else
#define KDA_TIMERS ((void)0)
#define KDA_CLOCK(t) ((void)0)
#define KDA_ADD(slot, t0) ((void)0)
#define KDA_FLUSH() ((void)0)
#endif

struct Params {
    const unsigned short* q;      // [tokens, H, D] bf16
    const unsigned short* k;      // [tokens, H, D] bf16
    const float* gc;              // [tokens, H, D]
    const float* beta;            // [tokens, H]
    const unsigned short* mqk;    // [tokens, H, C] bf16
    const unsigned short* inv;    // [tokens, H, C] bf16
    const unsigned short* dO;     // [tokens, H, D] bf16
    const float* dht;             // [N, H, D, D] or null
    void* snapshots;              // [total_snaps, H, D, D] fp32 or bf16
    float* dh0;                   // [N, H, D, D]
    const long long* cu_seqlens;  // [N + 1] token offsets
    const long long* snap_offsets;// [N + 1] snapshot offsets
    const int* order;             // [N] sequence processed by CTA slot (longest first) or null
    int H;
    float scale;
    const TmaMaps* maps;          // the tensor maps (a __grid_constant__ kernel parameter)
};

// What a CTA works on: v split vs of head h of sequence seq (the order's slot-th longest).
struct CtaWork {
    int vs, h, seq, len, nt;
    long long seq_start, snap_base;
};
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
    CtaWork w;
    w.vs = blockIdx.x % VSPLIT;
    w.h = (blockIdx.x / VSPLIT) % p.H;
    const int slot = blockIdx.x / (VSPLIT * p.H);
    w.seq = p.order ? p.order[slot] : slot;
    w.seq_start = p.cu_seqlens[w.seq];
    w.len = (int)(p.cu_seqlens[w.seq + 1] - w.seq_start);
    w.nt = (w.len + C - 1) / C;
    w.snap_base = p.snap_offsets[w.seq];
    return w;
}

__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// ---------------------------------------------------------------------------
// Producer side
// ---------------------------------------------------------------------------

// cp.async rows [row0, row0 + ROWS) of one tensor's tile, `ROW_BYTES` each
// (16-byte chunks), from global rows `src_row_bytes` apart (`src` = the tile's
// first row) into shared rows `SMEM_ROW_BYTES` apart at `dst`, spread over
// `THREADS` threads: chunk m of thread `tid` is chunk tid + m * THREADS of the
// block, the same row and column every tile, so the compiler keeps the offsets in
// registers and a copy costs a handful of instructions (the generic loop with
// 64-bit index math cost ~20 per copy: ncu, 700 of the producers' 3200
// instructions per tile). Rows at or past `L` are zero-filled (src-size 0:
// global memory is not read; the source address falls back to the tile's first
// row, which always exists, so it stays a valid operand).
template <int ROW_BYTES, int SMEM_ROW_BYTES, int ROWS, int THREADS_>
__device__ __forceinline__ void copy_rows(u32 dst, const char* src, u32 src_row_bytes, int L, int tid, int row0) {
    constexpr int CHUNKS = ROW_BYTES / 16;
    constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll
    for (int m = 0; m < (TOTAL + THREADS_ - 1) / THREADS_; ++m) {
        const int idx = tid + m * THREADS_;
        if (TOTAL % THREADS_ == 0 || idx < TOTAL) {
            const int c = row0 + idx / CHUNKS, ch = idx % CHUNKS;
            const bool valid = c < L;
            const u32 off = valid ? c * src_row_bytes + ch * 16 : 0u;
            cp_async_cg16_zfill(dst + c * SMEM_ROW_BYTES + ch * 16, src + off, valid ? 16u : 0u);
        }
    }
}

// beta of a tile's tokens: one 4-byte cp.async per token from the first C producer
// threads (a 16-byte .cg copy, or a tensor-copy box row, would be wider than a token's
// beta); tokens past L are zero-filled.
__device__ __forceinline__ void copy_beta(Stage& st, const Params& p, long long tok0, int L, int h, int ptid) {
    if (ptid < C) {
        const bool valid = ptid < L;
        cp_async_ca_zfill<4>(smem_addr(&st.beta[ptid]),
                             p.beta + (tok0 + (valid ? ptid : 0)) * p.H + h, valid ? 4u : 0u);
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
__device__ __forceinline__ void issue_tile_loads(Stage& st, const Params& p, long long tok0, int L,
                                                 int h, int vs, int pw, int lane, int ptid, bool own_gt) {
    constexpr int R = TOKENS_PER_PRODUCER;
    const u32 row_elems = (u32)p.H * D;          // elements between consecutive tokens
    const long long first = (tok0 * p.H + h) * D;
    const char* q = reinterpret_cast<const char*>(p.q + first);
    const char* k = reinterpret_cast<const char*>(p.k + first);
    const char* gc = reinterpret_cast<const char*>(p.gc + first);
    const char* dO = reinterpret_cast<const char*>(p.dO + first + vs * DV);
    copy_rows<D * 2, D * 2, R, 32>(smem_addr(st.q), q, row_elems * 2, L, lane, pw * R);
    copy_rows<D * 2, D * 2, R, 32>(smem_addr(st.k), k, row_elems * 2, L, lane, pw * R);
    copy_rows<D * 4, D * 4, R, 32>(smem_addr(st.gc), gc, row_elems * 4, L, lane, pw * R);
    if (own_gt) copy_rows<D * 4, D * 4, 1, 32>(smem_addr(st.gT[pw]), gc + (L - 1) * (row_elems * 4), 0u, 1, lane, 0);
    copy_rows<DV * 2, DO_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.dO), dO, row_elems * 2, L, ptid, 0);
    const long long sfirst = (tok0 * p.H + h) * C;
    const u32 srow_bytes = (u32)p.H * C * 2;
    copy_rows<C * 2, SMALL_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.mqk), reinterpret_cast<const char*>(p.mqk + sfirst),
                                                            srow_bytes, L, from_warp(ptid, MQK_WARP), 0);
    copy_rows<C * 2, SMALL_STRIDE * 2, C, PRODUCER_THREADS>(smem_addr(st.inv), reinterpret_cast<const char*>(p.inv + sfirst),
                                                            srow_bytes, L, from_warp(ptid, INV_WARP), 0);
    copy_beta(st, p, tok0, L, h, from_warp(ptid, BETA_WARP));
}

// LOADS 2: a tile's loads as tensor copies. One thread arms the stage's mbarrier
// with the tile's bytes and issues one copy per tensor and box (8 at vsplit 1, 7 at
// the others, instead of ~45 warp-wide LDGSTS; the SM's global-memory queue was the
// producers' and the snapshot stores' common stall: ncu, log 12). Measured slower all
// the same, for reasons not yet found (BENCHMARKS.md, log 15). A box starting at a partial
// tile's first token also reads the rows after the sequence's end (the next
// sequence's tokens, or zeros past the tensor): R1 masks q/k/gc rows >= L, and
// zero_tail_rows clears those of do/Mqk/INV. beta (a 4-byte row, under the 16-byte
// box minimum) still comes by cp.async, zero-filled.
__device__ __forceinline__ void issue_tile_tma(Stage& st, const Params& p, u32 mbar, long long tok0, int h, int vs) {
    const TmaMaps& m = *p.maps;
    const int row = (int)tok0;
    fence_proxy_async_shared();   // this stage's earlier generic writes (tail zeroing) before the async proxy's
    mbarrier_arrive_expect_tx(mbar, TILE_TX_BYTES);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.q), &m.q, h * D, row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.k), &m.k, h * D, row, mbar);
#pragma unroll
    for (int b = 0; b < GC_BOXES; ++b)
        cp_async_bulk_tensor_2d_g2s(smem_addr(st.gc + b * C * GC_BOX_COLS), &m.gc, h * D + b * GC_BOX_COLS, row, mbar);
#pragma unroll
    for (int b = 0; b < DO_BOXES; ++b)
        cp_async_bulk_tensor_2d_g2s(smem_addr(st.dO + b * C * DO_BOX_COLS), &m.dO, h * D + vs * DV + b * DO_BOX_COLS,
                                    row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.mqk), &m.mqk, h * C, row, mbar);
    cp_async_bulk_tensor_2d_g2s(smem_addr(st.inv), &m.inv, h * C, row, mbar);
}

// Zeros rows [L, C) of do, Mqk and INV after a partial tile's tensor copies landed
// (one warp). A swizzle permutes the 16-byte chunks within a box row only, so whole
// rows are cleared without it.
__device__ __forceinline__ void zero_tail_rows(Stage& st, int L, int lane) {
    constexpr int DO_CH = DO_SWZ / 16, SMALL_CH = SMALL_SWZ / 16;   // 16-byte chunks per box row
    const int rows = C - L;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    for (int idx = lane; idx < DO_BOXES * rows * DO_CH; idx += 32) {
        const int b = idx / (rows * DO_CH), r = L + (idx / DO_CH) % rows, ch = idx % DO_CH;
        reinterpret_cast<uint4*>(st.dO)[(b * C + r) * DO_CH + ch] = z;
    }
    for (int idx = lane; idx < rows * SMALL_CH; idx += 32) {
        const int r = L + idx / SMALL_CH, ch = idx % SMALL_CH;
        reinterpret_cast<uint4*>(st.mqk)[r * SMALL_CH + ch] = z;
        reinterpret_cast<uint4*>(st.inv)[r * SMALL_CH + ch] = z;
    }
}

// gc[c][k] of a stage: dense rows (cp.async) or GC_BOXES boxes of 64 columns (TMA).
__device__ __forceinline__ const float* gc_at(const Stage& st, int c, int k) {
    return TMA_LOADS ? &st.gc[(k / GC_BOX_COLS) * C * GC_BOX_COLS + c * GC_BOX_COLS + k % GC_BOX_COLS]
                     : &st.gc[c * D + k];
}

// EPL consecutive bf16 as one shared-memory access (no <type_traits> under NVRTC).
template <int EPL> struct BF16Row;
template <> struct BF16Row<4> { using type = uint2; };
template <> struct BF16Row<8> { using type = uint4; };

// R1: qd, kd, kr in fp32 from raw q/k and gc, rounded once to bf16.
// Producer warp pw handles tokens TOKENS_PER_PRODUCER*pw + r. R1_LANE_COUNT lanes share a token:
// 32 (lane handles k = 4*lane .. 4*lane+3) or 16 (two tokens at once, one per half-warp, lane
// handles 8 consecutive k: a 16-byte store per operand, which is one core-matrix row, and 4
// butterfly levels per norm instead of 5). Every shared read and write is a contiguous row
// segment (no bank conflicts, unlike a fragment-ordered walk where 32 lanes hit 32 tokens
// of one column).
// Phased (load all rows, reduce all norms together, then compute and store):
// written token by token, each token's 2 x 5 dependent shuffles and its
// sqrt/div ran back to back (the compiler cannot hoist the next token's shared
// loads above this token's shared stores), ~400 cycles a token, and R1 became
// the per-tile bottleneck (ncu: 0.25 IPC per scheduler, time per tile
// proportional to tokens per producer warp: 2.3 us at 4, 4.6 us at 8).
__device__ __forceinline__ void rebuild_operands(Stage& st, int L, float scale, int pw, int lane, bool gt_in_gc) {
    constexpr int EPL = D / R1_LANE_COUNT;       // k per lane: 4 or 8
    constexpr int TPP = 32 / R1_LANE_COUNT;      // tokens per warp-wide pass: 1 or 2
    constexpr int R = TOKENS_PER_PRODUCER / TPP; // passes
    static_assert(TOKENS_PER_PRODUCER % TPP == 0, "R1_LANES 16 needs an even number of tokens per producer warp");
    using RawRow = typename BF16Row<EPL>::type;
    const int sub = lane / R1_LANE_COUNT, hl = lane % R1_LANE_COUNT;
    const int k0 = EPL * hl;
    const int c0 = pw * TOKENS_PER_PRODUCER + sub;
    // gc stops at the last real token
    float gt[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e += 4) {
        const float4 g = *reinterpret_cast<const float4*>(TMA_LOADS || gt_in_gc ? gc_at(st, L - 1, k0 + e) : &st.gT[pw][k0 + e]);
        gt[e] = g.x; gt[e + 1] = g.y; gt[e + 2] = g.z; gt[e + 3] = g.w;
        if (pw == EGT_WARP && sub == 0)
            *reinterpret_cast<float4*>(&st.egT[k0 + e]) = make_float4(exp2f(g.x), exp2f(g.y), exp2f(g.z), exp2f(g.w));
    }
    float qv[R][EPL], kv[R][EPL], gv[R][EPL];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + TPP * r;
        RawRow qraw = *reinterpret_cast<const RawRow*>(&st.q[c * D + k0]);
        RawRow kraw = *reinterpret_cast<const RawRow*>(&st.k[c * D + k0]);
        const u32* qw = reinterpret_cast<const u32*>(&qraw);
        const u32* kw = reinterpret_cast<const u32*>(&kraw);
        const bool tail = TMA_LOADS && c >= L;   // a tensor copy's rows past the sequence (cp.async zero-fills them)
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            qv[r][e] = tail ? 0.f : bf16_lo(qw[e / 2]); qv[r][e + 1] = tail ? 0.f : bf16_hi(qw[e / 2]);
            kv[r][e] = tail ? 0.f : bf16_lo(kw[e / 2]); kv[r][e + 1] = tail ? 0.f : bf16_hi(kw[e / 2]);
        }
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            const float4 g = *reinterpret_cast<const float4*>(gc_at(st, c, k0 + e));
            gv[r][e] = tail ? 0.f : g.x; gv[r][e + 1] = tail ? 0.f : g.y;
            gv[r][e + 2] = tail ? 0.f : g.z; gv[r][e + 3] = tail ? 0.f : g.w;
        }
    }
    float qs[R], ks[R];
#if L2NORM
    // x / sqrt(sum(x^2) + 1e-6), fp32, as flash-linear-attention's l2norm; the 2R
    // butterfly reductions (within each R1_LANE_COUNT-lane group) run interleaved.
#pragma unroll
    for (int r = 0; r < R; ++r) {
        qs[r] = ks[r] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            qs[r] += qv[r][e] * qv[r][e];
            ks[r] += kv[r][e] * kv[r][e];
        }
    }
#pragma unroll
    for (int o = R1_LANE_COUNT / 2; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], o);
            ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], o);
        }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        // rsqrtf: one MUFU.RSQ (<= 2 ulp); scale / sqrtf was an IEEE sqrt and divide
        // with slow-path branches (ncu: ~200 BSSY/BSYNC/BRA per tile).
        qs[r] = scale * rsqrtf(qs[r] + 1e-6f);
        ks[r] = rsqrtf(ks[r] + 1e-6f);
    }
#else
#pragma unroll
    for (int r = 0; r < R; ++r) { qs[r] = scale; ks[r] = 1.f; }
#endif
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + TPP * r;
        u32 qd[EPL / 2], kd[EPL / 2], kr[EPL / 2];
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            float a[2], b[2], d[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const float eg = exp2f(gv[r][e + u]);
                a[u] = qs[r] * qv[r][e + u] * eg;
                b[u] = ks[r] * kv[r][e + u] * eg;
                d[u] = ks[r] * kv[r][e + u] * exp2f(gt[e + u] - gv[r][e + u]);   // exp2 of a difference: no overflow for strong gates
            }
            qd[e / 2] = pack_bf16x2(a[0], a[1]);
            kd[e / 2] = pack_bf16x2(b[0], b[1]);
            kr[e / 2] = pack_bf16x2(d[0], d[1]);
        }
        const int o = op_offset(c, k0);   // EPL consecutive k stay inside one 8-k core-matrix row
        *reinterpret_cast<RawRow*>(&st.qd[o]) = *reinterpret_cast<const RawRow*>(qd);
        *reinterpret_cast<RawRow*>(&st.kd[o]) = *reinterpret_cast<const RawRow*>(kd);
        *reinterpret_cast<RawRow*>(&st.kr[o]) = *reinterpret_cast<const RawRow*>(kr);
    }
    // WGMMA: the consumers' warpgroup MMAs read qd/kd through the async proxy; these generic
    // stores must be made visible to it before the FULL arrive releases them
    if constexpr (WGMMA) fence_proxy_async_shared();
}

// ---------------------------------------------------------------------------
// Consumer side
// ---------------------------------------------------------------------------

// The row (8 elements) lane l names in an ldmatrix / stmatrix .x4 of the 16x16 block at
// (row0, col0): row (l & 7) of matrix l >> 3, with the matrices ordered
//   rows first: (rows lo, cols lo), (rows hi, cols lo), (rows lo, cols hi), (rows hi, cols hi)
//   cols first: (rows lo, cols lo), (rows lo, cols hi), (rows hi, cols lo), (rows hi, cols hi).
struct RowCol {
    int row, col;
};
__device__ __forceinline__ RowCol x4_rows_first(int row0, int col0, int lane) {
    const int m = lane >> 3;
    return {row0 + (lane & 7) + 8 * (m & 1), col0 + 8 * (m >> 1)};
}
__device__ __forceinline__ RowCol x4_cols_first(int row0, int col0, int lane) {
    const int m = lane >> 3;
    return {row0 + (lane & 7) + 8 * (m >> 1), col0 + 8 * (m & 1)};
}
// Their shared addresses in a row-major bf16 tile, rows `stride` elements apart.
__device__ __forceinline__ u32 x4_addr_rows_first(const unsigned short* tile, int stride, int row0, int col0, int lane) {
    const RowCol p = x4_rows_first(row0, col0, lane);
    return smem_addr(tile + p.row * stride + p.col);
}
__device__ __forceinline__ u32 x4_addr_cols_first(const unsigned short* tile, int stride, int row0, int col0, int lane) {
    const RowCol p = x4_cols_first(row0, col0, lane);
    return smem_addr(tile + p.row * stride + p.col);
}

// ... and in an operand tile (qd, kd, kr: op_offset): an 8x8 matrix is 8 rows of 16 bytes
// either way (padded rows, or one core matrix).
__device__ __forceinline__ u32 op_addr_rows_first(const unsigned short* tile, int row0, int col0, int lane) {
    const RowCol p = x4_rows_first(row0, col0, lane);
    return smem_addr(tile + op_offset(p.row, p.col));
}
__device__ __forceinline__ u32 op_addr_cols_first(const unsigned short* tile, int row0, int col0, int lane) {
    const RowCol p = x4_cols_first(row0, col0, lane);
    return smem_addr(tile + op_offset(p.row, p.col));
}

// The same in the stage tiles whose layout depends on LOADS: do^T (cols first) and
// Mqk, INV (rows first), padded rows (cp.async) or swizzled boxes (tensor copies).
__device__ __forceinline__ u32 do_addr_cols_first(const Stage& st, int col0, int lane) {
    if constexpr (TMA_LOADS) {
        const RowCol p = x4_cols_first(0, col0, lane);
        return smem_addr(st.dO) + (p.col / DO_BOX_COLS) * (C * DO_SWZ) +
               tma_swizzle<DO_SWZ>(p.row * DO_SWZ + (p.col % DO_BOX_COLS) * 2);
    }
    return x4_addr_cols_first(st.dO, DO_STRIDE, 0, col0, lane);
}
__device__ __forceinline__ u32 small_addr_rows_first(const unsigned short* tile, int lane) {
    if constexpr (TMA_LOADS) {
        const RowCol p = x4_rows_first(0, 0, lane);
        return smem_addr(tile) + tma_swizzle<SMALL_SWZ>(p.row * SMALL_SWZ + p.col * 2);
    }
    return x4_addr_rows_first(tile, SMALL_STRIDE, 0, 0, lane);
}

// n-tiles 2 pr and 2 pr + 1 of m-tile m as bf16 pairs: both G2's A fragment of k-step pr
// and the 4 registers of the snapshot's stmatrix.x4.trans.
__device__ __forceinline__ void pack_pair(u32 (&b)[4], const float (&dS)[MT][NJ][4], int m, int pr) {
    b[0] = pack_bf16x2(dS[m][2 * pr][0], dS[m][2 * pr][1]);
    b[1] = pack_bf16x2(dS[m][2 * pr][2], dS[m][2 * pr][3]);
    b[2] = pack_bf16x2(dS[m][2 * pr + 1][0], dS[m][2 * pr + 1][1]);
    b[3] = pack_bf16x2(dS[m][2 * pr + 1][2], dS[m][2 * pr + 1][3]);
}
// stmatrix.x4.trans of n-tiles 2 pr and 2 pr + 1 of m-tile m (pack_pair), `addr` the lane's
// x4_cols_first row with k as rows and v as columns:
// matrices (v 0-7, k lo), (v 8-15, k lo), (v 0-7, k hi), (v 8-15, k hi).
__device__ __forceinline__ void stmatrix_band_pair(u32 addr, const float (&dS)[MT][NJ][4], int m, int pr) {
    u32 b[4];
    pack_pair(b, dS, m, pr);
    stmatrix_x4_trans(addr, b[0], b[1], b[2], b[3]);
}

// SNAP_STORE 3, the store of a staged snapshot: the warp's generic writes are fenced for the
// async proxy and lane 0 issues the tensor store as a bulk group (SNAP_LATE_ISSUE: at the
// tile's end, not right after the stmatrix).
__device__ __forceinline__ void issue_band_tma(const TensorMap* map, int row0, int v0, unsigned char* staging, int lane) {
    fence_proxy_async_shared();   // the tile's generic writes before the async proxy reads it
    __syncwarp();
    if (lane == 0) {
        cp_async_bulk_tensor_2d_s2g(map, v0, row0, smem_addr(staging));
        cp_async_bulk_commit();
    }
}

// SNAP_STORE 3: this warp's dS^T band as ONE tensor store. The fragments go to the
// warp's staging tile [KW][BAND] swizzled by its row length (bf16 by stmatrix.trans:
// 8 rows of a matrix in 8 distinct bank groups; fp32 by 4-byte stores: the 4 rows
// k = 8j + 2t of one store in distinct groups at 128-byte rows, 2-way at 64), then
// lane 0 stores the box to rows row0 .. row0 + KW - 1, columns v0 .. of the snapshot
// map. The store runs in the background (a bulk group); the next snapshot first
// waits until it has read the tile. No 16-byte STGs through the SM's memory queue.
__device__ __forceinline__ void store_band_tma(const TensorMap* map, int row0, int v0, const float (&dS)[MT][NJ][4],
                                               unsigned char* staging, int lane) {
    // The swizzle repeats every 8 rows (8 * SNAP_SWZ bytes), so a fragment's offset is
    // its row's position within 8 rows, swizzled once, plus a constant per 8 rows.
    constexpr u32 ROWS8 = 8 * SNAP_SWZ;
    const u32 base = smem_addr(staging);
    if (lane == 0) cp_async_bulk_wait_read<0>();   // the previous snapshot's store has read the tile
    __syncwarp();
#if SNAP_BF16
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // matrix mm: rows k = 16 pr + 8 (mm >> 1) + (lane & 7), columns v = 16 m + 8 (mm & 1) ..
        const int mm = lane >> 3;
        const u32 off = (mm >> 1) * ROWS8 + tma_swizzle<SNAP_SWZ>((lane & 7) * SNAP_SWZ + (16 * m + 8 * (mm & 1)) * 2);
#pragma unroll
        for (int pr = 0; pr < NJ / 2; ++pr) stmatrix_band_pair(base + off + 2 * pr * ROWS8, dS, m, pr);
    }
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // n-tile j: rows k = 8 j + 2t (+1), columns v = 16 m + g (+8)
        u32 off[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
            off[e] = tma_swizzle<SNAP_SWZ>((2 * t + (e & 1)) * SNAP_SWZ + (16 * m + g + 8 * (e >> 1)) * 4);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) *reinterpret_cast<float*>(staging + off[e] + j * ROWS8) = dS[m][j][e];
    }
#endif
    if constexpr (!SNAP_LATE_ISSUE) issue_band_tma(map, row0, v0, staging, lane);
}

// Store this warp's part of its dS^T band (fp32 accumulators, all MT m-tiles) as
// dS[k][v] rows k0 .. k0 + KW - 1, columns v0 .. v0 + BAND - 1 of `out` (fp32
// [D][D]). Accumulator n-tile j of m-tile m holds (k relative to k0, v to v0)
// (v = 16m+g, k = 8j+2t), (16m+g, 8j+2t+1), (16m+g+8, 8j+2t), (16m+g+8, 8j+2t+1).
// They go to a warp-private staging tile [k][BAND] first (rows SNAPF_STRIDE apart:
// the 4 rows k = 8j+2t of one store start 8 banks apart, conflict-free), then
// lane l stores 16 bytes of row l / CH (CH = 16-byte chunks per row; one quarter-warp
// reads whole rows, conflict-free): 16 global stores per lane per m-tile instead of 64
// scattered 4-byte ones (which cost as much as the five GEMMs in seed mode:
// kernel.profile, 2,558 of 5,855 cycles per tile at 4 x 8192 vsplit 1). In PASSES
// passes of KW / PASSES rows each, so that dh0 fits the smaller bf16 staging tile.
template <int PASSES>
__device__ __forceinline__ void store_band_f32(float* out, const float (&dS)[MT][NJ][4], float* staging,
                                               int k0, int v0, int lane) {
    constexpr int JP = NJ / PASSES;          // n-tiles (8 rows each) per pass
    constexpr int CH = BAND / 4;             // 16-byte chunks per staging row
    constexpr int ROWS = 32 / CH;            // rows per store instruction
    static_assert(NJ % PASSES == 0 && 8 * JP * SNAPF_STRIDE * 4 <= SNAP_STAGING_BYTES,
                  "a pass must fit the warp's staging tile");
    const int g = lane >> 2, t = lane & 3;
#if SNAP_STORE == SNAP_DIRECT
    // straight from the C fragments: each 4-byte store instruction writes 8
    // consecutive v (one 32-byte sector) in 4 k rows; no shared-memory round trip
    (void)staging;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int k = k0 + 8 * j + 2 * t, v = v0 + 16 * m + g;
            __stcs(out + k * D + v, dS[m][j][0]);
            __stcs(out + (k + 1) * D + v, dS[m][j][1]);
            __stcs(out + k * D + v + 8, dS[m][j][2]);
            __stcs(out + (k + 1) * D + v + 8, dS[m][j][3]);
        }
#else
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int jj = 0; jj < JP; ++jj) {
                const int j = pass * JP + jj, k = 8 * jj + 2 * t, v = 16 * m + g;   // k: row of the staging tile
                staging[k * SNAPF_STRIDE + v] = dS[m][j][0];
                staging[(k + 1) * SNAPF_STRIDE + v] = dS[m][j][1];
                staging[k * SNAPF_STRIDE + v + 8] = dS[m][j][2];
                staging[(k + 1) * SNAPF_STRIDE + v + 8] = dS[m][j][3];
            }
        __syncwarp();
#pragma unroll
        for (int it = 0; it < 8 * JP / ROWS; ++it) {
            const int k = ROWS * it + lane / CH, ch = lane % CH;
            const float4 v = *reinterpret_cast<const float4*>(staging + k * SNAPF_STRIDE + 4 * ch);
            __stcs(reinterpret_cast<float4*>(out + (k0 + 8 * JP * pass + k) * D + v0 + 4 * ch), v);
        }
        __syncwarp();
    }
#endif
}

// Same as bf16: stmatrix.trans turns the v-major fragments into k-major rows of
// a warp-private staging tile [k][BAND] (rows SNAP_STRIDE apart: the 8 rows of a
// matrix start in 8 distinct 16-byte bank groups), then 16-byte stores write
// 2 * BAND contiguous bytes per k row; a quarter-warp reads 8 rows' chunk ch
// (again 8 distinct bank groups).
__device__ __forceinline__ void store_band_bf16(unsigned short* out, const float (&dS)[MT][NJ][4],
                                                unsigned short* staging, int k0, int v0, int lane) {
    constexpr int CH = BAND / 8;             // 16-byte chunks per staging row
    constexpr int ROWS = 32 / CH;            // rows per store instruction
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int pr = 0; pr < NJ / 2; ++pr)   // k columns 16 pr .. 16 pr + 15 of m-tile m
            stmatrix_band_pair(x4_addr_cols_first(staging, SNAP_STRIDE, 16 * pr, 16 * m, lane), dS, m, pr);
    __syncwarp();
#pragma unroll
    for (int it = 0; it < KW / ROWS; ++it) {
        const int k = ROWS * it + lane % ROWS, ch = lane / ROWS;
        const uint4 v = *reinterpret_cast<const uint4*>(staging + k * SNAP_STRIDE + 8 * ch);
        __stcs(reinterpret_cast<uint4*>(out + (k0 + k) * D + v0 + 8 * ch), v);
    }
    __syncwarp();
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    const u32 b[2] = {b0, b1};
    mma_m16n8k16_bf16(d, a, b, d);
}

// dS^T += A @ B over this warp's k columns (G4 with A = do^T, B = qd; G5 with A = bdv^T,
// B = kd): B[c][k] is a stage tile read with ldmatrix.trans (pairs along c), and each B
// fragment serves all MT m-tiles.
__device__ __forceinline__ void accumulate_band(float (&dS)[MT][NJ][4], const u32 (&a)[MT][4],
                                                const unsigned short* tile, int k0, int lane) {
#pragma unroll
    for (int pr = 0; pr < NJ / 2; ++pr) {
        u32 b[4];
        ldmatrix_x4_trans(b, op_addr_rows_first(tile, 0, k0 + 16 * pr, lane));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            mma_bf16(dS[m][2 * pr], a[m], b[0], b[1]);
            mma_bf16(dS[m][2 * pr + 1], a[m], b[2], b[3]);
        }
    }
}

#if WGMMA
// The same as one warpgroup MMA per m-tile: m-tile m of the 4 consumer warps is rows
// 16 w .. of an m64n128k16 whose accumulators are the warps' dS[m] (the wgmma D fragment
// is the mma.sync C fragments of its 16 n-tiles in order, wgmma.cuh), with A from
// registers and B = tile[c][k] N-major by descriptor (op_offset: lbo between c blocks,
// sbo between k blocks). Asynchronous: the caller fences before and waits after.
__device__ __forceinline__ void accumulate_band_wgmma(float (&dS)[MT][NJ][4], const u32 (&a)[MT][4],
                                                      const unsigned short* tile) {
    static_assert(NJ * 4 == 64, "m64n128k16: 64 accumulators a thread");
    const u64 desc = wgmma_desc(smem_addr(tile), OP_CBLOCK, OP_KBLOCK, 0);
#pragma unroll
    for (int m = 0; m < MT; ++m)
        wgmma_m64n128k16_bf16_rs<1>(reinterpret_cast<float(&)[64]>(dS[m]), a[m], desc, 1);
}
#endif

}  // namespace kda

using namespace kda;

// Dynamic shared memory the launch must request (read by the host through the module).
extern "C" __constant__ int kda_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int kda_threads = THREADS;
extern "C" __constant__ int kda_reg_split = REG_SPLIT;   // 1: setmaxnreg moved registers to the consumers
extern "C" __constant__ int kda_wgmma = WGMMA;           // 1: G4 and G5 are warpgroup MMAs
// The tensor-map boxes (kernel.api encodes the maps from these): do box columns and
// swizzle, gc box columns, snapshot box rows (KW) and columns (BAND) and swizzle.
extern "C" __constant__ int kda_tma_dims[6] = {DO_BOX_COLS, DO_SWZ, GC_BOX_COLS, KW, BAND, SNAP_SWZ};
extern "C" __constant__ int kda_timing_dims[3] = {TIMING_CTAS, TIMING_WARPS, TIMING_SLOTS};   // kernel.profile
static_assert(NUM_CONSUMERS + NUM_PRODUCERS <= TIMING_WARPS, "kda_timing has a row per warp");
#if KDA_TIMING
extern "C" {
__device__ unsigned long long kda_timing[TIMING_CTAS * TIMING_WARPS * TIMING_SLOTS];
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
kda_dstate_scan(const unsigned short* q, const unsigned short* k, const float* gc, const float* beta,
                const unsigned short* mqk, const unsigned short* inv, const unsigned short* dO,
                const float* dht, void* snapshots, float* dh0, const long long* cu_seqlens,
                const long long* snap_offsets, const int* order, int H, float scale,
                const __grid_constant__ TmaMaps maps) {
    const Params p{q, k, gc, beta, mqk, inv, dO, dht, snapshots, dh0, cu_seqlens, snap_offsets, order, H, scale, &maps};
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // tensor copies: swizzled boxes need 1024-aligned addresses (SMEM_BYTES has the slack)
    unsigned char* const smem = ALIGN_SMEM ? smem_raw + (TMA_ALIGN - smem_addr(smem_raw) % TMA_ALIGN) % TMA_ALIGN : smem_raw;
    Stage* stages = reinterpret_cast<Stage*>(smem);
    const u32 mbar0 = smem_addr(smem + MBAR_OFFSET);   // LOADS 2: stage s's mbarrier at mbar0 + 8 s

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr u32 ALL = THREADS;
    KDA_TIMERS;
    KDA_CLOCK(t_start);
    if constexpr (TMA_LOADS) {
        if (threadIdx.x == 0) {
#pragma unroll 1
            for (int s = 0; s < NSTAGE; ++s) mbarrier_init(mbar0 + 8 * s, 1);   // one arrive (with the bytes) per use
            fence_mbarrier_init();
        }
        __syncthreads();
    }

    if (warp >= NUM_CONSUMERS) {
        // ----------------------------- producers -----------------------------
        // REGSPLIT: give registers back before anything is computed (a value live across the
        // change would be spilled); the consumers' inc below waits for them.
        if constexpr (REG_SPLIT) setmaxnreg_dec<PRODUCER_REGS>();
        const CtaWork w = cta_work(p);
        const int vs = w.vs, h = w.h, len = w.len, nt = w.nt;
        const long long seq_start = w.seq_start;
        const int pw = warp - NUM_CONSUMERS;
        const int ptid = threadIdx.x - NUM_CONSUMERS * 32;
        // Tile i of the walk is tile n = nt - 1 - i of the sequence. Loads run
        // PREFETCH = NSTAGE - 1 tiles ahead of R1: one tile ahead is not enough, a
        // tile's loads then wait out a whole global-memory latency (~1-2 us under
        // load) per tile (measured: 2.3 us/tile at 1 x 131072, 4.6 us at 32 x 8192).
        constexpr int PREFETCH = NSTAGE - 1;
        auto tile_len = [&](int n) { return min(C, len - n * C); };
        // Iteration i waits on EMPTY before refilling a stage with walk tile i + PREFETCH, if that
        // tile exists and the stage held an earlier one.
        auto empty_wait_at = [&](int i) { return i + PREFETCH < nt && i + PREFETCH >= NSTAGE; };
        // GT_SHARED: walk tile j (>= 1: whole) reads gT from the owner's gc rows when iteration
        // j - 1 passes that barrier, before which the owner waits for them
        constexpr int GT_OWNER = (C - 1) / TOKENS_PER_PRODUCER;
        constexpr bool GT_SHARED_OK = GT_SHARED && !TMA_LOADS && PREFETCH >= 2;
        auto gt_shared = [&](int j) { return GT_SHARED_OK && j >= 1 && empty_wait_at(j - 1); };
        if (TMA_LOADS && ptid == 0) {
            prefetch_tensormap(&maps.q); prefetch_tensormap(&maps.k); prefetch_tensormap(&maps.gc);
            prefetch_tensormap(&maps.dO); prefetch_tensormap(&maps.mqk); prefetch_tensormap(&maps.inv);
        }
        auto issue = [&](int j) {   // loads of walk tile j into stage j % NSTAGE, if it exists
            if (j < nt) {
                const int n = nt - 1 - j;
                const long long tok0 = seq_start + (long long)n * C;
                const int L = tile_len(n);
                if constexpr (TMA_LOADS) {
                    if (ptid == 0) issue_tile_tma(stages[j % NSTAGE], p, mbar0 + 8 * (j % NSTAGE), tok0, h, vs);
                    copy_beta(stages[j % NSTAGE], p, tok0, L, h, ptid);
                } else {
                    issue_tile_loads(stages[j % NSTAGE], p, tok0, L, h, vs, pw, lane, ptid, !gt_shared(j));
                }
            }
            cp_async_commit();      // one group per tile slot, possibly empty: uniform wait counts
        };
#pragma unroll 1
        for (int j = 0; j < PREFETCH; ++j) issue(j);
#pragma unroll 1
        for (int i = 0; i < nt; ++i) {
            const int s = i % NSTAGE;
            KDA_CLOCK(t0);
            cp_async_wait<PREFETCH - 1>();   // this thread's copies for tile i landed
            if constexpr (TMA_LOADS) mbarrier_wait_parity(mbar0 + 8 * s, (i / NSTAGE) & 1);   // the tile's tensor copies
            __syncwarp();                    // ... and its warp's: the rows this warp's R1 reads
            KDA_ADD(T_P_WAIT_LOADS, t0);
            KDA_CLOCK(t1);
            const int L = tile_len(nt - 1 - i);
            if (TMA_LOADS && L < C && pw == 0) zero_tail_rows(stages[s], L, lane);   // before this warp's FULL arrive
            rebuild_operands(stages[s], L, p.scale, pw, lane, gt_shared(i));
            named_barrier_arrive(full_bar(s), ALL);              // release tile i to the consumers
            KDA_ADD(T_P_R1, t1);
            // Refill the stage of tile i - 1 with tile i + PREFETCH once the consumers left it.
            // (After R1 and the arrive, so the wait never delays tile i.)
            const int j = i + PREFETCH;
            KDA_CLOCK(t2);
            // GT_SHARED: tile i + 1's rows (of PREFETCH + i groups, all but the last PREFETCH - 2)
            if (pw == GT_OWNER && gt_shared(i + 1)) cp_async_wait<(PREFETCH >= 2 ? PREFETCH - 2 : 0)>();
            if (empty_wait_at(i)) named_barrier_sync(empty_bar(j % NSTAGE), ALL);
            KDA_ADD(T_P_WAIT_EMPTY, t2);
            KDA_CLOCK(t3);
            issue(j);
            KDA_ADD(T_P_ISSUE, t3);
        }
        KDA_ADD(T_TOTAL, t_start);
        KDA_FLUSH();
        return;
    }

    // ------------------------------- consumers -------------------------------
    if constexpr (REG_SPLIT) setmaxnreg_inc<CONSUMER_REGS>();
    const CtaWork w = cta_work(p);
    const int vs = w.vs, h = w.h, seq = w.seq, nt = w.nt;
    const long long snap_base = w.snap_base;
    const int t = lane & 3;
    const int band = warp % NUM_BANDS;       // the two warps of a band sit on different
    const int kh = warp / NUM_BANDS;         // sub-partitions wherever NUM_BANDS is 1 or 2
    const int k0 = kh * KW;                  // this warp's k columns: k0 .. k0 + KW - 1
    const int vb = band * BAND;              // band start inside this CTA's DV columns
    const int v0 = vs * DV + vb;             // band start in [0, D); m-tile m starts at v0 + 16m
    const long long head_mat = (long long)D * D;
    // this warp's snapshot staging tile (bf16 [KW][SNAP_STRIDE] or fp32 [KW][SNAPF_STRIDE])
    unsigned char* staging = smem + STAGING_OFFSET + warp * SNAP_STAGING_BYTES;

#if KSPLIT > 1
    float4* const xchg = reinterpret_cast<float4*>(smem + XCHG_OFFSET);
    const int partner = band + (1 - kh) * NUM_BANDS;
#endif

    // dS^T band (its k0 .. k0 + KW - 1 part), fp32, for the whole scan: dS[m][j] is
    // m-tile m (v = v0 + 16m ..), n-tile j (k = k0 + 8j .. k0 + 8j + 7).
    float dS[MT][NJ][4];
#if HAS_DHT
    {
        const float* src = p.dht + ((long long)seq * p.H + h) * head_mat;
        const int g = lane >> 2;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int k = k0 + 8 * j + 2 * t, v = v0 + 16 * m + g;
                dS[m][j][0] = src[k * D + v];
                dS[m][j][1] = src[(k + 1) * D + v];
                dS[m][j][2] = src[k * D + v + 8];
                dS[m][j][3] = src[(k + 1) * D + v + 8];
            }
    }
#else
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j) dS[m][j][0] = dS[m][j][1] = dS[m][j][2] = dS[m][j][3] = 0.f;
#endif

    // Not unrolled: an unrolled body (the compiler likes to unroll by SNAP_EVERY to
    // make the snapshot test static) interleaves tiles and runs out of registers.
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int n = nt - 1 - i;
        const int s = i % NSTAGE;

        // snapshot[n] = dS at entry of tile n; written before waiting for the
        // tile's operands so the stores overlap the producers' work.
        KDA_CLOCK(t0);
        const bool snap_now = SNAP_EVERY == 1 || (n % SNAP_EVERY) == SNAP_EVERY - 1 || n == nt - 1;
        const long long snap_idx = snap_base + n / SNAP_EVERY;
        // the tensor map's row of this band's first k: where store_band_tma stages and issue_band_tma sends
        const int snap_row = (int)((snap_idx * p.H + h) * D + k0);
        if (snap_now) {
#if SNAP_STORE == SNAP_TMA
            store_band_tma(&maps.snap, snap_row, v0, dS, staging, lane);
#elif SNAP_BF16
            store_band_bf16(static_cast<unsigned short*>(p.snapshots) + (snap_idx * p.H + h) * head_mat, dS,
                            reinterpret_cast<unsigned short*>(staging), k0, v0, lane);
#else
            store_band_f32<1>(static_cast<float*>(p.snapshots) + (snap_idx * p.H + h) * head_mat, dS,
                              reinterpret_cast<float*>(staging), k0, v0, lane);
#endif
        }

        KDA_ADD(T_C_SNAPSHOT, t0);
        KDA_CLOCK(t1);
        named_barrier_sync(full_bar(s), ALL);
        KDA_ADD(T_C_WAIT_FULL, t1);
        KDA_CLOCK(t2);
        const Stage& st = stages[s];

        // do^T as the A operand [v, c]: ldmatrix.trans of do[c][v] rows, one per m-tile.
        u32 doT[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) ldmatrix_x4_trans(doT[m], do_addr_cols_first(st, vb + 16 * m, lane));
        // G1: dU^T = do^T @ Mqk  (B[c'][c] = Mqk[c'][c], pairs along c' -> ldmatrix.trans)
        u32 bm[4];
        ldmatrix_x4_trans(bm, small_addr_rows_first(st.mqk, lane));
        float acc[MT][G2_SPLIT][2][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int a = 0; a < G2_SPLIT; ++a)
#pragma unroll
                for (int nn = 0; nn < 2; ++nn) acc[m][a][nn][0] = acc[m][a][nn][1] = acc[m][a][nn][2] = acc[m][a][nn][3] = 0.f;
        if (KSPLIT == 1 || kh == 0) {        // G1 once per band: in the k0 = 0 warp's partial sum
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_bf16(acc[m][0][0], doT[m], bm[0], bm[1]);
                mma_bf16(acc[m][0][1], doT[m], bm[2], bm[3]);
            }
        }

        // G2: dU^T += dS^T @ kr^T  (B[k][c] = kr[c][k], pairs along k -> plain ldmatrix),
        // over this warp's k columns; dS^T's A operand is packed from the accumulators
        // (k-step ks uses n-tiles 2ks, 2ks+1), and each B fragment serves all MT m-tiles.
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            u32 bk[4];
            ldmatrix_x4(bk, op_addr_cols_first(st.kr, 0, k0 + 16 * ks, lane));
            // matrices: (c 0-7, k lo), (c 0-7, k hi), (c 8-15, k lo), (c 8-15, k hi)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                u32 a[4];
                pack_pair(a, dS, m, ks);
                mma_bf16(acc[m][ks % G2_SPLIT][0], a, bk[0], bk[1]);
                mma_bf16(acc[m][ks % G2_SPLIT][1], a, bk[2], bk[3]);
            }
        }

        // combine, first half: dS^T *= exp2(gT) per k column, then G4: dS^T += do^T @ qd.
        // Neither depends on G2, so they fill its latency.
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float2 e = *reinterpret_cast<const float2*>(&st.egT[k0 + 8 * j + 2 * t]);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                dS[m][j][0] *= e.x; dS[m][j][1] *= e.y; dS[m][j][2] *= e.x; dS[m][j][3] *= e.y;
            }
        }
#if WGMMA && !G4_WITH_G5
        wgmma_fence();   // dS (just scaled) and doT were written by ordinary instructions
        accumulate_band_wgmma(dS, doT, st.qd);
        wgmma_commit_group();   // runs while G3 below computes bdv^T
#elif WGMMA
        // G4 is issued with G5 below
#else
        accumulate_band(dS, doT, st.qd, k0, lane);
#endif

        // G3: dvcorr^T = dU^T @ INV; dU^T's accumulators are G3's A operand.
        float dU[MT][2][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int nn = 0; nn < 2; ++nn)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float x = acc[m][0][nn][e];
#pragma unroll
                    for (int a = 1; a < G2_SPLIT; ++a) x += acc[m][a][nn][e];
                    dU[m][nn][e] = x;
                }
#if KSPLIT > 1
        // dU^T = the two warps' partial sums. Both add them in the same order (a + b is
        // commutative in IEEE arithmetic), so both run G3 on identical operands.
        {
            float4* mine = xchg + ((i & 1) * NUM_CONSUMERS + warp) * XCHG_FLOAT4;
            const float4* theirs = xchg + ((i & 1) * NUM_CONSUMERS + partner) * XCHG_FLOAT4;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int nn = 0; nn < 2; ++nn)
                    mine[(2 * m + nn) * 32 + lane] = make_float4(dU[m][nn][0], dU[m][nn][1], dU[m][nn][2], dU[m][nn][3]);
            KDA_CLOCK(tp);
            named_barrier_sync(pair_bar(band), 64);
            KDA_ADD(T_C_PAIR, tp);
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int nn = 0; nn < 2; ++nn) {
                    const float4 o = theirs[(2 * m + nn) * 32 + lane];
                    dU[m][nn][0] += o.x; dU[m][nn][1] += o.y; dU[m][nn][2] += o.z; dU[m][nn][3] += o.w;
                }
        }
#endif
        u32 bi[4];
        ldmatrix_x4_trans(bi, small_addr_rows_first(st.inv, lane));
        // bdv^T = -beta[c] * dvcorr^T (column c = 8nn + 2t, +1), straight into G5's A operand.
        const float2 b0 = *reinterpret_cast<const float2*>(&st.beta[2 * t]);
        const float2 b1 = *reinterpret_cast<const float2*>(&st.beta[8 + 2 * t]);
        u32 aB[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const u32 aU[4] = {pack_bf16x2(dU[m][0][0], dU[m][0][1]), pack_bf16x2(dU[m][0][2], dU[m][0][3]),
                               pack_bf16x2(dU[m][1][0], dU[m][1][1]), pack_bf16x2(dU[m][1][2], dU[m][1][3])};
            float dv[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            mma_bf16(dv[0], aU, bi[0], bi[1]);
            mma_bf16(dv[1], aU, bi[2], bi[3]);
            aB[m][0] = pack_bf16x2(-b0.x * dv[0][0], -b0.y * dv[0][1]);
            aB[m][1] = pack_bf16x2(-b0.x * dv[0][2], -b0.y * dv[0][3]);
            aB[m][2] = pack_bf16x2(-b1.x * dv[1][0], -b1.y * dv[1][1]);
            aB[m][3] = pack_bf16x2(-b1.x * dv[1][2], -b1.y * dv[1][3]);
        }

        // G5: dS^T += bdv^T @ kd   (the last step of the dS-dependent path)
#if WGMMA
        wgmma_fence();   // aB written by ordinary instructions
        if constexpr (G4_WITH_G5) accumulate_band_wgmma(dS, doT, st.qd);
        accumulate_band_wgmma(dS, aB, st.kd);
        wgmma_commit_group();
        wgmma_wait_group<0>();   // dS is read next tile (snapshot, G2); qd/kd are read before EMPTY
#else
        accumulate_band(dS, aB, st.kd, k0, lane);
#endif

        KDA_ADD(T_C_CHAIN, t2);
        if (i + NSTAGE < nt) named_barrier_arrive(empty_bar(s), ALL);  // the producer reloads stage s
        if constexpr (TMA_SNAP && SNAP_LATE_ISSUE) {
            if (snap_now) issue_band_tma(&maps.snap, snap_row, v0, staging, lane);
        }
    }
    KDA_ADD(T_TOTAL, t_start);
    KDA_FLUSH();

    if constexpr (TMA_SNAP) {   // the last snapshot's tensor store has read the staging tile (and is done)
        if (lane == 0) cp_async_bulk_wait<0>();
        __syncwarp();
    }
    // dh0 (fp32) through the same staging tile: in two passes where it is the smaller bf16 one
    store_band_f32<SNAP_BF16 ? 2 : 1>(p.dh0 + ((long long)seq * p.H + h) * head_mat, dS,
                                      reinterpret_cast<float*>(staging), k0, v0, lane);
}
