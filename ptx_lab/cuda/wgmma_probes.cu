// ptx_lab/cuda/wgmma_probes.cu -- one warpgroup (128 threads) runs one wgmma.mma_async
// m64nNk16 bf16 -> f32 with A from registers and B from shared memory, so that
// ptx_lab.device.wgmma_m64nNk16_rs can be compared with ptx_lab.model's.
//
// The CTA copies a shared-memory image in (ordinary stores, then the async-proxy fence
// and a barrier, since wgmma reads shared memory through the async proxy), each thread
// loads its 4 A registers and its N / 2 accumulators, and the warpgroup issues
// fence, wgmma, commit, wait 0 before the accumulators go back out.
//
#include "common.cuh"
#include "bulk.cuh"
#include "wgmma.cuh"

namespace ptx_lab {
namespace wgmma_probes {

constexpr int THREADS = 128;
extern __shared__ uint4 smem_image[];

template <int N, int TRANS_B>
__device__ __forceinline__ void run(const uint4* __restrict__ image, u32 image_chunks, const u32* __restrict__ a,
                                    const float* __restrict__ c, u32 lbo, u32 sbo, u32 start, int scale_d,
                                    float* __restrict__ d) {
    for (u32 i = threadIdx.x; i < image_chunks; i += THREADS) smem_image[i] = image[i];
    fence_proxy_async_shared();   // the generic stores above, before the async proxy reads them
    __syncthreads();
    u32 ar[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) ar[r] = a[threadIdx.x * 4 + r];
    float acc[N / 2];
#pragma unroll
    for (int r = 0; r < N / 2; ++r) acc[r] = c[threadIdx.x * (N / 2) + r];
    const u64 desc = wgmma_desc(smem_addr(smem_image) + start, lbo, sbo, 0);
    wgmma_fence();
    if constexpr (N == 16) wgmma_m64n16k16_bf16_rs<TRANS_B>(acc, ar, desc, scale_d);
    else wgmma_m64n128k16_bf16_rs<TRANS_B>(acc, ar, desc, scale_d);
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < N / 2; ++r) d[threadIdx.x * (N / 2) + r] = acc[r];
}

}  // namespace wgmma_probes
}  // namespace ptx_lab

using namespace ptx_lab;

#define PTX_LAB_WGMMA_PROBE(NAME, N, TRANS_B)                                                     \
    extern "C" __global__ void __launch_bounds__(wgmma_probes::THREADS)                          \
    NAME(const uint4* image, u32 image_chunks, const u32* a, const float* c, u32 lbo, u32 sbo,    \
         u32 start, int scale_d, float* d) {                                                      \
        wgmma_probes::run<N, TRANS_B>(image, image_chunks, a, c, lbo, sbo, start, scale_d, d);   \
    }
PTX_LAB_WGMMA_PROBE(probe_wgmma_m64n16k16_bf16_rs, 16, 0)
PTX_LAB_WGMMA_PROBE(probe_wgmma_m64n128k16_bf16_rs, 128, 0)
PTX_LAB_WGMMA_PROBE(probe_wgmma_m64n16k16_bf16_rs_nmajor, 16, 1)
PTX_LAB_WGMMA_PROBE(probe_wgmma_m64n128k16_bf16_rs_nmajor, 128, 1)
