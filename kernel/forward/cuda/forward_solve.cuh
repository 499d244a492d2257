// kernel/forward/cuda/forward_solve.cuh -- column j of (I + L)^-1 for a strictly lower 16 x 16 L, in fp32 in
// registers, by forward substitution: x_i = [i == j] - sum_{m < i} L[i][m] x_m, in order of m. Both forwards'
// diagonal blocks of INV come from it, the one pass's a tile at a time (forward_intra.cuh) and the products
// pass's four a chunk (kernel/forward_products), so that the blocks our backward reads are the same bits.
// `l(i, m)` reads L[i][m] where the caller keeps it.
#pragma once
#include "../../shapes.cuh"   // TILE_TOKENS

namespace kda_solve {

template <typename L>
__device__ __forceinline__ void unit_lower_column(float (&x)[TILE_TOKENS], const L& l, int j) {
#pragma unroll
    for (int i = 0; i < TILE_TOKENS; ++i) {
        float acc = i == j ? 1.f : 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) acc -= l(i, m) * x[m];
        x[i] = acc;
    }
}

}  // namespace kda_solve
