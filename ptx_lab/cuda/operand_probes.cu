// ptx_lab/cuda/operand_probes.cu -- single-warp probes of the register steps between two mmas
// (fragments.cuh) and of the .x4 addresses (ldmatrix.cuh): each reads a warp's registers from
// global memory, runs one function of the header, and writes the registers back, so that
// ptx_lab.device can hold the header's code against ptx_lab.fragments' models bit for bit
// (tests/ptx_lab/test_operand_fragments.py, tests/ptx_lab/test_x4_lanes.py).
//
// Arrays are (32, n) row-major: lane l's n values at l * n. No asm here.
#include "fragments.cuh"
#include "ldmatrix.cuh"

namespace ptx_lab {
namespace operand_probes {

constexpr int WARP = 32;

template <int N>
__device__ __forceinline__ void load(float (&x)[N], const float* in, int lane) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = in[lane * N + i];
}
template <int N>
__device__ __forceinline__ void load(u32 (&x)[N], const u32* in, int lane) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = in[lane * N + i];
}
template <int N, class T>
__device__ __forceinline__ void store(T* out, const T (&x)[N], int lane) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[lane * N + i] = x[i];
}

}  // namespace operand_probes
}  // namespace ptx_lab

using namespace ptx_lab;
using namespace ptx_lab::operand_probes;

// left, right: (32, 4) f32, two n-tiles' accumulators -> a: (32, 4) u32, the A fragment.
extern "C" __global__ void __launch_bounds__(WARP)
probe_acc_to_a_bf16(const float* left_in, const float* right_in, u32* a_out) {
    const int lane = threadIdx.x;
    float left[4], right[4];
    load(left, left_in, lane);
    load(right, right_in, lane);
    u32 a[4];
    acc_to_a(a, left, right);
    store(a_out, a, lane);
}
extern "C" __global__ void __launch_bounds__(WARP)
probe_acc_to_a_f16(const float* left_in, const float* right_in, u32* a_out) {
    const int lane = threadIdx.x;
    float left[4], right[4];
    load(left, left_in, lane);
    load(right, right_in, lane);
    u32 a[4];
    acc_to_a_f16(a, left, right);
    store(a_out, a, lane);
}

// a: (32, 4) u32, a bf16 A fragment -> left, right: (32, 4) f32.
extern "C" __global__ void __launch_bounds__(WARP)
probe_a_to_acc(const u32* a_in, float* left_out, float* right_out) {
    const int lane = threadIdx.x;
    u32 a[4];
    load(a, a_in, lane);
    float left[4], right[4];
    a_to_acc(left, right, a);
    store(left_out, left, lane);
    store(right_out, right, lane);
}

// left, right: (32, 4) f32 -> hi, lo: (32, 4) u32, the A fragment in two parts.
extern "C" __global__ void __launch_bounds__(WARP)
probe_acc_to_a_two_parts(const float* left_in, const float* right_in, u32* hi_out, u32* lo_out) {
    const int lane = threadIdx.x;
    float left[4], right[4];
    load(left, left_in, lane);
    load(right, right_in, lane);
    u32 hi[4], lo[4];
    acc_to_a_two_parts(hi, lo, left, right);
    store(hi_out, hi, lane);
    store(lo_out, lo, lane);
}

// x: (32, 8) f32, pairs (x[2r], x[2r + 1]) -> hi, lo: (32, 4) u32, one two_part_bf16x2 a pair.
extern "C" __global__ void __launch_bounds__(WARP)
probe_two_part_bf16x2(const float* x_in, u32* hi_out, u32* lo_out) {
    const int lane = threadIdx.x;
    float x[8];
    load(x, x_in, lane);
    u32 hi[4], lo[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) two_part_bf16x2(hi[r], lo[r], x[2 * r], x[2 * r + 1]);
    store(hi_out, hi, lane);
    store(lo_out, lo, lane);
}

// x: (32,) f32 -> bits: (32,) u32 holding f32_to_bf16(x), back: (32,) f32 = bf16_to_f32(bits),
// rest: (32,) f32 = bf16_rest(x).
extern "C" __global__ void __launch_bounds__(WARP)
probe_bf16_scalars(const float* x_in, u32* bits_out, float* back_out, float* rest_out) {
    const int lane = threadIdx.x;
    const float x = x_in[lane];
    const unsigned short bits = f32_to_bf16(x);
    bits_out[lane] = bits;
    back_out[lane] = bf16_to_f32(bits);
    rest_out[lane] = bf16_rest(x);
}

// f16_lo and f16_hi of one b32 pair a lane: in (32,) u32 -> lo, hi (32,) fp32.
extern "C" __global__ void __launch_bounds__(WARP)
probe_unpack_f16x2(const u32* pairs_in, float* lo_out, float* hi_out) {
    const int lane = threadIdx.x;
    lo_out[lane] = f16_lo(pairs_in[lane]);
    hi_out[lane] = f16_hi(pairs_in[lane]);
}

// The .x4 addresses of the 16x16 block at (row0, col0) of a b16 tile with rows `stride`
// elements apart, as byte offsets from the tile's start: out (32, 4) u32 per lane,
// x4_addr_rows_first, x4_addr_cols_first, then x4_lane_bytes_rows_first / _cols_first plus the
// block's constant row0 * 2 stride + col0 * 2. No instruction reads the tile.
extern "C" __global__ void __launch_bounds__(WARP)
probe_x4_addresses(int row0, int col0, int stride, u32* out) {
    __shared__ unsigned short tile[8];   // only its address is used
    const int lane = threadIdx.x;
    const X4Lane x = x4_lane(lane);
    const u32 base = smem_addr(tile);
    const u32 block = row0 * 2 * stride + col0 * 2;
    out[lane * 4 + 0] = x4_addr_rows_first(tile, stride, row0, col0, lane) - base;
    out[lane * 4 + 1] = x4_addr_cols_first(tile, stride, row0, col0, lane) - base;
    out[lane * 4 + 2] = x4_lane_bytes_rows_first(2 * stride, x) + block;
    out[lane * 4 + 3] = x4_lane_bytes_cols_first(2 * stride, x) + block;
}
