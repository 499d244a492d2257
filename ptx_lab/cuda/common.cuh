// ptx_lab/cuda/common.cuh -- shared-address conversion and register packing.
//
// Every ptx_lab header includes this one. It must compile under NVRTC (CuPy
// RawModule) and nvcc alike, so it uses no standard headers.
#pragma once

namespace ptx_lab {

typedef unsigned int u32;
typedef unsigned long long u64;

// Generic pointer -> 32-bit shared-state-space address, the operand form that
// ldmatrix / stmatrix / cp.async take. The pointer must point into __shared__.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// Two fp32 -> one b32 register holding two bf16 (round to nearest even).
// `lo` lands in bits 0..15, `hi` in bits 16..31: the element with the lower
// column index of a fragment pair goes to `lo` (PTX packs the first source
// operand into the upper half, hence the swapped operand order).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Same for two f16.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

}  // namespace ptx_lab
