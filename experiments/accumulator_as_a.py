"""
The accumulator is already an A operand: chaining two mmas in registers
=======================================================================

What and why
------------
Attention-like kernels multiply twice: D1 = A1 @ B1, then D1 (after some
element-wise work) is the *left* operand of D2 = D1 @ B2. D1 comes out of the
first mma in the C layout, the second mma wants it in the A layout. Writing it
to shared memory and reading it back with ldmatrix would work; Kernel A does
not, because the two layouts already agree (g = lane // 4, t = lane % 4):

    C of n-tile j (16x8):   c0 = D[g][2t]    c1 = D[g][2t+1]
                            c2 = D[g+8][2t]  c3 = D[g+8][2t+1]      (columns 8j + ...)
    A (16x16):              a0 = A[g][2t..2t+1]     a1 = A[g+8][2t..2t+1]
                            a2 = A[g][2t+8..2t+9]   a3 = A[g+8][2t+8..2t+9]

so for A = [D_left | D_right] (two adjacent 16x8 n-tiles):

    a0 = pack(left.c0, left.c1)    a1 = pack(left.c2, left.c3)
    a2 = pack(right.c0, right.c1)  a3 = pack(right.c2, right.c3)

Every lane already holds the values it needs; no shuffle, no movmatrix, no
shared memory. This experiment checks the identity on the tensor core.

Idea
----
Small integers keep everything exact:

    A1[i][k] = (i + k) % 4 - 1      in -1..2
    B1[k][n] = (3k + n) % 5 - 2     in -2..2, 16x16 = two n-tiles
    B2[k][n] = (k + 2n) % 3 - 1     in -1..1

|D1| <= 16 * 2 * 2 = 64 is exact in bf16 and f16, |D2| <= 16 * 64 = 1024 is
exact in fp32, so D2 must equal D1 @ B2 computed in integers, bit for bit.

Kernel
------
::

    a1, b1_left, b1_right, b2 <- host-built fragments (closed-form maps)
    d_left  = mma(a1, b1_left, 0);  d_right = mma(a1, b1_right, 0)
    acc_to_a(a2, d_left, d_right)       (fragments.cuh: the kernels' packing)
        = a2 = { pack(d_left[0], d_left[1]), pack(d_left[2], d_left[3]),
                 pack(d_right[0], d_right[1]), pack(d_right[2], d_right[3]) }
    d2 = mma(a2, b2, 0)
    dump d_left, d_right, a2, d2

The model backend runs the same sequence through ptx_lab.model.mma_m16n8k16 and
ptx_lab.fragments.acc_to_a (the header's model, which places the accumulators in
their matrix and reads the A fragment back through the maps, assuming nothing
about which lane holds what), and must pass the same closed-form check, so on
the GPU a pass also means agreement with the model.

Check
-----
D1 per lane/register against the integer product, a2 per lane/register/half
against the A layout of D1, D2 against the integer D1 @ B2.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import acc_to_a, fragment_map

from . import _common
from ._common import HALF, WARP, Checker, from_bits, hex16, lane_values, num, pack, to_bits

NAME = "accumulator_as_a"
SUMMARY = "two n-tiles of an mma accumulator, packed pairwise, fed as the A operand of a second mma"

DTYPES = ("bf16", "f16")


def a1(i, k):
    return (i + k) % 4 - 1


def b1(k, n):
    return (3 * k + n) % 5 - 2


def b2(k, n):
    return (k + 2 * n) % 3 - 1


def integer_matrices() -> tuple[np.ndarray, np.ndarray]:
    """D1 = A1 @ B1 (16x16) and D2 = D1 @ B2 (16x8), in int64."""
    i16 = np.arange(16)
    A1 = a1(i16[:, None], i16[None, :])
    B1 = b1(i16[:, None], i16[None, :])
    B2 = b2(i16[:, None], np.arange(8)[None, :])
    D1 = A1 @ B1
    assert np.abs(D1).max() <= 256  # exact in bf16 (8 significant bits) and f16
    return D1, D1 @ B2


def inputs(dtype: str) -> dict[str, np.ndarray]:
    """Fragments straight from the layout formulas: a1 (32, 4), b1 halves and b2 (32, 2) u32."""
    frag = lambda op, f: pack(to_bits(lane_values(op, f), dtype))  # noqa: E731
    return {"a1": frag("mma.a", a1),
            "b1_left": frag("mma.b", b1),
            "b1_right": frag("mma.b", lambda k, n: b1(k, n + 8)),
            "b2": frag("mma.b", b2)}


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "fragments.cuh"
#include "mma.cuh"
using namespace ptx_lab;

// a1: (32, 4) u32; b1_left, b1_right, b2: (32, 2) u32 (fragments, bf16 or f16 pairs).
// Out: d1 (32, 8) f32 = left c0..c3, right c0..c3; a2 (32, 4) u32; d2 (32, 4) f32.
template <bool BF16>
__device__ void chain(const u32* a1, const u32* b1_left, const u32* b1_right, const u32* b2,
                      float* d1_out, u32* a2_out, float* d2_out) {
    const int lane = threadIdx.x;
    const u32 a[4] = {a1[lane * 4 + 0], a1[lane * 4 + 1], a1[lane * 4 + 2], a1[lane * 4 + 3]};
    const u32 bl[2] = {b1_left[lane * 2 + 0], b1_left[lane * 2 + 1]};
    const u32 br[2] = {b1_right[lane * 2 + 0], b1_right[lane * 2 + 1]};
    const u32 bb[2] = {b2[lane * 2 + 0], b2[lane * 2 + 1]};
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};

    float dl[4], dr[4];  // D1[:, 0:8] and D1[:, 8:16] in the C layout
    if constexpr (BF16) { mma_m16n8k16_bf16(dl, a, bl, zero); mma_m16n8k16_bf16(dr, a, br, zero); }
    else                { mma_m16n8k16_f16(dl, a, bl, zero);  mma_m16n8k16_f16(dr, a, br, zero); }

    // The identity under test: (c0, c1), (c2, c3) of each n-tile are a0/a2, a1/a3.
    u32 p[4];
    if constexpr (BF16) acc_to_a(p, dl, dr);
    else                acc_to_a_f16(p, dl, dr);
    float d2[4];
    if constexpr (BF16) mma_m16n8k16_bf16(d2, p, bb, zero);
    else                mma_m16n8k16_f16(d2, p, bb, zero);

    for (int i = 0; i < 4; ++i) {
        d1_out[lane * 8 + i] = dl[i];
        d1_out[lane * 8 + 4 + i] = dr[i];
        a2_out[lane * 4 + i] = p[i];
        d2_out[lane * 4 + i] = d2[i];
    }
}

extern "C" __global__ void chain_bf16(const u32* a1, const u32* b1l, const u32* b1r, const u32* b2,
                                      float* d1, u32* a2, float* d2) {
    chain<true>(a1, b1l, b1r, b2, d1, a2, d2);
}
extern "C" __global__ void chain_f16(const u32* a1, const u32* b1l, const u32* b1r, const u32* b2,
                                     float* d1, u32* a2, float* d2) {
    chain<false>(a1, b1l, b1r, b2, d1, a2, d2);
}
"""


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    _common.check_backend(backend)
    obs = {}
    for dtype in DTYPES:
        x = inputs(dtype)
        if backend == "gpu":
            d1, a2, d2 = _common.run_warp(
                SOURCE, f"chain_{dtype}", [x["a1"], x["b1_left"], x["b1_right"], x["b2"]],
                [((WARP, 8), np.float32), ((WARP, 4), np.uint32), ((WARP, 4), np.float32)])
        else:
            zero = np.zeros((WARP, 4), dtype=np.float32)
            dl = model.mma_m16n8k16(x["a1"], x["b1_left"], zero, dtype)
            dr = model.mma_m16n8k16(x["a1"], x["b1_right"], zero, dtype)
            a2 = acc_to_a(dl, dr, dtype)
            d1 = np.concatenate([dl, dr], axis=1)
            d2 = model.mma_m16n8k16(a2, x["b2"], zero, dtype)
        obs[f"{dtype}: d1"], obs[f"{dtype}: a2"], obs[f"{dtype}: d2"] = d1, a2, d2
    return obs


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    D1, D2 = integer_matrices()
    amap, cmap = fragment_map("mma.a"), fragment_map("mma.c")[:, :, 0]  # (32, 4, 2, 2), (32, 4, 2)
    for dtype in DTYPES:
        show = lambda bits, dt=dtype: f"{hex16(bits)} ({num(from_bits(bits, dt))})"  # noqa: E731
        # D1 as two n-tiles: register r of tile j holds D1[row][8j + col].
        want_d1 = np.concatenate([D1[cmap[..., 0], cmap[..., 1]], D1[cmap[..., 0], cmap[..., 1] + 8]],
                                 axis=1).astype(np.float32)
        chk.compare(dtype, obs[f"{dtype}: d1"], want_d1,
                    lambda l, k: (f"lane {l} {('left', 'right')[k // 4]} c{k % 4} "
                                  f"D1[{cmap[l, k % 4, 0]}][{cmap[l, k % 4, 1] + 8 * (k // 4)}]"), num)
        want_a2 = to_bits(D1[amap[..., 0], amap[..., 1]], dtype)
        chk.compare(dtype, _common.unpack(obs[f"{dtype}: a2"]), want_a2,
                    lambda l, r, h: f"lane {l} a{r}.{HALF[h]} D1[{amap[l, r, h, 0]}][{amap[l, r, h, 1]}]",
                    show)
        want_d2 = D2[cmap[..., 0], cmap[..., 1]].astype(np.float32)
        chk.compare(dtype, obs[f"{dtype}: d2"], want_d2,
                    lambda l, r: f"lane {l} c{r} D2[{cmap[l, r, 0]}][{cmap[l, r, 1]}]", num)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
