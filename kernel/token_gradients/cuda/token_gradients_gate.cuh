// kernel/token_gradients/cuda/token_gradients_gate.cuh -- Kernel B's gate epilogue: the backward of the
// gate activation FLA's layer asks the op to apply (kernel/activations.py), where dg is formed.
//
// Built with KDB_GATE=1 (the "token-gradients-gate" variant), the kernel writes, instead of dg,
// dg_raw = dg * dg/dx (bf16, g_raw's dtype) with x = g_raw + dt_bias[h, c], and per CTA the partial sums
// of ddt_bias (per channel, over the CTA's tokens) and dA_log (over its tokens and channels), for the
// caller to add over the CTAs (runs) in a fixed order. KDB_GATE=0 is the plain kernel, its SASS untouched.
#pragma once
#include "fragments.cuh"
#include "token_gradients_layout.cuh"

#ifndef KDB_GATE
#error "KDB_GATE must be defined: 0 (Kernel B writes dg) or 1 (the gate activation's backward in its epilogue)"
#endif

namespace kdb {

// the activation's form (kernel.token_gradients.launch.GATE_FORMS)
constexpr int GATE_SOFTPLUS = 1;   // g = -exp(A_log) softplus(x)
constexpr int GATE_SIGMOID = 2;    // g = L sigmoid(a x), a = exp(A_log) or 1

struct GateArgs {
    const unsigned short* g_raw;   // bf16 [tokens, HV, 128]
    const float* a_log;            // fp32 [HV], or null (the sigmoid form only: a = 1)
    const float* dt_bias;          // fp32 [HV, 128], or null
    unsigned short* dg_raw;        // bf16 [tokens, HV, 128]
    float* da_part;                // fp32 [runs, HV]: this CTA's share of dA_log, or null (no A_log)
    float* ddt_part;               // fp32 [runs, HV, 128]: ... of ddt_bias, or null (no dt_bias)
    int form;                      // GATE_SOFTPLUS or GATE_SIGMOID
    float lower_bound;             // L of the sigmoid form
};

struct GateGrad {
    float dx;   // dg * dg/dx: dg_raw's and dt_bias's term
    float da;   // dg * dg/dA_log
};

// exp(A_log) of head h (1 where the sigmoid form has no A_log): read once per CTA
__device__ __forceinline__ float gate_scale(const GateArgs& ga, int h) {
    return ga.a_log != nullptr ? expf(ga.a_log[h]) : 1.f;
}

// fp32; a = gate_scale(ga, h). The softplus form needs sigmoid(x) (dg/dx) and softplus(x) (dg/dA_log = g):
// both come from one exponential, e = exp(-|x|), instead of exp(-x) and exp(x):
//   sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0 (one reciprocal for both);
//   softplus(x) = max(x, 0) + log1p(e).
// e lies in [0, 1] (0 only where fp32 flushes exp(-|x|) below its normal range), so 1 + e is in [1, 2]:
// nothing overflows for any x, and no cutoff is needed (for large x the log1p term falls under half an ulp
// of x and softplus(x) rounds to x, which torch's softplus takes as given past 20).
// The sigmoid form, in the order of kernel.activations.gate_backward's torch expressions, already has one
// exponential: exp(-a x) is inf below a x = -88, where s = 1 / inf = 0 is the right limit.
__device__ __forceinline__ GateGrad gate_grad(const GateArgs& ga, float a, float dy, float x) {
    GateGrad r;
    if (ga.form == GATE_SOFTPLUS) {
        const float amp = -a;
        const float e = expf(-fabsf(x));
        const float rcp = 1.f / (1.f + e);
        const float sig = x >= 0.f ? rcp : e * rcp;
        const float sp = fmaxf(x, 0.f) + log1pf(e);
        r.dx = dy * amp * sig;
        r.da = dy * amp * sp;
    } else {
        const bool scaled = ga.a_log != nullptr;
        const float ax = scaled ? a * x : x;
        const float s = 1.f / (1.f + expf(-ax));
        const float d_inner = dy * (ga.lower_bound * s * (1.f - s));
        r.dx = scaled ? d_inner * a : d_inner;
        r.da = r.dx * x;
    }
    return r;
}

// Each channel's 16 rows of a tile are split between two lanes: lane l < 16 owns rows 0..7 of channel
// 16 warp + l, lane l + 16 its rows 8..15, so the whole warp shares the transcendental work.
constexpr int GATE_ROWS = TILE_TOKENS / 2;

// g_raw of one channel for GATE_ROWS rows j < lt at off0 + j rs in [tokens, HV, 128] (0 from lt on). Every
// load is issued before any is used, at the tile's start: the tile's phases then hide their one latency,
// which loaded beside the epilogue every warp of the SM's one CTA waited out together.
__device__ __forceinline__ void gate_raw_rows(const GateArgs& ga, long long off0, long long rs, int lt,
                                              unsigned short (&raw)[GATE_ROWS]) {
#pragma unroll
    for (int j = 0; j < GATE_ROWS; ++j) raw[j] = j < lt ? ga.g_raw[off0 + j * rs] : 0;
}

// dt_bias of one channel (hc: its index in dt_bias [HV, 128]), 0 without it: read once per CTA
__device__ __forceinline__ float gate_bias(const GateArgs& ga, int hc) {
    return ga.dt_bias != nullptr ? ga.dt_bias[hc] : 0.f;
}

// x = g_raw + dt_bias of those rows
__device__ __forceinline__ void gate_inputs(const unsigned short (&raw)[GATE_ROWS], float bias,
                                            float (&x)[GATE_ROWS]) {
#pragma unroll
    for (int j = 0; j < GATE_ROWS; ++j) x[j] = bf16_to_f32(raw[j]) + bias;
}

// dg_raw of one element (off: its index in [tokens, HV, 128]; x from gate_inputs), this thread's
// partial sums carried in dt_sum, da_sum
__device__ __forceinline__ void gate_epilogue(const GateArgs& ga, float a, float dy, float x, long long off,
                                              float& dt_sum, float& da_sum) {
    const GateGrad r = gate_grad(ga, a, dy, x);
    ga.dg_raw[off] = f32_to_bf16(r.dx);
    dt_sum += r.dx;
    da_sum += r.da;
}

// The CTA's partials out, after its last tile, in a fixed order so two runs give the same bits. ddt_bias's
// per channel: lane l's sum (rows 0..7 of each tile, in token order) plus lane l + 16's (rows 8..15), written
// by lane l of each warp for channel 16 warp + l. dA_log's over the 128 channels: a fixed shuffle tree over
// the warp's 32 lanes, then the WARPS warps in turn. scratch: WARPS floats of shared memory no thread reads
// any more; every thread of the CTA calls this.
__device__ __forceinline__ void gate_partials(const GateArgs& ga, float dt_sum, float da_sum, long long cta,
                                              int warp, int lane, float* scratch) {
    if (ga.ddt_part != nullptr) {   // the same for every thread
        const float dt = dt_sum + __shfl_down_sync(0xffffffffu, dt_sum, 16);
        if (lane < 16) ga.ddt_part[cta * HEAD_DIM + 16 * warp + lane] = dt;
    }
    if (ga.da_part == nullptr) return;   // the same for every thread
    float x = da_sum;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += scratch[w];
        ga.da_part[cta] = s;
    }
}

}  // namespace kdb
