// ptx_lab/cuda/tma_probes.cu -- the single-warp kernels of experiments/tma_tile.py: every
// function of tma.cuh on a tensor whose elements say where they came from.
//
// tensormap_echo: the tensor map as the kernel receives it (its 16 words and the
// generic address of the parameter), to show that the host's 128 bytes arrive intact
// and 64-byte aligned before any copy relies on them.
//
// tma_tile_2d: one CTA of one warp, lane 0 issuing every copy.
//   src_map:  a [rows][cols] u16 (bf16) tensor in global memory, box BOX_ROWS x BOX_COLS
//   dst_map:  a second tensor of the same shape and box (the stores' destination)
//   coords:   (COORDS,) int, in Coord order: the load's box and the two stores' boxes,
//             each {c0 = column, c1 = row} as the instruction takes them
//   rewritten_row: u32   the box row the warp rewrites with ordinary stores before storing
//   smem_out: (BOX_ROWS, BOX_COLS) u16   the box as the load left it in shared memory
//   flags:    (32, FLAGS) u32            lane l's mbarrier answers, in Flag order
// The coordinates come from the host, so the kernel holds no formula the experiment does
// not: it is the experiment's closed form that is checked. The host fills the whole
// destination buffer (and rows past both tensors' ends) so that bytes no store may
// write are seen to be untouched.
//
// tma_tile_2d_swizzled: the same, with a swizzled map (swizzle S = 32, 64 or 128 bytes):
// one load of a SWZ_BOX_ROWS x S-byte box into a 1024-byte aligned buffer, the buffer's raw
// bytes copied out (the experiment finds each element where ptx_lab.model says the
// swizzle puts it), then one store of the buffer, untouched, with the same map.
//   src_map:  a [rows][cols] bf16 tensor, box SWZ_BOX_ROWS x (S / element size), swizzle S
//   dst_map:  a second tensor of the same shape, box and swizzle
//   c0, c1:   {column, row} of the box, the same for the load and the store
//   box_bytes: SWZ_BOX_ROWS * S, what the load completes on the mbarrier
//   smem_out: (SWZ_BUF_BYTES / 2,) u16   the whole buffer after the load: the box's bytes
//             first, then the sentinel where the box (narrower than 128 bytes) does not reach
//   flags:    (32, FLAGS) u32            lane l's mbarrier answers, in Flag order
//   buf_mod:  (1,) u32                   the buffer's shared address mod SWZ_ALIGN: the TMA
//             unit takes the pattern from the address bits, so 0 or nothing is where the
//             model says
//
// The load's phase is awaited with a bounded loop: a phase that never completes (a
// copy that completes fewer bytes than the box, or none) ends as FLAG_LOADED = 0 and
// a readable failure instead of a hung kernel.
//
// No asm here: every instruction comes from tma.cuh and bulk.cuh.
#include "tma.cuh"

namespace ptx_lab {
namespace tma_probes {

typedef unsigned short u16;

constexpr int WARP = 32;
constexpr int BOX_ROWS = 16;                       // tokens per tile
constexpr int BOX_COLS = 128;                      // one head's D
constexpr u32 BOX_BYTES = BOX_ROWS * BOX_COLS * sizeof(u16);   // 4096: what one load completes
constexpr u16 SENTINEL = 0xffffu;                  // shared memory before the load lands
constexpr u16 STORE_MARK = 0xc000u;                // rewritten_row col c becomes STORE_MARK | c:
                                                   // sign set (no tensor element has it), a
                                                   // normal bf16 (-2 - c/64), never the sentinel
constexpr int MAX_POLLS = 1 << 16;                 // try_wait polls before giving up on a phase

// The swizzled boxes: 16 tokens, as Kernel A's tiles, of rows of S = 32, 64 or 128 bytes.
constexpr int SWZ_BOX_ROWS = 16;
constexpr int SWZ_BUF_BYTES = SWZ_BOX_ROWS * 128;   // room for the widest box (128-byte rows)
constexpr int SWZ_ALIGN = 1024;                     // 8 rows of 128 bytes: SW128's period, and a
                                                    // multiple of SW64's 512 and SW32's 256

// coords[...]: where each box starts, {column, row} of its first element.
enum Coord {
    LOAD_C0, LOAD_C1,          // the load from src_map
    STORE_A_C0, STORE_A_C1,    // store A to dst_map: the whole box inside the tensor
    STORE_B_C0, STORE_B_C1,    // store B to dst_map: the box runs past the last row and column
    COORDS
};

// flags[lane][FLAG_...]: mbarrier answers (1 = true).
enum Flag {
    FLAG_LOADED,          // parity 0 completed within MAX_POLLS polls: 1
    FLAG_P1_AFTER_LOAD,   // parity 1, same moment: 0 (phase 1 is current and empty)
    FLAGS
};

// mbarrier_wait_parity with a limit: true once the phase completed, false after MAX_POLLS.
__device__ __forceinline__ bool mbarrier_wait_parity_bounded(u32 bar, u32 parity) {
    for (int poll = 0; poll < MAX_POLLS; ++poll) {
        if (mbarrier_try_wait_parity(bar, parity)) return true;
    }
    return false;
}

}  // namespace tma_probes
}  // namespace ptx_lab

using namespace ptx_lab;
using namespace ptx_lab::tma_probes;

extern "C" __global__ void __launch_bounds__(WARP)
tensormap_echo(const __grid_constant__ TensorMap map, u64* words, u64* address) {
    const u32 lane = threadIdx.x;
    if (lane < 16) words[lane] = map.opaque[lane];
    if (lane == 0) address[0] = tensormap_addr(&map);
}

extern "C" __global__ void __launch_bounds__(WARP)
tma_tile_2d(const __grid_constant__ TensorMap src_map, const __grid_constant__ TensorMap dst_map,
            const int* __restrict__ coords, u32 rewritten_row, u16* smem_out, u32* flags) {
    // 128-byte aligned: a tensor copy's shared address must be; the mbarrier needs 8.
    __shared__ __align__(128) u16 tile[BOX_ROWS][BOX_COLS];
    __shared__ __align__(8) u64 bar_storage;
    const u32 lane = threadIdx.x;
    const u32 bar = smem_addr(&bar_storage);
    u32* my_flags = flags + lane * FLAGS;

    for (int i = lane; i < BOX_ROWS * BOX_COLS; i += WARP) tile[i / BOX_COLS][i % BOX_COLS] = SENTINEL;
    // The sentinel comes from the generic proxy, the tile that lands on top of it from the
    // async proxy: without this fence the load's bytes may land first and be overwritten.
    fence_proxy_async_shared();
    if (lane == 0) {
        mbarrier_init(bar, 1);   // one arrival per phase: lane 0's
        fence_mbarrier_init();
    }
    __syncthreads();             // the barrier and the fenced sentinel, before the copy names them

    // ---- load (phase 0): the arrival expects the WHOLE box, zero-filled rows included.
    if (lane == 0) {
        prefetch_tensormap(&src_map);
        mbarrier_arrive_expect_tx(bar, BOX_BYTES);
        cp_async_bulk_tensor_2d_g2s(smem_addr(&tile[0][0]), &src_map, coords[LOAD_C0], coords[LOAD_C1],
                                    bar);
    }
    my_flags[FLAG_LOADED] = mbarrier_wait_parity_bounded(bar, 0);   // the tile is visible here
    my_flags[FLAG_P1_AFTER_LOAD] = mbarrier_try_wait_parity(bar, 1);
    for (int i = lane; i < BOX_ROWS * BOX_COLS; i += WARP) smem_out[i] = tile[i / BOX_COLS][i % BOX_COLS];
    __syncwarp();                // every lane has read the tile before one row of it changes

    // ---- stores. One box row is rewritten by ordinary stores (lane l writes columns
    // l, l + 32, ...); each writer fences its stores for the async proxy, and the warp
    // syncs before lane 0 issues the stores that read them.
    for (int c = lane; c < BOX_COLS; c += WARP) tile[rewritten_row][c] = STORE_MARK | c;
    fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) {
        cp_async_bulk_tensor_2d_s2g(&dst_map, coords[STORE_A_C0], coords[STORE_A_C1], smem_addr(&tile[0][0]));
        cp_async_bulk_tensor_2d_s2g(&dst_map, coords[STORE_B_C0], coords[STORE_B_C1], smem_addr(&tile[0][0]));
        cp_async_bulk_commit();
        cp_async_bulk_wait<0>();   // both stores have written global memory
    }
}

extern "C" __global__ void __launch_bounds__(WARP)
tma_tile_2d_swizzled(const __grid_constant__ TensorMap src_map, const __grid_constant__ TensorMap dst_map,
                     int c0, int c1, u32 box_bytes, u16* smem_out, u32* flags, u32* buf_mod) {
    // 1024-byte aligned: the swizzle pattern comes from the address bits, and the model's
    // placement (offsets from the box start) is the hardware's only from a multiple of 8 * S.
    __shared__ __align__(SWZ_ALIGN) u16 buf[SWZ_BUF_BYTES / 2];
    __shared__ __align__(8) u64 bar_storage;
    const u32 lane = threadIdx.x;
    const u32 bar = smem_addr(&bar_storage);
    u32* my_flags = flags + lane * FLAGS;

    for (int i = lane; i < SWZ_BUF_BYTES / 2; i += WARP) buf[i] = SENTINEL;
    fence_proxy_async_shared();  // the sentinel (generic proxy) before the load's bytes (async)
    if (lane == 0) {
        mbarrier_init(bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();

    // ---- load (phase 0), swizzled by the map.
    if (lane == 0) {
        mbarrier_arrive_expect_tx(bar, box_bytes);
        cp_async_bulk_tensor_2d_g2s(smem_addr(buf), &src_map, c0, c1, bar);
    }
    my_flags[FLAG_LOADED] = mbarrier_wait_parity_bounded(bar, 0);
    my_flags[FLAG_P1_AFTER_LOAD] = mbarrier_try_wait_parity(bar, 1);
    for (int i = lane; i < SWZ_BUF_BYTES / 2; i += WARP) smem_out[i] = buf[i];
    if (lane == 0) buf_mod[0] = smem_addr(buf) % SWZ_ALIGN;

    // ---- store: the buffer exactly as the load left it (no generic-proxy writes since, so
    // no fence), through the same swizzled map: the tensor must come back unpermuted.
    if (lane == 0) {
        cp_async_bulk_tensor_2d_s2g(&dst_map, c0, c1, smem_addr(buf));
        cp_async_bulk_commit();
        cp_async_bulk_wait<0>();
    }
}
