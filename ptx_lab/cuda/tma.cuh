// ptx_lab/cuda/tma.cuh -- Hopper (sm_90) tensor copies: a whole 2-D tile between
// global and shared memory with ONE instruction of ONE thread, described by a
// tensor map (CUtensorMap) built on the host.
//
// cp.async.bulk (bulk.cuh) moves one contiguous run of bytes per instruction, so a
// 16-token tile of q (16 rows, H * 256 bytes apart) is 16 copies, issued one lane
// after another (docs/log/13-bulk-copies.md: about 60 cycles each). The tensor
// form, cp.async.bulk.tensor, moves the whole box: the tensor map says where the
// tensor is, its element type, its extent and row stride, and the box (rows x cols)
// one copy moves; the instruction names only the box's first element.
//
// Coordinates are ELEMENT indices, innermost dimension first: {c0, c1} = {column,
// row} of a row-major [rows][cols] tensor, signed 32-bit. The box lands in shared
// memory row after row (box_cols * element-size bytes each; no interleave), either
// densely or, when the map has a swizzle of S = 32, 64 or 128 bytes (box rows of
// exactly S bytes in ptx_lab.tensormap), with the 16-byte chunks of each row permuted:
// chunk c of box row i sits in chunk c ^ (i % 8) of the row for S = 128,
// c ^ ((i / 2) % 4) for 64, c ^ ((i / 4) % 2) for 32 -- CuTe's SW128/SW64/SW32
// (ptx_lab.layouts), so the same chunk of 8 consecutive rows lies in 8 bank groups. A
// store with the same map reads the chunks from the same places.
// ptx_lab.model.tensor_box_smem_offsets gives every element's byte. Elements of the box
// outside the tensor (a row >= rows, a column >= cols, or negative) are:
//   * load:  filled with zeros, and they still count: the copy completes
//            box_rows * box_cols * element-size bytes on its mbarrier, whether or
//            not every row exists, so mbarrier_arrive_expect_tx always expects the
//            full box;
//   * store: not written.
// ptx_lab.model.cp_async_bulk_tensor_2d_g2s / _s2g model exactly this.
//
// Addresses (ptx_lab.tensormap refuses the rest before the driver sees them):
//   * the tensor in global memory: 16-byte aligned, row stride a multiple of 16 B;
//   * the box in shared memory: 128-byte aligned (the TMA unit's requirement for
//     tensor copies, stricter than the 16 bytes of the 1-D bulk copy); swizzled, a
//     multiple of 8 * S = 256, 512, 1024 bytes (TensorMap2D.smem_align): the pattern
//     repeats every 8 rows of S bytes and is reported to follow the shared ADDRESS
//     bits, so a box less aligned would be permuted otherwise (not measured here:
//     experiments/tma_tile.py loads into a 1024-byte aligned buffer);
//   * the tensor map itself: 64-byte aligned, in the kernel's parameter space. Pass
//     it by value as `const __grid_constant__ TensorMap` (the qualifier keeps it in
//     param space instead of a local copy) and hand the instruction its GENERIC
//     address, &map. It must not be copied into local memory or registers.
//
// Completion: a load completes on an mbarrier exactly like cp_async_bulk_g2s
// (bulk.cuh: arrive.expect_tx, try_wait.parity). A store joins the issuing thread's
// current bulk group: cp_async_bulk_commit(), then cp_async_bulk_wait_read<N>()
// before the shared source is reused, cp_async_bulk_wait<N>() before the global
// result is needed. Shared memory written by ordinary stores needs
// fence_proxy_async_shared() before a tensor store reads it (bulk.cuh).
#pragma once
#include "bulk.cuh"

namespace ptx_lab {

// The 128-byte opaque tensor map. Same size and layout as the driver's CUtensorMap
// (cuda.h); defined here so that headers compile under NVRTC without cuda.h.
// cuda.h 13 aligns CUtensorMap to 128; the PTX ISA and cuTensorMapEncodeTiled
// require 64, which is what a kernel parameter of this type gets.
struct alignas(64) TensorMap {
    u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "a tensor map is 128 bytes");
static_assert(alignof(TensorMap) == 64, "a tensor map is 64-byte aligned");

// Where a tensor copy with CU_TENSOR_MAP_SWIZZLE_<S>B (S = 32, 64, 128; ptx_lab.tensormap
// TensorMap2D.swizzle; box rows of exactly S bytes) puts the byte at dense offset `off`
// of its box (row * S + column byte): the 16-byte chunk index (bits 4..) XORed with
// the row's position in its group of 8 rows (bits 7..), as CuTe's Swizzle<log2(S/16), 4, 3>
// of the byte offset (ptx_lab.layouts.GMMA_SWIZZLES SW32 / SW64 / SW128). The box's
// shared address must be a multiple of 8 * S, so the offset's bits are the address's.
// S = 0: the dense box, off itself.
template <int S>
__device__ __forceinline__ u32 tma_swizzle(u32 off) {
    static_assert(S == 0 || S == 32 || S == 64 || S == 128, "a tensor-copy swizzle spans 32, 64 or 128 bytes");
    if constexpr (S == 0) return off;
    else return off ^ ((off >> 3) & ((S / 16 - 1) << 4));
}

// Generic address of a tensor map (a __grid_constant__ parameter): the operand form
// cp.async.bulk.tensor and prefetch.tensormap take.
__device__ __forceinline__ u64 tensormap_addr(const TensorMap* map) {
    return reinterpret_cast<u64>(map);
}

// Brings the tensor map into the cache the TMA unit reads it from, ahead of the
// first copy that names it (optional; saves that copy the fetch).
__device__ __forceinline__ void prefetch_tensormap(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" :: "l"(tensormap_addr(map)) : "memory");
}

// global -> shared (this CTA): the box whose first element is (column c0, row c1)
// lands at `dst` (aligned to the map's smem_align: 128 bytes, or 8 * swizzle) and
// completes box-bytes on `bar`.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_g2s(u32 dst, const TensorMap* map, int c0,
                                                            int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(tensormap_addr(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// shared (this CTA) -> global, in the issuing thread's current bulk group: the box at
// `src` (aligned as for the load, laid out as the load leaves it) is written with its
// first element at (column c0, row c1);
// box elements outside the tensor are dropped.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_s2g(const TensorMap* map, int c0, int c1,
                                                            u32 src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(tensormap_addr(map)), "r"(c0), "r"(c1), "r"(src) : "memory");
}

}  // namespace ptx_lab
