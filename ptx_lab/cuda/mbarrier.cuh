// ptx_lab/cuda/mbarrier.cuh -- the mbarrier: an 8-byte shared-memory object that counts
// arrivals (and, for async copies, transaction bytes) per phase.
//
//   * mbarrier_init(bar, count): phase 0, `count` arrivals expected per phase.
//   * mbarrier_arrive(bar): one arrival on the current phase. It has release semantics at
//     CTA scope: this thread's earlier memory accesses happen before whatever follows a wait
//     that sees the phase complete.
//   * the phase completes once all its arrivals (and transaction bytes: bulk.cuh) are in; its
//     parity (0, 1, 0, ...) then flips and the count starts again.
//   * mbarrier_wait_parity(bar, p): returns once the phase with parity p has completed, with
//     acquire semantics. The hardware keeps only the parity, so a waiter must be at most one
//     phase behind: it cannot tell phase 0 from phase 2.
// Unlike a named barrier (barrier.cuh), the object lives in shared memory and its arrivals and
// waits are separate instructions on an address, which is what lets compute-sanitizer's
// racecheck follow a hand-off through it (ring.cuh's MbarrierRing). ptx_lab.model.MBarrier
// models its state.
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

// Makes mbarrier_init visible to the async proxy and the other threads; follow it
// with a CTA-wide barrier before any thread uses the mbarrier.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// true once the phase with this parity has completed. Without a suspend-time
// hint (none is passed) the hardware may park the thread for a system-dependent
// time before it returns false.
__device__ __forceinline__ bool mbarrier_try_wait_parity(u32 bar, u32 parity) {
    u32 done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbarrier_wait_parity(u32 bar, u32 parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

}  // namespace ptx_lab
