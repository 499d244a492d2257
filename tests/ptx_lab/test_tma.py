"""ptx_lab.model's 2-D tensor copies (tma.cuh): box placement, zero fill, clipped stores.

The oracle indexes the tensor as a 2-D numpy array (rows padded to the row
stride) and cuts the box out of it with ordinary slicing: a second way of
saying which element lands where, written without the model's byte offsets.
Boxes are drawn anywhere, partly or wholly outside the tensor, negative
coordinates included.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import model
from ptx_lab.model import (MBarrier, cp_async_bulk_tensor_2d_g2s, cp_async_bulk_tensor_2d_s2g,
                           tensor_tile_2d)
from ptx_lab.tensormap import TensorMap2D

DRAWS = settings(max_examples=80, deadline=None)
NUMPY = {"uint16": np.uint16, "bfloat16": np.uint16, "uint32": np.uint32, "float32": np.uint32}


@st.composite
def maps(draw):
    """(TensorMap2D at a 16-byte aligned offset of an image, image bytes it needs)."""
    dtype = draw(st.sampled_from(["bfloat16", "uint16", "float32", "uint32"]))
    esize = 2 if dtype in ("bfloat16", "uint16") else 4
    per16 = 16 // esize                                     # elements per 16 bytes
    rows, cols = draw(st.integers(1, 24)), draw(st.integers(1, 40))
    stride = 16 * draw(st.integers(-(-cols * esize // 16), -(-cols * esize // 16) + 2))
    box = (draw(st.integers(1, 12)), per16 * draw(st.integers(1, 4)))
    address = 16 * draw(st.integers(0, 3))
    return TensorMap2D(address, dtype, (rows, cols), stride, box), address + rows * stride


def coords(tmap: TensorMap2D):
    rows, cols = tmap.shape
    box_rows, box_cols = tmap.box
    return st.tuples(st.integers(-box_cols - 2, cols + 2), st.integers(-box_rows - 2, rows + 2))


def tensor_image(tmap: TensorMap2D, nbytes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(random gmem image, the tensor as a (rows, cols) array read out of it)."""
    gmem = np.random.default_rng(seed).integers(0, 256, nbytes + 64, dtype=np.uint8)
    return gmem, view_2d(gmem, tmap)


def view_2d(gmem: np.ndarray, tmap: TensorMap2D) -> np.ndarray:
    rows, cols = tmap.shape
    body = gmem[tmap.address:tmap.address + rows * tmap.row_stride].view(NUMPY[tmap.dtype])
    return body.reshape(rows, tmap.row_stride // tmap.element_bytes)[:, :cols]


def oracle_box(tensor: np.ndarray, tmap: TensorMap2D, c0: int, c1: int) -> np.ndarray:
    rows, cols = tmap.shape
    box = np.zeros(tmap.box, dtype=tensor.dtype)
    r0, r1 = max(c1, 0), min(c1 + tmap.box[0], rows)
    k0, k1 = max(c0, 0), min(c0 + tmap.box[1], cols)
    if r0 < r1 and k0 < k1:
        box[r0 - c1:r1 - c1, k0 - c0:k1 - c0] = tensor[r0:r1, k0:k1]
    return box


# ------------------------------------------------------------------ load

@DRAWS
@given(drawn=maps(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_load_puts_every_element_where_the_oracle_says_and_zeros_outside(drawn, data, seed):
    tmap, nbytes = drawn
    c0, c1 = data.draw(coords(tmap))
    gmem, tensor = tensor_image(tmap, nbytes, seed)
    before = gmem.copy()
    smem = np.full(256 + tmap.box_bytes, 0xEE, dtype=np.uint8)
    bar = MBarrier(1)
    bar.arrive_expect_tx(tmap.box_bytes)
    out = cp_async_bulk_tensor_2d_g2s(smem, gmem, 128, tmap, c0, c1, bar)
    got = out[128:128 + tmap.box_bytes].view(NUMPY[tmap.dtype]).reshape(tmap.box)
    assert (got == oracle_box(tensor, tmap, c0, c1)).all()
    assert (out[:128] == 0xEE).all() and (out[128 + tmap.box_bytes:] == 0xEE).all()
    assert (gmem == before).all() and (smem == 0xEE).all()       # inputs untouched
    assert bar.phase == 1, "the box's bytes, zero-filled or not, complete the phase"


def test_box_placement_and_zero_fill_by_hand():
    # A 5 x 16 uint16 tensor whose element (r, c) is 100 r + c, rows 48 bytes apart.
    tmap = TensorMap2D(0, "uint16", (5, 16), 48, box=(3, 8))
    tensor = np.zeros((5, 24), np.uint16)
    tensor[:, :16] = 100 * np.arange(5)[:, None] + np.arange(16)
    gmem = tensor.reshape(-1).view(np.uint8)
    offsets = tensor_tile_2d(tmap, 12, 3)        # columns 12..19 of rows 3..5
    assert offsets.tolist() == [
        [3 * 48 + 2 * c for c in range(12, 16)] + [-1] * 4,
        [4 * 48 + 2 * c for c in range(12, 16)] + [-1] * 4,
        [-1] * 8]
    bar = MBarrier(1)
    smem = cp_async_bulk_tensor_2d_g2s(np.full(128, 0xFF, np.uint8), gmem, 0, tmap, 12, 3, bar)
    assert smem[:48].view(np.uint16).reshape(3, 8).tolist() == [
        [312, 313, 314, 315, 0, 0, 0, 0],
        [412, 413, 414, 415, 0, 0, 0, 0],
        [0] * 8]
    assert (smem[48:] == 0xFF).all()
    assert bar.tx_count == -48                   # the whole 3 x 8 x 2-byte box, landed unexpected
    left = cp_async_bulk_tensor_2d_g2s(np.zeros(128, np.uint8), gmem, 0, tmap, -2, -1, MBarrier(1))
    assert left[:48].view(np.uint16).reshape(3, 8).tolist() == [
        [0] * 8, [0, 0, 0, 1, 2, 3, 4, 5], [0, 0, 100, 101, 102, 103, 104, 105]]


def test_a_box_wholly_outside_the_tensor_is_zeros_and_still_completes():
    tmap = TensorMap2D(0, "float32", (4, 4), 16, box=(2, 4))
    gmem = np.full(64, 0x3F, np.uint8)
    bar = MBarrier(1)
    bar.arrive_expect_tx(32)
    smem = cp_async_bulk_tensor_2d_g2s(np.full(128, 0xFF, np.uint8), gmem, 0, tmap, 0, 4, bar)
    assert (smem[:32] == 0).all() and bar.phase == 1


def test_the_guard_rows_past_the_map_are_never_read():
    # The image holds 8 rows; the map admits 5. Rows 5..7 are poison and must not show.
    tmap = TensorMap2D(0, "uint16", (5, 8), 16, box=(4, 8))
    gmem = np.full(8 * 16, 0xAB, np.uint8)
    gmem[:5 * 16] = 1
    smem = cp_async_bulk_tensor_2d_g2s(np.zeros(128, np.uint8), gmem, 0, tmap, 0, 3, MBarrier(1))
    assert (smem[:32] == 1).all() and (smem[32:64] == 0).all()


# ------------------------------------------------------------------ store

@DRAWS
@given(drawn=maps(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_store_writes_the_inside_only_and_loads_back(drawn, data, seed):
    tmap, nbytes = drawn
    c0, c1 = data.draw(coords(tmap))
    gmem, _ = tensor_image(tmap, nbytes, seed)
    smem = np.random.default_rng(seed + 1).integers(0, 256, 128 + tmap.box_bytes, dtype=np.uint8)
    out = cp_async_bulk_tensor_2d_s2g(gmem, smem, 128, tmap, c0, c1)
    box = smem[128:].view(NUMPY[tmap.dtype]).reshape(tmap.box)
    offsets = tensor_tile_2d(tmap, c0, c1)
    written = np.zeros(gmem.size, dtype=bool)
    for k in range(tmap.element_bytes):
        written[offsets[offsets >= 0] + k] = True
    assert (out[~written] == gmem[~written]).all(), "a byte outside the box's inside changed"
    # Loading the same box back gives the stored inside and zeros outside.
    back = cp_async_bulk_tensor_2d_g2s(np.zeros(128 + tmap.box_bytes, np.uint8), out, 128, tmap,
                                       c0, c1, MBarrier(1))
    got = back[128:].view(NUMPY[tmap.dtype]).reshape(tmap.box)
    assert (got == np.where(offsets >= 0, box, 0)).all()


def test_a_store_past_the_end_of_a_row_does_not_wrap_into_the_next():
    tmap = TensorMap2D(0, "uint16", (3, 8), 16, box=(2, 8))
    gmem = np.zeros(3 * 16, np.uint8)
    smem = np.arange(1, 33, dtype=np.uint16).view(np.uint8).copy()
    out = cp_async_bulk_tensor_2d_s2g(gmem, np.concatenate([smem, np.zeros(96, np.uint8)]), 0, tmap, 4, 1)
    assert out.view(np.uint16).reshape(3, 8).tolist() == [
        [0] * 8,
        [0, 0, 0, 0, 1, 2, 3, 4],
        [0, 0, 0, 0, 9, 10, 11, 12]]


# ------------------------------------------------------------------ misuse

def test_misuse_is_refused_before_anything_moves():
    tmap = TensorMap2D(0, "bfloat16", (40, 512), 1024, box=(16, 128))
    gmem = np.zeros(40 * 1024, np.uint8)
    smem = np.zeros(8192, np.uint8)
    bar = MBarrier(1)
    cases = [
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 64, tmap, 0, 0, bar),
         "dst = 64: a tensor copy's shared-memory address must be 128-byte aligned"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 4096 + 128, tmap, 0, 0, bar),
         r"dst = 4224: the 16 x 128 box \[4224, 8320\) is outside smem of 8192 bytes"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, tmap, 2**31, 0, bar),
         "c0 = 2147483648: a tensor coordinate is a signed 32-bit integer"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, tmap, 0, -2**31 - 1, bar), "c1 = -2147483649"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, tmap, 0.0, 0, bar), "c0 must be an int"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, tmap, 0, 0, "bar"), "bar: expected an MBarrier"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, {"box": (16, 128)}, 0, 0, bar),
         "tmap: expected a ptx_lab.tensormap.TensorMap2D; got dict"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem, gmem[:30000], 0, tmap, 0, 24, bar),
         "reaches tensor bytes up to 40192, outside gmem of 30000 bytes"),
        (lambda: cp_async_bulk_tensor_2d_g2s(smem.astype(np.uint16), gmem, 0, tmap, 0, 0, bar), "smem"),
        (lambda: cp_async_bulk_tensor_2d_s2g(gmem, smem, 16, tmap, 0, 0),
         "src = 16: a tensor copy's shared-memory address must be 128-byte aligned"),
        (lambda: cp_async_bulk_tensor_2d_s2g(gmem, smem[:4000], 0, tmap, 0, 0), r"src = 0: .* outside smem"),
        (lambda: cp_async_bulk_tensor_2d_s2g(gmem, smem, 0, tmap, -2**31 - 1, 0), "c0 = -2147483649"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    assert (bar.phase, bar.pending, bar.tx_count) == (0, 1, 0)   # no refused copy reached it


def test_public_names():
    assert set(model.__all__) >= {"tensor_tile_2d", "cp_async_bulk_tensor_2d_g2s",
                                  "cp_async_bulk_tensor_2d_s2g"}
