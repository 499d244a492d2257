// ptx_lab/cuda/bulk_probes.cu -- the single-warp kernel of experiments/bulk_copy.py: every
// function of bulk.cuh on rows whose contents say where they came from.
//
// One CTA of one warp. Lane l owns row l of two shared buffers, rows_a and rows_b
// ([ROWS][WORDS] u32 each), and copies a row of global memory into it with ONE
// cp.async.bulk. The byte counts differ per lane (multiples of 16, 16..128) and come
// from the host, as does which global row phase 1 reads, so the kernel holds no
// formula the experiment does not: it is the experiment's closed form that is checked.
//
//   src:       (ROWS, WORDS) u32   src[r][c] = 1000 r + c
//   bytes0:    (32,) u32           lane l's phase-0 copy: src row l -> rows_a[l]
//   bytes1:    (32,) u32           lane l's phase-1 copy: src row src_row1[l] -> rows_b[l]
//   src_row1:  (32,) u32
//   stored_row: u32                the row of rows_a the warp rewrites with ordinary stores
//   smem_a, smem_b: (ROWS, WORDS)  rows_a after phase 0, rows_b after phase 1
//   flags:     (32, FLAGS) u32     lane l's mbarrier_try_wait_parity answers, in FLAG order
//   out_a, out_b: (ROWS, WORDS)    the bulk stores' destinations; the host fills them with
//                                  SENTINEL so bytes no store writes are seen as untouched
//
// Every answer recorded here is the same on every run: each try_wait is taken when no
// outstanding copy or arrival can change it (the __syncwarp()s before lane 0's arrivals
// are there for that), and mbarrier_wait_parity returns only when its phase is complete.
//
// No asm here: every instruction comes from bulk.cuh.
#include "bulk.cuh"

namespace ptx_lab {
namespace bulk_probes {

constexpr int WARP = 32;
constexpr int ROWS = WARP;                  // one row per lane
constexpr int WORDS = 32;                   // u32 per row: 128 bytes, the longest copy
constexpr u32 SENTINEL = 0xffffffffu;       // never 1000 r + c, never a stored or reused word
constexpr u32 STORE_MARK = 900000;          // stored_row word c becomes STORE_MARK + 1000 r + c
constexpr u32 REUSED = 0xa5a5a5a5u;         // rows_a once its bulk store has read it

// flags[lane][FLAG_...]: mbarrier_try_wait_parity answers (1 = true).
enum Flag {
    FLAG_P0_ISSUED,       // parity 0, right after the phase-0 copies, before the arrival: 0
    FLAG_P0_DONE,         // parity 0, after mbarrier_wait_parity(bar, 0): 1
    FLAG_P1_AFTER_P0,     // parity 1, same moment: 0 (phase 1 is current and empty)
    FLAG_P1_DONE,         // parity 1, after mbarrier_wait_parity(bar, 1): 1
    FLAG_P0_AFTER_P1,     // parity 0, same moment: 0 (phase 2 is current: parity 0 again)
    FLAG_P0_DONE_AGAIN,   // parity 0, after phase 2 (no bytes, one plain arrival): 1
    FLAG_P1_AFTER_P2,     // parity 1, same moment: 0 (phase 3 is current)
    FLAGS
};

// The phase's byte count: what all 32 lanes' copies bring (summed by the arriving lane).
__device__ __forceinline__ u32 bytes_of_all_lanes(const u32* bytes) {
    u32 total = 0;
    for (int l = 0; l < WARP; ++l) total += bytes[l];
    return total;
}

}  // namespace bulk_probes
}  // namespace ptx_lab

using namespace ptx_lab;
using namespace ptx_lab::bulk_probes;

extern "C" __global__ void __launch_bounds__(WARP)
bulk_copy_rows(const u32* __restrict__ src, const u32* __restrict__ bytes0,
               const u32* __restrict__ bytes1, const u32* __restrict__ src_row1, u32 stored_row,
               u32* smem_a, u32* smem_b, u32* flags, u32* out_a, u32* out_b) {
    // 16-byte aligned: a bulk copy's shared address must be; the mbarrier needs 8.
    __shared__ __align__(16) u32 rows_a[ROWS][WORDS];
    __shared__ __align__(16) u32 rows_b[ROWS][WORDS];
    __shared__ __align__(8) u64 bar_storage;
    const u32 lane = threadIdx.x;
    const u32 bar = smem_addr(&bar_storage);
    u32* my_flags = flags + lane * FLAGS;

    for (int w = 0; w < WORDS; ++w) rows_a[lane][w] = rows_b[lane][w] = SENTINEL;
    // The sentinel stores come from the generic proxy, the copies that land on top of them
    // from the async proxy: without this fence a copy's bytes may land first and be overwritten.
    fence_proxy_async_shared();
    if (lane == 0) {
        mbarrier_init(bar, 1);   // one arrival per phase: lane 0's
        fence_mbarrier_init();
    }
    __syncthreads();             // the barrier and the fenced sentinel, before any copy names them

    // ---- phase 0 (parity 0): the copies first, the arrival after them.
    const u32 n0 = bytes0[lane];
    cp_async_bulk_g2s(smem_addr(rows_a[lane]), src + lane * WORDS, n0, bar);
    // Whether or not the bytes have landed (tx-count may be negative now), the phase
    // still waits for lane 0's arrival: false, every time.
    my_flags[FLAG_P0_ISSUED] = mbarrier_try_wait_parity(bar, 0);
    __syncwarp();                // every lane has taken FLAG_P0_ISSUED before the arrival
    if (lane == 0) mbarrier_arrive_expect_tx(bar, bytes_of_all_lanes(bytes0));
    mbarrier_wait_parity(bar, 0);   // returns once every byte has landed: they are visible here
    my_flags[FLAG_P0_DONE] = mbarrier_try_wait_parity(bar, 0);
    my_flags[FLAG_P1_AFTER_P0] = mbarrier_try_wait_parity(bar, 1);
    for (int w = 0; w < WORDS; ++w) smem_a[lane * WORDS + w] = rows_a[lane][w];
    __syncwarp();                // every lane has taken FLAG_P1_AFTER_P0 before phase 1 starts

    // ---- phase 1 (parity 1): the usual order, the arrival with the byte count first.
    const u32 n1 = bytes1[lane];
    if (lane == 0) mbarrier_arrive_expect_tx(bar, bytes_of_all_lanes(bytes1));
    cp_async_bulk_g2s(smem_addr(rows_b[lane]), src + src_row1[lane] * WORDS, n1, bar);
    mbarrier_wait_parity(bar, 1);
    my_flags[FLAG_P1_DONE] = mbarrier_try_wait_parity(bar, 1);
    my_flags[FLAG_P0_AFTER_P1] = mbarrier_try_wait_parity(bar, 0);
    for (int w = 0; w < WORDS; ++w) smem_b[lane * WORDS + w] = rows_b[lane][w];
    __syncwarp();                // every lane has taken FLAG_P0_AFTER_P1 before phase 2 starts

    // ---- phase 2 (parity 0 again): no bytes at all; an mbarrier is then a plain
    // arrive/wait barrier, and lane 0's arrival alone completes the phase.
    if (lane == 0) mbarrier_arrive(bar);
    mbarrier_wait_parity(bar, 0);
    my_flags[FLAG_P0_DONE_AGAIN] = mbarrier_try_wait_parity(bar, 0);
    my_flags[FLAG_P1_AFTER_P2] = mbarrier_try_wait_parity(bar, 1);

    // ---- shared -> global. One row of rows_a is rewritten by ordinary stores (lane c
    // writes word c); each writer fences its stores for the async proxy, and the warp
    // syncs before lane stored_row issues the bulk store that reads them.
    rows_a[stored_row][lane] = STORE_MARK + 1000 * stored_row + lane;
    fence_proxy_async_shared();
    __syncwarp();
    cp_async_bulk_s2g(out_a + lane * WORDS, smem_addr(rows_a[lane]), n0);
    cp_async_bulk_commit();
    cp_async_bulk_wait_read<0>();   // this lane's bulk store has read its row: reuse it at once
    for (int w = 0; w < WORDS; ++w) rows_a[lane][w] = REUSED;   // out_a must not see this
    // rows_b holds only bytes the async proxy wrote, so it needs no fence before its store.
    cp_async_bulk_s2g(out_b + lane * WORDS, smem_addr(rows_b[lane]), n1);
    cp_async_bulk_commit();
    cp_async_bulk_wait<0>();        // both stores have written global memory
}
