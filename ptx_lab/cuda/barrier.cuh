// ptx_lab/cuda/barrier.cuh -- named CTA barriers (bar.sync / bar.arrive).
//
// Barrier 0 is __syncthreads(); ids 1..15 are free for producer/consumer
// hand-offs. `threads` counts every thread that will sync or arrive on the id
// in one phase and must be a multiple of 32. bar.arrive does not wait: a
// producer arrives after writing shared memory (release), the consumers
// bar.sync on the same id before reading it (acquire).
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

}  // namespace ptx_lab
