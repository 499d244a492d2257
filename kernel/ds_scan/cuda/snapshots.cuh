// kernel/ds_scan/cuda/snapshots.cuh -- a consumer warp's dS^T band out to global memory:
// the snapshot of each tile (fp32 or bf16; straight from the accumulators, through a staging
// tile, or as one tensor store) and dh0 at the end of the walk.
#pragma once
#include "stmatrix.cuh"
#include "operands.cuh"
#include "work.cuh"

namespace kda {

// stmatrix.x4.trans of n-tiles 2 pr and 2 pr + 1 of m-tile m (pack_pair), `addr` the lane's
// x4_cols_first row with k as rows and v as columns:
// matrices (v 0-7, k lo), (v 8-15, k lo), (v 0-7, k hi), (v 8-15, k hi).
__device__ __forceinline__ void stmatrix_band_pair(u32 addr, const float (&dS)[MT][NJ][4], int m, int pr) {
    u32 b[4];
    pack_pair(b, dS, m, pr);
    stmatrix_x4_trans(addr, b[0], b[1], b[2], b[3]);
}

// SNAP_STORE 3, the store of a staged snapshot: the warp's generic writes are fenced for the
// async proxy and lane 0 issues the tensor store as a bulk group (SNAP_LATE_ISSUE: at the
// tile's end, not right after the stmatrix).
__device__ __forceinline__ void issue_band_tma(const TensorMap* map, int row0, int v0, unsigned char* staging, int lane) {
    fence_proxy_async_shared();   // the tile's generic writes before the async proxy reads it
    __syncwarp();
    if (lane == 0) {
        cp_async_bulk_tensor_2d_s2g(map, v0, row0, smem_addr(staging));
        cp_async_bulk_commit();
    }
}

// SNAP_STORE 3: this warp's dS^T band as ONE tensor store. The fragments go to the
// warp's staging tile [KW][BAND] swizzled by its row length (bf16 by stmatrix.trans:
// 8 rows of a matrix in 8 distinct bank groups; fp32 by 4-byte stores: the 4 rows
// k = 8j + 2t of one store in distinct groups at 128-byte rows, 2-way at 64), then
// lane 0 stores the box to rows row0 .. row0 + KW - 1, columns v0 .. of the snapshot
// map. The store runs in the background (a bulk group); the next snapshot first
// waits until it has read the tile. No 16-byte STGs through the SM's memory queue.
__device__ __forceinline__ void store_band_tma(const TensorMap* map, int row0, int v0, const float (&dS)[MT][NJ][4],
                                               unsigned char* staging, int lane) {
    // The swizzle repeats every 8 rows (8 * SNAP_SWZ bytes), so a fragment's offset is
    // its row's position within 8 rows, swizzled once, plus a constant per 8 rows.
    constexpr u32 ROWS8 = 8 * SNAP_SWZ;
    const u32 base = smem_addr(staging);
    if (lane == 0) cp_async_bulk_wait_read<0>();   // the previous snapshot's store has read the tile
    __syncwarp();
#if SNAP_BF16
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // the lane's row of x4_lane_cols_first (ldmatrix.cuh), split into its 8-row block and its row
        // in it, which the swizzle needs: matrix mm, rows k = 16 pr + 8 (mm >> 1) + (lane & 7), columns
        // v = 16 m + 8 (mm & 1) .. (written out: through the helper the SASS differs)
        const int mm = lane >> 3;
        const u32 off = (mm >> 1) * ROWS8 + tma_swizzle<SNAP_SWZ>((lane & 7) * SNAP_SWZ + (16 * m + 8 * (mm & 1)) * 2);
#pragma unroll
        for (int pr = 0; pr < NJ / 2; ++pr) stmatrix_band_pair(base + off + 2 * pr * ROWS8, dS, m, pr);
    }
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // n-tile j: rows k = 8 j + 2t (+1), columns v = 16 m + g (+8)
        u32 off[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
            off[e] = tma_swizzle<SNAP_SWZ>((2 * t + (e & 1)) * SNAP_SWZ + (16 * m + g + 8 * (e >> 1)) * 4);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) *reinterpret_cast<float*>(staging + off[e] + j * ROWS8) = dS[m][j][e];
    }
#endif
    if constexpr (!SNAP_LATE_ISSUE) issue_band_tma(map, row0, v0, staging, lane);
}

// Store this warp's part of its dS^T band (fp32 accumulators, all MT m-tiles) as
// dS[k][v] rows k0 .. k0 + KW - 1, columns v0 .. v0 + BAND - 1 of `out` (fp32
// [HEAD_DIM][HEAD_DIM]). Accumulator n-tile j of m-tile m holds (k relative to k0, v to v0)
// (v = 16m+g, k = 8j+2t), (16m+g, 8j+2t+1), (16m+g+8, 8j+2t), (16m+g+8, 8j+2t+1).
// They go to a warp-private staging tile [k][BAND] first (rows SNAPF_STRIDE apart:
// the 4 rows k = 8j+2t of one store start 8 banks apart, conflict-free), then
// lane l stores 16 bytes of row l / CH (CH = 16-byte chunks per row; one quarter-warp
// reads whole rows, conflict-free): 16 global stores per lane per m-tile instead of 64
// scattered 4-byte ones (which cost as much as the five GEMMs with fp32 snapshots every
// tile: log 9). In PASSES
// passes of KW / PASSES rows each, so that dh0 fits the smaller bf16 staging tile.
template <int PASSES>
__device__ __forceinline__ void store_band_f32(float* out, const float (&dS)[MT][NJ][4], float* staging,
                                               int k0, int v0, int lane) {
    constexpr int JP = NJ / PASSES;          // n-tiles (8 rows each) per pass
    constexpr int CH = BAND / 4;             // 16-byte chunks per staging row
    constexpr int ROWS = 32 / CH;            // rows per store instruction
    static_assert(NJ % PASSES == 0 && 8 * JP * SNAPF_STRIDE * 4 <= SNAP_STAGING_BYTES,
                  "a pass must fit the warp's staging tile");
    const int g = lane >> 2, t = lane & 3;
#if SNAP_STORE == SNAP_DIRECT
    // straight from the C fragments: each 4-byte store instruction writes 8
    // consecutive v (one 32-byte sector) in 4 k rows; no shared-memory round trip
    (void)staging;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int k = k0 + 8 * j + 2 * t, v = v0 + 16 * m + g;
            __stcs(out + k * HEAD_DIM + v, dS[m][j][0]);
            __stcs(out + (k + 1) * HEAD_DIM + v, dS[m][j][1]);
            __stcs(out + k * HEAD_DIM + v + 8, dS[m][j][2]);
            __stcs(out + (k + 1) * HEAD_DIM + v + 8, dS[m][j][3]);
        }
#else
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int jj = 0; jj < JP; ++jj) {
                const int j = pass * JP + jj, k = 8 * jj + 2 * t, v = 16 * m + g;   // k: row of the staging tile
                staging[k * SNAPF_STRIDE + v] = dS[m][j][0];
                staging[(k + 1) * SNAPF_STRIDE + v] = dS[m][j][1];
                staging[k * SNAPF_STRIDE + v + 8] = dS[m][j][2];
                staging[(k + 1) * SNAPF_STRIDE + v + 8] = dS[m][j][3];
            }
        __syncwarp();
#pragma unroll
        for (int it = 0; it < 8 * JP / ROWS; ++it) {
            const int k = ROWS * it + lane / CH, ch = lane % CH;
            const float4 v = *reinterpret_cast<const float4*>(staging + k * SNAPF_STRIDE + 4 * ch);
            __stcs(reinterpret_cast<float4*>(out + (k0 + 8 * JP * pass + k) * HEAD_DIM + v0 + 4 * ch), v);
        }
        __syncwarp();
    }
#endif
}

// Same as bf16: stmatrix.trans turns the v-major fragments into k-major rows of
// a warp-private staging tile [k][BAND] (rows SNAP_STRIDE apart: the 8 rows of a
// matrix start in 8 distinct 16-byte bank groups), then 16-byte stores write
// 2 * BAND contiguous bytes per k row; a quarter-warp reads 8 rows' chunk ch
// (again 8 distinct bank groups).
__device__ __forceinline__ void store_band_bf16(unsigned short* out, const float (&dS)[MT][NJ][4],
                                                unsigned short* staging, int k0, int v0, int lane) {
    constexpr int CH = BAND / 8;             // 16-byte chunks per staging row
    constexpr int ROWS = 32 / CH;            // rows per store instruction
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int pr = 0; pr < NJ / 2; ++pr)   // k columns 16 pr .. 16 pr + 15 of m-tile m
            stmatrix_band_pair(x4_addr_cols_first(staging, SNAP_STRIDE, 16 * pr, 16 * m, lane), dS, m, pr);
    __syncwarp();
#pragma unroll
    for (int it = 0; it < KW / ROWS; ++it) {
        const int k = ROWS * it + lane % ROWS, ch = lane / ROWS;
        const uint4 v = *reinterpret_cast<const uint4*>(staging + k * SNAP_STRIDE + 8 * ch);
        __stcs(reinterpret_cast<uint4*>(out + (k0 + k) * HEAD_DIM + v0 + 8 * ch), v);
    }
    __syncwarp();
}

// snapshot[n] = this warp's part of dS^T at the entry of tile n: row snap_row of the
// snapshot tensor map (SNAP_STORE 3), or snapshot snap_idx of p.snapshots.
__device__ __forceinline__ void store_snapshot(const Params& p, const TmaMaps& maps, long long snap_idx, int snap_row,
                                               int h, int k0, int v0, const float (&dS)[MT][NJ][4],
                                               unsigned char* staging, int lane) {
#if SNAP_STORE == SNAP_TMA
    (void)p; (void)snap_idx; (void)h; (void)k0;
    store_band_tma(&maps.snap, snap_row, v0, dS, staging, lane);
#else
    (void)maps; (void)snap_row;
    const long long head_mat = (long long)HEAD_DIM * HEAD_DIM;
#if SNAP_BF16
    store_band_bf16(static_cast<unsigned short*>(p.snapshots) + (snap_idx * p.HV + h) * head_mat, dS,
                    reinterpret_cast<unsigned short*>(staging), k0, v0, lane);
#else
    store_band_f32<1>(static_cast<float*>(p.snapshots) + (snap_idx * p.HV + h) * head_mat, dS,
                      reinterpret_cast<float*>(staging), k0, v0, lane);
#endif
#endif
}

// dh0 (fp32) of sequence seq through the same staging tile, once the last snapshot's tensor
// store has read it: in two passes where it is the smaller bf16 one.
// SUMMARY builds: role 1's dS (the segment's M) goes over the snapshots pointer, which such a
// build never stores snapshots to; role 0's (its d) to dh0.
__device__ __forceinline__ void store_dh0(const Params& p, int seq, int h, int k0, int v0, const float (&dS)[MT][NJ][4],
                                          unsigned char* staging, int lane, int role) {
    const long long head_mat = (long long)HEAD_DIM * HEAD_DIM;
    if constexpr (TMA_SNAP) {
        if (lane == 0) cp_async_bulk_wait<0>();
        __syncwarp();
    }
    float* const out = SUMMARY && role ? static_cast<float*>(p.snapshots) : p.dh0;
    store_band_f32<SNAP_BF16 ? 2 : 1>(out + ((long long)seq * p.HV + h) * head_mat, dS,
                                      reinterpret_cast<float*>(staging), k0, v0, lane);
}

}  // namespace kda
