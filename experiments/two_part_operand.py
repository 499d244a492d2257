"""
An fp32 operand in two bf16 parts: its rounding, then what the rounding left
============================================================================

What and why
------------
mma.sync reads bf16 operands. When an operand is computed in fp32 inside the
kernel (Kernel B's beta Vn before G7, dU before G3, U before G9/G10), packing it
to bf16 rounds every element to 8 significant bits, a relative error of up to
2^-9, and that error goes into every product. Two parts take it back:

    hi = bf16(x)            (round to nearest even: pack_bf16x2)
    lo = bf16(x - hi)       (x - hi is exact in fp32; for such x it is exact in bf16 too)
    D  = hi @ B + lo @ B    (two mmas into one fp32 accumulator)

hi + lo carries about 16 significant bits of x, so D is the product of x itself
to within fp32's rounding of the sum, for two more mmas and no more registers
than the second operand's pack. This experiment checks the split and both
products on the tensor core.

Idea
----
Values with more bits than bf16 keeps, and few enough that every sum is exact:

    A[i][k] = (i + 1) + 2^-10 ((i + 3k) % 8)      15 significant bits at most
    B[k][n] = (k + 2n) % 5 - 2                    in -2..2

bf16(A) keeps 8 bits, so hi != A for most elements, and A - hi (a multiple of
2^-10 below half of hi's last place) fits in bf16 exactly. Every partial sum of
A @ B is a multiple of 2^-10 below 2^10, exact in fp32 in any order, so

    one part:   D1 = hi @ B          = sum_k bf16(A[i][k]) B[k][n]
    two parts:  D2 = hi @ B + lo @ B = sum_k A[i][k] B[k][n]

hold bit for bit. D1 differs from the exact product; D2 does not.

Kernel
------
::

    x <- A in the A layout, fp32 (32 lanes x 8: a0.lo, a0.hi, ..., a3.hi)
    two_part_bf16x2(hi[r], lo[r], x[2r], x[2r + 1])     (fragments.cuh: the kernels' split)
        = hi[r] = pack(x[2r], x[2r + 1]);  lo[r] = pack(x[2r] - unpack(hi[r]).lo, x[2r + 1] - unpack(hi[r]).hi)
    d1 = mma(hi, b, 0);  d2 = mma(lo, b, d1)
    dump hi, lo, d1, d2

The model backend runs the same through ptx_lab.fragments.two_part_bf16x2 (the header's
model) and ptx_lab.model.mma_m16n8k16, and must pass the same closed-form check.

Check
-----
hi and lo per lane/register/half against bf16(A) and bf16(A - bf16(A)); D1 and
D2 per lane/register against the exact sums above.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import fragment_map, two_part_bf16x2

from . import _common
from ._common import HALF, WARP, Checker, from_bits, hex16, lane_values, num, pack, to_bits

NAME = "two_part_operand"
SUMMARY = "an fp32 A operand as two bf16 parts (its rounding and the rest) into one mma accumulator"


def a_value(i, k):
    return (i + 1) + 2.0 ** -10 * ((i + 3 * k) % 8)


def b_value(k, n):
    return (k + 2 * n) % 5 - 2


def exact_products() -> tuple[np.ndarray, np.ndarray]:
    """D1 = bf16(A) @ B and D2 = A @ B (16 x 8), in float64; both exact in fp32."""
    i16 = np.arange(16)
    A = a_value(i16[:, None], i16[None, :]).astype(np.float64)
    B = b_value(i16[:, None], np.arange(8)[None, :]).astype(np.float64)
    hi = from_bits(to_bits(A, "bf16"), "bf16").astype(np.float64)
    assert np.all(from_bits(to_bits(A - hi, "bf16"), "bf16") == A - hi)   # lo is exact in bf16
    D1, D2 = hi @ B, A @ B
    for D in (D1, D2):   # multiples of 2^-10 below 2^10: exact in fp32, whatever the order of the sum
        assert np.all(D * 1024 == np.round(D * 1024)) and np.abs(D).max() < 1024
    assert not np.array_equal(D1, D2)   # one part is not enough for this data
    return D1, D2


def inputs() -> dict[str, np.ndarray]:
    """x: A as fp32 in the A layout (32, 8); b: B's bf16 fragment (32, 2) u32."""
    x = lane_values("mma.a", a_value).astype(np.float32).reshape(WARP, 8)
    b = pack(to_bits(lane_values("mma.b", b_value), "bf16"))
    return {"x": x, "b": b}


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "fragments.cuh"
#include "mma.cuh"
using namespace ptx_lab;

// x: (32, 8) f32, A's elements in the A layout (register r: elements 2r, 2r + 1); b: (32, 2) u32.
// Out: hi, lo (32, 4) u32; d1 = hi @ B, d2 = hi @ B + lo @ B (32, 4) f32.
extern "C" __global__ void two_part(const float* x, const u32* b, u32* hi_out, u32* lo_out,
                                    float* d1_out, float* d2_out) {
    const int lane = threadIdx.x;
    u32 hi[4], lo[4];
    // each lane splits its own elements: the rounding, and the rounding of what it left
    for (int r = 0; r < 4; ++r) two_part_bf16x2(hi[r], lo[r], x[lane * 8 + 2 * r], x[lane * 8 + 2 * r + 1]);
    const u32 bb[2] = {b[lane * 2 + 0], b[lane * 2 + 1]};
    const float zero[4] = {0.f, 0.f, 0.f, 0.f};
    float d1[4], d2[4];
    mma_m16n8k16_bf16(d1, hi, bb, zero);
    mma_m16n8k16_bf16(d2, lo, bb, d1);
    for (int r = 0; r < 4; ++r) {
        hi_out[lane * 4 + r] = hi[r];
        lo_out[lane * 4 + r] = lo[r];
        d1_out[lane * 4 + r] = d1[r];
        d2_out[lane * 4 + r] = d2[r];
    }
}
"""


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    _common.check_backend(backend)
    x = inputs()
    if backend == "gpu":
        hi, lo, d1, d2 = _common.run_warp(
            SOURCE, "two_part", [x["x"], x["b"]],
            [((WARP, 4), np.uint32), ((WARP, 4), np.uint32), ((WARP, 4), np.float32), ((WARP, 4), np.float32)])
    else:
        hi, lo = two_part_bf16x2(x["x"])
        d1 = model.mma_m16n8k16(hi, x["b"], np.zeros((WARP, 4), np.float32), "bf16")
        d2 = model.mma_m16n8k16(lo, x["b"], d1, "bf16")
    return {"hi": hi, "lo": lo, "d1": d1, "d2": d2}


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    D1, D2 = exact_products()
    amap, cmap = fragment_map("mma.a"), fragment_map("mma.c")[:, :, 0]   # (32, 4, 2, 2), (32, 4, 2)
    A = lane_values("mma.a", a_value).astype(np.float32)                  # (32, 4, 2)
    want_hi = to_bits(A, "bf16")
    want_lo = to_bits(A - from_bits(want_hi, "bf16"), "bf16")
    show = lambda bits: f"{hex16(bits)} ({num(from_bits(bits, 'bf16'))})"  # noqa: E731
    for name, want in (("hi", want_hi), ("lo", want_lo)):
        chk.compare(name, _common.unpack(obs[name]), want,
                    lambda l, r, h: f"lane {l} a{r}.{HALF[h]} A[{amap[l, r, h, 0]}][{amap[l, r, h, 1]}]", show)
    for name, D in (("one part: d1 = hi @ B", D1), ("two parts: d2 = hi @ B + lo @ B", D2)):
        key = name.split(":")[1].split("=")[0].strip()
        chk.compare(name, obs[key], D[cmap[..., 0], cmap[..., 1]].astype(np.float32),
                    lambda l, r: f"lane {l} c{r} D[{cmap[l, r, 0]}][{cmap[l, r, 1]}]", num)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
