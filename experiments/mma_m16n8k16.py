"""
mma.m16n8k16 on one warp, with data whose answer you can do in your head
========================================================================

What and why
------------
``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`` computes
D[16x8] = A[16x16] @ B[16x8] + C with the three matrices spread over the 32
lanes of a warp in a layout the PTX ISA fixes. Get that layout wrong and
nothing crashes: the kernel just returns plausible numbers in the wrong places.
So before an mma goes into a real kernel, one warp runs it on data where every
cell of the answer is known and every wrong cell points at one register.

Idea
----
Take A[i][k] = i (the row number) and B[k][j] = j (the column number). Then

    D[i][j] = sum_k A[i][k] * B[k][j] = 16 * i * j      e.g. D[3][5] = 240

and the C/D layout (g = lane // 4, t = lane % 4)

    c0 = D[g][2t]   c1 = D[g][2t+1]   c2 = D[g+8][2t]   c3 = D[g+8][2t+1]

says who holds each cell: D[i][j] sits in lane 4 * (i % 8) + j // 2, register
c{2 * (i // 8) + j % 2}. D[3][5] is lane 14's c1. (The blog post this
experiment comes from names lane 13 for D[3][5]; lane 13 has t = 1, i.e.
columns 2 and 3.)

A second run adds C[i][j] = 8i + j, a different value in every cell, so that
a C fragment read from the wrong register shows up too: D = 16ij + 8i + j.
All values are small integers, exact in bf16, f16 and fp32, so the check is
exact equality (the blog allows 0.5; nothing here needs it).

Kernel
------
Pseudo-code for the one warp::

    sA[16][16] <- A (bf16/f16 bits), sB[16][8] <- B, row-major, in shared memory
    lane l, tile = l / 8, r = l % 8
    a[0..3] = ldmatrix.x4  at &sA[r + 8*(tile & 1)][8*(tile >> 1)]
              # matrices 0..3 = A[0:8,0:8], A[8:16,0:8], A[0:8,8:16], A[8:16,8:16]
              #             = a0, a1, a2, a3 of the A fragment
    b[0..1] = ldmatrix.x2.trans at &sB[l % 16][0]
              # matrices 0, 1 = B[0:8, :], B[8:16, :]; .trans hands lane l
              # {B[2t][g], B[2t+1][g]} = b0 and {B[2t+8][g], B[2t+9][g]} = b1
    d = mma(a, b, c)
    dump a, b, d of every lane

Check
-----
Each dumped register against the closed form: a_r holds A cells whose value
is their row, b_r cells whose value is their column n = g, and c_r
16 * i * j (+ 8i + j). A wrong load shows up in a/b, a wrong mma layout in d.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import fragment_map

from . import _common
from ._common import HALF, WARP, Checker, from_bits, hex16, lane_values, num, to_bits

NAME = "mma_m16n8k16"
SUMMARY = "A[i][k] = i, B[k][j] = j through ldmatrix and one mma: D[i][j] = 16*i*j in every lane"

M, N, K = 16, 8, 16
DTYPES = ("bf16", "f16")
ROW_BYTES = 16  # one ldmatrix row: 8 x 16-bit


# ------------------------------------------------------------------ the data

def a_matrix() -> np.ndarray:
    """A: (16, 16), A[i][k] = i."""
    return np.repeat(np.arange(M, dtype=np.float32)[:, None], K, axis=1)


def b_matrix() -> np.ndarray:
    """B: (16, 8) indexed [k][n], B[k][j] = j."""
    return np.repeat(np.arange(N, dtype=np.float32)[None, :], K, axis=0)


def c_value(case: str):
    """C[i][j] as a function of (i, j) for each case."""
    return (lambda i, j: 0 * i * j) if case == "C = 0" else (lambda i, j: 8 * i + j)


CASES = ("C = 0", "C = 8i + j")


def c_fragment(case: str) -> np.ndarray:
    """C fragment, float32 (32, 4), straight from the C layout formula."""
    return lane_values("mma.c", c_value(case))[:, :, 0].astype(np.float32)


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "ldmatrix.cuh"
#include "mma.cuh"
using namespace ptx_lab;

constexpr int WARP = 32;
constexpr int M = 16, N = 8, K = 16;

// a_bits: (16, 16) b16 row-major A; b_bits: (16, 8) b16 row-major B[k][n];
// c: (32, 4) f32 C fragment. Out: a_out (32, 4) u32, b_out (32, 2) u32, d_out (32, 4) f32.
template <bool BF16>
__device__ void mma_probe(const unsigned short* a_bits, const unsigned short* b_bits,
                          const float* c, u32* a_out, u32* b_out, float* d_out) {
    __shared__ __align__(16) unsigned short sA[M * K];  // sA: (16, 16), 32-byte rows
    __shared__ __align__(16) unsigned short sB[K * N];  // sB: (16, 8) [k][n], 16-byte rows
    const int lane = threadIdx.x;
    for (int i = lane; i < M * K; i += WARP) sA[i] = a_bits[i];
    for (int i = lane; i < K * N; i += WARP) sB[i] = b_bits[i];
    __syncwarp();  // every lane's stores are visible before ldmatrix reads any row

    // A: lane 8*tile + r gives row r of matrix `tile`; bit 0 of the tile number
    // selects the lower 8 rows, bit 1 the right 8 columns, so matrices 0..3 are a0..a3.
    const int tile = lane / 8, r = lane % 8;
    const int a_row = r + 8 * (tile & 1), a_col = 8 * (tile >> 1);
    u32 a[4];
    ldmatrix_x4(a, smem_addr(&sA[a_row * K + a_col]));

    // B: x2 reads lanes 0..15 = rows k 0..15 (matrix 0 = k 0..7, matrix 1 = k 8..15);
    // lanes 16..31 are ignored but must hold valid addresses, so they repeat 0..15.
    u32 b[2];
    ldmatrix_x2_trans(b[0], b[1], smem_addr(&sB[(lane % 16) * N]));

    const float cf[4] = {c[lane * 4 + 0], c[lane * 4 + 1], c[lane * 4 + 2], c[lane * 4 + 3]};
    float d[4];
    if constexpr (BF16) mma_m16n8k16_bf16(d, a, b, cf);
    else                mma_m16n8k16_f16(d, a, b, cf);

    for (int i = 0; i < 4; ++i) { a_out[lane * 4 + i] = a[i]; d_out[lane * 4 + i] = d[i]; }
    for (int i = 0; i < 2; ++i) b_out[lane * 2 + i] = b[i];
}

extern "C" __global__ void mma_probe_bf16(const unsigned short* a_bits, const unsigned short* b_bits,
                                          const float* c, u32* a_out, u32* b_out, float* d_out) {
    mma_probe<true>(a_bits, b_bits, c, a_out, b_out, d_out);
}
extern "C" __global__ void mma_probe_f16(const unsigned short* a_bits, const unsigned short* b_bits,
                                         const float* c, u32* a_out, u32* b_out, float* d_out) {
    mma_probe<false>(a_bits, b_bits, c, a_out, b_out, d_out);
}
"""


def row_addresses() -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets (into the model's smem image) the lanes hand to the two ldmatrix calls.

    The image is sA (512 bytes) followed by sB (256 bytes), as in the kernel.
    """
    lane = np.arange(WARP)
    tile, r = lane // 8, lane % 8
    a_row, a_col = r + 8 * (tile & 1), 8 * (tile >> 1)
    a_addrs = (a_row * K + a_col) * 2
    b_addrs = M * K * 2 + (lane % 16) * N * 2
    return a_addrs, b_addrs


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    _common.check_backend(backend)
    obs = {}
    for dtype in DTYPES:
        a_bits, b_bits = to_bits(a_matrix(), dtype), to_bits(b_matrix(), dtype)
        for case in CASES:
            c = c_fragment(case)
            if backend == "gpu":
                a, b, d = _common.run_warp(
                    SOURCE, f"mma_probe_{dtype}", [a_bits, b_bits, c],
                    [((WARP, 4), np.uint32), ((WARP, 2), np.uint32), ((WARP, 4), np.float32)])
            else:
                smem = np.concatenate([a_bits.view(np.uint8).ravel(), b_bits.view(np.uint8).ravel()])
                a_addrs, b_addrs = row_addresses()
                a = model.ldmatrix(smem, a_addrs, 4, False)
                b = model.ldmatrix(smem, b_addrs, 2, True)
                d = model.mma_m16n8k16(a, b, c, dtype)
            key = f"{dtype}, {case}"
            obs[f"{key}: a"], obs[f"{key}: b"], obs[f"{key}: d"] = a, b, d
    return obs


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    amap, bmap, cmap = fragment_map("mma.a"), fragment_map("mma.b"), fragment_map("mma.c")
    for dtype in DTYPES:
        show = lambda bits, dt=dtype: f"{hex16(bits)} ({num(from_bits(bits, dt))})"  # noqa: E731
        for case in CASES:
            key = f"{dtype}, {case}"
            # a_r: A cells hold their row number; b_r: B cells hold their column (n = g).
            want_a = to_bits(lane_values("mma.a", lambda i, k: i), dtype)
            want_b = to_bits(lane_values("mma.b", lambda k, j: j), dtype)
            chk.compare(key, _common.unpack(obs[f"{key}: a"]), want_a,
                        lambda l, r, h: f"lane {l} a{r}.{HALF[h]} A[{amap[l, r, h, 0]}][{amap[l, r, h, 1]}]",
                        show)
            chk.compare(key, _common.unpack(obs[f"{key}: b"]), want_b,
                        lambda l, r, h: f"lane {l} b{r}.{HALF[h]} B[{bmap[l, r, h, 0]}][{bmap[l, r, h, 1]}]",
                        show)
            cv = c_value(case)
            want_d = lane_values("mma.c", lambda i, j: 16 * i * j + cv(i, j))[:, :, 0].astype(np.float32)
            chk.compare(key, obs[f"{key}: d"], want_d,
                        lambda l, r: f"lane {l} c{r} D[{cmap[l, r, 0, 0]}][{cmap[l, r, 0, 1]}]", num)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
