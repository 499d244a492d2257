// kernel/forward/cuda/forward_l2norm.cuh -- the l2norm of q and k inside the kernels that read them raw: a
// warp normalises rows of its q and k tiles in shared memory (in place, or, with KeepRows, leaving the raw rows
// and keeping each row's rstd beside them), and one CTA of those that read a (sequence, query head) writes them
// out with each row's rstd for the backward (FLA's l2norm_fwd's tensors). Shared by the one-pass forward's R1
// (forward_r1.cuh) and the three passes' products pass (kernel/forward_products/cuda/forward_products.cu), so
// that both write the same normalised rows.
#pragma once
#include "fragments.cuh"   // bf16_lo, bf16_hi, pack_bf16x2

namespace kda_l2norm {
using namespace ptx_lab;

// The outputs: q and k normalised, bf16, and each row's rstd, fp32.
struct NormOut {
    unsigned short* q;   // row c of the tile at q + c * row; null: no l2norm (with MayOmitRows: the rstd alone)
    unsigned short* k;
    float* q_rstd;       // row c at q_rstd + c * H
    float* k_rstd;
    long long row;       // H * HEAD_DIM
    int H;
    bool write;          // this CTA writes them (the others of the (sequence, query head) only normalise)
};

// A lane's sum of squares of the 4 columns it holds of a row (bf16 pairs lo, hi)
__device__ __forceinline__ float square_sum(uint2 x) {
    const float v[4] = {bf16_lo(x.x), bf16_hi(x.x), bf16_lo(x.y), bf16_hi(x.y)};
    return v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
}

// The 4 columns of a row (bf16 pairs) times r, rounded to bf16 pairs
__device__ __forceinline__ uint2 scaled(uint2 x, float r) {
    return make_uint2(pack_bf16x2(bf16_lo(x.x) * r, bf16_hi(x.x) * r), pack_bf16x2(bf16_lo(x.y) * r, bf16_hi(x.y) * r));
}

// 1 / sqrt(sum + 1e-6) of row lane / (32 / Group) of a group of rows, in every lane, from each lane's partial sums
// ``sums`` of the Group rows, reduced over the warp together: at each of the first log2(Group) levels a lane keeps
// half of the rows it holds and sends its partner the other half (lanes with bit ``off`` set keep the upper half),
// then plain butterfly levels to the fifth: Group - 1 + 5 - log2(Group) shuffles (and Group more to hand each row
// its 1 / sqrt), against 5 Group for a butterfly a row, and one 1 / sqrt a lane against one a row. Every level adds
// the partner's partial sum to the lane's own, over lane bits 16, 8, 4, 2 and 1 in that order: the tree, and so the
// bits, of a butterfly a row.
template <int Group>
__device__ __forceinline__ float group_rstd(float (&sums)[Group], int lane) {
    static_assert(Group == 1 || Group == 2 || Group == 4 || Group == 8 || Group == 16 || Group == 32,
                  "the rows are reduced by halving: a power of two, at most the warp's lanes");
#pragma unroll
    for (int level = 0; level < 5; ++level) {
        const int off = 16 >> level;
        const int held = Group >> level;   // rows a lane holds a partial sum of (0 .. held - 1, renumbered each level)
        if (held > 1) {
            const bool upper = (lane & off) != 0;
#pragma unroll
            for (int i = 0; i < held / 2; ++i) {
                const float keep = upper ? sums[i + held / 2] : sums[i], send = upper ? sums[i] : sums[i + held / 2];
                sums[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
            }
        } else {
            sums[0] += __shfl_xor_sync(0xffffffffu, sums[0], off);
        }
    }
    return 1.f / sqrtf(sums[0] + 1e-6f);
}

// Rows c0 .. c0 + Group - 1 of the q and k tiles (bf16 [rows][at least HEAD_DIM]; lane l: columns col .. col + 3,
// col = 4 l), in place: x / sqrt(sum x^2 + 1e-6) in fp32, rounded to bf16, as FLA's l2norm_fwd (group_rstd; each
// row's 1 / sqrt read from its first lane); the rows rewritten where the kernel's later reads find them, and those
// below L written out where ``out.write``. Rows past L are zero and stay zero. The forward's producers take all of a
// warp's rows at once (8 or 4): the fewest shuffles and 1 / sqrt's, and, with the rows kept in registers between
// the sums and the scaling, no spill beside the forward's 8 consumer warps (168 registers a thread), where groups
// of 2 or 4, or rows read again from shared memory, made ptxas spill a pointer. The products pass takes its 16
// rows 8 at a time: 16 at once put 128 bytes on the stack. ``MayOmitRows``: a null ``out.q`` writes the rstd
// alone (the products pass, where the backward reads the raw rows); a template flag, because the test on the
// pointer made the one pass's l2norm build spill. ``KeepRows``: the tiles keep the raw rows and each row's rstd goes
// to ``q_rows_rstd[c]`` and ``k_rows_rstd[c]`` (shared memory) instead, for a kernel that folds it into its fp32
// operands: the normalised rows' bf16 rounding made a fifth of the three passes' o error (docs/log/68).
template <int Group, bool MayOmitRows = false, bool KeepRows = false, class Tile>
__device__ __forceinline__ void l2norm_rows(Tile& q_tile, Tile& k_tile, int c0, int col, int L, int lane,
                                            const NormOut& out, float* q_rows_rstd = nullptr,
                                            float* k_rows_rstd = nullptr) {
    uint2 qb[Group], kb[Group];
    float qs[Group], ks[Group];
#pragma unroll
    for (int r = 0; r < Group; ++r) {
        qb[r] = *reinterpret_cast<const uint2*>(&q_tile[c0 + r][col]);
        kb[r] = *reinterpret_cast<const uint2*>(&k_tile[c0 + r][col]);
        qs[r] = square_sum(qb[r]);
        ks[r] = square_sum(kb[r]);
    }
    const float q_rstd = group_rstd<Group>(qs, lane), k_rstd = group_rstd<Group>(ks, lane);
#pragma unroll
    for (int r = 0; r < Group; ++r) {
        const int c = c0 + r;
        const float qr = __shfl_sync(0xffffffffu, q_rstd, r * (32 / Group));
        const float kr = __shfl_sync(0xffffffffu, k_rstd, r * (32 / Group));
        const uint2 qn = scaled(qb[r], qr), kn = scaled(kb[r], kr);
        if constexpr (KeepRows) {
            if (lane == 0) {
                q_rows_rstd[c] = qr;
                k_rows_rstd[c] = kr;
            }
        } else {
            *reinterpret_cast<uint2*>(&q_tile[c][col]) = qn;   // each lane rewrites the columns it read
            *reinterpret_cast<uint2*>(&k_tile[c][col]) = kn;
        }
        if (out.write && c < L) {
            if (!MayOmitRows || out.q != nullptr) {
                *reinterpret_cast<uint2*>(out.q + c * out.row + col) = qn;
                *reinterpret_cast<uint2*>(out.k + c * out.row + col) = kn;
            }
            if (lane == 0) {
                out.q_rstd[(long long)c * out.H] = qr;
                out.k_rstd[(long long)c * out.H] = kr;
            }
        }
    }
}

}  // namespace kda_l2norm
