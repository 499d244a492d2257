// kernel/token_gradients/cuda/token_gradients_pairwise.cuh -- Kernel B's G14-G17 for a tile whose
// gates span more than SPAN_LIMIT (kernel/shapes.cuh) in some channel. There Kr = k 2^(gT - gc) is
// flushed to zero for the small k (-ftz=true), and past 126 R1's factors leave fp32's range (Qe's
// 2^(gc - gT) overflows), although every product the tile forms is bounded: entry (i, j <= i) pairs
// the rows through 2^(gc_i - gc_j) <= 1. Here each entry's decay is formed pairwise in fp32, so that
// nothing leaves the range but what truly decays below it.
#pragma once
#include "fragments.cuh"
#include "token_gradients_layout.cuh"
#include "token_gradients_reduce.cuh"

namespace kdb {

// What the tile MMAs G14-G17 give for row i and column kk, each with its row's factor applied:
//   below_m = sum_{j<i} dMqk_ij k_j 2^(gc_i - gc_j)                       = 2^(gc_i - gT) dQe_i   (G14)
//   below_l = sum_{j<i} dLkk_ij k_j 2^(gc_i - gc_j)                       = 2^(gc_i - gT) X_i     (G16)
//   above   = sum_{m>i} (dMqk_mi s q_m + dLkk_mi beta_m k_m) 2^(gc_m - gc_i)
//                                                                         = 2^(gT - gc_i) (G15 + G17)_i
// dMqk and dLkk as the MMAs read them: their bf16 fragments plus the remainders (reduce_partials).
struct PairwiseRow {
    float below_m, below_l, above;
};

__device__ __forceinline__ float frag_value(const unsigned short* frag16, int matrix, int i, int jj) {
    const int p = frag_position(i, jj);
    return bf16_to_f32(frag16[matrix * 256 + p]) + bf16_to_f32(frag16[(matrix + 4) * 256 + p]);
}

// frag16: the reduce step's fragments (matrix 0 dMqk, 2 dLkk; 4 and 6 their remainders); gcs, qs, ks,
// betas as the K phase reads them. The sums run over j (and m) in order; rows at or past the tile's
// length hold zero q and k and gc = gT, as in the MMAs.
__device__ __forceinline__ PairwiseRow pairwise_row(const unsigned short* frag16, const float* gcs,
                                                    const unsigned short* qs, const unsigned short* ks,
                                                    const float* betas, float s, int i, int kk) {
    const float gi = gcs[i * GC_ROW + kk];
    PairwiseRow r{0.f, 0.f, 0.f};
#pragma unroll 1
    for (int j = 0; j < i; ++j) {
        const float kj = bf16_to_f32(ks[j * (ROW / 2) + kk]) * exp2f(gi - gcs[j * GC_ROW + kk]);
        r.below_m += frag_value(frag16, 0, i, j) * kj;
        r.below_l += frag_value(frag16, 2, i, j) * kj;
    }
#pragma unroll 1
    for (int m = i + 1; m < TILE_TOKENS; ++m) {
        const float f = exp2f(gcs[m * GC_ROW + kk] - gi);
        const float qm = s * bf16_to_f32(qs[m * (ROW / 2) + kk]), km = betas[m] * bf16_to_f32(ks[m * (ROW / 2) + kk]);
        r.above += (frag_value(frag16, 0, m, i) * qm + frag_value(frag16, 2, m, i) * km) * f;
    }
    return r;
}

}  // namespace kdb
