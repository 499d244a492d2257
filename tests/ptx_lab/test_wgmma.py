"""wgmma.mma_async m64nNk16 (wgmma.cuh), B K-major or N-major: the model's algebra on the
CPU, and the model against the hardware (gpu).

Hand-checkable data as everywhere here: A[i][k] = i, B[k][j] = j, so D = 16 i j.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ptx_lab import device, model

CPU = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def layouts(n: int):
    """start, lbo, sbo (multiples of 16) whose 2 x n/8 core matrices (128 B each) do not
    overlap: either the two k halves sit next to each other (lbo >= 128, sbo >= lbo + 128)
    or the n blocks do (sbo >= 128, lbo >= n/8 * sbo), with 0-4 chunks of padding."""
    pad = st.integers(0, 4).map(lambda v: 16 * v)

    @st.composite
    def draw(draw_value):
        start = 16 * draw_value(st.integers(0, 64))
        inner = 16 * draw_value(st.integers(8, 12))   # 128 .. 192, multiples of 16
        if draw_value(st.booleans()):   # k halves inner
            lbo, sbo = inner, inner + 128 + draw_value(pad)
        else:                           # n blocks inner
            sbo, lbo = inner, (n // 8) * inner + draw_value(pad)
        return model.wgmma_desc(start, lbo, sbo)

    return draw()


def test_descriptor_fields_sit_where_the_isa_says():
    d = model.wgmma_desc(start=0x1230, lbo=256, sbo=1024, swizzle=1)
    assert d & 0x3FFF == 0x123 and (d >> 16) & 0x3FFF == 16 and (d >> 32) & 0x3FFF == 64 and d >> 62 == 1
    assert model.wgmma_desc_fields(d) == {"start": 0x1230, "lbo": 256, "sbo": 1024, "base_offset": 0, "swizzle": 1}
    for bad in (dict(start=8, lbo=0, sbo=0), dict(start=0, lbo=1 << 18, sbo=0), dict(start=0, lbo=0, sbo=-16)):
        with pytest.raises(ValueError, match="multiple of 16"):
            model.wgmma_desc(**bad)
    with pytest.raises(ValueError, match="swizzle"):
        model.wgmma_desc(0, 0, 0, swizzle=4)
    with pytest.raises(ValueError, match="unswizzled"):
        model.wgmma_b_offsets(16, model.wgmma_desc(0, 128, 256, swizzle=1))


def test_a_and_d_fragments_are_mma_sync_fragments_per_warp():
    A = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) % 97
    a = model.matrix_to_wgmma_a(A)
    assert np.array_equal(model.wgmma_a_to_matrix(a), A)
    assert np.array_equal(a[32:64], model.matrix_to_fragments("mma.a", A[16:32], "bf16"))   # warp 1
    D = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
    d = model.matrix_to_wgmma_d(D)
    assert d.shape == (128, 64) and np.array_equal(model.wgmma_d_to_matrix(d, 128), D)
    # thread 32 + 4 g + t (warp 1), float 4 j + e: row 16 + g + 8 (e >> 1), column 8 j + 2 t + (e & 1)
    g, t, j, e = 5, 3, 9, 3
    assert d[32 + 4 * g + t, 4 * j + e] == D[16 + g + 8, 8 * j + 2 * t + 1]


@pytest.mark.parametrize("n", model.WGMMA_N)
def test_hand_checkable_product_is_16_i_j(n):
    A = np.repeat(np.arange(64, dtype=np.float32)[:, None], 16, axis=1)
    B = np.repeat(np.arange(n, dtype=np.float32)[None, :], 16, axis=0)
    desc = model.wgmma_desc(start=64, lbo=128, sbo=256)
    d = model.wgmma_m64nNk16_rs(model.matrix_to_wgmma_a(A), model.wgmma_b_image(B, desc, 8192), desc,
                                np.zeros((128, n // 2), np.float32), n)
    assert np.array_equal(model.wgmma_d_to_matrix(d, n), 16 * np.outer(np.arange(64), np.arange(n)))


@pytest.mark.parametrize("major", model.WGMMA_B_MAJORS)
@pytest.mark.parametrize("n", model.WGMMA_N)
@CPU
@given(data=st.data())
def test_core_matrices_tile_b_exactly_once(n, major, data):
    desc = data.draw(layouts(n))
    off = model.wgmma_b_offsets(n, desc, major)
    assert np.unique(off).size == off.size and (off % 2 == 0).all()
    # each 8 x 8 block of B is one 128-byte core matrix; K-major: row n' at 16 n' bytes,
    # k at 2 k; N-major: row k at 16 k bytes, n' at 2 n'
    f = model.wgmma_desc_fields(desc)
    assert off[8, 8] - off[0, 0] == f["lbo"] + f["sbo"]      # the next k half and the next n block
    along_n, along_k = (16, 2) if major == "k" else (2, 16)
    assert (off[:, 1:8] - off[:, 0:7] == along_n).all() and (off[1:8, :] - off[0:7, :] == along_k).all()


def tile_offsets(rows: int, cols: int, row_block: int, col_block: int) -> np.ndarray:
    """Byte of X[r][c] in the kernel's operand tiles: (r % 8) 16 + (c % 8) 2 + (r / 8) R + (c / 8) Q."""
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    return (r % 8) * 16 + (c % 8) * 2 + (r // 8) * row_block + (c // 8) * col_block


@pytest.mark.parametrize("n", model.WGMMA_N)
def test_one_tile_is_x_transposed_k_major_and_x_n_major(n):
    # Kernel A's qd / kd / kr tiles X[c][k] (16 rows c, 128 k, core matrices 144 B apart
    # along k, 2304 along c) serve as B = X^T (K-major, G2) and as B = X (N-major, G4/G5).
    R, Q = 2304, 144
    X = tile_offsets(16, 128, R, Q)
    # B[k][c] = X[c][k] for k < 16 (one k-step of G2)
    assert np.array_equal(model.wgmma_b_offsets(16, model.wgmma_desc(0, lbo=Q, sbo=R), "k"), X[:16, :16].T)
    assert np.array_equal(model.wgmma_b_offsets(n, model.wgmma_desc(0, lbo=R, sbo=Q), "n"), X[:, :n])


def test_b_image_puts_bf16_bits_where_the_descriptor_says():
    B = np.arange(16 * 16, dtype=np.float32).reshape(16, 16) / 4    # bf16-exact
    desc = model.wgmma_desc(32, 128, 256)
    img = model.wgmma_b_image(B, desc, 1024, "n")
    off = model.wgmma_b_offsets(16, desc, "n")
    bits = (img[off].astype(np.uint16) | (img[off + 1].astype(np.uint16) << 8))
    assert np.array_equal(bits.view(ml_dtypes.bfloat16).astype(np.float32), B)
    assert np.count_nonzero(img) == np.count_nonzero(img[np.concatenate([off.ravel(), off.ravel() + 1])])
    with pytest.raises(ValueError, match="past the 256-byte image"):
        model.wgmma_b_image(B, desc, 256, "n")
    with pytest.raises(ValueError, match="B"):
        model.wgmma_b_image(B[:, :8], desc, 1024)


def test_a_wrong_layout_gives_a_wrong_product():
    # teeth: B written with lbo and sbo swapped reads back as another matrix
    n = 16
    A = np.repeat(np.arange(64, dtype=np.float32)[:, None], 16, axis=1)
    B = np.arange(16 * n, dtype=np.float32).reshape(16, n) % 13
    right = model.wgmma_desc(0, 128, 512)
    wrong = model.wgmma_desc(0, 512, 128)
    img = model.wgmma_b_image(B, wrong, 4096)
    d = model.wgmma_m64nNk16_rs(model.matrix_to_wgmma_a(A), img, right, np.zeros((128, 8), np.float32), n)
    assert not np.array_equal(model.wgmma_d_to_matrix(d, n), A @ B)


def test_scale_d_zero_ignores_c():
    n = 16
    A = np.ones((64, 16), np.float32)
    B = np.ones((16, n), np.float32)
    desc = model.wgmma_desc(0, 128, 256)
    c = np.full((128, 8), 7.0, np.float32)
    a, img = model.matrix_to_wgmma_a(A), model.wgmma_b_image(B, desc, 4096)
    assert (model.wgmma_m64nNk16_rs(a, img, desc, c, n, scale_d=False) == 16).all()
    assert (model.wgmma_m64nNk16_rs(a, img, desc, c, n) == 23).all()


# ------------------------------------------------------------------ the hardware

@pytest.mark.gpu
@pytest.mark.parametrize("major", model.WGMMA_B_MAJORS)
@pytest.mark.parametrize("n", model.WGMMA_N)
@DEVICE
@given(data=st.data())
def test_device_matches_model_exactly_on_small_integers(n, major, data):
    # |A @ B + C| < 2^24 with integers: every partial sum is exact in fp32, so the
    # tensor core and the float64 model must agree bit for bit
    desc = data.draw(layouts(n))
    A = data.draw(hnp.arrays(np.int64, (64, 16), elements=st.integers(-8, 8))).astype(np.float32)
    B = data.draw(hnp.arrays(np.int64, (16, n), elements=st.integers(-8, 8))).astype(np.float32)
    C = data.draw(hnp.arrays(np.int64, (64, n), elements=st.integers(-1000, 1000))).astype(np.float32)
    scale_d = data.draw(st.booleans())
    a, c = model.matrix_to_wgmma_a(A), model.matrix_to_wgmma_d(C)
    img = model.wgmma_b_image(B, desc, 16 * 1024, major)
    got = device.wgmma_m64nNk16_rs(a, img, desc, c, n, scale_d, major)
    want = model.wgmma_m64nNk16_rs(a, img, desc, c, n, scale_d, major)
    assert np.array_equal(model.wgmma_d_to_matrix(want, n), A @ B + (C if scale_d else 0))   # the model reads B back
    bad = np.argwhere(got != want)
    assert not bad.size, (f"wgmma m64n{n}k16 {major}-major B {model.wgmma_desc_fields(desc)}: "
                          f"{len(bad)} of {got.size} differ; "
                          + "; ".join(f"thread {t} float {r}: got {got[t, r]}, want {want[t, r]}" for t, r in bad[:6]))


@pytest.mark.gpu
@pytest.mark.parametrize("major", model.WGMMA_B_MAJORS)
def test_device_hand_checkable_product(major):
    for n in model.WGMMA_N:
        A = np.repeat(np.arange(64, dtype=np.float32)[:, None], 16, axis=1)
        B = np.repeat(np.arange(n, dtype=np.float32)[None, :], 16, axis=0)
        desc = model.wgmma_desc(start=64, lbo=128, sbo=256) if major == "k" else model.wgmma_desc(64, 128 * n // 8, 128)
        d = device.wgmma_m64nNk16_rs(model.matrix_to_wgmma_a(A), model.wgmma_b_image(B, desc, 8192, major), desc,
                                     np.zeros((128, n // 2), np.float32), n, major=major)
        D = model.wgmma_d_to_matrix(d, n)
        want = 16 * np.outer(np.arange(64), np.arange(n))
        bad = np.argwhere(D != want)
        assert not bad.size, f"m64n{n}k16 {major}-major B: D[i][j] != 16 i j at {bad[:6].tolist()}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", model.WGMMA_N)
def test_device_reads_one_tile_as_k_major_x_transposed_and_n_major_x(n):
    # Kernel A's layout claim on the hardware: one image of X[16][128] (tile_offsets, core
    # matrices 144 B apart along columns, 2304 along rows) gives A @ X^T[:, :16] with a K-major
    # descriptor and A @ X[:, :n] with an N-major one.
    R, Q = 2304, 144
    rng = np.random.default_rng(5)
    X = rng.integers(-8, 9, (16, 128)).astype(np.float32)
    off = tile_offsets(16, 128, R, Q)
    bits = model._to_bits(X, "bfloat16")
    img = np.zeros(2 * R, np.uint8)
    img[off] = bits & 0xFF
    img[off + 1] = bits >> 8
    A = rng.integers(-8, 9, (64, 16)).astype(np.float32)
    a, zero = model.matrix_to_wgmma_a(A), np.zeros((128, 8), np.float32)
    kt = device.wgmma_m64nNk16_rs(a, img, model.wgmma_desc(0, lbo=Q, sbo=R), zero, 16, major="k")
    assert np.array_equal(model.wgmma_d_to_matrix(kt, 16), A @ X[:, :16].T)
    nm = device.wgmma_m64nNk16_rs(a, img, model.wgmma_desc(0, lbo=R, sbo=Q), np.zeros((128, n // 2), np.float32),
                                  n, major="n")
    assert np.array_equal(model.wgmma_d_to_matrix(nm, n), A @ X[:, :n])
