// kernel/forward_products/cuda/forward_products.cu -- the first pass of the three-pass forward: every
// 64-token chunk's state-free products at once, one CTA a (chunk, value head), all chunks in parallel.
//
// Per chunk (rows c < L real; rows >= L: q = k = v = beta = 0, gc = gc[L-1]; gc is FLA's g, the chunk-local
// cumsum of the log2 gate, gT = gc[L-1]; the token-gate build, FP_TOKEN_GATE, takes each token's natural-log
// gate and forms gc itself, each channel's 64 rows summed in order by kernel/shapes.cuh's add_token_gate; the
// l2norm build, FP_L2NORM, takes q and k as the caller has them and normalises them first):
//     Aqk  = tril(s q k^T weighted 2^(gc_i - gc_j)), its diagonal s q . k      [64 x 64]
//     Lkk  = strict_tril(diag(beta) k k^T weighted the same)                     [64 x 64]
//     INV  = (I + Lkk)^-1 (fp32)
//     w    = INV bf16(beta k 2^gc),  u = INV bf16(beta v),  kg = k 2^(gT - gc),  qg = s q 2^gc,  decay = 2^gT
// w, kg and qg go out in bf16 (the chain and the o pass read them), decay in fp32. Aqk goes out in two bf16,
// aqk = bf16(Aqk) and aqk_lo = bf16(Aqk - aqk), so that the o pass reads it to about 16 bits: in one bf16 its
// rounding makes 13% of o's error in the model. u goes out in fp16, divided by a power of two 2^e a chunk
// (u_scale, fp32): the chain subtracts w S from u, so u's rounding goes straight into v_new, and fp16 rounds 8x
// finer than bf16 in the same bytes. fp16 tops out at 65504 and u has no bound of its own (v is any bf16), so e
// is chosen from a bound on |u|: INV's largest row sum of magnitudes times the largest |bf16(beta v)|, put in
// (2^14, 2^15] (half fp16's top: room for bf16(INV) rounding up and the MMA's sums), which also lifts a chunk of
// small values clear of fp16's subnormals. In training mode also the 16 x 16 diagonal blocks of Aqk (aqk's bits: the
// backward reads one bf16) and of INV in FLA's [tokens, HV, 64] layout, which our backward reads.
// chunk_operands of tests/kernel/three_pass_model.py (u_format "fp16") is the arithmetic, rounding for rounding.
//
// Every factorised product stays within fp32 for any gate. Warp I owns sub-chunk I (rows 16 I ..):
// * below the diagonal, block (I, J < I) pairs rows of I with rows of J through 2^(gc_i - gc_j), factorised
//   about g_ref = gc[16 I - 1], the row before sub-chunk I: x_i 2^(gc_i - g_ref) and k_j 2^(g_ref - gc_j);
// * the diagonal block is factorised about its own last row, as the one pass's tiles are, or formed
//   pairwise in fp32 where a channel of the block spans past SPAN_LIMIT (kernel/shapes.cuh).
// The MMA operands are built in registers, lane by lane, from q, k and gc in shared memory: each element
// of a fragment is one exp2 and its rounding to bf16, so no operand tile is staged. Aqk's operands go in two
// bf16 each (hi + lo, three MMAs, about 16 bits): o reads Aqk directly, and in the model one bf16 an operand
// makes 15% of o's error (docs/log/50). Lkk's k e keeps one bf16: its rounding is lost among INV's and the
// chain's. INV's diagonal blocks are solved by forward substitution (a lane a column), the blocks below in
// three stages of fp32 products, each stage's blocks on as many warps; w and u are MMAs of bf16(INV) against
// bf16(beta k 2^gc) and bf16(beta v), staged once.
//
// Tensors: q, k bf16 [tokens, H, 128]; v bf16 [tokens, HV, 128]; g fp32 [tokens, HV, 128]; beta fp32
// [tokens, HV]; chunk table int2 [chunks] (first token, real rows L); out: w, kg, qg bf16 [chunks, HV,
// 64, 128], u fp16 [chunks, HV, 64, 128], u_scale fp32 [chunks, HV, 4] (2^e, 0, 0, 0: 16 bytes, the chain's
// smallest bulk copy), aqk, aqk_lo bf16 [chunks, HV, 64, 64], decay fp32 [chunks, HV, 128]; training: aqk_blocks,
// inv_blocks bf16 [tokens, HV, 64] (only the 16 columns of each row's own block are written), or null; the
// l2norm build in training: q_norm, k_norm bf16 [tokens, H, 128] and q_rstd, k_rstd fp32 [tokens, H], q and k
// as normalised and each row's rstd, written by the CTA of the first value head of the query head's group,
// or null (q_norm and k_norm null with the rstd given: the rstd alone).
#include "../../shapes.cuh"   // HEAD_DIM, TILE_TOKENS, CHUNK_TOKENS, TILES_PER_CHUNK, SPAN_LIMIT, qk_head
#include "cp_async.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "../../forward/cuda/forward_solve.cuh"   // the diagonal blocks' forward substitution, the one pass's
#include "../../forward/cuda/forward_l2norm.cuh"  // the l2norm of q and k rows in shared memory, the one pass's

#ifndef FP_TOKEN_GATE
#error "FP_TOKEN_GATE is not set: kernel/forward_products/config.py sets every knob (Config.token_gate)"
#endif
#ifndef FP_L2NORM
#error "FP_L2NORM is not set: kernel/forward_products/config.py sets every knob (Config.l2norm)"
#endif

using namespace ptx_lab;

namespace fp {

constexpr int WARPS = TILES_PER_CHUNK;      // warp I owns sub-chunk I
constexpr int THREADS = 32 * WARPS;
constexpr bool TOKEN_GATE = FP_TOKEN_GATE != 0;   // g is each token's natural-log gate, summed here
constexpr bool L2NORM = FP_L2NORM != 0;           // q and k as the caller has them, l2-normalised here
static_assert(THREADS == HEAD_DIM, "the token-gate build's sums: a thread a channel");
constexpr int R = CHUNK_TOKENS;
constexpr int OP_STRIDE = HEAD_DIM + 8;     // bf16 rows of 272 bytes: ldmatrix rows in distinct bank groups
constexpr int G_STRIDE = HEAD_DIM + 8;      // fp32 rows: a half-warp's float2 reads of 4 rows x 4 lanes hit 32 banks
constexpr int L_STRIDE = R + 4;             // fp32 rows of Lkk and INV
constexpr int U_TOP_EXP = 15;               // u's bound is put in (2^14, 2^15] (U_FP16_TOP_EXP of the model)
constexpr int U_EXP_LIMIT = 100;            // |e| at most this: 2^e and 2^-e normal fp32 (the model's U_EXP_LIMIT)

// Three tiles, each reused as its contents are read for good, so that the CTA fits three times on an SM
// (about 69 KB): the pass waits on latency, not on memory or the tensor pipe, and more chunks side by side
// hide more of it (docs/log/65).
//     q   q, then bf16(beta k 2^gc) (bk_tile), formed after the products' MMAs
//     k   k, then Aqk staged on its way out, then INV (inv_tile)
//     g   gc, then Lkk and the inverse's scratch (lkk_tile, part_tile), then v, loaded once INV is whole, and
//         bf16(beta v) in place (bv_tile)
struct Shared {
    unsigned short q[R][OP_STRIDE];
    unsigned short k[R][OP_STRIDE];
    float g[R][G_STRIDE];
    float beta[R];
    float q_rstd[R], k_rstd[R];             // the l2norm build: each row's rstd, folded into the operands formed
    float u_bound_parts[2][WARPS];          // per warp: the largest |bf16(beta v)|, INV's largest row sum
};
using OpTile = unsigned short[R][OP_STRIDE];
using LTile = float[R][L_STRIDE];
using PartTile = float[WARPS][TILE_TOKENS][TILE_TOKENS + 1];   // a warp's block product, between its halves
static_assert(sizeof(LTile) == sizeof(Shared::k), "INV takes k's bytes");
static_assert(sizeof(LTile) + sizeof(PartTile) <= sizeof(Shared::g), "Lkk and the scratch fit in gc's bytes");
static_assert(sizeof(OpTile) <= sizeof(Shared::g), "v fits in gc's bytes");
__device__ __forceinline__ OpTile& bk_tile(Shared& sh) { return sh.q; }
__device__ __forceinline__ LTile& inv_tile(Shared& sh) { return *reinterpret_cast<LTile*>(&sh.k[0][0]); }
__device__ __forceinline__ LTile& lkk_tile(Shared& sh) { return *reinterpret_cast<LTile*>(&sh.g[0][0]); }
__device__ __forceinline__ PartTile& part_tile(Shared& sh) {
    return *reinterpret_cast<PartTile*>(reinterpret_cast<unsigned char*>(&sh.g[0][0]) + sizeof(LTile));
}
__device__ __forceinline__ OpTile& bv_tile(Shared& sh) { return *reinterpret_cast<OpTile*>(&sh.g[0][0]); }

// The l2norm build keeps q's and k's raw rows and scales each value by its row's rstd in fp32 as it forms an
// operand (rows rounded to bf16 once normalised made a fifth of o's error: docs/log/68); 1 in the other builds.
__device__ __forceinline__ float row_scale(const float (&rstd)[R], int row) {
    if constexpr (L2NORM) return rstd[row]; else return 1.f;
}

// bf16(x) as the low / high half of an MMA operand register
__device__ __forceinline__ u32 pair(float lo, float hi) { return pack_bf16x2(lo, hi); }

// d += a b with both operands in two bf16 (two_part_bf16x2): hi hi + hi lo + lo hi into the one accumulator, about
// 16 bits an operand where one MMA reads 8; lo lo (at most 2^-16 of a product) is left out.
__device__ __forceinline__ void mma_split(float (&d)[4], const u32 (&a)[4], const u32 (&a_lo)[4], const u32 (&b)[2],
                                          const u32 (&b_lo)[2]) {
    mma_m16n8k16_bf16(d, a, b, d);
    mma_m16n8k16_bf16(d, a, b_lo, d);
    mma_m16n8k16_bf16(d, a_lo, b, d);
}

// Four fp32 values at (row, c), (row, c + 1), (row, c + 8), (row, c + 9) of a bf16 tile: a lane's share of an
// m16n8k16 fragment's row (A: a0/a2 or a1/a3; B: b0/b1) at k-step columns c = 16 ks + 2 t
struct Quad { float v[4]; };
__device__ __forceinline__ Quad bf16_quad(const unsigned short (*tile)[OP_STRIDE], int row, int c) {
    const u32 lo = *reinterpret_cast<const u32*>(&tile[row][c]), hi = *reinterpret_cast<const u32*>(&tile[row][c + 8]);
    return {{bf16_lo(lo), bf16_hi(lo), bf16_lo(hi), bf16_hi(hi)}};
}
__device__ __forceinline__ Quad scaled_quad(const unsigned short (*tile)[OP_STRIDE], int row, int c, float r) {
    const Quad x = bf16_quad(tile, row, c);
    return {{x.v[0] * r, x.v[1] * r, x.v[2] * r, x.v[3] * r}};
}
__device__ __forceinline__ Quad g_quad(const Shared& sh, int row, int c) {
    const float2 lo = *reinterpret_cast<const float2*>(&sh.g[row][c]), hi = *reinterpret_cast<const float2*>(&sh.g[row][c + 8]);
    return {{lo.x, lo.y, hi.x, hi.y}};
}


// The A fragments of s q e (in two bf16: aq, aq_lo) and of k e (one bf16: ak) for this lane's two rows (q, k
// and the factor e of row gr: *a; of row gr + 8: *b). s q e feeds only Aqk, whose operand rounding o reads
// directly; k e feeds only Lkk, whose rounding INV and the chain lose among their own.
__device__ __forceinline__ void scaled_a(u32 (&aq)[4], u32 (&aq_lo)[4], u32 (&ak)[4], const Quad& qa, const Quad& qb,
                                         const Quad& ka, const Quad& kb, const float (&ea)[4], const float (&eb)[4],
                                         float scale) {
    two_part_bf16x2(aq[0], aq_lo[0], scale * qa.v[0] * ea[0], scale * qa.v[1] * ea[1]);
    two_part_bf16x2(aq[1], aq_lo[1], scale * qb.v[0] * eb[0], scale * qb.v[1] * eb[1]);
    two_part_bf16x2(aq[2], aq_lo[2], scale * qa.v[2] * ea[2], scale * qa.v[3] * ea[3]);
    two_part_bf16x2(aq[3], aq_lo[3], scale * qb.v[2] * eb[2], scale * qb.v[3] * eb[3]);
    ak[0] = pair(ka.v[0] * ea[0], ka.v[1] * ea[1]);
    ak[1] = pair(kb.v[0] * eb[0], kb.v[1] * eb[1]);
    ak[2] = pair(ka.v[2] * ea[2], ka.v[3] * ea[3]);
    ak[3] = pair(kb.v[2] * eb[2], kb.v[3] * eb[3]);
}

// The B fragment of k f for one row of the product's columns (the lane's row gr of an n-tile), in two bf16:
// Aqk reads b and b_lo, Lkk b alone (which is bf16(k f), the same as one rounding)
__device__ __forceinline__ void scaled_b(u32 (&b)[2], u32 (&b_lo)[2], const Quad& k, const float (&f)[4]) {
    two_part_bf16x2(b[0], b_lo[0], k.v[0] * f[0], k.v[1] * f[1]);
    two_part_bf16x2(b[1], b_lo[1], k.v[2] * f[2], k.v[3] * f[3]);
}

}  // namespace fp

extern "C" __constant__ int fp_smem_bytes = static_cast<int>(sizeof(fp::Shared));
extern "C" __constant__ int fp_threads = fp::THREADS;

extern "C" __global__ void __launch_bounds__(fp::THREADS, 3) kda_forward_products(
        const unsigned short* __restrict__ q, const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
        const float* __restrict__ g, const float* __restrict__ beta, const int2* __restrict__ chunk_table, int H, int HV,
        float scale, unsigned short* __restrict__ w_out, unsigned short* __restrict__ u_out,
        unsigned short* __restrict__ kg_out, unsigned short* __restrict__ qg_out, unsigned short* __restrict__ aqk_out,
        unsigned short* __restrict__ aqk_lo_out, float* __restrict__ decay_out, float* __restrict__ u_scale_out,
        unsigned short* __restrict__ aqk_blocks, unsigned short* __restrict__ inv_blocks,
        unsigned short* __restrict__ q_norm, unsigned short* __restrict__ k_norm, float* __restrict__ q_rstd,
        float* __restrict__ k_rstd) {
    using namespace fp;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    const int c = blockIdx.x / HV, hv = blockIdx.x % HV, hq = qk_head(hv, HV, H);
    const int2 entry = chunk_table[c];
    const long long tok0 = entry.x;
    const int L = entry.y;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, t = lane % 4;
    const long long ch = static_cast<long long>(c) * HV + hv;   // (chunk, value head): the outputs' index

    // ---- loads: rows < L by cp.async (16 bytes a copy), the rest zero; gc past L = gc[L - 1] (the token-gate
    // build: each token's gate past L zero, so that its sum stays at row L - 1's); v comes once INV is whole ----
    for (int i = tid; i < R * (HEAD_DIM / 8); i += THREADS) {
        const int row = i / (HEAD_DIM / 8), col = 8 * (i % (HEAD_DIM / 8));
        if (row < L) {
            const long long tk = tok0 + row;
            cp_async_cg16(smem_addr(&sh.q[row][col]), q + (tk * H + hq) * HEAD_DIM + col);
            cp_async_cg16(smem_addr(&sh.k[row][col]), k + (tk * H + hq) * HEAD_DIM + col);
        } else {
            *reinterpret_cast<uint4*>(&sh.q[row][col]) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(&sh.k[row][col]) = make_uint4(0, 0, 0, 0);
        }
    }
    for (int i = tid; i < R * (HEAD_DIM / 4); i += THREADS) {
        const int row = i / (HEAD_DIM / 4), col = 4 * (i % (HEAD_DIM / 4));
        if (TOKEN_GATE && row >= L)
            *reinterpret_cast<float4*>(&sh.g[row][col]) = make_float4(0.f, 0.f, 0.f, 0.f);
        else
            cp_async_cg16(smem_addr(&sh.g[row][col]), g + ((tok0 + min(row, L - 1)) * HV + hv) * HEAD_DIM + col);
    }
    cp_async_commit();
    if (tid < R) sh.beta[tid] = tid < L ? beta[(tok0 + tid) * HV + hv] : 0.f;
    cp_async_wait<0>();
    __syncthreads();

    // ---- the token-gate build: gc = each channel's sum over the chunk's rows in order (a thread a channel);
    // the l2norm build: each warp takes its sub-chunk's q and k rows' rstd (the rows stay raw: row_scale),
    // and the CTA of the query head's first value head writes them normalised with their rstd for the backward ----
    if constexpr (TOKEN_GATE) {
        float run = 0.f;
#pragma unroll 16
        for (int row = 0; row < R; ++row) {
            run = add_token_gate(run, sh.g[row][tid]);
            sh.g[row][tid] = run;
        }
    }
    if constexpr (L2NORM) {
        const long long first = tok0 * H + hq;   // (the chunk's first token, query head hq)'s row
        // q_norm null and q_rstd given: the rstd alone (the backward then reads the raw rows)
        const kda_l2norm::NormOut norm{q_norm != nullptr ? q_norm + first * HEAD_DIM : nullptr,
                                       k_norm != nullptr ? k_norm + first * HEAD_DIM : nullptr, q_rstd + first,
                                       k_rstd + first, static_cast<long long>(H) * HEAD_DIM, H,
                                       q_rstd != nullptr && hv % (HV / H) == 0};
        constexpr int AT_ONCE = 8;   // the warp's 16 rows 8 at a time (forward_l2norm.cuh: 16 went to the stack)
#pragma unroll
        for (int r = 0; r < TILE_TOKENS; r += AT_ONCE)
            kda_l2norm::l2norm_rows<AT_ONCE, true, true>(sh.q, sh.k, TILE_TOKENS * warp + r, 4 * lane, L, lane, norm,
                                                         sh.q_rstd, sh.k_rstd);
    }
    if constexpr (TOKEN_GATE || L2NORM) __syncthreads();   // every row's gc, q and k as the rest reads them

    // ---- elementwise: kg, qg, decay (out); each thread 4 consecutive channels of a row ----
#pragma unroll 4
    for (int i = tid; i < R * (HEAD_DIM / 4); i += THREADS) {
        const int row = i / (HEAD_DIM / 4), col = 4 * (i % (HEAD_DIM / 4));
        const float4 gc = *reinterpret_cast<const float4*>(&sh.g[row][col]);
        const float4 gT = *reinterpret_cast<const float4*>(&sh.g[R - 1][col]);   // rows >= L hold gc[L - 1]
        const uint2 kb = *reinterpret_cast<const uint2*>(&sh.k[row][col]);
        const uint2 qb = *reinterpret_cast<const uint2*>(&sh.q[row][col]);
        const float gcv[4] = {gc.x, gc.y, gc.z, gc.w}, gTv[4] = {gT.x, gT.y, gT.z, gT.w};
        const float rk = row_scale(sh.k_rstd, row), rq = row_scale(sh.q_rstd, row);
        const float kf[4] = {bf16_lo(kb.x) * rk, bf16_hi(kb.x) * rk, bf16_lo(kb.y) * rk, bf16_hi(kb.y) * rk};
        const float qf[4] = {bf16_lo(qb.x) * rq, bf16_hi(qb.x) * rq, bf16_lo(qb.y) * rq, bf16_hi(qb.y) * rq};
        float kg[4], qg[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            kg[e] = kf[e] * exp2f(gTv[e] - gcv[e]);
            qg[e] = scale * qf[e] * exp2f(gcv[e]);
        }
        const size_t o = (static_cast<size_t>(ch) * R + row) * HEAD_DIM + col;
        *reinterpret_cast<uint2*>(kg_out + o) = make_uint2(pair(kg[0], kg[1]), pair(kg[2], kg[3]));
        *reinterpret_cast<uint2*>(qg_out + o) = make_uint2(pair(qg[0], qg[1]), pair(qg[2], qg[3]));
        if (row == R - 1) *reinterpret_cast<float4*>(decay_out + ch * HEAD_DIM + col) =
            make_float4(exp2f(gT.x), exp2f(gT.y), exp2f(gT.z), exp2f(gT.w));
    }

    // ---- the diagonal block's span, per warp (NaN counts as past): the same in every lane, as the MMAs
    // below need (a warp's lanes must all take or all skip them) ----
    const int r0 = TILE_TOKENS * warp;
    bool past = false;
    for (int i = lane; i < TILE_TOKENS * HEAD_DIM; i += 32) {
        const int row = r0 + i / HEAD_DIM, col = i % HEAD_DIM;
        past |= !(sh.g[row][col] - sh.g[r0 + TILE_TOKENS - 1][col] <= SPAN_LIMIT);
    }
    past = __any_sync(0xffffffffu, past);

    // ---- warp I's row block of Aqk and Lkk ----
    // fragment rows of this lane: A rows r0 + gr, r0 + gr + 8; B rows (columns of the product) j0 + gr (+8)
    const int ra = r0 + gr, rb = r0 + gr + 8;
    const float rqa = row_scale(sh.q_rstd, ra), rqb = row_scale(sh.q_rstd, rb);
    const float rka = row_scale(sh.k_rstd, ra), rkb = row_scale(sh.k_rstd, rb);
    float dq[2][4], dk[2][4];           // the diagonal block, factorised: Qe Kr^T, Ke Kr^T
    float oq[3][2][4], ok[3][2][4];     // blocks (I, J < I): Qi Kj^T, Ki Kj^T
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            dq[n][e] = dk[n][e] = 0.f;
#pragma unroll
            for (int J = 0; J < 3; ++J) oq[J][n][e] = ok[J][n][e] = 0.f;
        }
#pragma unroll 1
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
        const int cc = 16 * ks + 2 * t;
        const Quad qa = scaled_quad(sh.q, ra, cc, rqa), qb = scaled_quad(sh.q, rb, cc, rqb);
        const Quad ka = scaled_quad(sh.k, ra, cc, rka), kb = scaled_quad(sh.k, rb, cc, rkb);
        const Quad ga = g_quad(sh, ra, cc), gb = g_quad(sh, rb, cc);
        if (!past) {   // diagonal: about the block's last row; its rows are the B rows too (n-tile 0: gr, 1: gr + 8)
            const Quad gT = g_quad(sh, r0 + TILE_TOKENS - 1, cc);
            float ea[4], eb[4], fa[4], fb[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                ea[e] = exp2f(ga.v[e] - gT.v[e]); eb[e] = exp2f(gb.v[e] - gT.v[e]);
                fa[e] = exp2f(gT.v[e] - ga.v[e]); fb[e] = exp2f(gT.v[e] - gb.v[e]);
            }
            u32 aq[4], aq_lo[4], ak[4], b0[2], b0_lo[2], b1[2], b1_lo[2];
            scaled_a(aq, aq_lo, ak, qa, qb, ka, kb, ea, eb, scale);
            scaled_b(b0, b0_lo, ka, fa);
            scaled_b(b1, b1_lo, kb, fb);
            mma_split(dq[0], aq, aq_lo, b0, b0_lo); mma_split(dq[1], aq, aq_lo, b1, b1_lo);
            mma_m16n8k16_bf16(dk[0], ak, b0, dk[0]); mma_m16n8k16_bf16(dk[1], ak, b1, dk[1]);
        }
        if (warp > 0) {   // below the diagonal: about g_ref, the row before the sub-chunk
            const Quad gref = g_quad(sh, r0 - 1, cc);
            float ua[4], ub[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) { ua[e] = exp2f(ga.v[e] - gref.v[e]); ub[e] = exp2f(gb.v[e] - gref.v[e]); }
            u32 aq[4], aq_lo[4], ak[4];
            scaled_a(aq, aq_lo, ak, qa, qb, ka, kb, ua, ub, scale);
#pragma unroll
            for (int J = 0; J < 3; ++J) {
                if (J >= warp) break;
                const int ja = TILE_TOKENS * J + gr, jb = ja + 8;
                const Quad kja = scaled_quad(sh.k, ja, cc, row_scale(sh.k_rstd, ja));
                const Quad kjb = scaled_quad(sh.k, jb, cc, row_scale(sh.k_rstd, jb));
                const Quad gja = g_quad(sh, ja, cc), gjb = g_quad(sh, jb, cc);
                float da[4], db[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) { da[e] = exp2f(gref.v[e] - gja.v[e]); db[e] = exp2f(gref.v[e] - gjb.v[e]); }
                u32 b0[2], b0_lo[2], b1[2], b1_lo[2];
                scaled_b(b0, b0_lo, kja, da);
                scaled_b(b1, b1_lo, kjb, db);
                mma_split(oq[J][0], aq, aq_lo, b0, b0_lo); mma_split(oq[J][1], aq, aq_lo, b1, b1_lo);
                mma_m16n8k16_bf16(ok[J][0], ak, b0, ok[J][0]); mma_m16n8k16_bf16(ok[J][1], ak, b1, ok[J][1]);
            }
        }
    }

    // The pairwise diagonal block, in fp32 into the accumulators' places: sum_d x_i k_j 2^(gc_i - gc_j).
    // Element e of n-tile n: row r0 + gr + 8 (e >> 1), column 8 n + 2 t + (e & 1) of the block.
    if (past) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = gr + 8 * (e >> 1), j = 8 * n + 2 * t + (e & 1), row = r0 + i;
                float sq = 0.f, sk = 0.f;
                if (j < i && row < L) {
                    const float rq = row_scale(sh.q_rstd, row), rk = row_scale(sh.k_rstd, row);
                    const float rkj = row_scale(sh.k_rstd, r0 + j);
#pragma unroll 4
                    for (int d = 0; d < HEAD_DIM; ++d) {
                        const float f = exp2f(sh.g[row][d] - sh.g[r0 + j][d]);
                        const float kj = bf16_to_f32(sh.k[r0 + j][d]) * rkj;
                        sq += bf16_to_f32(sh.q[row][d]) * rq * kj * f;
                        sk += bf16_to_f32(sh.k[row][d]) * rk * kj * f;
                    }
                }
                dq[n][e] = scale * sq;
                dk[n][e] = sk;
            }
    }
    // the diagonal of Aqk: s q . k of each row (lanes over channels, a fixed butterfly); lane i keeps row i's.
    // All 16 rows' lane sums first, then each butterfly step over the 16 at once: a step's shuffles are
    // independent of each other, so the warp waits out a shuffle's latency 5 times rather than 80.
    float dot[TILE_TOKENS];
#pragma unroll
    for (int i = 0; i < TILE_TOKENS; ++i) {
        dot[i] = 0.f;
        const float rq = row_scale(sh.q_rstd, r0 + i), rk = row_scale(sh.k_rstd, r0 + i);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dot[i] += (bf16_to_f32(sh.q[r0 + i][4 * lane + e]) * rq) * (bf16_to_f32(sh.k[r0 + i][4 * lane + e]) * rk);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
#pragma unroll
        for (int i = 0; i < TILE_TOKENS; ++i) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], off);
    float diag = 0.f;
#pragma unroll
    for (int i = 0; i < TILE_TOKENS; ++i)
        if (lane == i) diag = scale * dot[i];
    __syncthreads();   // q is read for good: its bytes become bk

    // ---- bk = bf16(beta k 2^gc), the B operand of w, into q's bytes; each thread 4 consecutive channels ----
    OpTile& bk_rows = bk_tile(sh);
#pragma unroll 4
    for (int i = tid; i < R * (HEAD_DIM / 4); i += THREADS) {
        const int row = i / (HEAD_DIM / 4), col = 4 * (i % (HEAD_DIM / 4));
        const float4 gc = *reinterpret_cast<const float4*>(&sh.g[row][col]);
        const uint2 kb = *reinterpret_cast<const uint2*>(&sh.k[row][col]);
        const float gcv[4] = {gc.x, gc.y, gc.z, gc.w};
        const float rk = row_scale(sh.k_rstd, row);
        const float kf[4] = {bf16_lo(kb.x) * rk, bf16_hi(kb.x) * rk, bf16_lo(kb.y) * rk, bf16_hi(kb.y) * rk};
        const float b = sh.beta[row];
        float bk[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) bk[e] = b * kf[e] * exp2f(gcv[e]);
        *reinterpret_cast<uint2*>(&bk_rows[row][col]) = make_uint2(pair(bk[0], bk[1]), pair(bk[2], bk[3]));
    }
    __syncthreads();   // k and gc are read for good: their bytes become INV (Aqk staged first), Lkk and the scratch
    LTile& lkk = lkk_tile(sh);
    LTile& inv = inv_tile(sh);
    PartTile& part = part_tile(sh);

    // Aqk's and Lkk's row block out of the registers: rows >= L zero, Lkk with beta's rows. Aqk goes to
    // shared memory first, staged in the INV tile (written before the inverse needs it).
    float* aqk_row = &inv[0][0];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = gr + 8 * (e >> 1), j = 8 * n + 2 * t + (e & 1), row = r0 + i;
            const bool real = row < L;
            aqk_row[row * L_STRIDE + r0 + j] = real && j < i ? dq[n][e] : 0.f;
            lkk[row][r0 + j] = real && j < i ? sh.beta[row] * dk[n][e] : 0.f;
#pragma unroll
            for (int J = 0; J < 3; ++J) {
                if (J >= warp) break;
                aqk_row[row * L_STRIDE + TILE_TOKENS * J + 8 * n + 2 * t + (e & 1)] = real ? oq[J][n][e] : 0.f;
                lkk[row][TILE_TOKENS * J + 8 * n + 2 * t + (e & 1)] = real ? sh.beta[row] * ok[J][n][e] : 0.f;
            }
        }
    __syncwarp();   // the block's zeros on the diagonal are written before the diagonal itself
    if (lane < TILE_TOKENS) aqk_row[(r0 + lane) * L_STRIDE + r0 + lane] = r0 + lane < L ? diag : 0.f;
    __syncwarp();
    // Aqk's rows of this warp out in two bf16 [64 x 64] (zero right of the diagonal: both parts); the diagonal
    // block also to FLA's layout for the backward, its hi part (the backward reads one bf16)
#pragma unroll 4
    for (int i = lane; i < TILE_TOKENS * (R / 2); i += 32) {
        const int row = r0 + i / (R / 2), col = 2 * (i % (R / 2));
        const float a0 = col <= row ? aqk_row[row * L_STRIDE + col] : 0.f;
        const float a1 = col + 1 <= row ? aqk_row[row * L_STRIDE + col + 1] : 0.f;
        u32 hi, lo;
        two_part_bf16x2(hi, lo, a0, a1);
        const size_t o = (static_cast<size_t>(ch) * R + row) * R + col;
        *reinterpret_cast<u32*>(aqk_out + o) = hi;
        *reinterpret_cast<u32*>(aqk_lo_out + o) = lo;
        if (aqk_blocks != nullptr && row < L && col >= r0 && col < r0 + TILE_TOKENS)
            *reinterpret_cast<u32*>(aqk_blocks + ((tok0 + row) * HV + hv) * R + col) = hi;
    }
    __syncthreads();   // Lkk whole; Aqk read out of the INV tile

    // ---- INV = (I + Lkk)^-1: the diagonal blocks by forward substitution, lane j < 16 solving column j ----
    if (lane < TILE_TOKENS) {
        const int j = lane;
        float x[TILE_TOKENS];
        kda_solve::unit_lower_column(x, [&](int i, int m) { return lkk[r0 + i][r0 + m]; }, j);
#pragma unroll
        for (int i = 0; i < TILE_TOKENS; ++i) inv[r0 + i][r0 + j] = x[i];
    }
    // zero above the diagonal blocks (the w and u products read whole rows)
#pragma unroll 4
    for (int i = lane; i < TILE_TOKENS * R; i += 32) {
        const int row = r0 + i / R, col = i % R;
        if (col >= r0 + TILE_TOKENS) inv[row][col] = 0.f;
    }
    __syncthreads();
    // the blocks below, stage by stage: block (I, J) = -INV_II sum_{J <= m < I} L_Im INV_mJ needs only rows
    // above I, so stage I's blocks run on warps J = 0 .. I - 1 at once. Lane: row i = lane / 2, 8 columns.
#pragma unroll 1
    for (int I = 1; I < WARPS; ++I) {
        if (warp < I) {
            const int J = warp, i = lane / 2, j0 = 8 * (lane % 2);
            float acc[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = 0.f;
            // unrolled so that the loads of several m are in flight at once (the FMAs' order is m's either way)
#pragma unroll 4
            for (int m = TILE_TOKENS * J; m < TILE_TOKENS * I; ++m) {
                const float l = lkk[TILE_TOKENS * I + i][m];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = fmaf(l, inv[m][TILE_TOKENS * J + j0 + e], acc[e]);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) part[warp][i][j0 + e] = acc[e];
            __syncwarp();
            float out[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) out[e] = 0.f;
#pragma unroll 4
            for (int m = 0; m < TILE_TOKENS; ++m) {
                const float d = inv[TILE_TOKENS * I + i][TILE_TOKENS * I + m];
#pragma unroll
                for (int e = 0; e < 8; ++e) out[e] = fmaf(d, part[warp][m][j0 + e], out[e]);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) inv[TILE_TOKENS * I + i][TILE_TOKENS * J + j0 + e] = -out[e];
        }
        __syncthreads();
    }

    // ---- v into gc's bytes (Lkk and the scratch are read for good: the stages above end on a barrier), in
    // flight while w is formed; rows past L zero ----
    OpTile& bv_rows = bv_tile(sh);
    for (int i = tid; i < R * (HEAD_DIM / 8); i += THREADS) {
        const int row = i / (HEAD_DIM / 8), col = 8 * (i % (HEAD_DIM / 8));
        if (row < L)
            cp_async_cg16(smem_addr(&bv_rows[row][col]), v + ((tok0 + row) * HV + hv) * HEAD_DIM + col);
        else
            *reinterpret_cast<uint4*>(&bv_rows[row][col]) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();

    // ---- INV's largest row sum of magnitudes, for u's scale below (warp I its 16 rows, lane i < 16 row r0 + i) ----
    float row_sum = 0.f;
    if (lane < TILE_TOKENS)
#pragma unroll 8
        for (int c = 0; c < R; ++c) row_sum += fabsf(inv[r0 + lane][c]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) row_sum = fmaxf(row_sum, __shfl_xor_sync(0xffffffffu, row_sum, off));
    if (lane == 0) sh.u_bound_parts[1][warp] = row_sum;   // read after the barriers below

    // the diagonal block of INV to FLA's layout for the backward (bf16)
    if (inv_blocks != nullptr)
        for (int i = lane; i < TILE_TOKENS * (TILE_TOKENS / 2); i += 32) {
            const int row = r0 + i / (TILE_TOKENS / 2), col = r0 + 2 * (i % (TILE_TOKENS / 2));
            if (row < L)
                *reinterpret_cast<u32*>(inv_blocks + ((tok0 + row) * HV + hv) * R + col) =
                    pair(inv[row][col], inv[row][col + 1]);
        }

    // ---- w = bf16(INV) bk, u = bf16(INV) bv: warp I's 16 rows, all 128 columns; k-steps past the diagonal
    // block are zero and skipped; w out in bf16, u divided by 2^e (exact) in fp16 ----
    const X4Lane xl = x4_lane(lane);
    u32 a[TILES_PER_CHUNK][4];
#pragma unroll
    for (int kk = 0; kk < TILES_PER_CHUNK; ++kk) {
        const int cc = 16 * kk + 2 * t;
        a[kk][0] = pair(inv[ra][cc], inv[ra][cc + 1]);
        a[kk][1] = pair(inv[rb][cc], inv[rb][cc + 1]);
        a[kk][2] = pair(inv[ra][cc + 8], inv[ra][cc + 9]);
        a[kk][3] = pair(inv[rb][cc + 8], inv[rb][cc + 9]);
    }
    // w leaves in bf16; u leaves times u_div (2^-e) in fp16, the scale that keeps it in fp16's range
    const auto times_inv = [&](const OpTile& b_tile, unsigned short* out, bool is_u, float u_div) {
#pragma unroll 2
        for (int np = 0; np < HEAD_DIM / 16; ++np) {   // 16 columns at a time: two n-tiles
            float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int kk = 0; kk < TILES_PER_CHUNK; ++kk) {
                if (kk > warp) break;
                // B[r][col] = b_tile rows, by ldmatrix .trans: matrix i = lane / 8 is r block i & 1, col block i >> 1
                const int r = 16 * kk + 8 * ((lane >> 3) & 1) + xl.row, col = 16 * np + 8 * (lane >> 4);
                u32 b[4];
                ldmatrix_x4_trans(b, smem_addr(&b_tile[r][col]));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(acc[0], a[kk], b_lo, acc[0]);
                mma_m16n8k16_bf16(acc[1], a[kk], b_hi, acc[1]);
            }
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int col = 16 * np + 8 * n + 2 * t;
                const u32 lo = !is_u ? pair(acc[n][0], acc[n][1]) : pack_f16x2(acc[n][0] * u_div, acc[n][1] * u_div);
                const u32 hi = !is_u ? pair(acc[n][2], acc[n][3]) : pack_f16x2(acc[n][2] * u_div, acc[n][3] * u_div);
                *reinterpret_cast<u32*>(out + (static_cast<size_t>(ch) * R + ra) * HEAD_DIM + col) = lo;
                *reinterpret_cast<u32*>(out + (static_cast<size_t>(ch) * R + rb) * HEAD_DIM + col) = hi;
            }
        }
    };
    times_inv(bk_tile(sh), w_out, false, 1.f);

    // ---- bv = bf16(beta v) in place, and the largest |bv| for u's scale ----
    cp_async_wait<0>();
    __syncthreads();   // every row of v landed
    float bv_max = 0.f;   // fmaxf drops a NaN, as the model's np.fmax does
#pragma unroll 4
    for (int i = tid; i < R * (HEAD_DIM / 4); i += THREADS) {
        const int row = i / (HEAD_DIM / 4), col = 4 * (i % (HEAD_DIM / 4));
        const uint2 vb = *reinterpret_cast<const uint2*>(&bv_rows[row][col]);
        const float b = sh.beta[row];
        const u32 bv01 = pair(b * bf16_lo(vb.x), b * bf16_hi(vb.x)), bv23 = pair(b * bf16_lo(vb.y), b * bf16_hi(vb.y));
        *reinterpret_cast<uint2*>(&bv_rows[row][col]) = make_uint2(bv01, bv23);
        // the largest |bf16(beta v)|, of the values the MMA reads
        bv_max = fmaxf(bv_max, fmaxf(fmaxf(fabsf(bf16_lo(bv01)), fabsf(bf16_hi(bv01))),
                                     fmaxf(fabsf(bf16_lo(bv23)), fabsf(bf16_hi(bv23)))));
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) bv_max = fmaxf(bv_max, __shfl_xor_sync(0xffffffffu, bv_max, off));
    if (lane == 0) sh.u_bound_parts[0][warp] = bv_max;
    __syncthreads();   // bv whole, and both parts of u's bound

    // ---- u's scale 2^e: the bound on |u| = INV's largest row sum of magnitudes times the largest
    // |bf16(beta v)|, put in (2^14, 2^15]; 1 where the bound is zero or not finite (u is past fp32 already) ----
    float bv_top = 0.f, row_top = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) {
        bv_top = fmaxf(bv_top, sh.u_bound_parts[0][i]);
        row_top = fmaxf(row_top, sh.u_bound_parts[1][i]);
    }
    const float bound = row_top * bv_top;
    int u_exp = 0;
    if (bound > 0.f && bound <= 3.4028234663852886e38f) {   // normal (row_top >= 1, bv_top 0 or normal):
        // bound = m 2^f with m in [0.5, 1), as frexp, f = the biased exponent - 126
        const int f = static_cast<int>((__float_as_uint(bound) >> 23) & 0xffu) - 126;
        u_exp = min(max(f - U_TOP_EXP, -U_EXP_LIMIT), U_EXP_LIMIT);
    }
    const float u_div = __uint_as_float(static_cast<u32>(127 - u_exp) << 23);   // 2^-e, exact and never 0
    if (tid == 0)
        *reinterpret_cast<float4*>(u_scale_out + ch * 4) =
            make_float4(__uint_as_float(static_cast<u32>(127 + u_exp) << 23), 0.f, 0.f, 0.f);
    times_inv(bv_rows, u_out, true, u_div);
}
