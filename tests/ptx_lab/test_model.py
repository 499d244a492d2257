"""ptx_lab.model: round trips and algebraic identities, with hypothesis inputs.

Where a test needs an expected value it reads the bytes by hand with the lane
formulas (g = lane // 4, t = lane % 4), not through ptx_lab.fragments.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import model
from ptx_lab.model import (acc_to_a_fragment, cp_async, fragments_to_matrix, ldmatrix,
                           matrix_to_fragments, mma_m16n8k16, movmatrix_trans, pack_bf16x2,
                           pack_f16x2, stmatrix, unpack_bf16x2, unpack_f16x2)

SLOTS = 40                  # 16-byte row slots in the test smem image
SMEM_BYTES = SLOTS * 16
settings.register_profile("ptx_lab", max_examples=60, deadline=None)
settings.load_profile("ptx_lab")

seeds = st.integers(0, 2**32 - 1)
nums = st.sampled_from([1, 2, 4])
row_slots = st.permutations(range(SLOTS))  # lane 8i + r reads slot perm[8i + r]


def rng_bytes(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def addrs_of(perm) -> np.ndarray:
    return np.asarray(perm[:32], dtype=np.int64) * 16


def u16_at(smem: np.ndarray, byte: int) -> int:
    return int(smem[byte]) | int(smem[byte + 1]) << 8


def halves(u: int) -> tuple[int, int]:
    return u & 0xFFFF, u >> 16


# ------------------------------------------------------------------ ldmatrix / stmatrix

@given(seed=seeds, perm=row_slots, num=nums, trans=st.booleans())
def test_ldmatrix_is_the_lane_formula(seed, perm, num, trans):
    smem, addrs = rng_bytes(seed, SMEM_BYTES), addrs_of(perm)
    regs = ldmatrix(smem, addrs, num, trans)
    assert regs.shape == (32, num) and regs.dtype == np.uint32
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(num):
            row = lambda r: int(addrs[8 * i + r])  # noqa: E731  row r of matrix i
            if trans:   # {M[2t][g], M[2t+1][g]}
                want = (u16_at(smem, row(2 * t) + 2 * g), u16_at(smem, row(2 * t + 1) + 2 * g))
            else:       # {M[g][2t], M[g][2t+1]}
                want = (u16_at(smem, row(g) + 4 * t), u16_at(smem, row(g) + 4 * t + 2))
            assert halves(int(regs[lane, i])) == want, (lane, i)


@given(seed=seeds, perm=row_slots, num=st.sampled_from([1, 2]), trans=st.booleans(),
       junk=st.lists(st.integers(-10**6, 10**6), min_size=32, max_size=32))
def test_ldmatrix_ignores_the_unused_lanes(seed, perm, num, trans, junk):
    smem, addrs = rng_bytes(seed, SMEM_BYTES), addrs_of(perm)
    other = addrs.copy()
    other[8 * num:] = junk[8 * num:]
    assert (ldmatrix(smem, addrs, num, trans) == ldmatrix(smem, other, num, trans)).all()


@given(seed=seeds, perm=row_slots, num=nums, trans=st.booleans())
def test_ldmatrix_then_stmatrix_is_the_identity_on_covered_rows(seed, perm, num, trans):
    smem, addrs = rng_bytes(seed, SMEM_BYTES), addrs_of(perm)
    background = rng_bytes(seed + 1, SMEM_BYTES)
    out = stmatrix(background, addrs, ldmatrix(smem, addrs, num, trans), trans)
    covered = np.zeros(SMEM_BYTES, dtype=bool)
    for a in addrs[:8 * num]:
        covered[a:a + 16] = True
    assert (out[covered] == smem[covered]).all()
    assert (out[~covered] == background[~covered]).all()


@given(seed=seeds, perm=row_slots, num=nums, trans=st.booleans())
def test_stmatrix_then_ldmatrix_is_the_identity_on_registers(seed, perm, num, trans):
    regs = np.random.default_rng(seed).integers(0, 2**32, (32, num), dtype=np.uint32)
    smem, addrs = rng_bytes(seed + 1, SMEM_BYTES), addrs_of(perm)
    before = smem.copy()
    stored = stmatrix(smem, addrs, regs, trans)
    assert (smem == before).all()  # input untouched
    assert (ldmatrix(stored, addrs, num, trans) == regs).all()


@given(seed=seeds, perm=row_slots, num=nums)
def test_ldmatrix_trans_equals_ldmatrix_of_the_transposes(seed, perm, num):
    smem, addrs = rng_bytes(seed, SMEM_BYTES), addrs_of(perm)
    transposed = smem.copy()
    for i in range(num):
        rows = [int(a) for a in addrs[8 * i:8 * i + 8]]
        M = np.stack([smem[a:a + 16].view("<u2") for a in rows])
        for r, a in enumerate(rows):
            transposed[a:a + 16] = M.T[r].astype("<u2").view(np.uint8)
    assert (ldmatrix(smem, addrs, num, True) == ldmatrix(transposed, addrs, num, False)).all()


# ------------------------------------------------------------------ movmatrix

@given(seed=seeds, perm=row_slots)
def test_movmatrix_of_an_ldmatrix_fragment_is_ldmatrix_trans(seed, perm):
    smem, addrs = rng_bytes(seed, SMEM_BYTES), addrs_of(perm)
    plain = ldmatrix(smem, addrs, 1, False)[:, 0]
    assert (movmatrix_trans(plain) == ldmatrix(smem, addrs, 1, True)[:, 0]).all()


@given(seed=seeds)
def test_movmatrix_twice_is_the_identity(seed):
    regs = np.random.default_rng(seed).integers(0, 2**32, 32, dtype=np.uint32)
    once = movmatrix_trans(regs)
    assert (movmatrix_trans(once) == regs).all()


def test_movmatrix_lane_formula():
    # in: lane l holds M[g][2t], M[g][2t+1] with M[r][c] = 16r + c
    regs = np.array([(16 * (l // 4) + 2 * (l % 4)) | (16 * (l // 4) + 2 * (l % 4) + 1) << 16
                     for l in range(32)], dtype=np.uint32)
    out = movmatrix_trans(regs)
    for lane in range(32):
        g, t = divmod(lane, 4)
        assert halves(int(out[lane])) == (16 * 2 * t + g, 16 * (2 * t + 1) + g)


# ------------------------------------------------------------------ mma

def matrices(seed: int, lo: float, hi: float, integer: bool):
    rng = np.random.default_rng(seed)
    draw = (lambda s: rng.integers(lo, hi + 1, s).astype(np.float32)) if integer else \
        (lambda s: rng.uniform(lo, hi, s).astype(np.float32))
    return draw((16, 16)), draw((16, 8)), draw((16, 8))


def rounded(M: np.ndarray, dtype: str) -> np.ndarray:
    return M.astype(ml_dtypes.bfloat16 if dtype == "bf16" else np.float16).astype(np.float64)


@given(seed=seeds, dtype=st.sampled_from(["bf16", "f16"]))
def test_mma_small_integers_exact(seed, dtype):
    A, B, C = matrices(seed, -16, 16, integer=True)
    d = mma_m16n8k16(matrix_to_fragments("mma.a", A, dtype), matrix_to_fragments("mma.b", B, dtype),
                     matrix_to_fragments("mma.c", C, "f32"), dtype)
    want = A.astype(np.int64) @ B.astype(np.int64) + C.astype(np.int64)
    assert (fragments_to_matrix("mma.c", d, "f32") == want).all()


@given(seed=seeds, dtype=st.sampled_from(["bf16", "f16"]))
def test_mma_random_data_matches_float64_of_rounded_inputs(seed, dtype):
    A, B, C = matrices(seed, -4.0, 4.0, integer=False)
    d = mma_m16n8k16(matrix_to_fragments("mma.a", A, dtype), matrix_to_fragments("mma.b", B, dtype),
                     matrix_to_fragments("mma.c", C, "f32"), dtype)
    ref = rounded(A, dtype) @ rounded(B, dtype) + C.astype(np.float64)
    bound = np.finfo(np.float32).eps * (np.abs(rounded(A, dtype)) @ np.abs(rounded(B, dtype)) + np.abs(C))
    assert (np.abs(fragments_to_matrix("mma.c", d, "f32") - ref) <= bound).all()


def test_mma_blog_experiment_per_lane():
    # A[i][k] = i, B[k][j] = j  =>  D[i][j] = 16 i j; lane l holds D[g][2t], D[g][2t+1], D[g+8][2t], ...
    a = np.array([[pack_bf16x2(l // 4 + 8 * (r & 1), l // 4 + 8 * (r & 1)) for r in range(4)]
                  for l in range(32)], dtype=np.uint32)
    b = np.array([[pack_bf16x2(l // 4, l // 4) for _ in range(2)] for l in range(32)], dtype=np.uint32)
    d = mma_m16n8k16(a, b, np.zeros((32, 4), np.float32), "bf16")
    for lane in range(32):
        g, t = divmod(lane, 4)
        assert d[lane].tolist() == [16 * g * 2 * t, 16 * g * (2 * t + 1),
                                    16 * (g + 8) * 2 * t, 16 * (g + 8) * (2 * t + 1)]
    assert d[14, 1] == 240  # D[3][5]


# ------------------------------------------------------------------ fragments <-> matrices

@pytest.mark.parametrize("operand,shape", [("mma.a", (16, 16)), ("mma.b", (16, 8)), ("m8n8", (8, 8)),
                                           ("m8n8.trans", (8, 8))])
@given(seed=seeds)
def test_matrix_fragment_round_trip_b16(operand, shape, seed):
    M = np.random.default_rng(seed).integers(0, 2**16, shape, dtype=np.uint16)
    assert (fragments_to_matrix(operand, matrix_to_fragments(operand, M, "b16"), "b16") == M).all()


@given(seed=seeds)
def test_matrix_fragment_round_trip_f32(seed):
    M = np.random.default_rng(seed).standard_normal((16, 8)).astype(np.float32)
    assert (fragments_to_matrix("mma.c", matrix_to_fragments("mma.c", M, "f32"), "f32") == M).all()


@given(seed=seeds, dtype=st.sampled_from(["bf16", "f16"]))
def test_acc_to_a_fragment_is_the_a_fragment_of_the_concatenation(seed, dtype):
    rng = np.random.default_rng(seed)
    CL, CR = rng.standard_normal((2, 16, 8)).astype(np.float32) * 100
    a = acc_to_a_fragment(matrix_to_fragments("mma.c", CL, "f32"),
                          matrix_to_fragments("mma.c", CR, "f32"), dtype)
    assert (a == matrix_to_fragments("mma.a", np.hstack([CL, CR]), dtype)).all()
    assert (fragments_to_matrix("mma.a", a, dtype) == rounded(np.hstack([CL, CR]), dtype)).all()


def test_pack_puts_lo_in_the_low_bits_and_rounds_to_nearest_even():
    assert int(pack_bf16x2(1.0, 0.0)) == 0x3F80
    assert int(pack_bf16x2(0.0, 1.0)) == 0x3F80 << 16
    assert int(pack_f16x2(1.0, -2.0)) == 0x3C00 | 0xC000 << 16
    assert unpack_bf16x2(pack_bf16x2(1 + 2**-8, 1 + 3 * 2**-8)) == (1.0, 1 + 2**-6)  # ties to even
    assert unpack_f16x2(pack_f16x2(1 + 2**-11, 1 + 3 * 2**-11)) == (1.0, 1 + 2**-9)
    lo, hi = unpack_bf16x2(np.array([0x3F80_4000], dtype=np.uint32))
    assert lo.tolist() == [2.0] and hi.tolist() == [1.0]


# ------------------------------------------------------------------ cp.async

@given(seed=seeds, size=st.sampled_from([4, 8, 16]), cg=st.booleans(), zfill=st.booleans(),
       dst_perm=st.permutations(range(64)), src_perm=st.permutations(range(64)))
def test_cp_async_copies_and_zero_fills(seed, size, cg, zfill, dst_perm, src_perm):
    cache = "cg" if cg and size == 16 else "ca"
    rng = np.random.default_rng(seed)
    smem, gmem = rng_bytes(seed, 64 * size), rng_bytes(seed + 1, 64 * size)
    dst = np.array(dst_perm[:32]) * size
    src = np.array(src_perm[:32]) * size
    nbytes = rng.integers(0, size + 1, 32) if zfill else None
    out = cp_async(smem, gmem, dst, src, size, nbytes, cache)
    want = smem.copy()
    for lane in range(32):
        n = size if nbytes is None else int(nbytes[lane])
        for j in range(size):
            want[dst[lane] + j] = gmem[src[lane] + j] if j < n else 0
    assert (out == want).all()


def test_cp_async_zero_fill_edges():
    smem = np.full(512, 0xEE, dtype=np.uint8)
    gmem = np.arange(1, 513, dtype=np.int64).astype(np.uint8)
    lanes = np.arange(32) * 16
    nbytes = np.array([0, 16, 1, 15] * 8)
    out = cp_async(smem, gmem, lanes, lanes, 16, nbytes, "cg")
    assert (out[0:16] == 0).all()                       # src_bytes 0: sixteen zeros
    assert (out[16:32] == gmem[16:32]).all()            # full copy
    assert out[32] == gmem[32] and (out[33:48] == 0).all()
    assert (out[48:63] == gmem[48:63]).all() and out[63] == 0


# ------------------------------------------------------------------ refused inputs

def test_bad_inputs_name_the_argument():
    smem = np.zeros(512, dtype=np.uint8)
    addrs = np.arange(32) * 16
    regs = np.zeros((32, 4), dtype=np.uint32)
    cases = [
        (lambda: ldmatrix(smem.astype(np.uint16), addrs, 4, False), "smem"),
        (lambda: ldmatrix(smem.reshape(32, 16), addrs, 4, False), "smem"),
        (lambda: ldmatrix(smem, addrs[:16], 4, False), "addrs"),
        (lambda: ldmatrix(smem, addrs + 8, 4, False), r"addrs\[0\].*aligned"),
        (lambda: ldmatrix(smem, addrs + 16, 4, False), r"addrs\[31\].*outside"),
        (lambda: ldmatrix(smem, addrs, 3, False), "num"),
        (lambda: stmatrix(smem, addrs, regs.astype(np.int32), False), "regs"),
        (lambda: stmatrix(smem, addrs, np.zeros((32, 3), np.uint32), False), "num"),
        (lambda: stmatrix(smem, np.zeros(32, np.int64), regs, False), "same row"),
        (lambda: movmatrix_trans(regs), "regs"),
        (lambda: mma_m16n8k16(regs, regs[:, :2], np.zeros((32, 4)), "bf16"), "c"),
        (lambda: mma_m16n8k16(regs, regs, np.zeros((32, 4), np.float32), "bf16"), "b"),
        (lambda: mma_m16n8k16(regs, regs[:, :2], np.zeros((32, 4), np.float32), "f32"), "dtype"),
        (lambda: fragments_to_matrix("mma.c", regs, "bf16"), "dtype"),
        (lambda: matrix_to_fragments("mma.a", np.zeros((16, 8)), "bf16"), "M"),
        (lambda: matrix_to_fragments("mma.x", np.zeros((16, 8)), "bf16"), "operand"),
        (lambda: cp_async(smem, smem, addrs, addrs, 2), "size"),
        (lambda: cp_async(smem, smem, addrs // 2, addrs // 2, 8, cache="cg"), "cg"),
        (lambda: cp_async(smem, smem, addrs, addrs, 16, cache="cs"), "cache"),
        (lambda: cp_async(smem, smem, addrs + 4, addrs, 16), r"dst\[0\]"),
        (lambda: cp_async(smem, smem, addrs, addrs + 8, 16), r"src\[0\]"),
        (lambda: cp_async(smem, smem, addrs, addrs, 16, np.full(32, 17)), "src_bytes"),
        (lambda: cp_async(smem, smem[:256], addrs, addrs, 16), r"src\[16\].*outside"),
        (lambda: cp_async(smem, smem, np.zeros(32, int), addrs, 16), "dst: two lanes"),
        (lambda: acc_to_a_fragment(regs, regs), "c_left"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_src_bytes_zero_reads_nothing():
    # The source range is checked only over the bytes actually read.
    smem = np.full(512, 7, dtype=np.uint8)
    out = cp_async(smem, np.zeros(16, np.uint8), np.arange(32) * 16, np.zeros(32, int), 16,
                   np.zeros(32, int))
    assert (out == 0).all()


def test_public_names():
    assert set(model.__all__) >= {"ldmatrix", "stmatrix", "movmatrix_trans", "mma_m16n8k16", "cp_async"}


# ------------------------------------------------------------------ flags are bools, counts are ints

def _bool_parameters(module) -> set[tuple[str, str]]:
    """(function, parameter) for every parameter annotated `bool` in the module's public API."""
    import inspect

    found = set()
    for name in module.__all__:
        fn = getattr(module, name)
        if inspect.isfunction(fn):
            for p in inspect.signature(fn).parameters.values():
                if p.annotation in (bool, "bool"):
                    found.add((name, p.name))
    return found


def _flag_calls():
    """(function, flag) -> call(flag value) with every other argument valid."""
    from ptx_lab import fragments

    smem = np.zeros(512, dtype=np.uint8)
    addrs = np.arange(32) * 16
    regs = np.zeros((32, 4), dtype=np.uint32)
    a = model.matrix_to_wgmma_a(np.ones((64, 16), np.float32))
    img = np.zeros(4096, dtype=np.uint8)
    desc = model.wgmma_desc(0, 128, 256)
    c = np.zeros((128, 8), dtype=np.float32)
    return {
        ("ldmatrix", "trans"): lambda v: ldmatrix(smem, addrs, 4, v),
        ("stmatrix", "trans"): lambda v: stmatrix(smem, addrs, regs, v),
        ("wgmma_m64nNk16_rs", "scale_d"): lambda v: model.wgmma_m64nNk16_rs(a, img, desc, c, 16, v),
        ("ldmatrix_map", "trans"): lambda v: fragments.ldmatrix_map(4, v),
    }


def test_every_bool_flag_of_the_api_is_tested_here():
    from ptx_lab import fragments

    assert _bool_parameters(model) | _bool_parameters(fragments) == set(_flag_calls())


@pytest.mark.parametrize("key", sorted(_flag_calls()))
@pytest.mark.parametrize("value", ["no", "yes", "False", 0, 1, 1.0, None, np.array([True]), np.int64(1)])
def test_a_flag_that_is_not_a_bool_is_refused_by_name(key, value):
    # "no" used to mean True: the flag was read for its truthiness
    with pytest.raises(TypeError, match=rf"{key[1]} must be a bool \(True or False\); got"):
        _flag_calls()[key](value)


@pytest.mark.parametrize("key", sorted(_flag_calls()))
def test_numpy_bools_are_bools(key):
    call = _flag_calls()[key]
    for flag in (False, True):
        assert np.array_equal(call(np.bool_(flag)), call(flag))


def test_counts_and_shapes_that_only_look_like_ints_are_refused():
    smem = np.zeros(512, dtype=np.uint8)
    addrs = np.arange(32) * 16
    d = np.zeros((128, 8), dtype=np.float32)
    a = np.zeros((128, 4), dtype=np.uint32)
    cases = [
        (lambda: ldmatrix(smem, addrs, True, False), r"num must be 1, 2 or 4.*got True"),    # was .x1
        (lambda: ldmatrix(smem, addrs, 2.0, False), r"num must be 1, 2 or 4.*got 2.0"),
        (lambda: cp_async(smem, smem, addrs, addrs, 16.0), "size must be an int; got 16.0"),
        (lambda: model.wgmma_desc(0, 128, 256, swizzle=True), "swizzle must be an int"),  # was 128B
        (lambda: model.wgmma_desc(0.0, 128, 256), "start must be an int"),
        (lambda: model.wgmma_desc_fields(1.5), "desc must be an int"),
        (lambda: model.wgmma_desc_fields(-1), "64-bit unsigned"),
        (lambda: model.wgmma_b_offsets(16.0, model.wgmma_desc(0, 128, 256)), r"n must be one of .*16.0"),
        # n = 20 used to return 64 x 20 with columns 16..19 left uninitialised
        (lambda: model.wgmma_d_to_matrix(np.zeros((128, 10), np.float32), 20), "n must be one of"),
        # float accumulators used to be cast by value to uint32 registers, and the reverse
        (lambda: model.wgmma_a_to_matrix(a.astype(np.float32)), "a: expected uint32"),
        (lambda: model.wgmma_d_to_matrix(d.view(np.uint32), 16), "d: expected float32"),
        (lambda: model.wgmma_b_image(np.zeros((16, 16)), 0, 4096.0), "size must be an int"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


# ------------------------------------------------------------------ dtype spellings (as ptx_lab.tensormap)

@pytest.mark.parametrize("name, alias", [("bfloat16", "bf16"), ("float16", "f16"), ("uint16", "b16"),
                                         ("uint16", "u16")])
@given(seed=seeds)
def test_numpy_names_and_ptx_aliases_are_the_same_dtype(name, alias, seed):
    M = np.random.default_rng(seed).standard_normal((16, 16)).astype(np.float32)
    if name == "uint16":
        M = M.view(np.uint32).astype(np.uint16)
    a = matrix_to_fragments("mma.a", M, name)
    assert (a == matrix_to_fragments("mma.a", M, alias)).all()
    assert np.array_equal(fragments_to_matrix("mma.a", a, name), fragments_to_matrix("mma.a", a, alias),
                          equal_nan=True)


def test_the_default_spelling_is_numpy_s_and_numpy_dtypes_are_accepted():
    A = np.arange(256, dtype=np.float32).reshape(16, 16)
    C = np.ones((16, 8), np.float32)
    a = matrix_to_fragments("mma.a", A, ml_dtypes.bfloat16)
    assert (a == matrix_to_fragments("mma.a", A, "bfloat16")).all()
    assert (acc_to_a_fragment(matrix_to_fragments("mma.c", C, np.float32),
                              matrix_to_fragments("mma.c", C, "float32")) == matrix_to_fragments(
        "mma.a", np.ones((16, 16)), "bfloat16")).all()
    assert model.DTYPES == ("bfloat16", "float16", "uint16", "float32")


def test_model_and_tensormap_spell_their_common_dtypes_alike():
    from ptx_lab import tensormap

    for name, alias in (("bfloat16", "bf16"), ("uint16", "b16"), ("float32", "f32")):
        assert tensormap.dtype_name(name) == tensormap.dtype_name(alias) == name
        assert model.fragments_to_matrix("m8n8" if name != "float32" else "mma.c",
                                         np.zeros((32, 1 if name != "float32" else 4),
                                                  np.uint32 if name != "float32" else np.float32),
                                         alias).dtype == (np.uint16 if name == "uint16" else np.float32)


_ZERO_REGS = (np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32), np.zeros((32, 4), np.float32))


@pytest.mark.parametrize("call, accepted", [
    (lambda d: mma_m16n8k16(*_ZERO_REGS, d), r"bfloat16, float16 \(aliases bf16, f16;"),
    (lambda d: fragments_to_matrix("mma.c", _ZERO_REGS[2], d), r"float32 \(aliases f32;"),
    (lambda d: matrix_to_fragments("mma.a", np.zeros((16, 16)), d),
     r"bfloat16, float16, uint16 \(aliases bf16, f16, b16, u16;"),
])
@pytest.mark.parametrize("dtype", ["bfloat", "BF16", "f2", "uint32", np.float64, None])
def test_a_dtype_outside_the_operand_s_is_refused_with_the_accepted_spellings(call, accepted, dtype):
    with pytest.raises(ValueError, match=rf"dtype must be one of {accepted}.*got"):
        call(dtype)


def test_f32_is_an_alias_only_where_float32_is_accepted():
    assert fragments_to_matrix("mma.c", _ZERO_REGS[2], "f32").dtype == np.float32
    with pytest.raises(ValueError, match=r"dtype must be one of bfloat16, float16 .*got 'f32'"):
        mma_m16n8k16(*_ZERO_REGS, "f32")
