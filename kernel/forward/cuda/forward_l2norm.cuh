// kernel/forward/cuda/forward_l2norm.cuh -- the l2norm of q and k inside the kernels that read them raw: a
// warp normalises rows of its q and k tiles in shared memory, in place, and one CTA of those that read a
// (sequence, query head) writes them out with each row's rstd for the backward (FLA's l2norm_fwd's
// tensors). Shared by the one-pass forward's R1 (forward_r1.cuh) and the three passes' products pass
// (kernel/forward_products/cuda/forward_products.cu), so that both round as one.
#pragma once
#include "fragments.cuh"   // bf16_lo, bf16_hi, pack_bf16x2

namespace kda_l2norm {
using namespace ptx_lab;

// The outputs: q and k normalised, bf16, and each row's rstd, fp32.
struct NormOut {
    unsigned short* q;   // row c of the tile at q + c * row; null: no l2norm
    unsigned short* k;
    float* q_rstd;       // row c at q_rstd + c * H
    float* k_rstd;
    long long row;       // H * HEAD_DIM
    int H;
    bool write;          // this CTA writes them (the others of the (sequence, query head) only normalise)
};

// Rows c0 .. c0 + Rows - 1 of the q and k tiles (bf16 [rows][at least HEAD_DIM]; lane l: columns col .. col + 3,
// col = 4 l), in place: x / sqrt(sum x^2 + 1e-6) in fp32, rounded to bf16, as FLA's l2norm_fwd. The rows' sums
// of squares are reduced together (a butterfly each, interleaved), the rows rewritten where the kernel's later
// reads find them, and those below L written out where ``out.write``. Rows past L are zero and stay zero.
template <int Rows, class Tile>
__device__ __forceinline__ void l2norm_some_rows(Tile& q_tile, Tile& k_tile, int c0, int col, int L, int lane,
                                                 const NormOut& out) {
    uint2 qb[Rows], kb[Rows];
    float qs[Rows], ks[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
        qb[r] = *reinterpret_cast<const uint2*>(&q_tile[c0 + r][col]);
        kb[r] = *reinterpret_cast<const uint2*>(&k_tile[c0 + r][col]);
        const float q[4] = {bf16_lo(qb[r].x), bf16_hi(qb[r].x), bf16_lo(qb[r].y), bf16_hi(qb[r].y)};
        const float k[4] = {bf16_lo(kb[r].x), bf16_hi(kb[r].x), bf16_lo(kb[r].y), bf16_hi(kb[r].y)};
        qs[r] = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
        ks[r] = k[0] * k[0] + k[1] * k[1] + k[2] * k[2] + k[3] * k[3];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
#pragma unroll
        for (int r = 0; r < Rows; ++r) {
            qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], off);
            ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], off);
        }
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
        const int c = c0 + r;
        const float qr = 1.f / sqrtf(qs[r] + 1e-6f), kr = 1.f / sqrtf(ks[r] + 1e-6f);
        const uint2 qn = make_uint2(pack_bf16x2(bf16_lo(qb[r].x) * qr, bf16_hi(qb[r].x) * qr),
                                    pack_bf16x2(bf16_lo(qb[r].y) * qr, bf16_hi(qb[r].y) * qr));
        const uint2 kn = make_uint2(pack_bf16x2(bf16_lo(kb[r].x) * kr, bf16_hi(kb[r].x) * kr),
                                    pack_bf16x2(bf16_lo(kb[r].y) * kr, bf16_hi(kb[r].y) * kr));
        *reinterpret_cast<uint2*>(&q_tile[c][col]) = qn;   // each lane rewrites the columns it read
        *reinterpret_cast<uint2*>(&k_tile[c][col]) = kn;
        if (out.write && c < L) {
            *reinterpret_cast<uint2*>(out.q + c * out.row + col) = qn;
            *reinterpret_cast<uint2*>(out.k + c * out.row + col) = kn;
            if (lane == 0) {
                out.q_rstd[(long long)c * out.H] = qr;
                out.k_rstd[(long long)c * out.H] = kr;
            }
        }
    }
}

// ... AtOnce rows at a time: the forward takes 2 (beside its 8 consumer warps, 168 registers a thread, four or
// eight at once spilled, and so, through ptxas's allocation, did one), the products pass 8. The bits are the
// same for any AtOnce: each row's arithmetic is its own.
template <int Rows, int AtOnce, class Tile>
__device__ __forceinline__ void l2norm_rows(Tile& q_tile, Tile& k_tile, int c0, int col, int L, int lane,
                                            const NormOut& out) {
    static_assert(Rows % AtOnce == 0, "the rows go AtOnce at a time");
#pragma unroll
    for (int r = 0; r < Rows; r += AtOnce) l2norm_some_rows<AtOnce>(q_tile, k_tile, c0 + r, col, L, lane, out);
}

}  // namespace kda_l2norm
