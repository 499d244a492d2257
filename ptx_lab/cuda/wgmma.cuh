// ptx_lab/cuda/wgmma.cuh -- warpgroup MMA (wgmma.mma_async, sm_90a), bf16 in, f32 out.
//
// A warpgroup is 4 aligned warps (128 threads, warps 4w .. 4w + 3) that issue one
// wgmma together. m64nNk16: D [64 x N] (+)= A [64 x 16] @ B [16 x N].
//   - A from registers: warp w of the warpgroup supplies rows 16w .. 16w + 15 in exactly
//     the A fragment of mma.sync m16n8k16 (mma.cuh): so an accumulator packed to bf16
//     pairs is an A operand here too.
//   - B from shared memory, named by a 64-bit matrix descriptor (wgmma_desc below).
//   - D: warp w holds rows 16w .. 16w + 15; its N/2 floats a thread are the m16n8 C
//     fragments of the N/8 column blocks in order: d[4j + e] is row 16w + g + 8 (e >> 1),
//     column 8j + 2t + (e & 1), g = lane / 4, t = lane % 4.
// The model of all three (and of the descriptor) is ptx_lab.model.wgmma_*.
//
// The instruction is asynchronous:
//   wgmma_fence()          before the first wgmma, and after registers it reads (d, a) were
//                          written by other instructions;
//   wgmma_commit_group()   closes the group of wgmmas issued so far;
//   wgmma_wait_group<N>()  waits until at most N groups are pending; only then may d be
//                          read or a / shared B be overwritten.
// Shared memory written by ordinary stores must be made visible to the async proxy
// (fence_proxy_async_shared(), bulk.cuh) and synchronised before a wgmma reads it.
//
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs an sm_90a build: nvcc -gencode=arch=compute_90a,code=sm_90a, NVRTC -arch=sm_90a (ptx_lab.gpu does this on compute capability 9.0)"
#endif

namespace ptx_lab {

// Shared-memory matrix descriptor (PTX ISA, "matrix descriptor"): bits 0-13 start address
// >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4,
// 49-51 base offset (0 here), 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B). Without a
// swizzle the operand is made of core matrices of 8 rows x 16 bytes (8 x 8 bf16, rows 16 B
// apart, 128 B each). In both majors lbo steps between the core matrices of k 0-7 and
// 8-15 and sbo between blocks of 8 n (CUTLASS's canonical INTERLEAVE layouts):
//   K-major B (TRANS_B 0; a core matrix's rows are n, its 16 bytes 8 consecutive k):
//     byte of B[k][n] = start + (n / 8) * sbo + (k / 8) * lbo + (n % 8) * 16 + (k % 8) * 2
//   N-major B (TRANS_B 1; rows are k, the 16 bytes 8 consecutive n):
//     byte of B[k][n] = start + (n / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (n % 8) * 2
// So one shared tile X[r][c] stored as (r % 8) * 16 + (c % 8) * 2 + (r / 8) * R + (c / 8) * Q
// is B = X^T K-major (lbo Q, sbo R) and B = X N-major (lbo R, sbo Q) alike.
__device__ __forceinline__ u64 wgmma_desc(u32 smem_address, u32 lbo_bytes, u32 sbo_bytes, u32 swizzle) {
    return (u64)((smem_address & 0x3FFFFu) >> 4) | ((u64)((lbo_bytes & 0x3FFFFu) >> 4) << 16) |
           ((u64)((sbo_bytes & 0x3FFFFu) >> 4) << 32) | ((u64)(swizzle & 3u) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// m64n16k16: D[64][16] (+)= A[64][16] @ B[16][16], A from registers, B from shared memory.
// d: 8 floats a thread (accumulator layout above); a: the warp's 4 A registers.
// scale_d 0 ignores d's old value (D = A @ B), 1 accumulates. TRANS_B 0: B is K-major in
// shared memory (the 8 k of one n contiguous), 1: N-major.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n16k16_bf16_rs(float (&d)[8], const u32 (&a)[4], u64 desc_b, int scale_d) {
    static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B is 0 (K-major B) or 1 (N-major B)");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B)
        : "memory");
}

// m64n128k16: D[64][128] (+)= A[64][16] @ B[16][128], A from registers, B from shared memory.
// d: 64 floats a thread (accumulator layout above); a: the warp's 4 A registers.
// scale_d 0 ignores d's old value (D = A @ B), 1 accumulates. TRANS_B 0: B is K-major in
// shared memory (the 8 k of one n contiguous), 1: N-major.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const u32 (&a)[4], u64 desc_b, int scale_d) {
    static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B is 0 (K-major B) or 1 (N-major B)");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B)
        : "memory");
}

}  // namespace ptx_lab
