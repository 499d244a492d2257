// ptx_lab/cuda/probes.cu -- one single-warp probe kernel per primitive variant.
//
// Each probe does the least that observes one instruction: copy a shared-
// memory image in from global memory, apply the primitive with per-lane
// addresses / registers read from global memory, and dump the registers or
// the shared-memory image back to global memory. ptx_lab/device.py launches
// them (grid 1, block 32) as the GPU twins of ptx_lab.model and the tests
// compare the two bit for bit.
//
// Every probe that touches shared memory takes its image through dynamic
// shared memory: the launch passes `image_bytes` (a multiple of 16, at most
// 48 KiB so no opt-in is needed) as the dynamic shared size, and the kernel
// sees `image_chunks = image_bytes / 16` uint4 chunks.
//
// No asm here: every instruction comes from the headers, the same ones the
// experiments and Kernel A include.
#include "common.cuh"
#include "cp_async.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "movmatrix.cuh"
#include "stmatrix.cuh"

namespace ptx_lab {
namespace probes {

constexpr int WARP = 32;

// smem: (image_chunks,) uint4, 16-B aligned: ldmatrix/stmatrix rows and
// 16-byte cp.async need 16-byte-aligned shared addresses.
extern __shared__ uint4 smem_image[];

// global -> shared, every lane strides over the chunks, then the warp syncs so
// that each lane sees every other lane's stores before the primitive runs.
__device__ __forceinline__ void image_in(const uint4* __restrict__ image, u32 image_chunks) {
    for (u32 i = threadIdx.x; i < image_chunks; i += WARP) smem_image[i] = image[i];
    __syncthreads();
}

// shared -> global, after a barrier that makes every lane's writes visible.
__device__ __forceinline__ void image_out(uint4* __restrict__ out, u32 image_chunks) {
    __syncthreads();
    for (u32 i = threadIdx.x; i < image_chunks; i += WARP) out[i] = smem_image[i];
}

// Byte offset into the image -> 32-bit shared address.
__device__ __forceinline__ u32 image_addr(u32 byte_offset) {
    return smem_addr(smem_image) + byte_offset;
}

// ---- ldmatrix: addrs (32,) byte offsets -> out (32, NUM) u32, row-major ----
template <int NUM, bool TRANS>
__device__ __forceinline__ void ldmatrix_probe(const uint4* image, u32 image_chunks,
                                               const u32* addrs, u32* out) {
    image_in(image, image_chunks);
    const u32 lane = threadIdx.x;
    const u32 addr = image_addr(addrs[lane]);
    u32 r[4] = {0, 0, 0, 0};
    if constexpr (NUM == 1) {
        if constexpr (TRANS) ldmatrix_x1_trans(r[0], addr); else ldmatrix_x1(r[0], addr);
    } else if constexpr (NUM == 2) {
        if constexpr (TRANS) ldmatrix_x2_trans(r[0], r[1], addr); else ldmatrix_x2(r[0], r[1], addr);
    } else {
        if constexpr (TRANS) ldmatrix_x4_trans(r, addr); else ldmatrix_x4(r, addr);
    }
#pragma unroll
    for (int i = 0; i < NUM; ++i) out[lane * NUM + i] = r[i];
}

// ---- stmatrix: addrs (32,), regs (32, NUM) u32 row-major -> new image ----
template <int NUM, bool TRANS>
__device__ __forceinline__ void stmatrix_probe(const uint4* image, u32 image_chunks,
                                               const u32* addrs, const u32* regs, uint4* out) {
    image_in(image, image_chunks);
    const u32 lane = threadIdx.x;
    const u32 addr = image_addr(addrs[lane]);
    u32 r[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < NUM; ++i) r[i] = regs[lane * NUM + i];
    if constexpr (NUM == 1) {
        if constexpr (TRANS) stmatrix_x1_trans(addr, r[0]); else stmatrix_x1(addr, r[0]);
    } else if constexpr (NUM == 2) {
        if constexpr (TRANS) stmatrix_x2_trans(addr, r[0], r[1]); else stmatrix_x2(addr, r[0], r[1]);
    } else {
        if constexpr (TRANS) stmatrix_x4_trans(addr, r[0], r[1], r[2], r[3]);
        else stmatrix_x4(addr, r[0], r[1], r[2], r[3]);
    }
    image_out(out, image_chunks);
}

// ---- cp.async: lane copies BYTES from gmem + src[lane] to image + dst[lane] ----
// ZFILL: copy src_bytes[lane] bytes and zero the rest of the BYTES.
template <int BYTES, bool CG, bool ZFILL>
__device__ __forceinline__ void cp_async_probe(const uint4* image, u32 image_chunks,
                                               const unsigned char* gmem, const u32* dst,
                                               const u32* src, const u32* src_bytes, uint4* out) {
    static_assert(!CG || BYTES == 16, "cp.async.cg copies 16 bytes only");
    image_in(image, image_chunks);
    const u32 lane = threadIdx.x;
    const u32 d = image_addr(dst[lane]);
    const void* s = gmem + src[lane];
    if constexpr (CG) {
        if constexpr (ZFILL) cp_async_cg16_zfill(d, s, src_bytes[lane]); else cp_async_cg16(d, s);
    } else {
        if constexpr (ZFILL) cp_async_ca_zfill<BYTES>(d, s, src_bytes[lane]); else cp_async_ca<BYTES>(d, s);
    }
    cp_async_commit();
    cp_async_wait<0>();  // this lane's copy has landed; image_out's barrier publishes it
    image_out(out, image_chunks);
}

}  // namespace probes
}  // namespace ptx_lab

using namespace ptx_lab;
using namespace ptx_lab::probes;

// ---------------------------------------------------------------- ldmatrix
#define PTX_LAB_LDMATRIX_PROBE(NAME, NUM, TRANS)                                           \
    extern "C" __global__ void __launch_bounds__(WARP)                                    \
    NAME(const uint4* image, u32 image_chunks, const u32* addrs, u32* out) {               \
        ldmatrix_probe<NUM, TRANS>(image, image_chunks, addrs, out);                      \
    }
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x1, 1, false)
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x2, 2, false)
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x4, 4, false)
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x1_trans, 1, true)
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x2_trans, 2, true)
PTX_LAB_LDMATRIX_PROBE(probe_ldmatrix_x4_trans, 4, true)

// ---------------------------------------------------------------- stmatrix
#define PTX_LAB_STMATRIX_PROBE(NAME, NUM, TRANS)                                           \
    extern "C" __global__ void __launch_bounds__(WARP)                                    \
    NAME(const uint4* image, u32 image_chunks, const u32* addrs, const u32* regs,         \
         uint4* out) {                                                                     \
        stmatrix_probe<NUM, TRANS>(image, image_chunks, addrs, regs, out);                \
    }
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x1, 1, false)
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x2, 2, false)
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x4, 4, false)
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x1_trans, 1, true)
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x2_trans, 2, true)
PTX_LAB_STMATRIX_PROBE(probe_stmatrix_x4_trans, 4, true)

// -------------------------------------------------------------- x4 lanes
// The .x4 recipe of ldmatrix.cuh (X4Lane), no instruction: out (32, 4) int, each lane's
// (row, col) in a 16x16 tile, rows first then cols first (ptx_lab.fragments.x4_lane_row_col).
extern "C" __global__ void __launch_bounds__(WARP)
probe_x4_lanes(int* out) {
    const int lane = threadIdx.x;
    const X4Lane x = x4_lane(lane);
    out[lane * 4 + 0] = x.row + x.rows_first_mat_row();
    out[lane * 4 + 1] = x.rows_first_mat_col();
    out[lane * 4 + 2] = x.row + x.cols_first_mat_row();
    out[lane * 4 + 3] = x.cols_first_mat_col();
}

// --------------------------------------------------------------- movmatrix
// in, out: (32,) u32, one b32 fragment register per lane.
extern "C" __global__ void __launch_bounds__(WARP)
probe_movmatrix_trans(const u32* in, u32* out) {
    const u32 lane = threadIdx.x;
    out[lane] = movmatrix_trans(in[lane]);
}

// --------------------------------------------------------------------- mma
// a: (32, 4) u32, b: (32, 2) u32, c: (32, 4) f32 -> d: (32, 4) f32, row-major.
#define PTX_LAB_MMA_PROBE(NAME, FN)                                                        \
    extern "C" __global__ void __launch_bounds__(WARP)                                    \
    NAME(const u32* a_in, const u32* b_in, const float* c_in, float* d_out) {             \
        const u32 lane = threadIdx.x;                                                      \
        u32 a[4], b[2];                                                                    \
        float c[4], d[4];                                                                  \
        _Pragma("unroll") for (int i = 0; i < 4; ++i) a[i] = a_in[lane * 4 + i];           \
        _Pragma("unroll") for (int i = 0; i < 2; ++i) b[i] = b_in[lane * 2 + i];           \
        _Pragma("unroll") for (int i = 0; i < 4; ++i) c[i] = c_in[lane * 4 + i];           \
        FN(d, a, b, c);                                                                    \
        _Pragma("unroll") for (int i = 0; i < 4; ++i) d_out[lane * 4 + i] = d[i];          \
    }
PTX_LAB_MMA_PROBE(probe_mma_m16n8k16_bf16, mma_m16n8k16_bf16)
PTX_LAB_MMA_PROBE(probe_mma_m16n8k16_f16, mma_m16n8k16_f16)

// ---------------------------------------------------------------- cp.async
// gmem: source bytes; dst, src: (32,) byte offsets; src_bytes: (32,) or unused.
#define PTX_LAB_CP_ASYNC_PROBE(NAME, BYTES, CG, ZFILL)                                     \
    extern "C" __global__ void __launch_bounds__(WARP)                                    \
    NAME(const uint4* image, u32 image_chunks, const unsigned char* gmem, const u32* dst, \
         const u32* src, const u32* src_bytes, uint4* out) {                               \
        cp_async_probe<BYTES, CG, ZFILL>(image, image_chunks, gmem, dst, src, src_bytes,   \
                                         out);                                             \
    }
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca4, 4, false, false)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca8, 8, false, false)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca16, 16, false, false)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_cg16, 16, true, false)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca4_zfill, 4, false, true)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca8_zfill, 8, false, true)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_ca16_zfill, 16, false, true)
PTX_LAB_CP_ASYNC_PROBE(probe_cp_async_cg16_zfill, 16, true, true)
