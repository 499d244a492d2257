// kernel/token_gradients/cuda/token_gradients_timing.cuh -- where a Kernel B tile's cycles go (KDB_TIMING 1,
// kernel.tools.profile --kernel b).
//
// Every thread sums the clock64 deltas of each phase of its tiles in registers (a TileTimer, kernel/lap_timer.cuh's
// LapTimer: each lap() charges the cycles since the last one to a phase); at the CTA's end lane 0 of each warp
// writes its sums to kdb_timing[cta][warp][phase], cta = blockIdx.y gridDim.x + blockIdx.x, into the buffer whose
// address the host stores in kdb_timing. A phase that ends at a CTA barrier holds the barrier's wait: the warps that finished early
// wait there for the slowest. With KDB_TIMING 0 every call is empty, and the builds the API launches hold no clock
// read.
#pragma once
#include "../../lap_timer.cuh"
#include "token_gradients_layout.cuh"

#ifndef KDB_TIMING
#error "KDB_TIMING must be defined: 0 (the builds the API launches) or 1 (kernel.tools.profile's clock accounting)"
#endif

namespace kdb {

// The phases of a tile, in the order they run (kernel.tools.profile.KERNEL_B_PHASES names them in this order)
enum TimingPhase {
    T_ISSUE,            // the rstd and g_raw loads, the next tile's cp.async issue
    T_WAIT_FIRST,       // the run's first tile: its copies (with S0, issued at the CTA's start) landed, the barrier
    T_WAIT_LOADS,       // every later tile: its copies (issued a tile ahead) landed, and the CTA barrier after them
    T_R1,               // the gate-weighted operands (and S0 into registers at the run's first tile), the barrier
    T_V_PHASE,          // G6, G7, G1-G3, the partial sums, G9 / G10, G8 (next_state)
    T_V_BARRIER,        // the CTA barrier after the V phase
    T_REDUCE,           // the fixed-order sums over the warps, the barrier after them
    T_K_PRODUCTS,       // G11-G13, S0 dS1^T, G14-G17 and dgamma's shuffles
    T_K_ELEMENTWISE,    // dq, dk and the gate's per-row products
    T_L2NORM_STORES,    // the l2norm's backward (its barrier included), dq's and dk's stores, rowsum(Ke . X)
    T_DG,               // dg's in-tile sums (and the gate activation's backward, KDB_GATE)
    T_END,              // the tile's last barrier, dbeta, dv and the next state's stores
    TIMING_PHASES
};

}  // namespace kdb

#if KDB_TIMING
extern "C" __constant__ int kdb_timing_dims[2] = {kdb::WARPS, kdb::TIMING_PHASES};   // kdb_timing's [warp][phase]
extern "C" {
__device__ unsigned int* kdb_timing = nullptr;   // [CTAs][WARPS][TIMING_PHASES] cycles: the host's buffer, or none
}
#endif

namespace kdb {

using TileTimer = LapTimer<TIMING_PHASES, KDB_TIMING != 0>;

// This warp's row of kdb_timing (cta = blockIdx.y gridDim.x + blockIdx.x); null where the host pointed no buffer,
// and in the other builds, whose TileTimer writes nothing
__device__ __forceinline__ unsigned int* timing_row(int warp) {
#if KDB_TIMING
    if (kdb_timing == nullptr) return nullptr;
    const long long cta = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
    return kdb_timing + (cta * WARPS + warp) * TIMING_PHASES;
#else
    return nullptr;
#endif
}

}  // namespace kdb
