// kernel/ds_scan/cuda/timing.cuh -- where each warp's cycles go (KDA_TIMING 1, kernel.profile).
//
// Every thread sums clock64 deltas per phase in registers (a PhaseTimer); at exit lane 0 of
// each warp of the first TIMING_CTAS CTAs writes them to kda_timing[cta][warp][slot] (no
// global traffic inside the scan). Producer slots: total, wait for own loads + the warp's
// barrier, R1 (+ FULL arrive), wait EMPTY, issue loads. Consumer slots: total, snapshot
// store, wait FULL, G1..G5 (with the pair exchange), of which the pair barrier.
// With KDA_TIMING 0 every call is empty and the builds the API launches hold no clock read.
#pragma once
#include "config.cuh"

namespace kda {

enum TimingSlot { T_TOTAL = 0, T_P_WAIT_LOADS = 1, T_P_R1 = 2, T_P_WAIT_EMPTY = 3, T_P_ISSUE = 4,
                  T_C_SNAPSHOT = 1, T_C_WAIT_FULL = 2, T_C_CHAIN = 3, T_C_PAIR = 4 };
constexpr int TIMING_CTAS = 8, TIMING_WARPS = 32, TIMING_SLOTS = 8;   // kda_timing's shape
static_assert(NUM_CONSUMERS + NUM_PRODUCERS <= TIMING_WARPS, "kda_timing has a row per warp");

}  // namespace kda

// kernel.profile reads the shape, then the counts
extern "C" __constant__ int kda_timing_dims[3] = {kda::TIMING_CTAS, kda::TIMING_WARPS, kda::TIMING_SLOTS};
#if KDA_TIMING
extern "C" {
__device__ unsigned long long kda_timing[kda::TIMING_CTAS * kda::TIMING_WARPS * kda::TIMING_SLOTS];
}
#endif

namespace kda {

// Usage: const long long t0 = PhaseTimer::now(); ...; timer.add(SLOT, t0); at exit timer.flush(warp, lane).
#if KDA_TIMING
struct PhaseTimer {
    long long t[TIMING_SLOTS] = {};
    __device__ __forceinline__ static long long now() { return clock64(); }
    __device__ __forceinline__ void add(int slot, long long t0) { t[slot] += clock64() - t0; }
    __device__ __forceinline__ void flush(int warp, int lane) const {
        if (blockIdx.x < TIMING_CTAS && lane == 0)
            for (int s = 0; s < TIMING_SLOTS; ++s) kda_timing[(blockIdx.x * TIMING_WARPS + warp) * TIMING_SLOTS + s] = t[s];
    }
};
#else
struct PhaseTimer {
    __device__ __forceinline__ static long long now() { return 0; }
    __device__ __forceinline__ void add(int, long long) {}
    __device__ __forceinline__ void flush(int, int) const {}
};
#endif

}  // namespace kda
