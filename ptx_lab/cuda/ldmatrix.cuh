// ptx_lab/cuda/ldmatrix.cuh -- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
//
// Loads 1, 2 or 4 8x8 matrices of 16-bit elements from shared memory.
// Addresses: lanes 8i..8i+7 supply the 16-byte-aligned addresses of rows 0..7
// of matrix i (x1 reads lanes 0-7, x2 lanes 0-15; the other lanes' addresses
// are ignored but must still be valid operands).
// Register ri of lane l receives two elements of matrix i (lower col/row in the
// low half), with g = l / 4, t = l % 4:
//   plain:  { M_i[g][2t],  M_i[g][2t+1] }
//   .trans: { M_i[2t][g],  M_i[2t+1][g] }
#pragma once
#include "common.cuh"

namespace ptx_lab {

__device__ __forceinline__ void ldmatrix_x1(u32& r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                 : "=r"(r0) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x1_trans(u32& r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];"
                 : "=r"(r0) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// Array forms, convenient for fragments held as u32[4] / u32[2].
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) { ldmatrix_x4(r[0], r[1], r[2], r[3], addr); }
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) { ldmatrix_x4_trans(r[0], r[1], r[2], r[3], addr); }

// An .x4 load of a whole 16x16 tile of 16-bit elements (the same recipe serves stmatrix .x4):
// lane l supplies the address of row l % 8 of matrix l / 8, 8 elements (16 bytes), and
// register i receives matrix i. Two orders of the four 8x8 matrices, by their first row
// and column in the tile:
//   rows first: (0, 0), (8, 0), (0, 8), (8, 8)
//   cols first: (0, 0), (0, 8), (8, 0), (8, 8)
// so lane l names tile[row + rows_first_mat_row()][rows_first_mat_col()] (or the cols_first_
// pair), and for mma.m16n8k16 (mma.cuh) the four registers are
//   rows first, plain:  the A fragment a0..a3 of A = tile            (A[m][k] at tile[m][k])
//   rows first, .trans: the B fragments {r0, r1} of n 0-7 and {r2, r3} of n 8-15 of B = tile
//                       (B[k][n] at tile[k][n])
//   cols first, plain:  the B fragments {r0, r1} of n 0-7 and {r2, r3} of n 8-15 of B = tile^T
//                       (B[k][n] at tile[n][k])
//   cols first, .trans: the A fragment a0..a3 of A = tile^T          (A[m][k] at tile[k][m])
// For a tile at (row0, col0) of a larger one the lane's row is row0 + row + rows_first_mat_row(),
// added in that order: the kernels' SASS depends on it (so does it on the corners being
// computed where they are used, from the lane, as here).
// ptx_lab.fragments.x4_lane_row_col is the model twin; tests/ptx_lab/test_x4_lanes.py ties it to
// the mma fragments and, through the probe_x4_lanes probe (probes.cu), to this code. The
// addresses below have fragments.x4_lane_offsets as theirs (probe_x4_addresses, operand_probes.cu).
struct X4Lane {
    int lane;   // 0..31
    int row;    // lane % 8: the row of its matrix that this lane addresses
    __device__ __forceinline__ int rows_first_mat_row() const { return 8 * ((lane >> 3) & 1); }
    __device__ __forceinline__ int rows_first_mat_col() const { return 8 * ((lane >> 3) >> 1); }
    __device__ __forceinline__ int cols_first_mat_row() const { return 8 * ((lane >> 3) >> 1); }
    __device__ __forceinline__ int cols_first_mat_col() const { return 8 * ((lane >> 3) & 1); }
};
__device__ __forceinline__ X4Lane x4_lane(int lane) { return {lane, lane & 7}; }

// The (row, col) a lane's .x4 address names in the 16x16 block at (row0, col0) of a larger tile,
// in either order; the row is row0 + row + the matrix's corner row, added in that order.
struct RowCol {
    int row, col;
};
__device__ __forceinline__ RowCol x4_rows_first(int row0, int col0, X4Lane x) {
    return {row0 + x.row + x.rows_first_mat_row(), col0 + x.rows_first_mat_col()};
}
__device__ __forceinline__ RowCol x4_cols_first(int row0, int col0, X4Lane x) {
    return {row0 + x.row + x.cols_first_mat_row(), col0 + x.cols_first_mat_col()};
}
__device__ __forceinline__ RowCol x4_rows_first(int row0, int col0, int lane) {
    return x4_rows_first(row0, col0, x4_lane(lane));
}
__device__ __forceinline__ RowCol x4_cols_first(int row0, int col0, int lane) {
    return x4_cols_first(row0, col0, x4_lane(lane));
}
// Its shared address in a row-major 16-bit tile whose rows are `stride` elements apart.
__device__ __forceinline__ u32 x4_addr_rows_first(const unsigned short* tile, int stride, int row0, int col0,
                                                  int lane) {
    const RowCol p = x4_rows_first(row0, col0, lane);
    return smem_addr(tile + p.row * stride + p.col);
}
__device__ __forceinline__ u32 x4_addr_cols_first(const unsigned short* tile, int stride, int row0, int col0,
                                                  int lane) {
    const RowCol p = x4_cols_first(row0, col0, lane);
    return smem_addr(tile + p.row * stride + p.col);
}
// Only the lane's part of that address, in bytes, for rows `row_bytes` apart: a kernel that adds
// it once to a tile's base address then reaches the block at (row0, col0) with the constant
// row0 * row_bytes + col0 * 2, which the compiler folds into the instruction's immediate offset.
__device__ __forceinline__ u32 x4_lane_bytes_rows_first(int row_bytes, X4Lane x) {
    return (x.row + x.rows_first_mat_row()) * row_bytes + x.rows_first_mat_col() * 2;
}
__device__ __forceinline__ u32 x4_lane_bytes_cols_first(int row_bytes, X4Lane x) {
    return (x.row + x.cols_first_mat_row()) * row_bytes + x.cols_first_mat_col() * 2;
}

}  // namespace ptx_lab
