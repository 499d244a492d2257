"""The rstd pass in numpy: its float64 reference, its fp32 arithmetic in the kernel's order, and the bound between
the two.

The reference is the formula: rstd = 1 / sqrt(sum x^2 + 1e-6) over a row's 128 elements, in float64 (a bf16
square is exact there, and so is the sum of 128 of them but for its last bits).

The kernel (kernel/row_rstd/cuda/row_rstd.cu) computes it in fp32: each of a row's 16 lanes sums the squares of
its 8 columns in column order, the 16 partial sums meet by butterfly shuffles over lane distances 8, 4, 2, 1, then
1 / sqrt(sum + 1e-6f), the square root and the division each correctly rounded. :func:`kernel_order` is that
arithmetic in numpy fp32, which gives the kernel's bits wherever every nonzero square of the row is a normal fp32
number: the kernel's fma of an exact square rounds as numpy's add of it does, and fp32 addition commutes, so
the shuffles' operand order does not matter. (A square below 2^-126 is kept as a subnormal by numpy and used
exactly by the kernel's fma, whose result -ftz=true flushes where it is itself below 2^-126; all three are below
the last bit of any sum with the 1e-6 added.)

The bound (:data:`BOUND`, relative). With u = 2^-24, fp32's unit roundoff: a square reaches the row's sum through
at most 7 fma roundings of its lane and 4 of the shuffles, and the 1e-6 is added by one more: the sum of
nonnegative terms rounded 12 times is within 12u of its exact value (relative, to first order), and 1e-6f is
within u of 1e-6, so sum + 1e-6f is within 13u of the exact sum x^2 + 1e-6. The square root halves that (6.5u)
and adds its own rounding (u), the reciprocal its own (u): at most 8.5u = 5.1e-7 in all. :data:`BOUND` is 2^-20
= 16u (9.5e-7), a 1.9x margin over 8.5u for the second-order terms and nothing else.

Out of range: a row whose fp32 sum of squares overflows (past 3.4e38) gets 0, in the kernel as in FLA's fp32
formula; the float64 reference does not overflow, so such rows are outside the bound (tested apart).
"""
from __future__ import annotations

import numpy as np

from kernel.reference.checks import l2norm_rstd

D = 128
LANES = 16              # a row's lanes (half a warp)
PER_LANE = D // LANES   # the columns each sums, in order
EPS = 1e-6
U = 2.0 ** -24
DERIVED = ((12 + 1) / 2 + 1 + 1) * U   # the sum's 12 roundings and eps's, halved by the square root; its and the
                                       # reciprocal's roundings
BOUND = 2.0 ** -20
FP32_MAX = float(np.finfo(np.float32).max)


def reference(x) -> np.ndarray:
    """float64 1 / sqrt(sum x^2 + 1e-6) over the last axis of ``x`` (any float values): the float64 references'
    l2norm scale."""
    return l2norm_rstd(np, np.asarray(x, dtype=np.float64))


def kernel_order(x) -> np.ndarray:
    """The kernel's fp32 rstd of rows ``x`` [..., 128] (bf16 values, as float32 or float64): its sums in its order
    (module docstring), then 1 / sqrt(sum + 1e-6f)."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape[:-1]
    with np.errstate(over="ignore"):    # a row past fp32's range sums to inf, and its rstd is 0 (as the kernel's)
        squares = (x * x).reshape(-1, LANES, PER_LANE)
        sums = squares[..., 0]
        for i in range(1, PER_LANE):    # each lane's columns in order
            sums = sums + squares[..., i]
        lanes = np.arange(LANES)
        for distance in (8, 4, 2, 1):   # the butterfly: each lane adds its partner's sum
            sums = sums + sums[:, lanes ^ distance]
        total = sums[:, 0] + np.float32(EPS)
    return (np.float32(1.0) / np.sqrt(total)).astype(np.float32).reshape(shape)


def normal_squares(x) -> np.ndarray:
    """Whether each row's nonzero squares are all normal fp32 numbers and its fp32 sum cannot overflow: the rows
    whose bits :func:`kernel_order` gives (module docstring)."""
    sq = np.asarray(x, dtype=np.float64) ** 2
    tiny = np.any((sq > 0) & (sq < np.finfo(np.float32).tiny), axis=-1)
    return ~tiny & (sq.sum(axis=-1) * (1 + 2 ** -20) < FP32_MAX)


def relative_error(got, want) -> np.ndarray:
    """|got - want| / want, element by element, in float64 (want > 0: every rstd is)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return np.abs(got - want) / want


def ulps_apart(a, b) -> np.ndarray:
    """How many fp32 values lie between positive fp32 numbers a and b (0: the same bits)."""
    a = np.ascontiguousarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
    b = np.ascontiguousarray(b, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.abs(a - b)


def rows(shape, seed: int = 0, *, span: float = 40.0, zero_every: int = 0) -> np.ndarray:
    """bf16 values (float32) of shape [..., 128]: standard normal rows, each scaled by 2^s for s uniform in
    [-span, span] (norms from tiny to huge), every ``zero_every``-th row zero (rows zero_every - 1, 2 zero_every - 1,
    ...; 0: none)."""
    from kernel.runtime.arrays import bf16_bits, bits_to_f32

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    scale = np.exp2(rng.uniform(-span, span, size=(*shape[:-1], 1)))
    flat = (x * scale).reshape(-1, shape[-1])
    if zero_every:
        flat[zero_every - 1::zero_every] = 0.0
    return bits_to_f32(bf16_bits(flat.reshape(shape)))


def bf16(x) -> np.ndarray:
    """x rounded to bf16 values (float32), as the GPU tests' tensors hold them."""
    from kernel.runtime.arrays import bf16_bits, bits_to_f32

    return bits_to_f32(bf16_bits(x))
