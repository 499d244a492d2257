// kernel/forward_states/cuda/forward_states.cu -- Kernel S: KDA's forward state scan, the state
// entering every 64-token chunk (FLA's h), for the backward to read.
//
// Math per 16-token tile of one sequence and head (rows c < L real, the rest zero):
//     gc = g - g[row before the tile]   (FLA's g restarts every 64 tokens: nothing to subtract
//                                        at a 64-chunk's first tile)
//     gT = gc[L-1];  rows >= L: gc = gT, k = v = beta = 0
//     Kd = k 2^gc    Kr = k 2^(gT-gc)    gamma = 2^gT   (once per tile by the producers, for every consumer)
//     Vn = v - Kd S;  U = INV (beta Vn);  S <- diag(gamma) S + Kr^T U
// INV = the 16 x 16 diagonal block of Akk at columns 16 (tile mod 4), lower triangle only.
// Before every 4th tile's update S goes out as bf16 [K][V] (FLA's h layout, state_v_first False).
//
// Design: S is held transposed, S^T [V x K], in mma.m16n8k16 fp32 accumulators, one consumer warp
// per 16 V rows (16 n-tiles of 8 K columns: 64 registers a thread) for the whole scan. Then every
// product takes its A operand from registers (mma.cuh's corollary: two adjacent n-tiles' C
// fragments, packed pairwise to bf16, are one k-step's A fragment) and its B operand from
// shared memory by ldmatrix, with no transpose anywhere:
//     P^T  = S^T Kd^T            A = S^T (accumulators)  B = Kd^T: Kd [token][K], cols first, plain
//     W^T  = beta (v^T - P^T)    per token column, in registers
//     U^T  = W^T INV^T           A = W^T                 B = INV^T: INV [i][j], cols first, plain
//     S^T <- gamma S^T + U^T Kr  A = U^T                 B = Kr: Kr [token][K], rows first, .trans
// and the snapshot's stmatrix .trans of S^T's A fragments writes S [K][V] rows to a staging tile.
// P^T's 8 k-steps go to FS_G6_SPLIT independent accumulator pairs, summed at the end: the chain
// of dependent MMAs is 8 / FS_G6_SPLIT long instead of 8.
//
// A CTA owns (sequence, head, VW = 16 FS_WARPS v rows) and has two roles. Warps [0, FS_WARPS)
// are consumers: each runs only its chain above, tile after tile. FS_PRODUCERS producer warps
// fill a ring of FS_NSTAGE stages: they issue a tile's cp.async loads FS_NSTAGE - 1 tiles ahead
// and rebuild its Kd, Kr and gamma (R1) in the stage while the consumers run earlier tiles.
// Producer warp pw copies and rebuilds tile rows [R pw, R (pw+1)) alone (R = TILE_TOKENS / P), with
// its own copies of g at the tile's last row and at the row before the tile, so a producer waits
// only for its own warp's copies (cp.async.wait_group + __syncwarp) and never for another producer. Hand-off
// by the named-barrier ring of ptx_lab's ring.cuh, each barrier counting all threads: FULL(s)
// producers arrive once stage s holds a tile's operands, consumers sync; EMPTY(s) consumers
// arrive when done reading stage s, producers sync before refilling it.
//
// The rooms: forward_states_layout.cuh (the stages, the staging tiles, the ring),
// forward_states_loads.cuh (a tile's copies), forward_states_r1.cuh (R1), and two shared with the
// forward (kernel/forward/cuda): forward_states_chain.cuh (a consumer warp's step of the chain) and
// forward_states_walk.cuh (the CTA's sequence, the producers' ring loop, a consumer's initial state and
// snapshot store). This file holds the knobs and the shape they give (kernel/forward_states/config.py
// sets every knob), and the kernel: each role's walk over the tiles.
#include "../../shapes.cuh"   // HEAD_DIM (K = V), TILE_TOKENS, CHUNK_TOKENS, TILES_PER_CHUNK
#include "cp_async.cuh"
#include "fragments.cuh"
#include "ldmatrix.cuh"
#include "mma.cuh"
#include "ring.cuh"
#include "stmatrix.cuh"

// Every knob is set by kernel/forward_states/config.py (config.Config, options()); none has a
// default here.
#ifndef FS_WARPS
#error "FS_WARPS is not set: kernel/forward_states/config.py sets every knob (Config.warps)"
#endif
#ifndef FS_PRODUCERS
#error "FS_PRODUCERS is not set: kernel/forward_states/config.py sets every knob (Config.producers)"
#endif
#ifndef FS_NSTAGE
#error "FS_NSTAGE is not set: kernel/forward_states/config.py sets every knob (Config.nstage)"
#endif
#ifndef FS_G6_SPLIT
#error "FS_G6_SPLIT is not set: kernel/forward_states/config.py sets every knob (Config.g6_split)"
#endif

namespace fs {
using namespace ptx_lab;
typedef unsigned short u16;

constexpr int WARPS = FS_WARPS;         // consumer warps
constexpr int PRODUCERS = FS_PRODUCERS; // producer warps
constexpr int NSTAGE = FS_NSTAGE;
constexpr int PREFETCH = NSTAGE - 1;    // tiles whose loads are in flight ahead of R1
constexpr int G6_SPLIT = FS_G6_SPLIT;
constexpr int CONSUMER_THREADS = 32 * WARPS;
constexpr int PRODUCER_THREADS = 32 * PRODUCERS;
constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS;
constexpr int ROWS_PER_PRODUCER = TILE_TOKENS / PRODUCERS;
constexpr int VW = 16 * WARPS;          // v rows of S^T per CTA
constexpr int VGROUPS = HEAD_DIM / VW;  // CTAs per (sequence, head)
static_assert(WARPS == 1 || WARPS == 2 || WARPS == 4 || WARPS == 8, "FS_WARPS must be 1, 2, 4 or 8");
static_assert(PRODUCERS == 1 || PRODUCERS == 2 || PRODUCERS == 4 || PRODUCERS == 8, "FS_PRODUCERS must be 1, 2, 4 or 8");
// FULL(s) and EMPTY(s) take ids 1 .. 2 NSTAGE of the 15 named barriers
static_assert(NSTAGE >= 2 && NSTAGE <= 7, "FS_NSTAGE must be 2 .. 7");
static_assert(G6_SPLIT == 1 || G6_SPLIT == 2 || G6_SPLIT == 4, "FS_G6_SPLIT must be 1, 2 or 4");

}  // namespace fs

// the roles' headers, built on the configuration above
#include "forward_states_layout.cuh"
#include "forward_states_loads.cuh"
#include "forward_states_r1.cuh"
#include "forward_states_chain.cuh"
#include "forward_states_walk.cuh"

using namespace fs;

// Dynamic shared memory and threads the launch must use (read by the host through the module).
extern "C" __constant__ int fs_smem_bytes = SMEM_BYTES;
extern "C" __constant__ int fs_threads = THREADS;

// Grid: one CTA per (sequence rank, value head, v group), v group fastest; order[rank] is the
// sequence (longest first). k has H heads, the other arrays HV (FLA's grouped value heads: value head
// h reads k at head qk_head(h, HV, H); HV = H without them). states: bf16 [sum of entries, HV, K, V],
// entry snap_offsets[n] + c of sequence n is the state entering its tile 4c.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
kda_forward_states(const u16* __restrict__ k, const u16* __restrict__ v, const float* __restrict__ g,
                   const float* __restrict__ beta, const u16* __restrict__ akk, const float* __restrict__ h0,
                   u16* __restrict__ states, const long long* __restrict__ cu_seqlens,
                   const long long* __restrict__ snap_offsets, const int* __restrict__ order, int HV, int H) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const kda_walk::Cta cta = kda_walk::cta_of<VGROUPS>(cu_seqlens, order, HV);
    const int vg = cta.vg, h = cta.h, n = cta.n, len = cta.len, ntiles = cta.ntiles;
    const long long bos = cta.bos;

    if (warp >= WARPS) {
        // ---------------- producers: loads and R1, PREFETCH tiles / one tile ahead ----------------
        const int pw = warp - WARPS, ptid = tid - CONSUMER_THREADS;
        const int kh = qk_head(h, HV, H);
        auto issue = [&](int i) {
            issue_tile(sh.stage[i % NSTAGE], k, v, g, beta, akk, bos + (long long)TILE_TOKENS * i,
                       min(TILE_TOKENS, len - TILE_TOKENS * i), i, HV, H, h, kh, vg, pw, lane, ptid);
        };
        kda_walk::prefetch<PREFETCH>(ntiles, issue);
#pragma unroll 1
        for (int i = 0; i < ntiles; ++i) {
            const int s = i % NSTAGE;
            kda_walk::copies_landed<PREFETCH>();
            rebuild(sh.stage[s], min(TILE_TOKENS, len - TILE_TOKENS * i), pw, lane);
            kda_walk::hand_over<Ring, PREFETCH>(i, s, ntiles, issue);
        }
        cp_async_wait<0>();
        return;
    }

    // ---------------- consumers: the chain, one warp per 16 v rows ----------------
    const int gr = lane / 4, t = lane % 4;                 // mma fragment row and column pair
    const long long snap0 = snap_offsets[n];
    const int vrow = 16 * warp;                            // this warp's first v row within the CTA's VW
    const X4Lane xl = x4_lane(lane);

    // S^T [16 v x 128 k] of this warp, in the chain's accumulators (forward_states_walk.cuh)
    float acc[HEAD_DIM / 8][4];
    kda_walk::load_state(acc, h0, n, HV, h, vg * VW + vrow + gr, t);

#pragma unroll 1
    for (int i = 0; i < ntiles; ++i) {
        const int s = i % NSTAGE;
        Ring::wait_full(s);   // tile i's inputs and operands are in stage s
        const Stage& st = sh.stage[s];

        // the chain's step (forward_states_chain.cuh): G6 (every 4th tile staging S for its store
        // first), G7, G8
        const bool snap = i % TILES_PER_CHUNK == 0;
        u32 ua[4];
        kda_chain::step<G6_SPLIT>(ua, acc, st, sh.snap[warp], snap, vrow, gr, t, xl, [](int, const u32 (&)[4]) {});
        if (Ring::releases(i, ntiles)) Ring::release(s);   // the producers refill stage s

        // the staged S goes out while the update's MMAs run (the staging tile is this warp's alone)
        if (snap)
            kda_walk::store_snapshot(states, sh.snap[warp], snap0, i, HV, h, vg * VW, vrow, lane);
    }
}
