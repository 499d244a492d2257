// ptx_lab/cuda/bulk.cuh -- Hopper (sm_90) bulk copies and the mbarrier that
// tracks them.
//
// cp.async.bulk moves one contiguous run of bytes (a multiple of 16, both ends
// 16-byte aligned) between global and shared memory with ONE instruction of ONE
// thread, through the async proxy (the copy engine), not through the issuing
// thread's load/store path. Compare cp.async (cp_async.cuh): 16 bytes per thread
// per instruction, so a 256-byte row is 16 thread-copies and a 16-token tile of
// q, k, gc, do is hundreds of them, all queued in the SM's global-memory (LG)
// queue.
//
// global -> shared completes on an mbarrier (mbarrier.cuh, an 8-byte shared-memory object):
//   * mbarrier_init(bar, count): the barrier expects `count` arrivals per phase.
//   * mbarrier_arrive_expect_tx(bar, bytes): one arrival, and `bytes` more
//     transaction bytes to wait for in the current phase.
//   * each bulk copy names the barrier and, when its bytes land, takes them off
//     the phase's transaction count.
//   * the phase completes when both its arrivals and its transaction bytes are
//     all in; its parity (0, 1, 0, ...) then flips. mbarrier_wait_parity(bar, p)
//     returns once the phase with parity p has completed; a thread that returns
//     from it sees the copied bytes.
// The arrive may come before or after the copies are issued: when bytes land
// before the expect_tx, the phase's tx-count goes negative for a while (the
// arrival count never does). Limits: count 1 .. 2^20 - 1, and the tx-count stays
// within +-(2^20 - 1), so one phase expects under 1 MiB. ptx_lab.model.MBarrier
// models all of this.
//
// One instruction per copy is per THREAD: when the lanes of a warp each issue a
// copy, the compiler emits a loop that sends one UBLKCP per lane, one after
// another (kernel A measured ~60 cycles per 32..512-byte copy that way;
// docs/log/13-bulk-copies.md).
//
// shared -> global is tracked per thread in bulk groups, like cp.async groups:
// commit, then wait until at most N groups still READ shared memory (the source
// may then be overwritten) or are still pending at all. Shared memory written by
// ordinary stores must be made visible to the async proxy first:
// fence_proxy_async_shared() after the writes (and before the barrier / warp
// sync that hands the buffer to the issuing thread).
#pragma once
#include "mbarrier.cuh"

namespace ptx_lab {

// global -> shared (this CTA), `bytes` a multiple of 16, both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// shared (this CTA) -> global, in the issuing thread's current bulk group.
__device__ __forceinline__ void cp_async_bulk_s2g(void* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// At most N of this thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

// At most N of this thread's bulk groups are still pending (writes done).
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}

// Orders this thread's earlier ordinary shared-memory writes before later
// async-proxy accesses (a bulk store reading them).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace ptx_lab
