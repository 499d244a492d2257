"""ptx_lab.device against ptx_lab.model: every primitive variant, every lane, every bit.

The GPU twins in ``ptx_lab.device`` run the real instruction in a one-warp
probe; the CPU model in ``ptx_lab.model`` moves bytes along the PTX ISA's
fragment formulas. For each variant, hypothesis draws shared-memory images,
row addresses in random order (repeats too, where the instruction allows them)
and register contents, and the two must agree bit for bit:

    ldmatrix  .x1/.x2/.x4 [.trans]   registers      exact
    stmatrix  .x1/.x2/.x4 [.trans]   smem image     exact (rows distinct: overlap is undefined)
    movmatrix .trans                 registers      exact
    mma m16n8k16 bf16/f16            fp32 results   exact on sums fp32 holds exactly,
                                                    else |d - model| <= 2^-18 (|A||B| + |C|)
    cp.async  ca4/ca8/ca16/cg16 [zfill]  smem image exact

Every device test is marked ``gpu`` (``pytest -m gpu``) and is skipped, with
the reason, where no GPU is usable. The tests at the end run on the CPU: they
show the comparison has teeth by feeding it a deliberately wrong model (two
lanes swapped) and expecting it to fail.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ptx_lab import device, model
from ptx_lab.gpu import gpu_reason, has_gpu

WARP = 32
ROW_BYTES = 16                  # one ldmatrix/stmatrix row
MAX_IMAGE_BYTES = 4096          # images drawn here; the probes take up to 48 KiB

LD_ST_VARIANTS = [(num, trans) for num in (1, 2, 4) for trans in (False, True)]
CP_ASYNC_VARIANTS = [(4, "ca"), (8, "ca"), (16, "ca"), (16, "cg")]

# The first example of a run compiles probes.cu, so no per-example deadline.
DEVICE = settings(max_examples=40, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CPU = settings(max_examples=30, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# mma on general data: the tensor core sums the 16 products and c in its own
# order with its own internal rounding, the model in float64 rounded once.
# Allow 64 fp32 roundings (2^-24 each) of the absolute sum: far more than any
# summation order needs, far less than one misplaced product (~ |A||B| / 16).
MMA_BOUND = 2.0 ** -18

SIGN_BITS = np.uint32(0x8000_8000)  # sign of both bf16/f16 halves of a b32


def variant_id(num: int, trans: bool) -> str:
    return f"x{num}" + ("_trans" if trans else "")


# ----------------------------------------------------------------- comparison helpers

def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Same shape, same dtype, same bits everywhere; else name the first differences.

    Indices are (lane, register) for register arrays and byte offsets for images.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape}")
    if got.dtype.kind == "f":  # compare float bits, not values: NaN == NaN, -0 != +0
        got, want = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    bad = np.argwhere(got != want)
    if bad.size:
        lines = [f"{what}: {len(bad)} of {got.size} entries differ"]
        for idx in bad[:8]:
            i = tuple(int(k) for k in idx)
            lines.append(f"  at {i}: got {int(got[i]):#x}, want {int(want[i]):#x}")
        raise AssertionError("\n".join(lines))


def mma_abs_sum(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: str) -> np.ndarray:
    """|A| @ |B| + |C| in the D layout: the model run on sign-cleared fragments."""
    return model.mma_m16n8k16(a & ~SIGN_BITS, b & ~SIGN_BITS, np.abs(c), dtype)


def assert_mma_close(got: np.ndarray, want: np.ndarray, abs_sum: np.ndarray, what: str) -> None:
    """|got - want| <= MMA_BOUND * (|A||B| + |C|) for every (lane, register)."""
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = MMA_BOUND * abs_sum.astype(np.float64)
    bad = np.argwhere(~(err <= bound))
    if bad.size:
        lines = [f"{what}: {len(bad)} of {got.size} results off by more than 2^-18 (|A||B| + |C|)"]
        for lane, reg in bad[:8]:
            lines.append(f"  lane {lane} reg {reg}: got {got[lane, reg]!r}, want {want[lane, reg]!r}, "
                         f"bound {bound[lane, reg]:.3g}")
        raise AssertionError("\n".join(lines))


def without_negative_zero(x: np.ndarray) -> np.ndarray:
    """-0.0 -> +0.0 (x + 0 does exactly that): an exact sum's sign of zero is not a layout fact."""
    return x + np.float32(0)


def swap_lanes(regs: np.ndarray, p: int, q: int) -> np.ndarray:
    out = regs.copy()
    out[[p, q]] = out[[q, p]]
    return out


# ----------------------------------------------------------------- strategies

seeds = st.integers(0, 2**32 - 1)


def random_bytes(seed: int, n: int) -> np.ndarray:
    """Bulk data comes from a seed (cheap, reproducible); structure comes from hypothesis."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@st.composite
def row_cases(draw, num: int, distinct: bool):
    """(smem, addrs): an image of n >= 32 rows (plus a ragged tail) and 32 row addresses.

    Used lanes (0..8*num-1) name rows in random order: a prefix of a permutation,
    or, unless `distinct`, any rows with repeats. Ignored lanes sometimes get
    junk (unaligned, out of range) that both twins must ignore.
    """
    n_rows = draw(st.integers(WARP, MAX_IMAGE_BYTES // ROW_BYTES))
    tail = draw(st.integers(0, ROW_BYTES - 1))
    smem = random_bytes(draw(seeds), n_rows * ROW_BYTES + tail)
    permuted = st.permutations(range(n_rows)).map(lambda p: p[:WARP])
    repeated = st.lists(st.integers(0, n_rows - 1), min_size=WARP, max_size=WARP)
    rows = draw(permuted if distinct else st.one_of(permuted, repeated))
    addrs = np.asarray(rows, dtype=np.int64) * ROW_BYTES
    if num < 4 and draw(st.booleans()):
        addrs[8 * num:] = 1_000_003  # ignored lanes: not aligned, not inside smem
    return smem, addrs


@st.composite
def exact_mma_cases(draw, dtype: str):
    """(a, b, c) fragments whose D = A @ B + C every fp32 summation order gets exactly.

    A, B elements m * 2^e with |m| <= 7, |e| <= 2 (exact in bf16 and f16);
    C a multiple of 2^-4 in [-256, 256]. Every product and partial sum is then
    a multiple of 2^-4 below 2^12 in magnitude: 16 significant bits at most.
    """
    def elements(shape):
        m = draw(hnp.arrays(np.int64, shape, elements=st.integers(-7, 7)))
        e = draw(hnp.arrays(np.int64, shape, elements=st.integers(-2, 2)))
        return m * np.exp2(e)

    A, B = elements((16, 16)), elements((16, 8))
    C = draw(hnp.arrays(np.int64, (16, 8), elements=st.integers(-4096, 4096))) / 16.0
    return (model.matrix_to_fragments("mma.a", A, dtype),
            model.matrix_to_fragments("mma.b", B, dtype),
            model.matrix_to_fragments("mma.c", C, "f32"))


def random_mma_case(seed: int, dtype: str):
    """(a, b, c) fragments of standard-normal A, B (rounded to dtype) and C (fp32)."""
    rng = np.random.default_rng(seed)
    return (model.matrix_to_fragments("mma.a", rng.standard_normal((16, 16)), dtype),
            model.matrix_to_fragments("mma.b", rng.standard_normal((16, 8)), dtype),
            model.matrix_to_fragments("mma.c", rng.standard_normal((16, 8)), "f32"))


@st.composite
def cp_async_cases(draw, size: int, zfill: bool):
    """(smem, gmem, dst, src, src_bytes): distinct destinations in random order,
    sources anywhere (repeats allowed: reads may alias), src_bytes in 0..size."""
    n_dst = draw(st.integers(WARP, min(MAX_IMAGE_BYTES // size, 256)))
    smem = random_bytes(draw(seeds), n_dst * size + draw(st.integers(0, 15)))
    n_src = draw(st.integers(1, 256))
    gmem = random_bytes(draw(seeds), n_src * size + draw(st.integers(0, 15)))
    dst = np.asarray(draw(st.permutations(range(n_dst)))[:WARP], dtype=np.int64) * size
    src = np.asarray(draw(st.lists(st.integers(0, n_src - 1), min_size=WARP, max_size=WARP)),
                     dtype=np.int64) * size
    src_bytes = None
    if zfill:
        src_bytes = np.asarray(draw(st.lists(st.integers(0, size), min_size=WARP, max_size=WARP)),
                               dtype=np.int64)
    return smem, gmem, dst, src, src_bytes


# ----------------------------------------------------------------- device vs model

@pytest.mark.gpu
@pytest.mark.parametrize("num,trans", LD_ST_VARIANTS, ids=[variant_id(*v) for v in LD_ST_VARIANTS])
@DEVICE
@given(data=st.data())
def test_ldmatrix(num: int, trans: bool, data) -> None:
    smem, addrs = data.draw(row_cases(num, distinct=False))
    assert_bits_equal(device.ldmatrix(smem, addrs, num, trans),
                      model.ldmatrix(smem, addrs, num, trans), f"ldmatrix.{variant_id(num, trans)}")


@pytest.mark.gpu
@pytest.mark.parametrize("num,trans", LD_ST_VARIANTS, ids=[variant_id(*v) for v in LD_ST_VARIANTS])
@DEVICE
@given(data=st.data())
def test_stmatrix(num: int, trans: bool, data) -> None:
    smem, addrs = data.draw(row_cases(num, distinct=True))
    regs = data.draw(hnp.arrays(np.uint32, (WARP, num)))
    assert_bits_equal(device.stmatrix(smem, addrs, regs, trans),
                      model.stmatrix(smem, addrs, regs, trans), f"stmatrix.{variant_id(num, trans)}")


@pytest.mark.gpu
@DEVICE
@given(regs=hnp.arrays(np.uint32, WARP))
def test_movmatrix_trans(regs: np.ndarray) -> None:
    assert_bits_equal(device.movmatrix_trans(regs), model.movmatrix_trans(regs), "movmatrix.trans")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@DEVICE
@given(data=st.data())
def test_mma_exact(dtype: str, data) -> None:
    """Bit-exact (up to the sign of an exact zero) where fp32 holds every partial sum."""
    a, b, c = data.draw(exact_mma_cases(dtype))
    assert_bits_equal(without_negative_zero(device.mma_m16n8k16(a, b, c, dtype)),
                      without_negative_zero(model.mma_m16n8k16(a, b, c, dtype)),
                      f"mma.m16n8k16.{dtype} (exact data)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@DEVICE
@given(seed=seeds)
def test_mma_random(dtype: str, seed: int) -> None:
    """Normal data: within 2^-18 (|A||B| + |C|) of the model's float64-then-round result."""
    a, b, c = random_mma_case(seed, dtype)
    assert_mma_close(device.mma_m16n8k16(a, b, c, dtype), model.mma_m16n8k16(a, b, c, dtype),
                     mma_abs_sum(a, b, c, dtype), f"mma.m16n8k16.{dtype} (random data)")


@pytest.mark.gpu
@pytest.mark.parametrize("zfill", [False, True], ids=["plain", "zfill"])
@pytest.mark.parametrize("size,cache", CP_ASYNC_VARIANTS, ids=[f"{c}{s}" for s, c in CP_ASYNC_VARIANTS])
@DEVICE
@given(data=st.data())
def test_cp_async(size: int, cache: str, zfill: bool, data) -> None:
    smem, gmem, dst, src, src_bytes = data.draw(cp_async_cases(size, zfill))
    assert_bits_equal(device.cp_async(smem, gmem, dst, src, size, src_bytes, cache),
                      model.cp_async(smem, gmem, dst, src, size, src_bytes, cache),
                      f"cp.async.{cache}{size}" + (" zfill" if zfill else ""))


# ----------------------------------------------------------------- device-only identities

@pytest.mark.gpu
@pytest.mark.parametrize("num,trans", LD_ST_VARIANTS, ids=[variant_id(*v) for v in LD_ST_VARIANTS])
@DEVICE
@given(data=st.data())
def test_device_stmatrix_then_ldmatrix_round_trips(num: int, trans: bool, data) -> None:
    """No model involved: what stmatrix stores, ldmatrix of the same addresses reads back."""
    smem, addrs = data.draw(row_cases(num, distinct=True))
    regs = data.draw(hnp.arrays(np.uint32, (WARP, num)))
    stored = device.stmatrix(smem, addrs, regs, trans)
    assert_bits_equal(device.ldmatrix(stored, addrs, num, trans), regs,
                      f"ldmatrix(stmatrix(regs)).{variant_id(num, trans)}")


@pytest.mark.gpu
@DEVICE
@given(regs=hnp.arrays(np.uint32, WARP))
def test_device_movmatrix_is_stmatrix_then_ldmatrix_trans(regs: np.ndarray) -> None:
    """No model involved: movmatrix.trans == stmatrix.x1 then ldmatrix.x1.trans."""
    addrs = np.arange(WARP, dtype=np.int64) % 8 * ROW_BYTES
    stored = device.stmatrix(np.zeros(8 * ROW_BYTES, np.uint8), addrs, regs.reshape(WARP, 1), False)
    via_smem = device.ldmatrix(stored, addrs, 1, True).reshape(WARP)
    assert_bits_equal(device.movmatrix_trans(regs), via_smem, "movmatrix.trans vs stmatrix+ldmatrix.trans")


# ----------------------------------------------------------------- teeth (CPU)
# The comparisons above are only worth something if a wrong answer fails them.
# Each test below builds data on which every lane's answer is distinct, swaps
# two lanes of the model (its result or its fragment map) and requires the
# same helper to reject the perturbed model.

lane_pairs = st.lists(st.integers(0, WARP - 1), min_size=2, max_size=2, unique=True)


@pytest.mark.parametrize("num,trans", LD_ST_VARIANTS, ids=[variant_id(*v) for v in LD_ST_VARIANTS])
@CPU
@given(data=st.data(), pair=lane_pairs)
def test_teeth_ldmatrix_lane_swap_is_caught(num: int, trans: bool, data, pair) -> None:
    n_rows = 64
    smem = np.arange(n_rows * 8, dtype="<u2").view(np.uint8)  # every element distinct
    rows = data.draw(st.permutations(range(n_rows)))[:WARP]
    addrs = np.asarray(rows, dtype=np.int64) * ROW_BYTES
    wrong = swap_lanes(model.ldmatrix(smem, addrs, num, trans), *pair)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(wrong, model.ldmatrix(smem, addrs, num, trans), "perturbed ldmatrix")


@pytest.mark.parametrize("num,trans", LD_ST_VARIANTS, ids=[variant_id(*v) for v in LD_ST_VARIANTS])
@CPU
@given(data=st.data(), pair=lane_pairs)
def test_teeth_stmatrix_fragment_map_swap_is_caught(num: int, trans: bool, data, pair) -> None:
    smem, addrs = data.draw(row_cases(num, distinct=True))
    regs = data.draw(hnp.arrays(np.uint32, (WARP, num), unique=True))
    halves = np.concatenate([regs & 0xFFFF, regs >> 16], axis=None)
    if np.unique(halves).size != halves.size:  # need every stored element distinct
        regs = (np.arange(WARP * num, dtype=np.uint32).reshape(WARP, num) * 2) | \
               ((np.arange(WARP * num, dtype=np.uint32).reshape(WARP, num) * 2 + 1) << 16)
    wrong = model.stmatrix(smem, addrs, swap_lanes(regs, *pair), trans)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(wrong, model.stmatrix(smem, addrs, regs, trans), "perturbed stmatrix")


@CPU
@given(halves=hnp.arrays(np.uint32, 2 * WARP, elements=st.integers(0, 0xFFFF), unique=True),
       pair=lane_pairs)
def test_teeth_movmatrix_lane_swap_is_caught(halves: np.ndarray, pair) -> None:
    regs = halves[:WARP] | (halves[WARP:] << 16)  # all 64 16-bit elements distinct
    wrong = swap_lanes(model.movmatrix_trans(regs), *pair)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(wrong, model.movmatrix_trans(regs), "perturbed movmatrix")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@CPU
@given(data=st.data(), pair=lane_pairs)
def test_teeth_mma_exact_lane_swap_is_caught(dtype: str, data, pair) -> None:
    # A, B in 0..3 keep |A @ B| <= 144; C = 1024 * (distinct index) then makes
    # every one of the 128 results distinct, whatever the layout.
    A = data.draw(hnp.arrays(np.int64, (16, 16), elements=st.integers(0, 3)))
    B = data.draw(hnp.arrays(np.int64, (16, 8), elements=st.integers(0, 3)))
    a = model.matrix_to_fragments("mma.a", A, dtype)
    b = model.matrix_to_fragments("mma.b", B, dtype)
    c = (1024 * np.arange(WARP * 4)).reshape(WARP, 4).astype(np.float32)
    d = model.mma_m16n8k16(a, b, c, dtype)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(without_negative_zero(swap_lanes(d, *pair)), without_negative_zero(d),
                          "perturbed mma")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@CPU
@given(seed=seeds, pair=lane_pairs)
def test_teeth_mma_random_lane_swap_is_caught(dtype: str, seed: int, pair) -> None:
    a, b, c = random_mma_case(seed, dtype)
    d = model.mma_m16n8k16(a, b, c, dtype)
    with pytest.raises(AssertionError, match="off by more than"):
        assert_mma_close(swap_lanes(d, *pair), d, mma_abs_sum(a, b, c, dtype), "perturbed mma")


@pytest.mark.parametrize("size,cache", CP_ASYNC_VARIANTS, ids=[f"{c}{s}" for s, c in CP_ASYNC_VARIANTS])
@CPU
@given(data=st.data(), pair=lane_pairs)
def test_teeth_cp_async_lane_swap_is_caught(size: int, cache: str, data, pair) -> None:
    n_slots = 64
    gmem = np.arange(n_slots * size // 2, dtype="<u2").view(np.uint8)  # every slot distinct
    smem = np.zeros(n_slots * size, dtype=np.uint8)
    dst = np.asarray(data.draw(st.permutations(range(n_slots)))[:WARP], dtype=np.int64) * size
    src = np.asarray(data.draw(st.permutations(range(n_slots)))[:WARP], dtype=np.int64) * size
    wrong = model.cp_async(smem, gmem, dst, swap_lanes(src, *pair), size, None, cache)
    with pytest.raises(AssertionError, match="differ"):
        assert_bits_equal(wrong, model.cp_async(smem, gmem, dst, src, size, None, cache),
                          "perturbed cp.async")


def test_exact_mma_strategy_really_is_exact() -> None:
    """The exact-data claim, checked on the model: float32 accumulation in any order
    (here: forward and reversed, product by product) equals the float64 result."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        A = rng.integers(-7, 8, (16, 16)) * np.exp2(rng.integers(-2, 3, (16, 16)))
        B = rng.integers(-7, 8, (16, 8)) * np.exp2(rng.integers(-2, 3, (16, 8)))
        C = rng.integers(-4096, 4097, (16, 8)) / 16.0
        terms = np.concatenate([(A[:, :, None] * B[None, :, :]), C[:, None, :]], axis=1)
        exact = terms.sum(axis=1)
        for order in (slice(None), slice(None, None, -1)):
            acc = np.zeros((16, 8), dtype=np.float32)
            for k in range(terms.shape[1])[order]:
                acc = acc + terms[:, k, :].astype(np.float32)
            assert np.array_equal(acc.astype(np.float64), exact)


# ----------------------------------------------------------------- no GPU

@pytest.mark.skipif(has_gpu(), reason="a GPU is usable here")
def test_device_says_why_without_a_gpu() -> None:
    regs = np.zeros(WARP, dtype=np.uint32)
    with pytest.raises(RuntimeError, match=gpu_reason()):
        device.movmatrix_trans(regs)


def test_nvrtc_builds_hopper_for_its_arch_specific_target():
    # CuPy asks NVRTC for sm_90 on an H100/H200; setmaxnreg (and wgmma) need sm_90a.
    from ptx_lab.gpu import arch_options

    assert arch_options("nvrtc", "90") == ("-arch=sm_90a",)
    assert arch_options("nvcc", "90") == ()      # CuPy's nvcc backend brings its own -gencode
    assert arch_options("nvrtc", "89") == ()     # no arch-specific target wanted there
