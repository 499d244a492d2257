// ptx_lab/cuda/ring.cuh -- a ring of shared-memory stages handed between producer and
// consumer warps by named barriers (barrier.cuh).
//
// Tile i of a walk goes through stage i % Stages. Each stage has two barriers, both counting
// Threads (every thread of both roles, a multiple of 32):
//     FULL(s)  = FirstId + s             producers arrive once stage s holds its tile;
//                                        consumers sync before reading it
//     EMPTY(s) = FirstId + Stages + s    consumers arrive once done reading stage s;
//                                        producers sync before overwriting it
// bar.arrive does not wait and bar.sync does; the barrier orders the shared-memory accesses of
// the threads on both sides (the producers' writes before the consumers' reads, the consumers'
// reads before the producers' next writes). A stage's first tile has no earlier reader, so
// its producers do not wait, and a tile whose stage is never used again is not released:
// every phase of every barrier then gets exactly Threads arrivals (refill_waits and releases
// below pair up one to one), whatever the number of tiles.
// Ids FirstId .. END_ID - 1 are the ring's; a kernel numbers its other barriers from END_ID.
// Id 0 is __syncthreads; a CTA has 16, so FirstId + 2 Stages <= 16. (The parameters are not
// spelt in capitals: the kernels' knobs, NSTAGE among them, are macros.)
//
// ptx_lab.ring is the CPU model (the ids, and a walk of both roles over any interleaving that
// checks every hand-off); ring_probes.cu runs this code for ptx_lab.device.
#pragma once
#include "barrier.cuh"

namespace ptx_lab {

template <int Stages, u32 Threads, u32 FirstId = 1>
struct BarrierRing {
    static_assert(Stages >= 1 && FirstId >= 1 && FirstId + 2 * Stages <= 16,
                  "a ring's 2 Stages barriers take ids FirstId .. FirstId + 2 Stages - 1 of 1..15");
    static_assert(Threads % 32 == 0, "named barriers count whole warps");
    static constexpr u32 END_ID = FirstId + 2 * Stages;   // the first id after the ring's

    __device__ static __forceinline__ u32 full_id(int s) { return FirstId + s; }
    __device__ static __forceinline__ u32 empty_id(int s) { return FirstId + Stages + s; }

    // Producers: stage s holds its tile (no wait).
    __device__ static __forceinline__ void publish(int s) { named_barrier_arrive(full_id(s), Threads); }
    // Consumers: wait until stage s holds its tile.
    __device__ static __forceinline__ void wait_full(int s) { named_barrier_sync(full_id(s), Threads); }
    // Consumers: done reading stage s (no wait).
    __device__ static __forceinline__ void release(int s) { named_barrier_arrive(empty_id(s), Threads); }
    // Producers: wait until stage s may be overwritten.
    __device__ static __forceinline__ void wait_empty(int s) { named_barrier_sync(empty_id(s), Threads); }

    // Whether the consumers of tile i release its stage: only if tile i + Stages exists.
    __device__ static __forceinline__ bool releases(int i, int ntiles) { return i + Stages < ntiles; }
    // Whether the producers of tile j wait for its stage: only if tile j exists and the stage
    // held tile j - Stages.
    __device__ static __forceinline__ bool refill_waits(int j, int ntiles) { return j < ntiles && j >= Stages; }
    // Producers of tile j: wait until its stage may be overwritten, where refill_waits says so.
    // (The predicate is written out: called through refill_waits, the forward-state scan's
    // producer loop compiles to other SASS.)
    __device__ static __forceinline__ void wait_to_refill(int j, int ntiles) {
        if (j < ntiles && j >= Stages) wait_empty(j % Stages);
    }
};

}  // namespace ptx_lab
