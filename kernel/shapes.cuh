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

// FLA's grouped value heads (GVA): q and k have H heads, every other per-head array (v, do, the gate,
// beta, Aqk, Akk, the states and their gradients) HV = G H, and value head hv reads query / key head
// hv / G, as FLA maps them. Without GVA, HV = H and every head reads its own.
__host__ __device__ constexpr int qk_head(int hv, int HV, int H) { return hv / (HV / H); }
