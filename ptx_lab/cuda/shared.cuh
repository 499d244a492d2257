// ptx_lab/cuda/shared.cuh -- ld.shared / st.shared of 2, 4, 8 and 16 bytes, one instruction per call.
//
// Each lane passes its own 32-bit shared address (smem_addr), aligned to the
// access size; the 8- and 16-byte forms move 2 / 4 consecutive b32 registers
// (the low register at the low address).
//
// Plain C++ loads and stores of a __shared__ array compile to the same
// LDS / STS. These helpers exist for the bank probes, which must execute
// "exactly one LDS.U16 here, every time". `asm volatile` alone does not give
// that: it binds only the C++ compiler, and ptxas happily merges repeated
// weak ld.shared of one address into one LDS (seen with nvcc 13.0). So the
// PTX itself is .volatile, which ptxas may neither merge, hoist nor drop; it
// still compiles to a plain LDS / STS. Kernel code that wants the compiler's
// freedom should keep using ordinary C++ accesses.
#pragma once
#include "common.cuh"

namespace ptx_lab {

// ---- loads: the loaded value(s) go to the return value / references ----
__device__ __forceinline__ u32 ld_shared_u16(u32 addr) {
    unsigned short v;
    asm volatile("ld.volatile.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_shared_b32(u32 addr) {
    u32 v;
    asm volatile("ld.volatile.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void ld_shared_v2_b32(u32& r0, u32& r1, u32 addr) {
    asm volatile("ld.volatile.shared.v2.b32 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ld_shared_v4_b32(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ld.volatile.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// ---- stores: the low 16 bits of v for the u16 form ----
__device__ __forceinline__ void st_shared_u16(u32 addr, u32 v) {
    asm volatile("st.volatile.shared.u16 [%0], %1;" :: "r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}
__device__ __forceinline__ void st_shared_b32(u32 addr, u32 v) {
    asm volatile("st.volatile.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v2_b32(u32 addr, u32 r0, u32 r1) {
    asm volatile("st.volatile.shared.v2.b32 [%0], {%1, %2};" :: "r"(addr), "r"(r0), "r"(r1) : "memory");
}
__device__ __forceinline__ void st_shared_v4_b32(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("st.volatile.shared.v4.b32 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

}  // namespace ptx_lab
