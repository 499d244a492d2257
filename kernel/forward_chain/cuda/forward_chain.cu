// kernel/forward_chain/cuda/forward_chain.cu -- the forward's chain in 64-token steps: the middle pass of
// the three-pass forward (docs/kda_forward.md, the design "three passes (64-token chain)").
//
// Per sequence, value head and 64-token chunk c, from the chunk's products (the first pass's outputs):
//     v_new = 2^e u - w bf16(S)                      [64 x V]   w [64 x K] bf16, u [64 x V] fp16 (2^e its
//                                                               chunk's scale: kernel/forward_products)
//     S    <- diag(decay) S + kg^T v_new             [K x V]    kg [64 x K] bf16, decay = 2^gT [K] fp32,
//                                                               v_new in two bf16 parts
// with bf16(S), the state entering the chunk, and bf16(v_new) written out (the o pass and the backward
// read them), and S in fp32 from start to end (chain_step of tests/kernel/three_pass_model.py is the
// arithmetic). At one long sequence this is the forward's serial path: one step of two dependent GEMMs
// per 64 tokens instead of the one pass's four 16-token tiles, each with its own INV and loads.
//
// Design: the serial step of kernel/studies/b1_composition/composed_step.cu (mma.sync, 4 warps),
// fed by a ring of tensor copies and writing through tensor stores. A CTA owns one (sequence, value
// head) and 32 of its 128 v columns (4 CTAs a pair). S is held transposed, S^T [32 v x 128 k], in
// m16n8k16 fp32 accumulators: warp w holds v rows 16 mv + g (+8), mv = w & 1, and the k half kh = w >> 1
// (64 k), so that all four SM sub-partitions' tensor cores work on the chain.
//     X^T   = bf16(S^T) w^T           A: S^T's accumulators repacked; B: w [r][k] rows, ldmatrix
//                                     (each warp over its k half; the halves meet in shared memory)
//     Vn^T  = 2^e u^T - X^T           u [r][v] by ldmatrix .trans, in the accumulators' layout
//     S^T   = S^T diag(decay) + Vn^T kg           A: Vn^T in two bf16; B: kg [r][k] by ldmatrix .trans
// The fifth warp is the producer: one lane issues each step's tensor copies (w and kg as two [64 x 64]
// boxes each, u's [64 x 32] box, decay's 512 bytes, u's scale's 16) into a ring of FC_NSTAGE stages on mbarriers
// (ring.cuh's MbarrierRing), FC_NSTAGE - 1 steps ahead of the chain.
// Out: each k-half pair of warps writes bf16(S) [128 k x 16 v] into a staging tile by stmatrix .trans,
// and warp (mv, kh 0) bf16(Vn) [64 r x 16 v]; after the pair's exchange barrier one lane stores both
// with tensor stores. Three staging tiles a kind: a store's tile is rewritten two steps later, after
// that lane waited (cp.async.bulk.wait_group.read 1) for the store before it.
//
// Tensors (chunk-major: a sequence's chunks one after another, sequence after sequence; per chunk and
// value head 64 rows; the first pass writes them so):
//     w, kg        bf16 [chunks * HV * 64, 128] (rows: (chunk HV + hv) 64 + r)
//     u            fp16 [chunks * HV * 64, 128], divided by u_scale (the chain's copies move its 16-bit
//                  elements as they are)
//     decay        fp32 [chunks, HV, 128]       2^gT, gT the gate's sum over the chunk's real rows
//     u_scale      fp32 [chunks, HV, 4]         2^e, 0, 0, 0 (16 bytes: a bulk copy's smallest)
//     states       bf16 [chunks * HV * 128, 128] = [chunks, HV, K, V]: the state entering every chunk
//     v_new        bf16 [chunks * HV * 64, 128]
//     h0, final    fp32 [N, HV, K, V] or null
//     chunk_start  int32 [N + 1]: sequence n's chunks are chunk_start[n] .. chunk_start[n + 1] - 1
#include "../../shapes.cuh"   // HEAD_DIM (K = V), CHUNK_TOKENS
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "ring.cuh"
#include "stmatrix.cuh"
#include "tma.cuh"

// Every knob is set by kernel/forward_chain/config.py (config.Config, options()); none has a default here.
#ifndef FC_NSTAGE
#error "FC_NSTAGE is not set: kernel/forward_chain/config.py sets every knob (Config.nstage)"
#endif

using namespace ptx_lab;

namespace fc {

constexpr int CHAIN_WARPS = 4;
constexpr int THREADS = 32 * (CHAIN_WARPS + 1);    // the chain warps and the producer warp
constexpr int V_CTA = 32;                          // v columns a CTA owns
constexpr int VGROUPS = HEAD_DIM / V_CTA;          // CTAs per (sequence, value head)
constexpr int R = CHUNK_TOKENS;                    // rows of a chunk's w, u, kg and v_new
constexpr int K_HALF = HEAD_DIM / 2;
constexpr int STAGING = 3;                         // staging tiles a kind (see the header)

// A ring stage: w's and kg's two k-half boxes [64 r][64 k] (128-byte rows, SW128), u's box
// [64 r][32 v] (64-byte rows, SW64), decay [128], u's scale [4]
constexpr int HALF_BOX_BYTES = R * K_HALF * 2;     // 8192
constexpr int U_BOX_BYTES = R * V_CTA * 2;         // 4096
constexpr int DECAY_BYTES = HEAD_DIM * 4;          // 512
constexpr int U_SCALE_BYTES = 16;
constexpr int STAGE_TX_BYTES = 4 * HALF_BOX_BYTES + U_BOX_BYTES + DECAY_BYTES + U_SCALE_BYTES;
struct alignas(1024) Stage {
    unsigned char w[2][HALF_BOX_BYTES];
    unsigned char kg[2][HALF_BOX_BYTES];
    unsigned char u[U_BOX_BYTES];
    float decay[HEAD_DIM];
    float u_scale[4];
};

// Staging for the tensor stores, per mv: bf16(S) [128 k][16 v] and bf16(Vn) [64 r][16 v], 32-byte rows
// (SW32)
constexpr int STATE_TILE_BYTES = HEAD_DIM * 16 * 2;   // 4096
constexpr int VNEW_TILE_BYTES = R * 16 * 2;           // 2048

struct Shared {
    Stage stages[FC_NSTAGE];
    alignas(256) unsigned char state_tiles[STAGING][2][STATE_TILE_BYTES];
    alignas(256) unsigned char vnew_tiles[STAGING][2][VNEW_TILE_BYTES];
    float4 x_exchange[2][2][2][8][32];   // [step parity][kh][mv][n][lane]: X^T's k-half partial sums
    MbarrierRing<FC_NSTAGE, 1, 32 * CHAIN_WARPS> ring;
};

// Byte of (row, 16-byte chunk) in a box whose rows are S bytes with the tensor copies' swizzle S
// (tma.cuh's tma_swizzle): the chunk XORed with the row's place in its group of rows
template <int S>
__device__ __forceinline__ u32 swizzled(int row, int chunk) {
    return tma_swizzle<S>(static_cast<u32>(row * S + 16 * chunk));
}

}  // namespace fc

extern "C" __constant__ int fc_smem_bytes = static_cast<int>(sizeof(fc::Shared));
extern "C" __constant__ int fc_threads = fc::THREADS;
extern "C" __constant__ int fc_vgroups = fc::VGROUPS;   // the launch's grid has VGROUPS CTAs a (sequence, value head)

extern "C" __global__ void __launch_bounds__(fc::THREADS, 1) kda_forward_chain(
        const __grid_constant__ TensorMap w_map,       // box [64 r][64 k], SW128
        const __grid_constant__ TensorMap kg_map,      // box [64 r][64 k], SW128
        const __grid_constant__ TensorMap u_map,       // box [64 r][32 v], SW64 (16-bit elements: fp16)
        const __grid_constant__ TensorMap states_map,  // box [128 k][16 v], SW32 (stores)
        const __grid_constant__ TensorMap vnew_map,    // box [64 r][16 v], SW32 (stores)
        const float* __restrict__ decay, const float* __restrict__ u_scale, const int* __restrict__ chunk_start, int HV,
        const float* __restrict__ h0, float* __restrict__ final_state) {
    using namespace fc;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    if (smem_addr(smem_raw) % 1024 != 0) __trap();   // the SW128 boxes' pattern follows the address bits
    const int pair = blockIdx.x / VGROUPS, vg = blockIdx.x % VGROUPS;
    const int n = pair / HV, hv = pair % HV;
    const int c0 = chunk_start[n], nsteps = chunk_start[n + 1] - c0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (threadIdx.x == 0) {
        sh.ring.init();
        fence_mbarrier_init();
    }
    __syncthreads();

    if (warp == CHAIN_WARPS) {   // the producer: one lane issues every copy
        if (lane != 0) return;
        prefetch_tensormap(&w_map);
        prefetch_tensormap(&kg_map);
        prefetch_tensormap(&u_map);
        for (int j = 0; j < nsteps; ++j) {
            sh.ring.wait_to_refill(j, nsteps);
            Stage& st = sh.stages[j % FC_NSTAGE];
            const u32 full = smem_addr(&sh.ring.full[j % FC_NSTAGE]);
            const long long ch = static_cast<long long>(c0 + j) * HV + hv;   // (chunk, value head)
            const int row = static_cast<int>(ch * R);
            mbarrier_arrive_expect_tx(full, STAGE_TX_BYTES);
#pragma unroll
            for (int kh = 0; kh < 2; ++kh) {
                cp_async_bulk_tensor_2d_g2s(smem_addr(st.w[kh]), &w_map, K_HALF * kh, row, full);
                cp_async_bulk_tensor_2d_g2s(smem_addr(st.kg[kh]), &kg_map, K_HALF * kh, row, full);
            }
            cp_async_bulk_tensor_2d_g2s(smem_addr(st.u), &u_map, V_CTA * vg, row, full);
            cp_async_bulk_g2s(smem_addr(st.decay), decay + ch * HEAD_DIM, DECAY_BYTES, full);
            cp_async_bulk_g2s(smem_addr(st.u_scale), u_scale + ch * 4, U_SCALE_BYTES, full);
        }
        return;
    }

    // the chain warps
    const int mv = warp & 1, kh = warp >> 1;
    const int v0 = 16 * mv + g, k_base = K_HALF * kh;    // v0: this CTA's v row of accumulator rows 0-7
    const bool stores = kh == 0 && lane == 0;           // the lane that issues the pair's tensor stores
    const size_t state_base = (static_cast<size_t>(n) * HV + hv) * HEAD_DIM * HEAD_DIM;
    float st[8][4];   // S^T: rows v0 (e 0, 1), v0 + 8 (e 2, 3); columns k_base + 8 j + 2 t (+ (e & 1))
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int k = k_base + 8 * j + 2 * t + (e & 1), v = V_CTA * vg + v0 + 8 * (e >> 1);
            st[j][e] = h0 != nullptr ? h0[state_base + static_cast<size_t>(k) * HEAD_DIM + v] : 0.f;
        }

    for (int s = 0; s < nsteps; ++s) {
        sh.ring.wait_full(s);
        const Stage& stg = sh.stages[s % FC_NSTAGE];
        const long long ch = static_cast<long long>(c0 + s) * HV + hv;
        unsigned char* state_tile = sh.state_tiles[s % STAGING][mv];
        unsigned char* vnew_tile = sh.vnew_tiles[s % STAGING][mv];

        // bf16(S^T) as the A operand of X's 4 k-steps, and out as bf16(S) [k][v] by stmatrix .trans
        u32 a[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            acc_to_a(a[kk], st[2 * kk], st[2 * kk + 1]);
            // matrix i = lane / 8 of the x4: k rows +8 for i >= 2, v chunk i & 1 (16-byte chunks of 8 v)
            const int k = k_base + 16 * kk + 8 * ((lane >> 4) & 1) + (lane & 7);
            stmatrix_x4_trans(smem_addr(state_tile + swizzled<32>(k, (lane >> 3) & 1)), a[kk][0], a[kk][1], a[kk][2],
                              a[kk][3]);
        }

        // X^T partial over this warp's k half: rows v0 (+8), columns r = 8 n + 2 t (+1)
        const X4Lane xl = x4_lane(lane);
        float x[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                const int r = 16 * np + xl.row + xl.cols_first_mat_row();
                const int chunk = 2 * kk + xl.cols_first_mat_col() / 8;
                u32 b[4];
                ldmatrix_x4(b, smem_addr(stg.w[kh] + swizzled<128>(r, chunk)));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(x[2 * np], a[kk], b_lo, x[2 * np]);
                mma_m16n8k16_bf16(x[2 * np + 1], a[kk], b_hi, x[2 * np + 1]);
            }
        float4* mine = &sh.x_exchange[s & 1][kh][mv][0][lane];
        const float4* partner = &sh.x_exchange[s & 1][kh ^ 1][mv][0][lane];
#pragma unroll
        for (int i = 0; i < 8; ++i) mine[32 * i] = make_float4(x[i][0], x[i][1], x[i][2], x[i][3]);

        // while the partner finishes its half: 2^e u^T in the accumulators' layout (ldmatrix .trans of u's
        // [r][v] rows: matrix i = lane / 8 is v block i & 1, r block 2 np' + (i >> 1); fp16 widened, times a
        // power of two: exact), and S^T diag(decay)
        float un[8][4];
        const float sc = stg.u_scale[0];
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            const int r = 8 * (2 * np + (lane >> 4)) + (lane & 7);
            u32 m[4];
            ldmatrix_x4_trans(m, smem_addr(stg.u + swizzled<64>(r, 2 * mv + ((lane >> 3) & 1))));
            un[2 * np][0] = sc * f16_lo(m[0]); un[2 * np][1] = sc * f16_hi(m[0]);
            un[2 * np][2] = sc * f16_lo(m[1]); un[2 * np][3] = sc * f16_hi(m[1]);
            un[2 * np + 1][0] = sc * f16_lo(m[2]); un[2 * np + 1][1] = sc * f16_hi(m[2]);
            un[2 * np + 1][2] = sc * f16_lo(m[3]); un[2 * np + 1][3] = sc * f16_hi(m[3]);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 d = *reinterpret_cast<const float2*>(&stg.decay[k_base + 8 * j + 2 * t]);
            st[j][0] *= d.x; st[j][1] *= d.y; st[j][2] *= d.x; st[j][3] *= d.y;
        }
        fence_proxy_async_shared();   // the state tile's stmatrix writes, before the tensor store reads them
        named_barrier_sync(1 + mv, 64);

        // X^T = the two halves' sum (fp32 addition commutes: both warps of the pair get its bits, and so
        // round Vn alike); Vn^T = u^T - X^T
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float4 o = partner[32 * i];
            un[i][0] -= x[i][0] + o.x; un[i][1] -= x[i][1] + o.y; un[i][2] -= x[i][2] + o.z; un[i][3] -= x[i][3] + o.w;
        }
        // Vn^T in two bf16 parts (fragments.cuh) as the A operand of the update's 4 r-steps: va = bf16(Vn^T), what
        // is written out, and vr the rest, which the state update also reads; one bf16 of Vn was the largest
        // rounding in the final state's error
        u32 va[4][4], vr[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) acc_to_a_two_parts(va[kk], vr[kk], un[2 * kk], un[2 * kk + 1]);
        if (kh == 0) {   // bf16(Vn) [r][v] out, by the k-half-0 warp of each mv
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const int r = 16 * kk + 8 * ((lane >> 4) & 1) + (lane & 7);
                stmatrix_x4_trans(smem_addr(vnew_tile + swizzled<32>(r, (lane >> 3) & 1)), va[kk][0], va[kk][1], va[kk][2],
                                  va[kk][3]);
            }
            fence_proxy_async_shared();
            __syncwarp();
            if (stores) {
                const int col = V_CTA * vg + 16 * mv;
                cp_async_bulk_tensor_2d_s2g(&states_map, col, static_cast<int>(ch * HEAD_DIM), smem_addr(state_tile));
                cp_async_bulk_tensor_2d_s2g(&vnew_map, col, static_cast<int>(ch * R), smem_addr(vnew_tile));
                cp_async_bulk_commit();
                cp_async_bulk_wait_read<1>();   // the stores of step s - 1 have read their tiles
            }
        }

        // S^T += Vn^T kg, the rest's part first: B[r][k] = kg's rows, by ldmatrix .trans (matrix i: r block i & 1,
        // k block i >> 1)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                const int r = 16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7);
                const int chunk = 2 * np + (lane >> 4);
                u32 b[4];
                ldmatrix_x4_trans(b, smem_addr(stg.kg[kh] + swizzled<128>(r, chunk)));
                const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16_bf16(st[2 * np], vr[kk], b_lo, st[2 * np]);
                mma_m16n8k16_bf16(st[2 * np + 1], vr[kk], b_hi, st[2 * np + 1]);
                mma_m16n8k16_bf16(st[2 * np], va[kk], b_lo, st[2 * np]);
                mma_m16n8k16_bf16(st[2 * np + 1], va[kk], b_hi, st[2 * np + 1]);
            }
        if (sh.ring.releases(s, nsteps)) sh.ring.release(s);
    }
    if (stores) cp_async_bulk_wait<0>();   // the last stores are written before the CTA's shared memory goes
    if (final_state != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int k = k_base + 8 * j + 2 * t + (e & 1), v = V_CTA * vg + v0 + 8 * (e >> 1);
                final_state[state_base + static_cast<size_t>(k) * HEAD_DIM + v] = st[j][e];
            }
    }
}
