// kernel/ds_scan/cuda/config.cuh -- Kernel A's configuration: the knobs and what follows from them.
//
// Every knob is a -D that kernel/ds_scan/config.py sets (config.Config: its meaning, default, auto rule
// and checks; config.defines passes them all). This file chooses no value: a missing knob
// stops the build. It derives the constants the other rooms use and re-checks what they rely on.
#pragma once
#include "../../shapes.cuh"   // HEAD_DIM (K = V), TILE_TOKENS, CHUNK_TOKENS, TILES_PER_CHUNK
#include "common.cuh"

#ifndef VSPLIT
#error "VSPLIT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SNAP_BF16
#error "SNAP_BF16 is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SNAP_EVERY
#error "SNAP_EVERY is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef HAS_DHT
#error "HAS_DHT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef L2NORM
#error "L2NORM is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef NSTAGE
#error "NSTAGE is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef G2_SPLIT
#error "G2_SPLIT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef PRODUCERS
#error "PRODUCERS is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef MT
#error "MT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef KSPLIT
#error "KSPLIT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef LOADS
#error "LOADS is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SNAP_STORE
#error "SNAP_STORE is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef WGMMA
#error "WGMMA is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef G4_WITH_G5
#error "G4_WITH_G5 is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SNAP_LATE_ISSUE
#error "SNAP_LATE_ISSUE is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef GT_SHARED
#error "GT_SHARED is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SPREAD_EXTRA
#error "SPREAD_EXTRA is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef R1_LANES
#error "R1_LANES is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef REGSPLIT
#error "REGSPLIT is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef CONSUMER_REGS
#error "CONSUMER_REGS is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef KDA_TIMING
#error "KDA_TIMING is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef FLA_INPUTS
#error "FLA_INPUTS is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef SUMMARY
#error "SUMMARY is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif
#ifndef TOKEN_GATE
#error "TOKEN_GATE is not set: kernel/ds_scan/config.py sets every knob (config.defines)"
#endif

// The values of LOADS and SNAP_STORE (config.py's LOADS_* and SNAP_* name the same numbers)
#define LOADS_CP_ASYNC 1
#define LOADS_TMA 2
#define SNAP_DIRECT 1
#define SNAP_STAGED 2
#define SNAP_TMA 3

// wgmma exists in sm_90a builds only: a plain sm_90 build (an NVRTC not asked for sm_90a)
// runs G4/G5 on mma.sync (kda_wgmma says which).
#if WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#undef WGMMA
#define WGMMA 0
#endif

using namespace ptx_lab;

namespace kda {

constexpr int DV = HEAD_DIM / VSPLIT;     // v columns per CTA
constexpr int BAND = 16 * MT;             // v columns per consumer band: MT m-tiles of 16
constexpr int NUM_BANDS = DV / BAND;      // v bands of this CTA
constexpr int NUM_CONSUMERS = NUM_BANDS * KSPLIT;   // KSPLIT warps per band
constexpr int KW = HEAD_DIM / KSPLIT;     // k columns of the dS^T band one consumer warp holds
constexpr int NJ = KW / 8;                // its accumulator n-tiles (8 k each)
constexpr int KSTEPS = KW / 16;           // its G2 k-steps
constexpr int NUM_PRODUCERS = PRODUCERS;
constexpr int TOKENS_PER_PRODUCER = TILE_TOKENS / NUM_PRODUCERS;   // R1 rows per producer warp
constexpr int PRODUCER_THREADS = NUM_PRODUCERS * 32;
constexpr int THREADS = (NUM_CONSUMERS + NUM_PRODUCERS) * 32;
constexpr int PREFETCH = NSTAGE - 1;      // tiles the loads run ahead of R1
constexpr int R1_LANE_COUNT = R1_LANES;   // lanes that share a token in R1
// The producer warp that copies Mqk, INV and beta and writes egT (SPREAD_EXTRA: four different ones)
constexpr int MQK_WARP = SPREAD_EXTRA ? 1 % NUM_PRODUCERS : 0;
constexpr int INV_WARP = SPREAD_EXTRA ? 2 % NUM_PRODUCERS : 0;
constexpr int BETA_WARP = SPREAD_EXTRA ? 3 % NUM_PRODUCERS : 0;
constexpr int EGT_WARP = SPREAD_EXTRA ? 4 % NUM_PRODUCERS : 0;
constexpr bool TMA_LOADS = LOADS == LOADS_TMA;
constexpr bool TMA_SNAP = SNAP_STORE == SNAP_TMA;
// FLA_INPUTS: gc, mqk and inv are flash-linear-attention's forward tensors as it stores them:
// g (the 64-token chunk-local cumulative gate, log2), Aqk and Akk ([tokens, H, 64]). A tile's
// Mqk / INV is the 16 x 16 diagonal block of its 64-token chunk, read in place.
constexpr int SMALL_COLS = FLA_INPUTS ? CHUNK_TOKENS : TILE_TOKENS;   // elements between the Mqk/INV rows of one head

static_assert(HEAD_DIM % VSPLIT == 0 && DV % 16 == 0, "VSPLIT must be 1, 2, 4 or 8");
static_assert(KSPLIT == 1 || KSPLIT == 2, "KSPLIT must be 1 or 2");
static_assert((MT == 1 || MT == 2) && DV % BAND == 0,
              "MT must be 1 or 2, and HEAD_DIM / VSPLIT a multiple of 16 * MT");
static_assert(NSTAGE >= 2 && 2 * NSTAGE + (KSPLIT > 1 ? NUM_BANDS : 0) <= 15,
              "named barrier ids run out (FULL and EMPTY per stage, one per band with KSPLIT 2)");
static_assert(NSTAGE - 1 <= 7, "cp.async.wait_group takes 0..7");
static_assert(PRODUCERS == 2 || PRODUCERS == 4 || PRODUCERS == 8 || PRODUCERS == 16, "PRODUCERS must be 2, 4, 8 or 16");
static_assert(G2_SPLIT == 1 || G2_SPLIT == 2 || G2_SPLIT == 4, "G2_SPLIT must be 1, 2 or 4");
static_assert(LOADS == LOADS_CP_ASYNC || LOADS == LOADS_TMA, "LOADS must be 1 (cp.async) or 2 (tensor copies)");
static_assert(SNAP_STORE == SNAP_STAGED || SNAP_STORE == SNAP_TMA || (SNAP_STORE == SNAP_DIRECT && !SNAP_BF16),
              "SNAP_STORE must be 1 (direct, fp32 only), 2 (staged) or 3 (tensor store)");
static_assert(!WGMMA || (NUM_CONSUMERS == 4 && KSPLIT == 1),
              "WGMMA needs the consumers to be one warpgroup (4 warps) that holds all 128 k columns (KSPLIT 1)");
static_assert(G4_WITH_G5 == 0 || G4_WITH_G5 == 1, "G4_WITH_G5 must be 0 or 1");
static_assert(SNAP_LATE_ISSUE == 0 || SNAP_LATE_ISSUE == 1, "SNAP_LATE_ISSUE must be 0 or 1");
static_assert(GT_SHARED == 0 || (GT_SHARED == 1 && !TMA_LOADS && PREFETCH >= 2),
              "GT_SHARED must be 0, or 1 with cp.async loads and NSTAGE 3 or more");
static_assert(SPREAD_EXTRA == 0 || SPREAD_EXTRA == 1, "SPREAD_EXTRA must be 0 or 1");
static_assert((R1_LANES == 16 || R1_LANES == 32) && TOKENS_PER_PRODUCER % (32 / R1_LANES) == 0,
              "R1_LANES must be 32, or 16 with an even number of tokens per producer warp");
static_assert(KDA_TIMING == 0 || KDA_TIMING == 1, "KDA_TIMING must be 0 or 1");
// SUMMARY: pass 1 of the sequence split (kernel/ds_scan/split.py). The grid's y index is the CTA's role:
// role 0 scans its segment from dS = 0 (d, written to dh0), role 1 scans the K x K identity with
// do read as zeros (M, written over the snapshots pointer). No snapshot is stored.
static_assert(SUMMARY == 0 || (SUMMARY == 1 && !TMA_LOADS && !HAS_DHT),
              "SUMMARY must be 0, or 1 with cp.async loads (do's zero-fill) and no dht (its start is 0 or I)");
static_assert(FLA_INPUTS == 0 || (FLA_INPUTS == 1 && !TMA_LOADS),
              "FLA_INPUTS must be 0, or 1 with cp.async loads (the lower-triangle copies are cp.async zero-fills)");
// TOKEN_GATE: gc holds each token's natural-log gate (FLA's tensors otherwise), summed over the tile in R1
// (kernel/shapes.cuh's add_token_gate) once every producer warp's rows are in: a producers' mbarrier
static_assert(TOKEN_GATE == 0 || (TOKEN_GATE == 1 && FLA_INPUTS && !GT_SHARED),
              "TOKEN_GATE must be 0, or 1 with FLA_INPUTS and without GT_SHARED (R1 sums gT itself)");

// REGSPLIT: the launch gives every thread LAUNCH_REGS (__launch_bounds__(THREADS, 1): the
// register file's 65536 over THREADS, in steps of 8); the consumers raise theirs to
// CONSUMER_REGS, the producers lower theirs to what is left, so the CTA's pool balances.
constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8 > 255 ? 255 : (65536 / THREADS) / 8 * 8;
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
constexpr bool REG_SPLIT = HAS_SETMAXNREG && REGSPLIT != 0;
static_assert(REGSPLIT == 0 || (REGSPLIT == 1 && REGSPLIT_FITS),
              "REGSPLIT must be 0, or 1 where it moves registers between whole warpgroups (consumers and "
              "producers in multiples of 4 warps) and leaves the producers 56 or more");
static_assert(CONSUMER_REGS % 8 == 0 && CONSUMER_REGS >= 24 && CONSUMER_REGS <= 256,
              "CONSUMER_REGS must be a multiple of 8 in 24..256 (setmaxnreg)");

}  // namespace kda
