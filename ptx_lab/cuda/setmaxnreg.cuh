// ptx_lab/cuda/setmaxnreg.cuh -- warpgroup register reallocation (sm_90a).
//
// A CTA launches with one register count for every thread (the kernel's, at most
// 65536 / threads). setmaxnreg moves registers between warpgroups (4 aligned warps,
// warps 4w .. 4w + 3) through a per-CTA pool: .dec gives a warpgroup's registers above
// the new count back, .inc blocks until the pool can raise it. ptxas allocates the code
// after each instruction within its count, so a warp-specialised kernel can give its
// accumulator-holding warps more registers than 65536 / threads allows, paid for by
// warps that need few.
//
// Rules (PTX ISA, setmaxnreg): every warp of a warpgroup executes the same instruction
// (.sync.aligned); the count is a multiple of 8 in [24, 256]; registers gained by .inc
// hold undefined values. The counts of a kernel must add up: sum over warpgroups of
// count * 128 <= the launch count * threads, or an .inc waits forever.
#pragma once
#include "common.cuh"

namespace ptx_lab {

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS) : "memory");
}

}  // namespace ptx_lab
