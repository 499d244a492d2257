"""ptx_lab.model's swizzled tensor copies: where box element [i][j] sits in shared memory.

With TensorMap2D.swizzle = S (32, 64 or 128 bytes; a box row is exactly S
bytes), the 16-byte chunks of each box row are permuted within the row, by
the row's position in an 8-row group. The model takes the permutation from
ptx_lab.layouts (Swizzle<1|2|3, 4, 3> of the byte offset); these tests state it
three other ways: tables written out by hand, a one-line chunk formula, and
the properties the swizzle exists for (a permutation of the box, the dense
layout at S = 0, every chunk column of 8 rows in 8 bank groups, a load and a
store with the same map undoing each other).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import banks, layouts, model
from ptx_lab.model import (MBarrier, cp_async_bulk_tensor_2d_g2s, cp_async_bulk_tensor_2d_s2g,
                           tensor_box_smem_offsets, tensor_tile_2d)
from ptx_lab.tensormap import ELEMENT_BYTES, TensorMap2D

DRAWS = settings(max_examples=80, deadline=None)
NUMPY = {"uint16": np.uint16, "bfloat16": np.uint16, "uint32": np.uint32, "float32": np.uint32}
SWIZZLES = (32, 64, 128)
CHUNK = 16


@st.composite
def swizzled_maps(draw, swizzles=SWIZZLES):
    """(TensorMap2D with box rows of exactly `swizzle` bytes, image bytes the tensor needs)."""
    swizzle = draw(st.sampled_from(swizzles))
    dtype = draw(st.sampled_from(["bfloat16", "uint16", "float32", "uint32"]))
    esize = ELEMENT_BYTES[dtype]
    box_cols = swizzle // esize if swizzle else 16 * draw(st.integers(1, 8)) // esize
    rows, cols = draw(st.integers(1, 40)), draw(st.integers(1, 3 * box_cols))
    stride = 16 * draw(st.integers(-(-cols * esize // 16), -(-cols * esize // 16) + 2))
    box = (draw(st.integers(1, 24)), box_cols)
    address = 16 * draw(st.integers(0, 3))
    return (TensorMap2D(address, dtype, (rows, cols), stride, box, swizzle=swizzle),
            address + rows * stride)


def chunk_table(tmap: TensorMap2D, rows: int) -> list[list[int]]:
    """[i][c]: which 16-byte chunk of its row chunk c of box row i occupies in shared memory."""
    off = tensor_box_smem_offsets(tmap)
    per = CHUNK // tmap.element_bytes
    row_bytes = tmap.box_row_bytes
    return [[int(off[i, c * per] - i * row_bytes) // CHUNK for c in range(row_bytes // CHUNK)]
            for i in range(rows)]


def bf16_box(swizzle: int, rows: int = 16) -> TensorMap2D:
    return TensorMap2D(0, "bfloat16", (40, 512), 1024, (rows, swizzle // 2), swizzle=swizzle)


# ------------------------------------------------------------------ by hand

# Written out from the definition (chunk bits 4.. XOR line bits 7.. of the byte offset), one
# row per box row 0..8: row 8 starts the pattern again.
SW128_CHUNKS = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [1, 0, 3, 2, 5, 4, 7, 6],
    [2, 3, 0, 1, 6, 7, 4, 5],
    [3, 2, 1, 0, 7, 6, 5, 4],
    [4, 5, 6, 7, 0, 1, 2, 3],
    [5, 4, 7, 6, 1, 0, 3, 2],
    [6, 7, 4, 5, 2, 3, 0, 1],
    [7, 6, 5, 4, 3, 2, 1, 0],
    [0, 1, 2, 3, 4, 5, 6, 7],
]
SW64_CHUNKS = [          # two 64-byte rows share a 128-byte line, so rows change pattern in pairs
    [0, 1, 2, 3], [0, 1, 2, 3],
    [1, 0, 3, 2], [1, 0, 3, 2],
    [2, 3, 0, 1], [2, 3, 0, 1],
    [3, 2, 1, 0], [3, 2, 1, 0],
    [0, 1, 2, 3],
]
SW32_CHUNKS = [          # four 32-byte rows per line: rows 0..3 as they are, 4..7 chunks swapped
    [0, 1], [0, 1], [0, 1], [0, 1],
    [1, 0], [1, 0], [1, 0], [1, 0],
    [0, 1],
]


@pytest.mark.parametrize("swizzle, table", [(128, SW128_CHUNKS), (64, SW64_CHUNKS), (32, SW32_CHUNKS)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_chunk_tables_by_hand(swizzle, table, dtype):
    esize = ELEMENT_BYTES[dtype]
    tmap = TensorMap2D(0, dtype, (40, 1024 // esize), 1024, (16, swizzle // esize), swizzle=swizzle)
    assert chunk_table(tmap, 9) == table
    assert chunk_table(tmap, 16)[8:] == table[:8], "rows 8..15 repeat rows 0..7"


def test_byte_offsets_by_hand():
    # bf16 SW128 [3][10]: dense 3*128 + 20 = 404 is chunk 1 of row 3 -> chunk 1^3 = 2: 384 + 32 + 4.
    assert tensor_box_smem_offsets(bf16_box(128))[3, 10] == 420
    # bf16 SW64 [5][9]: dense 5*64 + 18 = 338, chunk 1 of row 5 -> 1^2 = 3: 320 + 48 + 2.
    assert tensor_box_smem_offsets(bf16_box(64))[5, 9] == 370
    # bf16 SW32 [6][3]: dense 6*32 + 6 = 198, chunk 0 of row 6 -> 0^1 = 1: 192 + 16 + 6.
    assert tensor_box_smem_offsets(bf16_box(32))[6, 3] == 214
    # float32 SW128 [9][5]: dense 9*128 + 20 = 1172, chunk 1 of row 9 -> 1^1 = 0: 1152 + 4.
    f32 = TensorMap2D(0, "float32", (40, 256), 1024, (16, 32), swizzle=128)
    assert tensor_box_smem_offsets(f32)[9, 5] == 1156
    # Row 0 is never moved, whatever the swizzle.
    for s in SWIZZLES:
        assert tensor_box_smem_offsets(bf16_box(s))[0].tolist() == list(range(0, s, 2))


def test_a_small_load_by_hand():
    # An 8 x 16 uint16 tensor, element (r, c) = 100 r + c, loaded whole as one SW32 box: rows
    # 0..3 land as they are, rows 4..7 with their two 16-byte chunks swapped.
    r, c = np.indices((8, 16))
    tensor = (100 * r + c).astype(np.uint16)
    tmap = TensorMap2D(0, "uint16", (8, 16), 32, (8, 16), swizzle=32)
    smem = cp_async_bulk_tensor_2d_g2s(np.zeros(256, np.uint8), tensor.view(np.uint8).reshape(-1), 0,
                                       tmap, 0, 0, MBarrier(1))
    got = smem.view(np.uint16).reshape(8, 16)
    assert got[3].tolist() == [300, 301, 302, 303, 304, 305, 306, 307,
                               308, 309, 310, 311, 312, 313, 314, 315]
    assert got[4].tolist() == [408, 409, 410, 411, 412, 413, 414, 415,
                               400, 401, 402, 403, 404, 405, 406, 407]
    assert got[7, :8].tolist() == list(range(708, 716)) and got[7, 8:].tolist() == list(range(700, 708))


# ------------------------------------------------------------------ properties

def chunk_formula(tmap: TensorMap2D) -> np.ndarray:
    """The brief's closed form, written without ptx_lab.layouts: chunk c of row i -> c ^ (line bits)."""
    i, j = np.indices(tmap.box, dtype=np.int64)
    s, e = tmap.box_row_bytes, tmap.element_bytes
    byte = j * e
    line_bits = (i * s // 128) % (s // CHUNK) if tmap.swizzle else 0
    return i * s + CHUNK * ((byte // CHUNK) ^ line_bits) + byte % CHUNK


@DRAWS
@given(drawn=swizzled_maps(swizzles=(0, *SWIZZLES)))
def test_every_box_byte_lands_exactly_once_inside_the_box(drawn):
    tmap, _ = drawn
    off = tensor_box_smem_offsets(tmap)
    assert off.shape == tmap.box and off.dtype == np.int64
    every_byte = (off[..., None] + np.arange(tmap.element_bytes)).reshape(-1)
    assert sorted(every_byte.tolist()) == list(range(tmap.box_bytes))
    # Each element stays inside its own box row; a chunk moves whole.
    assert (off // tmap.box_row_bytes == np.arange(tmap.box[0])[:, None]).all()
    assert (off % CHUNK == (np.arange(tmap.box[1]) * tmap.element_bytes % CHUNK)).all()
    assert (off == chunk_formula(tmap)).all()


@DRAWS
@given(drawn=swizzled_maps(swizzles=(0,)))
def test_swizzle_0_is_the_dense_layout(drawn):
    tmap, _ = drawn
    i, j = np.indices(tmap.box)
    assert (tensor_box_smem_offsets(tmap) == (i * tmap.box[1] + j) * tmap.element_bytes).all()


@pytest.mark.parametrize("swizzle, dense_degree", [(128, 8), (64, 4), (32, 2)])
def test_each_chunk_column_of_8_rows_is_in_8_bank_groups(swizzle, dense_degree):
    # One ldmatrix phase (or one quarter-warp of 16-byte loads) reads the same chunk of 8
    # consecutive rows: swizzled, that is one wavefront from any first row; dense rows of
    # `swizzle` bytes put those 8 chunks in 8 / (128 / swizzle) groups: 8-, 4-, 2-way.
    swz = bf16_box(swizzle, 24)
    dense = TensorMap2D(0, "bfloat16", (40, 512), 1024, swz.box)          # the same box, swizzle 0
    per = CHUNK // 2
    for first in range(16):
        rows = np.arange(first, first + 8)
        for c in range(swizzle // CHUNK):
            addrs = tensor_box_smem_offsets(swz)[rows, c * per]
            assert len(set((addrs // CHUNK % 8).tolist())) == 8, (first, c)
            assert banks.ldmatrix_access(addrs, 1).degree == 1
            plain = tensor_box_smem_offsets(dense)[rows, c * per]
            assert banks.ldmatrix_access(plain, 1).degree == dense_degree


@DRAWS
@given(drawn=swizzled_maps(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_load_places_the_oracle_box_by_the_chunk_formula(drawn, data, seed):
    tmap, nbytes = drawn
    rows, cols = tmap.shape
    c0 = data.draw(st.integers(-tmap.box[1] - 2, cols + 2))
    c1 = data.draw(st.integers(-tmap.box[0] - 2, rows + 2))
    gmem = np.random.default_rng(seed).integers(0, 256, nbytes + 64, dtype=np.uint8)
    rows_img = gmem[tmap.address:tmap.address + rows * tmap.row_stride].view(NUMPY[tmap.dtype])
    tensor = rows_img.reshape(rows, -1)[:, :cols]
    box = np.zeros(tmap.box, tensor.dtype)                    # the box cut out by slicing
    r0, r1 = max(c1, 0), min(c1 + tmap.box[0], rows)
    k0, k1 = max(c0, 0), min(c0 + tmap.box[1], cols)
    if r0 < r1 and k0 < k1:
        box[r0 - c1:r1 - c1, k0 - c0:k1 - c0] = tensor[r0:r1, k0:k1]
    base = tmap.smem_align
    bar = MBarrier(1)
    bar.arrive_expect_tx(tmap.box_bytes)
    smem = cp_async_bulk_tensor_2d_g2s(np.full(2 * base + tmap.box_bytes, 0xEE, np.uint8), gmem,
                                       base, tmap, c0, c1, bar)
    assert bar.phase == 1
    words = smem[base:base + tmap.box_bytes].view(NUMPY[tmap.dtype])
    placed = words[chunk_formula(tmap) // tmap.element_bytes]
    assert (placed == box).all()
    assert (smem[:base] == 0xEE).all() and (smem[base + tmap.box_bytes:] == 0xEE).all()


@DRAWS
@given(drawn=swizzled_maps(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_a_load_then_a_store_with_the_same_map_restore_the_tensor(drawn, data, seed):
    tmap, nbytes = drawn
    rows, cols = tmap.shape
    c0 = data.draw(st.integers(-tmap.box[1] - 2, cols + 2))
    c1 = data.draw(st.integers(-tmap.box[0] - 2, rows + 2))
    gmem = np.random.default_rng(seed).integers(0, 256, nbytes + 64, dtype=np.uint8)
    smem = cp_async_bulk_tensor_2d_g2s(np.zeros(1024 + tmap.box_bytes, np.uint8), gmem, 1024, tmap,
                                       c0, c1, MBarrier(1))
    blank = np.random.default_rng(seed + 1).integers(0, 256, gmem.size, dtype=np.uint8)
    out = cp_async_bulk_tensor_2d_s2g(blank, smem, 1024, tmap, c0, c1)
    offsets = tensor_tile_2d(tmap, c0, c1)
    written = np.zeros(gmem.size, dtype=bool)
    for k in range(tmap.element_bytes):
        written[offsets[offsets >= 0] + k] = True
    assert (out[written] == gmem[written]).all(), "the box's inside came back as it was"
    assert (out[~written] == blank[~written]).all(), "nothing outside the box's inside was written"


def test_a_store_reads_the_swizzled_places():
    # Shared memory written by hand in the SW64 layout (row 2: chunks 1, 0, 3, 2) stores as
    # plain rows.
    tmap = TensorMap2D(0, "uint16", (4, 32), 64, (4, 32), swizzle=64)
    smem = np.zeros((4, 4, 8), np.uint16)                      # [row][chunk slot][element]
    for i, slots in enumerate([[0, 1, 2, 3], [0, 1, 2, 3], [1, 0, 3, 2], [1, 0, 3, 2]]):
        for c, slot in enumerate(slots):
            smem[i, slot] = 100 * i + 8 * c + np.arange(8)     # chunk c of row i in its slot
    out = cp_async_bulk_tensor_2d_s2g(np.zeros(4 * 64, np.uint8), smem.reshape(-1).view(np.uint8),
                                      0, tmap, 0, 0)
    r, c = np.indices((4, 32))
    assert (out.view(np.uint16).reshape(4, 32) == 100 * r + c).all()


# ------------------------------------------------------------------ alignment

@pytest.mark.parametrize("swizzle, align", [(0, 128), (32, 256), (64, 512), (128, 1024)])
def test_the_box_start_must_be_aligned_to_smem_align(swizzle, align):
    box = (16, swizzle // 2) if swizzle else (16, 128)
    tmap = TensorMap2D(0, "bfloat16", (40, 512), 1024, box, swizzle=swizzle)
    assert tmap.smem_align == align
    gmem, smem = np.zeros(40 * 1024, np.uint8), np.zeros(4096 + 2048, np.uint8)
    cp_async_bulk_tensor_2d_g2s(smem, gmem, align, tmap, 0, 0, MBarrier(1))       # aligned: fine
    cp_async_bulk_tensor_2d_s2g(gmem, smem, 2 * align, tmap, 0, 0)
    why = (f" \\(swizzle = {swizzle}: the pattern repeats every 8 rows of {swizzle} bytes and "
           "follows the address bits\\)" if swizzle else "$")
    bad = align + 128 if swizzle else align + 64    # swizzled: 128-aligned is not enough
    bar = MBarrier(1)
    with pytest.raises(ValueError, match=f"dst = {bad}: a tensor copy's shared-memory "
                                         f"address must be {align}-byte aligned{why}"):
        cp_async_bulk_tensor_2d_g2s(smem, gmem, bad, tmap, 0, 0, bar)
    assert (bar.phase, bar.tx_count) == (0, 0)
    with pytest.raises(ValueError, match=f"src = {align // 2}: .* must be {align}-byte aligned"):
        cp_async_bulk_tensor_2d_s2g(gmem, smem, align // 2, tmap, 0, 0)


def test_refuses_what_is_not_a_map():
    with pytest.raises(ValueError, match="tmap: expected a ptx_lab.tensormap.TensorMap2D; got tuple"):
        tensor_box_smem_offsets((16, 64))


def test_one_source_of_truth():
    # The model's swizzles ARE ptx_lab.layouts' GMMA swizzles, and their atoms are 8 rows.
    assert model.TENSOR_SWIZZLES == {32: layouts.GMMA_SWIZZLES["SW32"], 64: layouts.GMMA_SWIZZLES["SW64"],
                                     128: layouts.GMMA_SWIZZLES["SW128"]}
    for s, swz in model.TENSOR_SWIZZLES.items():
        assert swz.atom_size == 8 * s == bf16_box(s).smem_align
    assert {"tensor_box_smem_offsets", "TENSOR_SWIZZLES"} <= set(model.__all__)
