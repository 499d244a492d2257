// kernel/ds_scan/cuda/work.cuh -- the kernel's arguments, and what one CTA works on.
#pragma once
#include "layout.cuh"

namespace kda {

// q and k have H heads, everything else HV (FLA's grouped value heads: value head h reads q and k at
// head qk_head(h, HV, H); HV = H without them).
struct Params {
    const unsigned short* q;      // [tokens, H, HEAD_DIM] bf16
    const unsigned short* k;      // [tokens, H, HEAD_DIM] bf16
    const float* gc;              // [tokens, HV, HEAD_DIM]
    const float* beta;            // [tokens, HV]
    const unsigned short* mqk;    // [tokens, HV, TILE_TOKENS] bf16
    const unsigned short* inv;    // [tokens, HV, TILE_TOKENS] bf16
    const unsigned short* dO;     // [tokens, HV, HEAD_DIM] bf16
    const float* dht;             // [N, HV, HEAD_DIM, HEAD_DIM] or null
    void* snapshots;              // [total_snaps, HV, HEAD_DIM, HEAD_DIM] fp32 or bf16
    float* dh0;                   // [N, HV, HEAD_DIM, HEAD_DIM]
    const long long* cu_seqlens;  // [N + 1] token offsets
    const long long* snap_offsets;// [N + 1] snapshot offsets
    const int* order;             // [N] sequence processed by CTA slot (longest first) or null
    int HV;                       // value heads: the grid's
    int H;                        // query / key heads
    float scale;
    const TmaMaps* maps;          // the tensor maps (a __grid_constant__ kernel parameter)
};

// What a CTA works on: v split vs of (value) head h of sequence seq (the order's slot-th longest),
// whose q and k are at head qh; SUMMARY builds: role 0 (the segment's d) or 1 (its M), the grid's y index.
struct CtaWork {
    int vs, h, qh, seq, len, nt, role;
    long long seq_start, snap_base;
};
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
    CtaWork w;
    w.vs = blockIdx.x % VSPLIT;
    w.h = (blockIdx.x / VSPLIT) % p.HV;
    w.qh = qk_head(w.h, p.HV, p.H);
    const int slot = blockIdx.x / (VSPLIT * p.HV);
    w.seq = p.order ? p.order[slot] : slot;
    w.seq_start = p.cu_seqlens[w.seq];
    w.len = (int)(p.cu_seqlens[w.seq + 1] - w.seq_start);
    w.nt = (w.len + TILE_TOKENS - 1) / TILE_TOKENS;
    w.snap_base = p.snap_offsets[w.seq];
    w.role = SUMMARY ? (int)blockIdx.y : 0;
    return w;
}

}  // namespace kda
