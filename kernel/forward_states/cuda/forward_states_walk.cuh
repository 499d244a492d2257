// kernel/forward_states/cuda/forward_states_walk.cuh -- the walk over a sequence's tiles that Kernel S
// and the forward (kernel/forward/cuda/forward.cu) share: the CTA's sequence, head and v group, the
// producer warps' ring loop, and the consumer warp's initial state and snapshot store.
// Included after a kernel's configuration; every name it uses is a parameter or ptx_lab's.
#pragma once
#include "../../shapes.cuh"
#include "cp_async.cuh"

namespace kda_walk {
using namespace ptx_lab;

// What a CTA scans: grid index = (sequence rank, value head, v group), v group fastest; order[rank] is
// the sequence (longest first), cu_seqlens its tokens [bos, bos + len).
struct Cta {
    int vg, h, n;
    long long bos;
    int len, ntiles;
};

template <int VGroups>
__device__ __forceinline__ Cta cta_of(const long long* __restrict__ cu_seqlens, const int* __restrict__ order,
                                      int HV) {
    Cta c;
    c.vg = blockIdx.x % VGroups;
    c.h = (blockIdx.x / VGroups) % HV;
    c.n = order[blockIdx.x / VGroups / HV];
    c.bos = cu_seqlens[c.n];
    c.len = (int)(cu_seqlens[c.n + 1] - c.bos);
    c.ntiles = (c.len + TILE_TOKENS - 1) / TILE_TOKENS;
    return c;
}

// A producer warp's walk over the ring, around its own work on each tile in the kernel's loop (R1, and
// what else the kernel builds in the stage): issue(i) copies tile i into its stage Prefetch tiles ahead,
// prefetch() the first tiles, hand_over() after each tile's work the next; copies_landed() opens the work.
// (The work stays in the kernel's loop: passed in here as a lambda, NVRTC schedules the forward's
// producers otherwise.)

// Tile i's copies where the tile exists, and one cp.async group a tile slot: empty past the end, so the
// wait count stays fixed. (ntiles by reference, as the kernels' own lambdas held it: by value, NVRTC lays
// the branch out the other way round.)
template <class Issue>
__device__ __forceinline__ void issue_slot(int i, const int& ntiles, Issue&& issue) {
    if (i < ntiles) issue(i);
    cp_async_commit();
}

// Before the walk: the first Prefetch tiles' copies.
template <int Prefetch, class Issue>
__device__ __forceinline__ void prefetch(const int& ntiles, Issue&& issue) {
#pragma unroll 1
    for (int s = 0; s < Prefetch; ++s) issue_slot(s, ntiles, issue);
}

// Opening the work on a tile: this thread's copies of it landed, and its warp's (the rows R1 reads).
template <int Prefetch>
__device__ __forceinline__ void copies_landed() {
    cp_async_wait<Prefetch - 1>();
    __syncwarp();
}

// After the work on tile i in stage s: the stage goes to the consumers, and the stage of tile i - 1 is
// refilled with tile i + Prefetch once they left it (after the publish, so the wait never delays tile i).
template <class Ring, int Prefetch, class Issue>
__device__ __forceinline__ void hand_over(int i, int s, const int& ntiles, Issue&& issue) {
    Ring::publish(s);
    const int j = i + Prefetch;
    Ring::wait_to_refill(j, ntiles);
    issue_slot(j, ntiles, issue);
}

// A consumer warp's S^T [16 v x 128 k] from h0 (fp32 [N, HV, K, V]; null: zeros) in the chain's
// accumulators: acc[nt] holds n-tile nt (k = 8 nt ..); c0 = S^T[gr][8nt+2t], c1 = [gr][8nt+2t+1],
// c2 = [gr+8][8nt+2t], c3 = [gr+8][8nt+2t+1], v0 = the v column of row gr.
__device__ __forceinline__ void load_state(float (&acc)[HEAD_DIM / 8][4], const float* __restrict__ h0, int n,
                                           int HV, int h, long long v0, int t) {
    const float* s0 = h0 ? h0 + ((long long)n * HV + h) * HEAD_DIM * HEAD_DIM : nullptr;
#pragma unroll
    for (int nt = 0; nt < HEAD_DIM / 8; ++nt) {
        const int k0 = 8 * nt + 2 * t;
        acc[nt][0] = s0 ? s0[(long long)k0 * HEAD_DIM + v0] : 0.f;
        acc[nt][1] = s0 ? s0[(long long)(k0 + 1) * HEAD_DIM + v0] : 0.f;
        acc[nt][2] = s0 ? s0[(long long)k0 * HEAD_DIM + v0 + 8] : 0.f;
        acc[nt][3] = s0 ? s0[(long long)(k0 + 1) * HEAD_DIM + v0 + 8] : 0.f;
    }
}

// A consumer warp's staged S (staging: bf16 S [k][its 16 v], rows SnapStride elements apart), the
// state entering tile i, to states (bf16 [entries, HV, K, V]; the sequence's entries from snap0, one
// every TILES_PER_CHUNK tiles) at v columns cta_col + vrow ..: 128 rows of 32 bytes, 16 bytes a lane.
template <int SnapStride>
__device__ __forceinline__ void store_snapshot(unsigned short* __restrict__ states,
                                               const unsigned short (*staging)[SnapStride], long long snap0,
                                               int i, int HV, int h, int cta_col, int vrow, int lane) {
    __syncwarp();
    unsigned short* dst = states + ((snap0 + i / TILES_PER_CHUNK) * HV + h) * (long long)(HEAD_DIM * HEAD_DIM)
                          + cta_col + vrow;
#pragma unroll
    for (int m = 0; m < HEAD_DIM * 2 / 32; ++m) {
        const int idx = lane + 32 * m, row = idx / 2, half = idx % 2;
        *reinterpret_cast<uint4*>(dst + (long long)row * HEAD_DIM + half * 8) =
            *reinterpret_cast<const uint4*>(&staging[row][half * 8]);
    }
}

}  // namespace kda_walk
