// kernel/forward/cuda/forward_timing.cuh -- where the forward's tile goes, role by role (KF_TIMING 1,
// kernel.tools.profile --kernel f).
//
// Every warp sums the clock64 cycles of each slot of its tiles in registers (kernel/lap_timer.cuh's LapTimer, each
// lap() charging the cycles since the last to a slot); at its end lane 0 writes them to kf_timing[cta][warp][slot],
// into the buffer whose address the host stores in kf_timing. A slot means what its warp's role does there. A role
// that waits most of a tile does not set the pace; the one it waits for does. With KF_TIMING 0 every call is empty,
// and the builds the API launches hold no clock read.
// Included by forward.cu after its configuration (TIMING, THREADS).
#pragma once
#include "../../lap_timer.cuh"

namespace kf {

// The slots of a tile, by role (kernel.tools.profile.FORWARD_SLOTS names them)
enum TimingSlot {
    T_WAIT,     // producers: this tile's copies landed (and the producers' barrier before R1, token gate);
                // product warps: the tile's R1 handed over; consumers: FULL (the tile's operands in)
    T_WORK,     // producers: R1 (the l2norm build's normalisation first); product warps: Mqk, Akk and INV;
                // consumers: the chain's step (G6-G8 with F1) and F2
    T_PASS,     // producers: the producers' barrier and Mqk, Akk and INV (without product warps), or the hand-over
                // to the product warps; product warps: the hand-back and the publish; consumers: the release and
                // the state's store (every 4th tile)
    T_REFILL,   // producers: the publish, EMPTY, the next copies' issue; consumers: o's store
    TIMING_SLOTS
};

using WarpTimer = LapTimer<TIMING_SLOTS, TIMING>;

}  // namespace kf

#if KF_TIMING
extern "C" __constant__ int kf_timing_slots = kf::TIMING_SLOTS;   // kf_timing's [slot] (its warps: kf_threads / 32)
extern "C" {
__device__ unsigned int* kf_timing = nullptr;   // [CTAs][warps][TIMING_SLOTS] cycles: the host's buffer, or none
}
#endif

namespace kf {

// This warp's row of kf_timing (the grid is one-dimensional); null where the host pointed no buffer, and in the
// other builds, whose WarpTimer writes nothing
__device__ __forceinline__ unsigned int* timing_row(int warp) {
#if KF_TIMING
    if (kf_timing == nullptr) return nullptr;
    return kf_timing + (static_cast<long long>(blockIdx.x) * (THREADS / 32) + warp) * TIMING_SLOTS;
#else
    return nullptr;
#endif
}

}  // namespace kf
