// ptx_lab/cuda/ring_probes.cu -- probes of ring.cuh for ptx_lab.device (tests/ptx_lab/test_ring.py).
//
// probe_ring_ids_<N>: one warp writes the ring's barrier ids and hand-off predicates, which
// ptx_lab.ring states in closed form.
// probe_ring_walk_<N>: the ring itself, one producer warp (warp 1) and one consumer warp
// (warp 0), 64 threads on every barrier: the producer writes tile j's 32 words
// (j * 32 + lane) into stage j % N, the consumer copies every tile it is handed out, so a
// hand-off that let the producer overwrite an unread stage, or the consumer read a stage early,
// shows in the copy; a barrier left unbalanced hangs the launch instead.
// probe_mring_parities_<N> and probe_mring_walk_<N>: the same for MbarrierRing (32 producer and
// 32 consumer threads), its parities and predicates in place of the ids.
#include "ring.cuh"

namespace ptx_lab {
namespace ring_probes {

constexpr int WARP = 32;
constexpr u32 THREADS = 2 * WARP;

// out: (N, 2) u32 the FULL and EMPTY ids of every stage, then END_ID, then (ntiles, 2) u32 the
// releases and refill_waits of every tile.
template <int N>
__device__ __forceinline__ void ids(int ntiles, u32* out) {
    using Ring = BarrierRing<N, THREADS>;
    const int lane = threadIdx.x;
    for (int s = lane; s < N; s += WARP) {
        out[2 * s] = Ring::full_id(s);
        out[2 * s + 1] = Ring::empty_id(s);
    }
    if (lane == 0) out[2 * N] = Ring::END_ID;
    u32* const flags = out + 2 * N + 1;
    for (int i = lane; i < ntiles; i += WARP) {
        flags[2 * i] = Ring::releases(i, ntiles);
        flags[2 * i + 1] = Ring::refill_waits(i, ntiles);
    }
}

// seen: (ntiles, 32) u32, what the consumer read of every tile.
template <int N>
__device__ __forceinline__ void walk(int ntiles, u32* seen) {
    using Ring = BarrierRing<N, THREADS>;
    __shared__ u32 stage[N][WARP];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (warp == 1) {
        for (int j = 0; j < ntiles; ++j) {
            const int s = j % N;
            Ring::wait_to_refill(j, ntiles);
            stage[s][lane] = j * WARP + lane;
            Ring::publish(s);
        }
    } else {
        for (int i = 0; i < ntiles; ++i) {
            const int s = i % N;
            Ring::wait_full(s);
            // another lane's word: the barrier, not the warp's own store order, must make it visible
            seen[i * WARP + lane] = stage[s][(lane + 1) % WARP];
            if (Ring::releases(i, ntiles)) Ring::release(s);
        }
    }
}

// out: (ntiles, 4) u32 per tile: FULL's parity, the refill's parity, releases, refill_waits.
template <int N>
__device__ __forceinline__ void mring_parities(int ntiles, u32* out) {
    using Ring = MbarrierRing<N, WARP, WARP>;
    for (int i = threadIdx.x; i < ntiles; i += WARP) {
        out[4 * i] = Ring::full_parity(i);
        out[4 * i + 1] = Ring::refill_parity(i);
        out[4 * i + 2] = Ring::releases(i, ntiles);
        out[4 * i + 3] = Ring::refill_waits(i, ntiles);
    }
}

// seen: (ntiles, 32) u32, what the consumer read of every tile (as walk above).
template <int N>
__device__ __forceinline__ void mring_walk(int ntiles, u32* seen) {
    __shared__ MbarrierRing<N, WARP, WARP> ring;
    __shared__ u32 stage[N][WARP];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (threadIdx.x == 0) ring.init();
    __syncthreads();
    if (warp == 1) {
        for (int j = 0; j < ntiles; ++j) {
            ring.wait_to_refill(j, ntiles);
            stage[j % N][lane] = j * WARP + lane;
            ring.publish(j);
        }
    } else {
        for (int i = 0; i < ntiles; ++i) {
            ring.wait_full(i);
            seen[i * WARP + lane] = stage[i % N][(lane + 1) % WARP];
            if (ring.releases(i, ntiles)) ring.release(i);
        }
    }
}

}  // namespace ring_probes
}  // namespace ptx_lab

using namespace ptx_lab::ring_probes;

#define PTX_LAB_RING_PROBES(N)                                                                   \
    extern "C" __global__ void __launch_bounds__(WARP) probe_ring_ids_##N(int ntiles, ptx_lab::u32* out) { \
        ids<N>(ntiles, out);                                                                     \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) probe_ring_walk_##N(int ntiles, ptx_lab::u32* seen) { \
        walk<N>(ntiles, seen);                                                                   \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARP) probe_mring_parities_##N(int ntiles, ptx_lab::u32* out) { \
        mring_parities<N>(ntiles, out);                                                          \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) probe_mring_walk_##N(int ntiles, ptx_lab::u32* seen) { \
        mring_walk<N>(ntiles, seen);                                                             \
    }
PTX_LAB_RING_PROBES(1)
PTX_LAB_RING_PROBES(2)
PTX_LAB_RING_PROBES(3)
PTX_LAB_RING_PROBES(4)
PTX_LAB_RING_PROBES(6)
PTX_LAB_RING_PROBES(7)
