// kernel/ds_scan/cuda/operands.cuh -- the consumers' MMA operands: where each lane's
// ldmatrix row lies in a stage's tiles, accumulators packed into A fragments, and
// dS^T += A @ B over a warp's band (G4, G5) on mma.sync or as a warpgroup MMA.
#pragma once
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "layout.cuh"
#if WGMMA
#include "wgmma.cuh"
#endif

namespace kda {

// The row (8 elements) lane l names in an ldmatrix / stmatrix .x4 of a 16x16 block, and its
// address in a row-major tile: x4_rows_first / x4_cols_first and x4_addr_rows_first /
// x4_addr_cols_first of ptx_lab's ldmatrix.cuh (which also says what each register receives).
// ... and in an operand tile (qd, kd, kr: op_offset): an 8x8 matrix is 8 rows of 16 bytes
// either way (padded rows, or one core matrix).
__device__ __forceinline__ u32 op_addr_rows_first(const unsigned short* tile, int row0, int col0, int lane) {
    const RowCol p = x4_rows_first(row0, col0, lane);
    return smem_addr(tile + op_offset(p.row, p.col));
}
__device__ __forceinline__ u32 op_addr_cols_first(const unsigned short* tile, int row0, int col0, int lane) {
    const RowCol p = x4_cols_first(row0, col0, lane);
    return smem_addr(tile + op_offset(p.row, p.col));
}

// The same in the stage tiles whose layout depends on LOADS: do^T (cols first) and
// Mqk, INV (rows first), padded rows (cp.async) or swizzled boxes (tensor copies).
__device__ __forceinline__ u32 do_addr_cols_first(const Stage& st, int col0, int lane) {
    if constexpr (TMA_LOADS) {
        const RowCol p = x4_cols_first(0, col0, lane);
        return smem_addr(st.dO) + (p.col / DO_BOX_COLS) * (TILE_TOKENS * DO_SWZ) +
               tma_swizzle<DO_SWZ>(p.row * DO_SWZ + (p.col % DO_BOX_COLS) * 2);
    }
    return x4_addr_cols_first(st.dO, DO_STRIDE, 0, col0, lane);
}
__device__ __forceinline__ u32 small_addr_rows_first(const unsigned short* tile, int lane) {
    if constexpr (TMA_LOADS) {
        const RowCol p = x4_rows_first(0, 0, lane);
        return smem_addr(tile) + tma_swizzle<SMALL_SWZ>(p.row * SMALL_SWZ + p.col * 2);
    }
    return x4_addr_rows_first(tile, SMALL_STRIDE, 0, 0, lane);
}

// n-tiles 2 pr and 2 pr + 1 of m-tile m as bf16 pairs (ptx_lab's acc_to_a, fragments.cuh):
// both G2's A fragment of k-step pr and the 4 registers of the snapshot's stmatrix.x4.trans.
__device__ __forceinline__ void pack_pair(u32 (&b)[4], const float (&dS)[MT][NJ][4], int m, int pr) {
    acc_to_a(b, dS[m][2 * pr], dS[m][2 * pr + 1]);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    const u32 b[2] = {b0, b1};
    mma_m16n8k16_bf16(d, a, b, d);
}

// dS^T += A @ B over this warp's k columns (G4 with A = do^T, B = qd; G5 with A = bdv^T,
// B = kd): B[c][k] is a stage tile read with ldmatrix.trans (pairs along c), and each B
// fragment serves all MT m-tiles.
// `addr(row0, col0, lane)` is the lane's ldmatrix row address (rows first) in the B tile.
template <class Addr>
__device__ __forceinline__ void accumulate_band_at(float (&dS)[MT][NJ][4], const u32 (&a)[MT][4], Addr addr,
                                                   int k0, int lane) {
#pragma unroll
    for (int pr = 0; pr < NJ / 2; ++pr) {
        u32 b[4];
        ldmatrix_x4_trans(b, addr(0, k0 + 16 * pr, lane));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            mma_bf16(dS[m][2 * pr], a[m], b[0], b[1]);
            mma_bf16(dS[m][2 * pr + 1], a[m], b[2], b[3]);
        }
    }
}
__device__ __forceinline__ void accumulate_band(float (&dS)[MT][NJ][4], const u32 (&a)[MT][4],
                                                const unsigned short* tile, int k0, int lane) {
    accumulate_band_at(dS, a, [tile](int r0, int c0, int l) { return op_addr_rows_first(tile, r0, c0, l); }, k0, lane);
}
// G4's second half, dS^T += do^T @ (qd's rounding rest), from the raw q rows R1 wrote it over.
__device__ __forceinline__ void accumulate_qd_rest(float (&dS)[MT][NJ][4], const u32 (&doT)[MT][4], const Stage& st,
                                                   int k0, int lane) {
    accumulate_band_at(dS, doT, [&st](int r0, int c0, int l) {
        const RowCol p = x4_rows_first(r0, c0, l);
        return smem_addr(&st.q[qd_rest_offset(p.row, p.col)]);
    }, k0, lane);
}

#if WGMMA
// The same as one warpgroup MMA per m-tile: m-tile m of the 4 consumer warps is rows
// 16 w .. of an m64n128k16 whose accumulators are the warps' dS[m] (the wgmma D fragment
// is the mma.sync C fragments of its 16 n-tiles in order, wgmma.cuh), with A from
// registers and B = tile[c][k] N-major by descriptor (op_offset: lbo between c blocks,
// sbo between k blocks). Asynchronous: the caller fences before and waits after.
__device__ __forceinline__ void accumulate_band_wgmma(float (&dS)[MT][NJ][4], const u32 (&a)[MT][4],
                                                      const unsigned short* tile) {
    static_assert(NJ * 4 == 64, "m64n128k16: 64 accumulators a thread");
    const u64 desc = wgmma_desc(smem_addr(tile), OP_CBLOCK, OP_KBLOCK, 0);
#pragma unroll
    for (int m = 0; m < MT; ++m)
        wgmma_m64n128k16_bf16_rs<1>(reinterpret_cast<float(&)[64]>(dS[m]), a[m], desc, 1);
}
#endif

}  // namespace kda
