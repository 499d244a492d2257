// ptx_lab/cuda/fragments.cuh -- a warp's registers between one mma and the next: fp32
// accumulators packed into a bf16 A fragment, an fp32 operand in two bf16 parts, and bf16
// values back to fp32.
//
// No instruction of its own beyond common.cuh's conversions: what these functions carry is a
// layout claim (mma.cuh's fragments, g = lane / 4, t = lane % 4) and a rounding claim.
//
// Accumulators as an A operand. Two adjacent 16x8 n-tiles `left`, `right` of an m16n8k16
// accumulator (c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]) hold, in
// every lane, exactly the elements that lane needs of the A fragment of [left | right]:
//     a0 = (left.c0, left.c1)    a1 = (left.c2, left.c3)
//     a2 = (right.c0, right.c1)  a3 = (right.c2, right.c3)      (low half first)
// so packing pairwise turns a product into the next product's left operand with no shuffle,
// movmatrix or shared memory. The same four registers are what stmatrix .x4 .trans of a
// cols-first address stores as the tile's transpose (ldmatrix.cuh), which is how the kernels
// write a state held transposed in accumulators. a_to_acc is the way back: an A fragment's
// bf16 pairs as the fp32 accumulators of the two n-tiles.
//
// The two-part operand. mma reads bf16, 8 significant bits; an operand computed in fp32 loses
// up to 2^-9 of itself in that one rounding. Two parts take it back:
//     hi = bf16(x)            (round to nearest even)
//     lo = bf16(x - hi)       (x - hi is exact in fp32)
// and hi @ B + lo @ B into one fp32 accumulator reads about 16 bits of x. Each lane splits
// its own elements: hi and lo have hi's layout, element for element.
// Two forms give the same bits: two_part_bf16x2 reads the rounding back from the packed pair
// (one conversion a pair), acc_to_a_two_parts rounds every element on its own first (bf16_rest:
// one more conversion an element); the kernels each keep the form their SASS was measured with.
//
// ptx_lab.fragments holds the CPU models (acc_to_a, a_to_acc, two_part, acc_to_a_two_parts),
// built from the fragment maps rather than from this pairwise packing; the probes in
// operand_probes.cu run this code for ptx_lab.device, and tests/ptx_lab/test_operand_fragments.py
// holds the two equal.
#pragma once
#include "common.cuh"

namespace ptx_lab {

// ---- bf16 <-> fp32, one value or one half of a b32 pair ----
// A bf16 is the top half of an fp32: widening is a shift, exact.
__device__ __forceinline__ float bf16_lo(u32 pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(u32 pair) { return __uint_as_float(pair & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(unsigned short bits) {
    return __uint_as_float(static_cast<u32>(bits) << 16);
}
// fp32 -> bf16 bits, round to nearest even (the low half of pack_bf16x2's pair).
__device__ __forceinline__ unsigned short f32_to_bf16(float x) {
    return static_cast<unsigned short>(pack_bf16x2(x, 0.f) & 0xffffu);
}
// What bf16 rounding leaves of x: x - bf16(x), exact in fp32 (the two-part operand's second
// part before its own rounding).
__device__ __forceinline__ float bf16_rest(float x) { return x - bf16_to_f32(f32_to_bf16(x)); }

// ---- f16 -> fp32, one half of a b32 pair ----
// Exact: every f16, subnormals included, is a normal fp32. Unlike bf16 an f16 is not the top of
// an fp32 (5 exponent bits, not 8), so widening is a cvt, which takes a 16-bit register: the pair
// is split into its halves first (the low half is the element with the lower index, as
// pack_f16x2 packs it).
__device__ __forceinline__ float f16_lo(u32 pair) {
    float f;
    asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.f32.f16 %0, lo;\n\t}" : "=f"(f) : "r"(pair));
    return f;
}
__device__ __forceinline__ float f16_hi(u32 pair) {
    float f;
    asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.f32.f16 %0, hi;\n\t}" : "=f"(f) : "r"(pair));
    return f;
}

// ---- accumulators -> A fragment ----
// The A fragment of [left | right] from the accumulators of two adjacent n-tiles (above).
__device__ __forceinline__ void acc_to_a(u32 (&a)[4], const float (&left)[4], const float (&right)[4]) {
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}
// The same for an f16 mma.
__device__ __forceinline__ void acc_to_a_f16(u32 (&a)[4], const float (&left)[4], const float (&right)[4]) {
    a[0] = pack_f16x2(left[0], left[1]);
    a[1] = pack_f16x2(left[2], left[3]);
    a[2] = pack_f16x2(right[0], right[1]);
    a[3] = pack_f16x2(right[2], right[3]);
}
// The way back: a bf16 A fragment as the fp32 accumulators of its two n-tiles (exact).
__device__ __forceinline__ void a_to_acc(float (&left)[4], float (&right)[4], const u32 (&a)[4]) {
    left[0] = bf16_lo(a[0]); left[1] = bf16_hi(a[0]);
    left[2] = bf16_lo(a[1]); left[3] = bf16_hi(a[1]);
    right[0] = bf16_lo(a[2]); right[1] = bf16_hi(a[2]);
    right[2] = bf16_lo(a[3]); right[3] = bf16_hi(a[3]);
}

// ---- the two-part operand ----
// One pair: hi = (bf16(x0), bf16(x1)), lo = what that rounding left, read back from hi. The subtraction is
// __fsub_rn so that it is never contracted into an FMA with a product that x came from: lo is then the rest of
// x as rounded to fp32, as the CPU models have it, wherever the caller computes x inline.
__device__ __forceinline__ void two_part_bf16x2(u32& hi, u32& lo, float x0, float x1) {
    hi = pack_bf16x2(x0, x1);
    lo = pack_bf16x2(__fsub_rn(x0, bf16_lo(hi)), __fsub_rn(x1, bf16_hi(hi)));
}
// The A fragment of [left | right] in two parts: hi its rounding, lo the rounding of the rest.
__device__ __forceinline__ void acc_to_a_two_parts(u32 (&hi)[4], u32 (&lo)[4], const float (&left)[4],
                                                   const float (&right)[4]) {
    float rest_left[4], rest_right[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        rest_left[e] = bf16_rest(left[e]);
        rest_right[e] = bf16_rest(right[e]);
    }
    acc_to_a(hi, left, right);
    acc_to_a(lo, rest_left, rest_right);
}

}  // namespace ptx_lab
