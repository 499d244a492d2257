// kernel/ds_scan/cuda/r1.cuh -- R1, the step that rebuilds qd, kd and kr on chip: from a
// stage's raw q, k and gc rows, in fp32, rounded once to bf16 into the stage's operand tiles
// (and what qd's rounding left, in bf16 too, over the raw q rows: qd_rest_offset).
#pragma once
#include "fragments.cuh"
#include "layout.cuh"

namespace kda {

// gc[c][k] of a stage: dense rows (cp.async) or GC_BOXES boxes of 64 columns (TMA).
__device__ __forceinline__ const float* gc_at(const Stage& st, int c, int k) {
    return TMA_LOADS ? &st.gc[(k / GC_BOX_COLS) * TILE_TOKENS * GC_BOX_COLS + c * GC_BOX_COLS + k % GC_BOX_COLS]
                     : &st.gc[c * HEAD_DIM + k];
}

// EPL consecutive bf16 as one shared-memory access (no <type_traits> under NVRTC).
template <int EPL> struct BF16Row;
template <> struct BF16Row<4> { using type = uint2; };
template <> struct BF16Row<8> { using type = uint4; };

// R1: qd, kd, kr in fp32 from raw q/k and gc, rounded once to bf16.
// Producer warp pw handles tokens TOKENS_PER_PRODUCER*pw + r. R1_LANE_COUNT lanes share a token:
// 32 (lane handles k = 4*lane .. 4*lane+3) or 16 (two tokens at once, one per half-warp, lane
// handles 8 consecutive k: a 16-byte store per operand, which is one core-matrix row, and 4
// butterfly levels per norm instead of 5). Every shared read and write is a contiguous row
// segment (no bank conflicts, unlike a fragment-ordered walk where 32 lanes hit 32 tokens
// of one column).
// Phased (load all rows, reduce all norms together, then compute and store):
// written token by token, each token's 2 x 5 dependent shuffles and its
// sqrt/div ran back to back (the compiler cannot hoist the next token's shared
// loads above this token's shared stores), and R1 became the per-tile bottleneck,
// its time proportional to the tokens per producer warp (logs 3 and 4).
// TOKEN_GATE: gc holds each token's natural-log gate: every lane sums its columns over the tile's rows in
// order from the first (kernel/shapes.cuh's add_token_gate and tile_rows_in_order; the producers' mbarrier
// let every warp's rows in), keeping the sums at its own rows, gT at the end. Rows past L were zero-filled:
// they add nothing, and their gc is 0, as in the other builds (their q and k are zero).
template <int EPL, int R>
__device__ __forceinline__ void token_sums(const Stage& st, int L, int pw, int sub, int k0, float (&gt)[EPL],
                                           float (&sums)[R][EPL]) {
    constexpr int TPP = 32 / R1_LANE_COUNT;   // tokens per warp-wide pass
    const int cw = pw * TOKENS_PER_PRODUCER;  // the warp's first row
    float run[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) run[e] = 0.f;
    auto add = [&](int c) {
#pragma unroll
        for (int e = 0; e < EPL; e += 4)
            add_token_gates(&run[e], *reinterpret_cast<const float4*>(gc_at(st, c, k0 + e)));
    };
    tile_rows_in_order<TOKENS_PER_PRODUCER>(cw, add, [&](int rr) {
        add(cw + rr);
        if (rr % TPP == sub) {   // this lane's token cw + sub + TPP r
            const bool real = cw + rr < L;
#pragma unroll
            for (int e = 0; e < EPL; ++e) sums[rr / TPP][e] = real ? run[e] : 0.f;
        }
    });
#pragma unroll
    for (int e = 0; e < EPL; ++e) gt[e] = run[e];
}

// FLA_INPUTS: gc holds FLA's chunk-local gate and gbase this warp's copy of it at the token
// before the tile; R1 subtracts gbase from the rows of real tokens and from gT, which gives the
// tile-local gate exactly as the tile inputs carry it. Rows past L stay zero: their q and k are
// zero, and exp2 of a rebased zero (up to 2^460) would make 0 * inf.
__device__ __forceinline__ void rebuild_operands(Stage& st, int L, float scale, int pw, int lane, bool gt_in_gc,
                                                 const float* gbase = nullptr) {
    constexpr int EPL = HEAD_DIM / R1_LANE_COUNT;   // k per lane: 4 or 8
    constexpr int TPP = 32 / R1_LANE_COUNT;      // tokens per warp-wide pass: 1 or 2
    constexpr int R = TOKENS_PER_PRODUCER / TPP; // passes
    static_assert(TOKENS_PER_PRODUCER % TPP == 0, "R1_LANES 16 needs an even number of tokens per producer warp");
    using RawRow = typename BF16Row<EPL>::type;
    const int sub = lane / R1_LANE_COUNT, hl = lane % R1_LANE_COUNT;
    const int k0 = EPL * hl;
    const int c0 = pw * TOKENS_PER_PRODUCER + sub;
    // gc stops at the last real token
    float gt[EPL], base[EPL];
    float sums[R][EPL];   // TOKEN_GATE: gc of this lane's rows
    if constexpr (TOKEN_GATE) token_sums(st, L, pw, sub, k0, gt, sums);
#pragma unroll
    for (int e = 0; e < EPL; e += 4) {
        if constexpr (!TOKEN_GATE) {   // (TOKEN_GATE: token_sums made gt)
            const float4 b = FLA_INPUTS ? *reinterpret_cast<const float4*>(&gbase[k0 + e])
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
            base[e] = b.x; base[e + 1] = b.y; base[e + 2] = b.z; base[e + 3] = b.w;
            float4 g = *reinterpret_cast<const float4*>(TMA_LOADS || gt_in_gc ? gc_at(st, L - 1, k0 + e)
                                                                              : &st.gT[pw][k0 + e]);
            if constexpr (FLA_INPUTS) { g.x -= b.x; g.y -= b.y; g.z -= b.z; g.w -= b.w; }
            gt[e] = g.x; gt[e + 1] = g.y; gt[e + 2] = g.z; gt[e + 3] = g.w;
        }
        if (pw == EGT_WARP && sub == 0)
            *reinterpret_cast<float4*>(&st.egT[k0 + e]) =
                make_float4(exp2f(gt[e]), exp2f(gt[e + 1]), exp2f(gt[e + 2]), exp2f(gt[e + 3]));
    }
    float qv[R][EPL], kv[R][EPL], gv[R][EPL];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + TPP * r;
        RawRow qraw = *reinterpret_cast<const RawRow*>(&st.q[c * HEAD_DIM + k0]);
        RawRow kraw = *reinterpret_cast<const RawRow*>(&st.k[c * HEAD_DIM + k0]);
        const u32* qw = reinterpret_cast<const u32*>(&qraw);
        const u32* kw = reinterpret_cast<const u32*>(&kraw);
        const bool tail = TMA_LOADS && c >= L;   // a tensor copy's rows past the sequence (cp.async zero-fills them)
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            qv[r][e] = tail ? 0.f : bf16_lo(qw[e / 2]); qv[r][e + 1] = tail ? 0.f : bf16_hi(qw[e / 2]);
            kv[r][e] = tail ? 0.f : bf16_lo(kw[e / 2]); kv[r][e + 1] = tail ? 0.f : bf16_hi(kw[e / 2]);
        }
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            if constexpr (TOKEN_GATE) {
#pragma unroll
                for (int u = 0; u < 4; ++u) gv[r][e + u] = sums[r][e + u];
                continue;
            }
            float4 g = *reinterpret_cast<const float4*>(gc_at(st, c, k0 + e));
            if (FLA_INPUTS && c < L) { g.x -= base[e]; g.y -= base[e + 1]; g.z -= base[e + 2]; g.w -= base[e + 3]; }
            gv[r][e] = tail ? 0.f : g.x; gv[r][e + 1] = tail ? 0.f : g.y;
            gv[r][e + 2] = tail ? 0.f : g.z; gv[r][e + 3] = tail ? 0.f : g.w;
        }
    }
    float qs[R], ks[R];
#if L2NORM
    // x / sqrt(sum(x^2) + 1e-6), fp32, as flash-linear-attention's l2norm; the 2R
    // butterfly reductions (within each R1_LANE_COUNT-lane group) run interleaved.
#pragma unroll
    for (int r = 0; r < R; ++r) {
        qs[r] = ks[r] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            qs[r] += qv[r][e] * qv[r][e];
            ks[r] += kv[r][e] * kv[r][e];
        }
    }
#pragma unroll
    for (int o = R1_LANE_COUNT / 2; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qs[r] += __shfl_xor_sync(0xffffffffu, qs[r], o);
            ks[r] += __shfl_xor_sync(0xffffffffu, ks[r], o);
        }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        // rsqrtf: one MUFU.RSQ (<= 2 ulp); scale / sqrtf was an IEEE sqrt and divide
        // with slow-path branches (log 5).
        qs[r] = scale * rsqrtf(qs[r] + 1e-6f);
        ks[r] = rsqrtf(ks[r] + 1e-6f);
    }
#else
#pragma unroll
    for (int r = 0; r < R; ++r) { qs[r] = scale; ks[r] = 1.f; }
#endif
    __syncwarp();   // every lane has read this warp's q rows: the rest of qd overwrites them
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = c0 + TPP * r;
        u32 qd[EPL / 2], kd[EPL / 2], kr[EPL / 2], rest[EPL / 2];
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            float a[2], b[2], d[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const float eg = exp2f(gv[r][e + u]);
                a[u] = qs[r] * qv[r][e + u] * eg;
                b[u] = ks[r] * kv[r][e + u] * eg;
                d[u] = ks[r] * kv[r][e + u] * exp2f(gt[e + u] - gv[r][e + u]);   // exp2 of a difference: no overflow for strong gates
            }
            two_part_bf16x2(qd[e / 2], rest[e / 2], a[0], a[1]);   // qd and what its rounding left
            kd[e / 2] = pack_bf16x2(b[0], b[1]);
            kr[e / 2] = pack_bf16x2(d[0], d[1]);
        }
        const int o = op_offset(c, k0);   // EPL consecutive k stay inside one 8-k core-matrix row
        *reinterpret_cast<RawRow*>(&st.qd[o]) = *reinterpret_cast<const RawRow*>(qd);
        *reinterpret_cast<RawRow*>(&st.kd[o]) = *reinterpret_cast<const RawRow*>(kd);
        *reinterpret_cast<RawRow*>(&st.kr[o]) = *reinterpret_cast<const RawRow*>(kr);
        *reinterpret_cast<RawRow*>(&st.q[qd_rest_offset(c, k0)]) = *reinterpret_cast<const RawRow*>(rest);
    }
    // WGMMA: the consumers' warpgroup MMAs read qd/kd through the async proxy; these generic
    // stores must be made visible to it before the FULL arrive releases them
    if constexpr (WGMMA) fence_proxy_async_shared();
}

}  // namespace kda
