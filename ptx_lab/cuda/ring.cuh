// ptx_lab/cuda/ring.cuh -- a ring of shared-memory stages handed between producer and
// consumer warps, by named barriers (BarrierRing, barrier.cuh) or by mbarriers (MbarrierRing,
// mbarrier.cuh).
//
// BarrierRing
// -----------
// Tile i of a walk goes through stage i % Stages. Each stage has two barriers:
//     FULL(s)  = FirstId + s             producers arrive once stage s holds its tile;
//                                        consumers sync before reading it
//     EMPTY(s) = FirstId + Stages + s    consumers arrive once done reading stage s;
//                                        producers sync before overwriting it
// FULL counts Threads (every thread of every role, a multiple of 32), EMPTY counts EmptyThreads
// (by default Threads). A kernel gives EMPTY fewer where a role only adds to a stage's tile and
// never refills a stage: it arrives on FULL with the producers and stays off EMPTY, so it never
// waits for the consumers. Such a role must reach a stage's next tile only through a hand-off
// from the producers that refill it (they waited on EMPTY), or it could write into a tile the
// consumers still read.
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
//
// MbarrierRing
// ------------
// The same hand-off on 2 Stages mbarriers in shared memory: FULL(s) expects one arrival from
// each of the Producers threads, EMPTY(s) one from each of the Consumers threads, and a wait
// names the phase it waits for by its parity. Tile i is stage s = i % Stages's use number
// u = i / Stages, which is phase u of FULL(s) (the consumers wait for parity u & 1) and, for
// its refill, phase u - 1 of EMPTY(s) (the producers of tile i wait for parity (u - 1) & 1):
// so its calls take the TILE, not the stage. Each thread arrives for itself, so every thread's
// own writes (or reads) are ordered by its own release; no warp-wide sync is needed first.
// What it costs over BarrierRing: 16 bytes of shared memory per stage and a one-thread init
// followed by a CTA barrier; what it gains: the arrivals and waits are memory operations on an
// address, which compute-sanitizer's racecheck follows, where it misreads named-barrier
// hand-offs of cp.async data (kernel/tools/racecheck_probes.cu), and it needs no barrier id.
// The same pairing of releases and refill waits keeps every phase whole, so no parity is ever
// two phases behind.
//
// ptx_lab.ring is the CPU model of both (the ids and parities, and walks of both roles over any
// interleaving that check every hand-off); ring_probes.cu runs this code for ptx_lab.device.
#pragma once
#include "barrier.cuh"
#include "mbarrier.cuh"

namespace ptx_lab {

template <int Stages, u32 Threads, u32 FirstId = 1, u32 EmptyThreads = Threads>
struct BarrierRing {
    static_assert(Stages >= 1 && FirstId >= 1 && FirstId + 2 * Stages <= 16,
                  "a ring's 2 Stages barriers take ids FirstId .. FirstId + 2 Stages - 1 of 1..15");
    static_assert(Threads % 32 == 0 && EmptyThreads % 32 == 0, "named barriers count whole warps");
    static_assert(EmptyThreads >= 64 && EmptyThreads <= Threads,
                  "EMPTY counts the consumers and the producers, a warp each at least, and no more than FULL");
    static constexpr u32 END_ID = FirstId + 2 * Stages;   // the first id after the ring's

    __device__ static __forceinline__ u32 full_id(int s) { return FirstId + s; }
    __device__ static __forceinline__ u32 empty_id(int s) { return FirstId + Stages + s; }

    // Producers: stage s holds its tile (no wait).
    __device__ static __forceinline__ void publish(int s) { named_barrier_arrive(full_id(s), Threads); }
    // Consumers: wait until stage s holds its tile.
    __device__ static __forceinline__ void wait_full(int s) { named_barrier_sync(full_id(s), Threads); }
    // Consumers: done reading stage s (no wait).
    __device__ static __forceinline__ void release(int s) { named_barrier_arrive(empty_id(s), EmptyThreads); }
    // Producers: wait until stage s may be overwritten.
    __device__ static __forceinline__ void wait_empty(int s) { named_barrier_sync(empty_id(s), EmptyThreads); }

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

template <int Stages, u32 Producers, u32 Consumers>
struct MbarrierRing {
    static_assert(Stages >= 1, "a ring has at least one stage");
    static_assert(Producers >= 1 && Consumers >= 1, "each side has at least one thread");

    u64 full[Stages];    // FULL(s): Producers arrivals per phase
    u64 empty[Stages];   // EMPTY(s): Consumers arrivals per phase

    // One thread, before any other use; then a CTA-wide barrier (__syncthreads) so that every
    // thread sees the initialised objects.
    __device__ __forceinline__ void init() {
#pragma unroll 1
        for (int s = 0; s < Stages; ++s) {
            mbarrier_init(smem_addr(&full[s]), Producers);
            mbarrier_init(smem_addr(&empty[s]), Consumers);
        }
    }

    // The parity of FULL's phase that hands tile i to the consumers.
    __device__ static __forceinline__ u32 full_parity(int i) { return (i / Stages) & 1; }
    // The parity of EMPTY's phase that frees tile j's stage of tile j - Stages.
    __device__ static __forceinline__ u32 refill_parity(int j) { return (j / Stages + 1) & 1; }

    // Producers: tile i is in its stage (no wait).
    __device__ __forceinline__ void publish(int i) { mbarrier_arrive(smem_addr(&full[i % Stages])); }
    // Consumers: wait until tile i is in its stage.
    __device__ __forceinline__ void wait_full(int i) {
        mbarrier_wait_parity(smem_addr(&full[i % Stages]), full_parity(i));
    }
    // Consumers: done reading tile i's stage (no wait).
    __device__ __forceinline__ void release(int i) { mbarrier_arrive(smem_addr(&empty[i % Stages])); }

    // Whether the consumers of tile i release its stage: only if tile i + Stages exists.
    __device__ static __forceinline__ bool releases(int i, int ntiles) { return i + Stages < ntiles; }
    // Whether the producers of tile j wait for its stage: only if tile j exists and the stage
    // held tile j - Stages.
    __device__ static __forceinline__ bool refill_waits(int j, int ntiles) { return j < ntiles && j >= Stages; }
    // Producers of tile j: wait until its stage may be overwritten, where refill_waits says so.
    __device__ __forceinline__ void wait_to_refill(int j, int ntiles) {
        if (refill_waits(j, ntiles)) mbarrier_wait_parity(smem_addr(&empty[j % Stages]), refill_parity(j));
    }
};

}  // namespace ptx_lab
