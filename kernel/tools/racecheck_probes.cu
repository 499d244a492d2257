// kernel/tools/racecheck_probes.cu -- the probes with known answers that kernel.tools.racecheck runs
// under compute-sanitizer racecheck before the kernels, to calibrate how to read its reports.
//
// Each probe is one `extern "C" __global__ void <name>(float* out)`, launched as one CTA; the
// tool's PROBES list names it (its run name is the function's with '-' for '_') with its thread
// count, its answer by construction and what lane 0 of `out` must hold; the tool's docstring
// says what each probe asks. The hand-offs are ptx_lab's own: the FULL/EMPTY ring is ring.cuh's
// BarrierRing, the copies cp_async.cuh's, the reads ldmatrix.cuh's and wgmma.cuh's, so a probe
// checks the code the kernels run. A probe that copies its stages in reads them from a
// __device__ array at global scope, which the tool fills by its name before the launch.
#include "barrier.cuh"
#include "bulk.cuh"
#include "cp_async.cuh"
#include "ldmatrix.cuh"
#include "ring.cuh"
#include "wgmma.cuh"
using namespace ptx_lab;

// One producer warp (warp 1) and one consumer warp (warp 0); 2-stage ring of 32 floats.
// The consumer reads lane 31 - l's word so that every read crosses lanes.
constexpr int ITERS = 8, STAGES = 2, THREADS = 64;
using Ring = BarrierRing<STAGES, THREADS>;

template <bool LATE_LAST_SYNC>
__device__ void ring(float* out) {
    __shared__ float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 1) {
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            Ring::wait_to_refill(i, ITERS);
            buf[s][lane] = float(i * 32 + lane);
            Ring::publish(s);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            if (LATE_LAST_SYNC && i == ITERS - 1) {
                const long long t0 = clock64();
                while (clock64() - t0 < 2000000) {}
            }
            Ring::wait_full(s);
            acc += buf[s][31 - lane];
            if (Ring::releases(i, ITERS)) Ring::release(s);
        }
        out[lane] = acc;
    }
}

extern "C" __global__ void ring_arrive(float* out) { ring<false>(out); }
extern "C" __global__ void ring_arrive_exit(float* out) { ring<true>(out); }

// Two producer warps (1, 2) that first meet on a producers-only barrier (the first id after the
// ring's, as Kernel A's producers do before R1), then write and arrive on FULL; one consumer warp (0).
using Ring2 = BarrierRing<STAGES, 96>;

template <bool PRODUCER_BARRIER>
__device__ void ring2(float* out) {
    __shared__ float buf[STAGES][64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= 1) {
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            Ring2::wait_to_refill(i, ITERS);
            if (PRODUCER_BARRIER) named_barrier_sync(Ring2::END_ID, 64);
            buf[s][threadIdx.x - 32] = float(i * 32 + lane);
            Ring2::publish(s);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            Ring2::wait_full(s);
            acc += buf[s][63 - lane];
            if (Ring2::releases(i, ITERS)) Ring2::release(s);
        }
        out[lane] = acc;
    }
}
extern "C" __global__ void ring2_arrive(float* out) { ring2<false>(out); }
extern "C" __global__ void ring2_producer_bar(float* out) { ring2<true>(out); }

// The ring of ring_arrive with the stages filled by cp.async, in Kernel A's order: the copy of
// tile i + 1 is issued after tile i's FULL arrive, into the stage the consumer left (EMPTY),
// and each tile's group is waited for before its FULL arrive. Race-free by construction: a
// report here means racecheck does not order cp.async writes by the barrier hand-off.
__device__ float ring_cp_async_src[ITERS][32];
extern "C" __global__ void ring_cp_async(float* out) {
    __shared__ __align__(16) float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 1) {
        cp_async_ca<4>(smem_addr(&buf[0][lane]), &ring_cp_async_src[0][lane]);
        cp_async_commit();
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            cp_async_wait<0>();
            Ring::publish(s);
            const int j = i + 1;
            if (j < ITERS) {
                Ring::wait_to_refill(j, ITERS);
                cp_async_ca<4>(smem_addr(&buf[j % STAGES][lane]), &ring_cp_async_src[j][lane]);
            }
            cp_async_commit();
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            Ring::wait_full(s);
            acc += buf[s][31 - lane];
            if (Ring::releases(i, ITERS)) Ring::release(s);
        }
        out[lane] = acc;
    }
}

// Stages of 64 words filled by cp.async (as ring_cp_async) and read whole by ldmatrix: lane l gets
// words l and 32 + l. CONSUMER_PAIR false: producer warps 1 and 2 copy a half each, consumer warp 0
// reads (Kernel A's consumers read words several producer warps copied). true: producer warp 2
// copies it all, consumer warps 0 and 1 meet on a consumers-only barrier (the first id after the
// ring's, as Kernel A's pair barriers) and then read (as Kernel A's two warps of a band do before
// G3). Race-free by construction either way.
__device__ float ring2_cp_async_src[ITERS][64];
template <bool CONSUMER_PAIR>
__device__ void ring2_cp_async(float* out) {
    __shared__ __align__(16) float buf[STAGES][64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (CONSUMER_PAIR ? warp == 2 : warp >= 1) {
        // this thread's words of a stage: lane and 32 + lane (one producer warp) or its half's one
        const int e0 = CONSUMER_PAIR ? lane : threadIdx.x - 32, step = CONSUMER_PAIR ? 32 : 64;
        for (int e = e0; e < 64; e += step) cp_async_ca<4>(smem_addr(&buf[0][e]), &ring2_cp_async_src[0][e]);
        cp_async_commit();
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            cp_async_wait<0>();
            Ring2::publish(s);
            const int j = i + 1;
            if (j < ITERS) {
                Ring2::wait_to_refill(j, ITERS);
                for (int e = e0; e < 64; e += step)
                    cp_async_ca<4>(smem_addr(&buf[j % STAGES][e]), &ring2_cp_async_src[j][e]);
            }
            cp_async_commit();
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES;
            Ring2::wait_full(s);
            if (CONSUMER_PAIR) named_barrier_sync(Ring2::END_ID, 64);
            u32 r0, r1;   // two 8 x 16-byte matrices: the stage's 64 words, row r at byte 16 r
            ldmatrix_x2(r0, r1, smem_addr(&buf[s][0]) + 16u * (lane & 15));
            acc += __uint_as_float(r0) + __uint_as_float(r1);
            if (Ring2::releases(i, ITERS)) Ring2::release(s);
        }
        if (warp == 0) out[lane] = acc;
    }
}
extern "C" __global__ void ring2_cp_async_ldmatrix(float* out) { ring2_cp_async<false>(out); }
extern "C" __global__ void ring2_consumer_bar(float* out) { ring2_cp_async<true>(out); }

// Kernel A's ring without its math: 4 stages, each tile's copies issued 3 tiles ahead (PREFETCH =
// NSTAGE - 1) after an EMPTY sync, as 16-byte cp.async.cg with a src-size (Kernel A's zero-fill
// form), by 4 producer warps (4-7) a quarter of a stage each; 4 consumer warps (0-3) each read the
// whole 512-byte stage by ldmatrix .trans and arrive on EMPTY; FULL and EMPTY count all 256
// threads. Race-free by construction: a report here is racecheck's reading of that shape.
// FENCE: the producers' fence.proxy.async before each FULL arrive, as Kernel A's R1 ends in its
// warpgroup-MMA builds. WGMMA: the consumers (one warpgroup) also read the stage through the async
// proxy, an m64n16k16 whose B is the stage's 512 bytes, and wait for it before EMPTY, as Kernel A's
// G4/G5 read qd and kd.
constexpr int KA_ITERS = 13, KA_WORDS = 128;
__device__ float kernel_a_ring_src[KA_ITERS][KA_WORDS];
// KA_STAGES: the ring's depth (FULL and EMPTY take barrier ids 1 .. 2 KA_STAGES).
// OWN_A: the warpgroup MMA takes A from registers of its own instead of the ldmatrix result.
// RELEASE_FENCE: a fence.proxy.async after the MMA's wait, before the EMPTY arrive.
// CONSUMERS: consumer warps (warps 0 .. CONSUMERS - 1; the 4 producer warps follow).
template <bool FENCE, bool WGMMA, bool OWN_A = false, bool RELEASE_FENCE = false, int KA_STAGES = 4,
          int CONSUMERS = 4>
__device__ void kernel_a_ring_t(float* out) {
    constexpr int KA_PREFETCH = KA_STAGES - 1, KA_THREADS = 32 * (CONSUMERS + 4);
    using KaRing = BarrierRing<KA_STAGES, KA_THREADS>;
    static_assert(!WGMMA || CONSUMERS == 4, "the warpgroup MMA needs four consumer warps");
    __shared__ __align__(16) float buf[KA_STAGES][KA_WORDS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= CONSUMERS) {
        const int chunk = (warp - CONSUMERS) * 8 + (lane & 7);   // 32 chunks of 16 bytes: lanes 0-7 of each warp
        auto issue = [&](int j) {
            if (j < KA_ITERS && lane < 8)
                cp_async_cg16_zfill(smem_addr(&buf[j % KA_STAGES][4 * chunk]), &kernel_a_ring_src[j][4 * chunk], 16u);
            cp_async_commit();   // one group per tile slot, possibly empty: uniform wait counts
        };
        for (int j = 0; j < KA_PREFETCH; ++j) issue(j);
        for (int i = 0; i < KA_ITERS; ++i) {
            cp_async_wait<KA_PREFETCH - 1>();   // this thread's copies of tile i landed
            __syncwarp();
            if (FENCE) fence_proxy_async_shared();
            KaRing::publish(i % KA_STAGES);
            const int j = i + KA_PREFETCH;
            KaRing::wait_to_refill(j, KA_ITERS);
            issue(j);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < KA_ITERS; ++i) {
            const int s = i % KA_STAGES;
            KaRing::wait_full(s);
            u32 r[4];   // four 8 x 16-byte matrices: the stage's 32 rows of 16 bytes, row l at byte 16 l
            ldmatrix_x4_trans(r, smem_addr(&buf[s][0]) + 16u * lane);
            acc += __uint_as_float(r[0]) + __uint_as_float(r[1]) + __uint_as_float(r[2]) + __uint_as_float(r[3]);
            if constexpr (WGMMA) {   // B [16 x 16] bf16 = the stage: core matrices 128 B apart (lbo), 256 B (sbo)
                float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                u32 own[4] = {0x3f803f80u * (lane & 1), 0u, 0u, 0u};   // bf16 ones in half the lanes
                wgmma_fence();
                wgmma_m64n16k16_bf16_rs<1>(d, OWN_A ? own : r, wgmma_desc(smem_addr(&buf[s][0]), 128, 256, 0), 0);
                wgmma_commit_group();
                wgmma_wait_group<0>();
                if (RELEASE_FENCE) fence_proxy_async_shared();
                acc += d[0];
            }
            // KaRing::releases(i, KA_ITERS) written out, as Kernel A writes it: through the function the
            // warpgroup-MMA probes compile to other SASS
            if (i + KA_STAGES < KA_ITERS) KaRing::release(s);
        }
        if (warp == 0) out[lane] = acc;
    }
}
extern "C" __global__ void kernel_a_ring(float* out) { kernel_a_ring_t<false, false>(out); }
extern "C" __global__ void kernel_a_ring_6(float* out) { kernel_a_ring_t<false, false, false, false, 6>(out); }
extern "C" __global__ void kernel_a_ring_1c(float* out) { kernel_a_ring_t<false, false, false, false, 4, 1>(out); }
extern "C" __global__ void kernel_a_ring_fence(float* out) { kernel_a_ring_t<true, false>(out); }
extern "C" __global__ void kernel_a_ring_wgmma(float* out) { kernel_a_ring_t<true, true>(out); }
extern "C" __global__ void kernel_a_ring_wgmma_own_a(float* out) { kernel_a_ring_t<true, true, true>(out); }
extern "C" __global__ void kernel_a_ring_wgmma_release_fence(float* out) {
    kernel_a_ring_t<true, true, false, true>(out);
}

// kernel_a_ring's copies and reads handed over by ring.cuh's MbarrierRing (the forward-state scan's
// shape on mbarriers): every producer thread (4 warps) arrives on FULL, every consumer
// thread on EMPTY, and each side waits for its phase by parity. Race-free by construction: hazards
// here would say racecheck misreads mbarrier hand-offs too. EARLY_RELEASE: the consumers release a
// stage before they read it, so the producers may refill it under the read: a real race, which the
// tool must report through mbarriers for a clean run above to mean anything.
template <int STAGES, int CONSUMERS, bool EARLY_RELEASE = false>
__device__ void mbarrier_ring_t(float* out) {
    constexpr int PREFETCH = STAGES - 1;
    using Ring = MbarrierRing<STAGES, 4 * 32, CONSUMERS * 32>;
    __shared__ __align__(16) float buf[STAGES][KA_WORDS];
    __shared__ Ring ring;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) ring.init();
    __syncthreads();
    if (warp >= CONSUMERS) {
        const int chunk = (warp - CONSUMERS) * 8 + (lane & 7);
        auto issue = [&](int j) {
            if (j < KA_ITERS && lane < 8)
                cp_async_cg16_zfill(smem_addr(&buf[j % STAGES][4 * chunk]), &kernel_a_ring_src[j][4 * chunk], 16u);
            cp_async_commit();
        };
        for (int j = 0; j < PREFETCH; ++j) issue(j);
        for (int i = 0; i < KA_ITERS; ++i) {
            cp_async_wait<PREFETCH - 1>();
            __syncwarp();
            ring.publish(i);
            const int j = i + PREFETCH;
            ring.wait_to_refill(j, KA_ITERS);
            issue(j);
        }
    } else {
        float acc = 0.f;
        for (int i = 0; i < KA_ITERS; ++i) {
            const int s = i % STAGES;
            ring.wait_full(i);
            if (EARLY_RELEASE && Ring::releases(i, KA_ITERS)) ring.release(i);
            u32 r[4];
            ldmatrix_x4_trans(r, smem_addr(&buf[s][0]) + 16u * lane);
            acc += __uint_as_float(r[0]) + __uint_as_float(r[1]) + __uint_as_float(r[2]) + __uint_as_float(r[3]);
            if (!EARLY_RELEASE && Ring::releases(i, KA_ITERS)) ring.release(i);
        }
        if (warp == 0) out[lane] = acc;
    }
}
extern "C" __global__ void mbarrier_ring(float* out) { mbarrier_ring_t<4, 4>(out); }
extern "C" __global__ void mbarrier_ring_6_1c(float* out) { mbarrier_ring_t<6, 1>(out); }
extern "C" __global__ void mbarrier_ring_early_release(float* out) { mbarrier_ring_t<4, 4, true>(out); }

// The same data flow as ring_arrive, ordered by __syncthreads.
extern "C" __global__ void ring_syncthreads(float* out) {
    __shared__ float buf[STAGES][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int i = 0; i < ITERS; ++i) {
        const int s = i % STAGES;
        if (warp == 1) buf[s][lane] = float(i * 32 + lane);
        __syncthreads();
        if (warp == 0) acc += buf[s][31 - lane];
    }
    if (warp == 0) out[lane] = acc;
}

// One buffer and a FULL hand-off per iteration, no EMPTY: the producer really overwrites words the
// consumer may not have read yet. Not a ring: barrier ids 1..ITERS, each used once, so nothing
// waits on a reused id.
extern "C" __global__ void no_empty(float* out) {
    __shared__ float buf[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int i = 0; i < ITERS; ++i) {
        if (warp == 1) {
            buf[lane] = float(i * 32 + lane);
            named_barrier_arrive(1 + i, THREADS);
        } else {
            named_barrier_sync(1 + i, THREADS);
            acc += buf[31 - lane];
        }
    }
    if (warp == 0) out[lane] = acc;
}
