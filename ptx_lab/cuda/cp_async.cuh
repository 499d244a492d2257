// ptx_lab/cuda/cp_async.cuh -- cp.async (sm_80+): global -> shared copies that
// bypass registers and complete asynchronously, in commit groups.
//
// Each thread copies its own `BYTES` (4, 8 or 16; .cg allows only 16) from
// `src` (global, BYTES-aligned) to `dst` (32-bit shared address, BYTES-aligned).
// The zfill forms copy `src_bytes` (0..BYTES) and write zeros to the rest:
// src_bytes = 0 writes BYTES zeros without reading global memory, which is how
// rows past a sequence end are cleared.
// .ca caches in L1 and L2, .cg only in L2 (16-byte copies only).
// A thread sees its copies in shared memory after cp_async_wait<N>() leaves at
// most N of its committed groups pending; other threads see them after a
// barrier that follows that wait.
#pragma once
#include "common.cuh"

namespace ptx_lab {

template <int BYTES>
__device__ __forceinline__ void cp_async_ca(u32 dst, const void* src) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async.ca copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(dst), "l"(src), "n"(BYTES) : "memory");
}

template <int BYTES>
__device__ __forceinline__ void cp_async_ca_zfill(u32 dst, const void* src, u32 src_bytes) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async.ca copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
                 :: "r"(dst), "l"(src), "n"(BYTES), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_cg16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_cg16_zfill(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

}  // namespace ptx_lab
