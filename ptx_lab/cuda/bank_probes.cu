// ptx_lab/cuda/bank_probes.cu -- single-warp kernels that repeat one shared-memory access pattern,
// for counting its wavefronts (ncu) and timing it (clock64). experiments/banks.py launches them.
//
// Every kernel has the same arguments and does the same thing with a different instruction:
//
//   offsets: (32,) u32   lane l's byte offset into dynamic shared memory (a row address for
//                        ldmatrix/stmatrix, the destination for cp.async)
//   src:     (32,) u32   lane l's byte offset into gmem (cp.async only; ignored otherwise)
//   gmem:    bytes       cp.async's source (ignored otherwise)
//   reps:    int         outer iterations; each issues UNROLL independent instances of the access
//   zero:    u32         must be 0; the compiler cannot know it (see "Keeping every access" below)
//   cycles:  (1,) u64    clock64 after the loop minus clock64 before it (lane 0 writes it)
//   sink:    (32,) u32   XOR of everything lane l loaded, so no load is dead
//
// The host launches each kernel at two rep counts and divides the difference of any count
// (cycles, wavefronts, instructions) by (reps_hi - reps_lo) * UNROLL: the setup, the clock reads
// and the loop tail cancel, leaving one access's share.
//
// Keeping every access. ptxas merges identical weak shared loads (and ldmatrix) of one address
// and could hoist them out of the loop or drop overwritten stores, whatever `asm volatile` says
// to the C++ compiler. So instance u of an iteration adds u * SHIFT_BYTES to every lane's
// address, and iteration r adds (acc ^ r) & zero, which is 0 at run time but opaque to ptxas.
// SHIFT_BYTES is a multiple of 128 B (32 banks x 4 B): moving all 32 addresses by it keeps every
// word in its bank and every pair of lanes on the same or distinct words, so each instance costs
// exactly what the pattern at shift 0 costs. The launch gives the pattern's span plus
// (UNROLL - 1) * SHIFT_BYTES of shared memory.
//
// The UNROLL instances of an iteration are independent, so a single warp keeps them in flight
// and the timing approaches the shared pipe's rate (one wavefront per cycle per SM); the next
// iteration waits for them (its addresses depend on acc), so latency still shows once per
// iteration. That is why clock64 is only expected to order the cases; ncu's counters are what the
// model predicts exactly.
//
// No asm here: the accesses come from shared.cuh, ldmatrix.cuh, stmatrix.cuh and cp_async.cuh.
#include "common.cuh"
#include "cp_async.cuh"
#include "ldmatrix.cuh"
#include "shared.cuh"
#include "stmatrix.cuh"

namespace ptx_lab {
namespace bank_probes {

constexpr int WARP = 32;
constexpr int UNROLL = 32;          // accesses in flight per iteration (UNROLL in experiments/banks.py)
constexpr u32 SHIFT_BYTES = 128;    // instance u reads at +u * SHIFT_BYTES (SHIFT_BYTES in banks.py)

extern __shared__ uint4 bank_smem[];   // 16-B aligned: ldmatrix rows and 16-B accesses need it

enum class Op {
    LD_U16, LD_B32, LD_V2, LD_V4,
    ST_U16, ST_B32, ST_V2, ST_V4,
    LDSM_X4, LDSM_X4_TRANS, STSM_X4, STSM_X4_TRANS,
    CP_CA4, CP_CA8, CP_CA16,
};

// Instance u's address: the pattern moved by whole 128-B bank rows (same banks, same conflicts).
__device__ __forceinline__ u32 at(u32 addr, int u) { return addr + static_cast<u32>(u) * SHIFT_BYTES; }

// One iteration: UNROLL instances of OP, instance u at `addr + u * SHIFT_BYTES` (and `src` for
// cp.async); returns the XOR of what was loaded (0 for stores). `salt` varies what stores write.
template <Op OP>
__device__ __forceinline__ u32 iteration(u32 addr, const unsigned char* src, u32 salt) {
    u32 x = 0;
    if constexpr (OP == Op::LD_U16 || OP == Op::LD_B32) {
        u32 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = OP == Op::LD_U16 ? ld_shared_u16(at(addr, u)) : ld_shared_b32(at(addr, u));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) x ^= v[u];
    } else if constexpr (OP == Op::LD_V2) {
        u32 v[UNROLL][2];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) ld_shared_v2_b32(v[u][0], v[u][1], at(addr, u));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) x ^= v[u][0] ^ v[u][1];
    } else if constexpr (OP == Op::LD_V4 || OP == Op::LDSM_X4 || OP == Op::LDSM_X4_TRANS) {
        u32 v[UNROLL][4];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if constexpr (OP == Op::LD_V4) ld_shared_v4_b32(v[u][0], v[u][1], v[u][2], v[u][3], at(addr, u));
            else if constexpr (OP == Op::LDSM_X4) ldmatrix_x4(v[u], at(addr, u));
            else ldmatrix_x4_trans(v[u], at(addr, u));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) x ^= v[u][0] ^ v[u][1] ^ v[u][2] ^ v[u][3];
    } else if constexpr (OP == Op::ST_U16 || OP == Op::ST_B32 || OP == Op::ST_V2 || OP == Op::ST_V4) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u32 v = salt + u;
            if constexpr (OP == Op::ST_U16) st_shared_u16(at(addr, u), v);
            else if constexpr (OP == Op::ST_B32) st_shared_b32(at(addr, u), v);
            else if constexpr (OP == Op::ST_V2) st_shared_v2_b32(at(addr, u), v, ~v);
            else st_shared_v4_b32(at(addr, u), v, ~v, v ^ 1u, v ^ 2u);
        }
    } else if constexpr (OP == Op::STSM_X4 || OP == Op::STSM_X4_TRANS) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u32 v = salt + u;
            if constexpr (OP == Op::STSM_X4) stmatrix_x4(at(addr, u), v, ~v, v ^ 1u, v ^ 2u);
            else stmatrix_x4_trans(at(addr, u), v, ~v, v ^ 1u, v ^ 2u);
        }
    } else {  // cp.async: the copies of one iteration form one group, awaited before the next
        constexpr int BYTES = OP == Op::CP_CA4 ? 4 : OP == Op::CP_CA8 ? 8 : 16;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cp_async_ca<BYTES>(at(addr, u), src);
        cp_async_commit();
        cp_async_wait<0>();
    }
    return x;
}

template <Op OP>
__device__ __forceinline__ void probe(const u32* offsets, const u32* src, const unsigned char* gmem,
                                      int reps, u32 zero, u64* cycles, u32* sink) {
    const u32 lane = threadIdx.x;
    const u32 addr = smem_addr(bank_smem) + offsets[lane];
    const unsigned char* from = gmem + src[lane];
    u32 acc = lane;
    __syncwarp();  // every lane has its address before the timed loop starts

    const u64 t0 = clock64();
    for (int r = 0; r < reps; ++r) {
        const u32 opaque = (acc ^ static_cast<u32>(r)) & zero;   // 0, but not to the compiler
        acc ^= iteration<OP>(addr + opaque, from, acc + static_cast<u32>(r));
    }
    const u64 t1 = clock64();

    sink[lane] = acc;
    if (lane == 0) cycles[0] = t1 - t0;
}

}  // namespace bank_probes
}  // namespace ptx_lab

using namespace ptx_lab;
using namespace ptx_lab::bank_probes;

#define PTX_LAB_BANK_PROBE(NAME, OP)                                                          \
    extern "C" __global__ void __launch_bounds__(WARP)                                       \
    NAME(const u32* offsets, const u32* src, const unsigned char* gmem, int reps, u32 zero,  \
         u64* cycles, u32* sink) {                                                            \
        probe<OP>(offsets, src, gmem, reps, zero, cycles, sink);                               \
    }
PTX_LAB_BANK_PROBE(bank_ld_u16, Op::LD_U16)
PTX_LAB_BANK_PROBE(bank_ld_b32, Op::LD_B32)
PTX_LAB_BANK_PROBE(bank_ld_v2, Op::LD_V2)
PTX_LAB_BANK_PROBE(bank_ld_v4, Op::LD_V4)
PTX_LAB_BANK_PROBE(bank_st_u16, Op::ST_U16)
PTX_LAB_BANK_PROBE(bank_st_b32, Op::ST_B32)
PTX_LAB_BANK_PROBE(bank_st_v2, Op::ST_V2)
PTX_LAB_BANK_PROBE(bank_st_v4, Op::ST_V4)
PTX_LAB_BANK_PROBE(bank_ldsm_x4, Op::LDSM_X4)
PTX_LAB_BANK_PROBE(bank_ldsm_x4_trans, Op::LDSM_X4_TRANS)
PTX_LAB_BANK_PROBE(bank_stsm_x4, Op::STSM_X4)
PTX_LAB_BANK_PROBE(bank_stsm_x4_trans, Op::STSM_X4_TRANS)
PTX_LAB_BANK_PROBE(bank_cp_async_ca4, Op::CP_CA4)
PTX_LAB_BANK_PROBE(bank_cp_async_ca8, Op::CP_CA8)
PTX_LAB_BANK_PROBE(bank_cp_async_ca16, Op::CP_CA16)
