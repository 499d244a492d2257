// kernel/shapes.cuh -- the shapes every kernel shares, on the device: each named once, here.
//
// They are kernel/shapes.py's, under the same names (tests/kernel/test_shapes.py holds the two
// files equal): the host plans, checks and references with that module, the kernels compile
// with this header, and neither can change without the other.
//
// A tile is 16 tokens because an mma.m16n8k16's m is 16: one tile's rows fill one MMA's rows, and
// every serial scan steps one tile at a time. A chunk is FLA's chunk_size: the rows of its 64-wide
// Aqk / Akk, the tokens between two of its states, and the tokens of one Kernel B CTA.
#pragma once

constexpr int HEAD_DIM = 128;                               // K = V: the head size every kernel is built for
constexpr int TILE_TOKENS = 16;                             // tokens per tile
constexpr int CHUNK_TOKENS = 64;                            // tokens per chunk (FLA's chunk_size)
constexpr int TILES_PER_CHUNK = CHUNK_TOKENS / TILE_TOKENS;

static_assert(CHUNK_TOKENS % TILE_TOKENS == 0, "a chunk must be a whole number of tiles");

// The widest span |gc - gT| (log2) a channel may have within a tile for the tile's gated products to
// be factorised about its last row, Qe = s q 2^(gc - gT) against Kr = k 2^(gT - gc); a wider tile
// forms them pairwise (Kernel B's G14-G17, the forward's Mqk and Akk). Both factors stay normal fp32
// up to 126, but the kernels build with -ftz=true, so Kr = k 2^-span is flushed to zero wherever it
// lands below 2^-126, i.e. for |k| < 2^(span - 126), and its products with the later rows' Qe, whose
// true size is O(q . k), are lost: at 124, those of every |k| < 1/4. At 110 only |k| < 2^-16 is flushed, terms
// already below the 2^-9 relative rounding of the bf16 operands they sit beside, and every Kr kept is
// a normal number, with bf16's full 8 bits (below 2^-126 a bf16 keeps fewer).
constexpr float SPAN_LIMIT = 110.f;

// FLA's grouped value heads (GVA): q and k have H heads, every other per-head array (v, do, the gate,
// beta, Aqk, Akk, the states and their gradients) HV = G H, and value head hv reads query / key head
// hv / G, as FLA maps them. Without GVA, HV = H and every head reads its own.
__host__ __device__ constexpr int qk_head(int hv, int HV, int H) { return hv / (HV / H); }

// The tile's gate from each token's own gate (the 64-chunk cumsum folded into its readers,
// docs/kda_forward.md section 8): a reader given each token's natural-log gate g forms the tile-local
// cumsum in log2 units itself, over the tile's rows in order from its first, each term g / ln 2
// rounded before it is added (no fma). Every reader sums by this one step, so all of them, and the
// models (kernel/shapes.py's tile_gate_sums), hold the same bits.
constexpr float RCP_LN2 = 1.4426950408889634f;              // 1 / ln 2 in fp32, FLA's scale of the log gate
__device__ __forceinline__ float add_token_gate(float run, float g) { return __fadd_rn(run, __fmul_rn(g, RCP_LN2)); }
__device__ __forceinline__ void add_token_gates(float* run, float4 g) {   // 4 adjacent columns
    run[0] = add_token_gate(run[0], g.x);
    run[1] = add_token_gate(run[1], g.y);
    run[2] = add_token_gate(run[2], g.z);
    run[3] = add_token_gate(run[3], g.w);
}

// A tile's rows in order, for a reader (a producer warp) whose own rows are first .. first + Own - 1: other(c)
// for each row before and after them, own(r) for each of its own. The others are visited under a predicate
// on a row known at compile time, so that no array is indexed by the warp (a runtime index puts an array in
// local memory).
template <int Own, class Other, class OwnRow>
__device__ __forceinline__ void tile_rows_in_order(int first, Other&& other, OwnRow&& own) {
#pragma unroll
    for (int c = 0; c < TILE_TOKENS - Own; ++c)
        if (c < first) other(c);
#pragma unroll
    for (int r = 0; r < Own; ++r) own(r);
#pragma unroll
    for (int c = Own; c < TILE_TOKENS; ++c)
        if (c >= first + Own) other(c);
}
