"""
cp.async.bulk.tensor: a whole 16 x 128 tile of q in one instruction, tensor map from the host
=============================================================================================

What and why
------------
Kernel A loads, per 16-token tile, one head's rows of q, k, gc and do: 16 rows
of 128 bf16 (256 bytes), the rows ``H * 256`` bytes apart because the heads of
a token sit side by side. With ``cp.async`` that is 16 lane-copies per row;
with one ``cp.async.bulk`` per row (experiment ``bulk_copy``) it is 16 copies
that one lane issues one after another, which docs/log/13-bulk-copies.md
measured at about 60 cycles each. ``cp.async.bulk.tensor`` (tma.cuh) moves the
whole 16 x 128 box with ONE instruction of ONE thread: a tensor map, encoded
on the host by the driver (ptx_lab.tensormap), tells the TMA unit where the
tensor is, its row stride and extent, and the box; the instruction names only
the box's first element, {column, row}.

Two things the tensor form does that the 1-D one cannot:

* rows or columns of the box past the tensor's end land as ZEROS on a load (no
  separate masking of the last tile of a sequence), and the copy still
  completes the whole box's bytes on its mbarrier;
* on a store they are simply not written (the tile past a sequence's end is
  dropped instead of overwriting the next sequence).

And one thing Kernel A wants from it: the box can land SWIZZLED. With the map's
swizzle S = 32, 64 or 128 bytes (a box row of exactly S bytes), the 16-byte
chunks of each box row are permuted within the row, so that the same chunk of
8 consecutive rows lies in 8 different bank groups and an ``ldmatrix`` of it
is conflict-free; a store with the same map reads them back from the same
places. ``ptx_lab.model.tensor_box_smem_offsets`` says where: box element
[i][j] at byte ``swz(i * S + j * 2)`` of the box, ``swz`` being ptx_lab.layouts'
SW32/SW64/SW128 (``Swizzle<1|2|3, 4, 3>``): chunk c of row i goes to chunk
``c ^ (i % 8)`` (S = 128), ``c ^ ((i // 2) % 4)`` (64), ``c ^ ((i // 4) % 2)``
(32). The pattern repeats every 8 rows (8 * S bytes) and is reported to follow
the shared ADDRESS bits, so the kernel's buffer is 1024-byte aligned (a
multiple of every 8 * S), and the kernel reports that it is.

Idea
----
q: [T][H * D] bf16, T = 40 tokens, H = 4 heads, D = 128, row-major, so element
(token t, head h, d) is column c = h * D + d of row t, and its 16 bits are
``t * 512 + c`` (= ``t << 9 | h << 7 | d``): read in hex, every element says
where it came from (0x4102 = token 32, head 2, d 2). As a bf16 each pattern is
an ordinary finite number (exponent field ``4 t + h``, at most 191), so the
map's element type is honest; a tensor copy moves bits and converts nothing.
Both global buffers have GUARD_ROWS more rows than the maps admit (in src they
hold the same closed form, in dst the sentinel), so a load that read past the
tensor's end, or a store that wrote past it, shows up.

Kernel (``ptx_lab/cuda/tma_probes.cu``, one CTA of one warp, lane 0 issues every copy)
---------------------------------------------------------------------------------------
::

    tensormap_echo(src_map), tensormap_echo(dst_map)  # the 128 bytes arrive, 64-B aligned
    tile[16][128] <- 0xffff; fence.proxy.async; mbarrier.init(bar, 1)
    lane 0: prefetch.tensormap; arrive.expect_tx(bar, 4096)     # the WHOLE box
            tensor load src box at {c0 = 2 D, c1 = 32}: head 2, tokens 32..47 -> tile
    every lane: wait(0) (bounded), try_wait(1); tile -> smem_out
    tile row 3 <- 0xc000 | col by ordinary stores; fence.proxy.async; __syncwarp
    lane 0: tensor store tile -> dst at {0, 5}:            head 0, tokens 5..20, all inside
            tensor store tile -> dst at {3 D + D/2, 30}:   tokens 30..45 x cols 448..575:
                                                          only rows < 40, cols < 512 written
            commit; wait_group 0

    for S in 32, 64, 128: tma_tile_2d_swizzled(src_map_S, dst_map_S)  # box 16 x S/2 bf16, swizzle S
        buf[2048 B], 1024-aligned <- 0xffff; fence.proxy.async; mbarrier.init(bar, 1)
        lane 0: arrive.expect_tx(bar, 16 S); tensor load src box at {c0 = D + S/2, c1 = 8} -> buf
        every lane: wait(0) (bounded), try_wait(1); buf (raw, all 2048 bytes) -> smem_out;
        buf's shared address mod 1024 -> buf_mod
        lane 0: tensor store buf -> dst at the same {c0, c1}; commit; wait_group 0

The model backend runs the same steps through ``ptx_lab.model``
(``cp_async_bulk_tensor_2d_g2s``/``_s2g`` on an ``MBarrier``), with the maps'
addresses as offsets into byte images; the driver's 128 bytes exist only on
the GPU, so only the GPU run checks the echo.

Check
-----
smem_out row i col j = ``(32 + i) * 512 + 2 D + j`` for tokens 32 + i < 40,
0 for the eight rows past the end; every lane's wait returned (1) and phase 1
is open (0); dst: the box (with row 3 rewritten) at rows 5..20 cols 0..127 and
its top-left 10 x 64 corner at rows 30..39 cols 448..511; every other element,
the guard rows included, still 0xffff. On the GPU also: both maps' 16 words
as encoded, at a 64-byte aligned parameter address.

Swizzled, for each S: the word at byte ``tensor_box_smem_offsets(map)[i][j]``
of the raw buffer is element (8 + i, D + S/2 + j) of q for every box element
(a wrong one is reported with its box row and column, the shared byte it was
read from, and which box element the value found there is), the buffer past
the box's 16 S bytes still 0xffff, the buffer's address 0 mod 1024, every
lane's wait returned; dst holds the box at the same place as src and the
sentinel everywhere else (a store that read the chunks from anywhere but
where the load put them leaves them permuted).
"""
from __future__ import annotations

import re

import numpy as np

from ptx_lab import CUDA_INCLUDE_DIR, model
from ptx_lab.tensormap import ELEMENT_BYTES, TENSOR_MAP_ALIGN, TensorMap2D

from . import _common
from ._common import WARP, Checker

NAME = "tma_tile"
SUMMARY = "cp.async.bulk.tensor.2d box of q (16 x 128 bf16): zero fill, clipped stores; 32/64/128 B swizzle"

TMA_PROBES_CU = CUDA_INCLUDE_DIR / "tma_probes.cu"

# q as Kernel A sees it: token rows, the heads side by side.
T, H, D = 40, 4, 128
COLS = H * D                    # 512 bf16 per token row
ROW_BYTES = 2 * COLS            # 1024: the row stride both maps are given
GUARD_ROWS = 8                  # rows past T in both buffers, outside both maps
BUFFER_ROWS = T + GUARD_ROWS
BOX = (BOX_ROWS, BOX_COLS) = (16, 128)
BOX_BYTES = 2 * BOX_ROWS * BOX_COLS

SENTINEL = 0xFFFF               # the tile before the load, dst before the stores (a bf16 NaN)
STORE_MARK = 0xC000             # rewritten tile row, col c: STORE_MARK | c (sign bit: no q element)
REWRITTEN_ROW = 3               # a row of the box that lies inside the tensor (token 35)

# {c0, c1} = {column, row} of each box's first element, as the instruction takes them.
LOAD = (2 * D, 32)              # head 2, tokens 32..47: rows 40..47 are past T
STORE_A = (0, 5)                # head 0, tokens 5..20: the whole box inside dst
STORE_B = (3 * D + D // 2, 30)  # tokens 30..45, cols 448..575: clipped at row 40 and column 512
COORDS = np.array([*LOAD, *STORE_A, *STORE_B], dtype=np.int32)
COORD_NAMES = ("LOAD_C0", "LOAD_C1", "STORE_A_C0", "STORE_A_C1", "STORE_B_C0", "STORE_B_C1")

# The swizzled boxes: 16 tokens of one head, rows of S bytes (S / 2 bf16), the head's second
# S-byte box (Kernel A loads a 256-byte head row as 256 / S boxes), at token 8.
SWIZZLES = (32, 64, 128)
SWZ_BOX_ROWS = 16
SWZ_BUF_BYTES = SWZ_BOX_ROWS * 128      # the kernel's buffer: room for the widest box
SWZ_ALIGN = 1024                        # the buffer's alignment: 8 rows of 128 bytes
SWZ_TOKEN = 8

FLAGS = (("wait(0) for the load's phase returned", 1),
         ("try_wait(1) after the load: phase 1 is current", 0))
FLAG_NAMES = ("FLAG_LOADED", "FLAG_P1_AFTER_LOAD")
EXPECTED_FLAGS = np.array([want for _, want in FLAGS], dtype=np.uint32)

SOURCE = TMA_PROBES_CU.read_text()
# The kernel and this file must agree on the box, the marks and the order of coords and flags.
for _line in (f"BOX_ROWS = {BOX_ROWS};", f"BOX_COLS = {BOX_COLS};", "SENTINEL = 0xffffu;",
              "STORE_MARK = 0xc000u;", f"SWZ_BOX_ROWS = {SWZ_BOX_ROWS};",
              "SWZ_BUF_BYTES = SWZ_BOX_ROWS * 128;", f"SWZ_ALIGN = {SWZ_ALIGN};"):
    assert _line in SOURCE, f"{TMA_PROBES_CU.name} no longer says {_line!r}"
assert re.findall(r"^\s*(FLAG_\w+),", SOURCE, re.M) == list(FLAG_NAMES), \
    f"the Flag enum of {TMA_PROBES_CU.name} differs from FLAG_NAMES"
assert re.findall(r"\b((?:LOAD|STORE_[AB])_C[01])\b,", SOURCE) == list(COORD_NAMES), \
    f"the Coord enum of {TMA_PROBES_CU.name} differs from COORD_NAMES"


def src_tensor() -> np.ndarray:
    """uint16 (BUFFER_ROWS, COLS): element (t, c) = t * 512 + c, the guard rows included."""
    t, c = np.indices((BUFFER_ROWS, COLS))
    return (t * COLS + c).astype(np.uint16)


def tensor_map(address: int, l2_promotion: int = 0, dtype: str = "bfloat16") -> TensorMap2D:
    """The map of a [T][H * D] bf16 tensor at `address` (the guard rows are outside it).

    Another `dtype` describes the same bytes in its own elements (uint32: [T][256], box
    16 x 64): the GPU tests run the same kernel through each element type.
    """
    per = ELEMENT_BYTES[dtype] // 2       # bf16 elements per element of `dtype`
    return TensorMap2D(address, dtype, (T, COLS // per), ROW_BYTES, (BOX_ROWS, BOX_COLS // per),
                       l2_promotion=l2_promotion)


def swizzled_map(address: int, swizzle: int, dtype: str = "bfloat16") -> TensorMap2D:
    """The same [T][H * D] tensor, box SWZ_BOX_ROWS x `swizzle` bytes, swizzled by `swizzle`."""
    per = ELEMENT_BYTES[dtype] // 2
    return TensorMap2D(address, dtype, (T, COLS // per), ROW_BYTES,
                       (SWZ_BOX_ROWS, swizzle // ELEMENT_BYTES[dtype]), swizzle=swizzle)


def swizzled_box(swizzle: int) -> tuple[int, int]:
    """{c0, c1} (bf16 columns) of the swizzled box: head 1, d = S/2 .., tokens 8..23."""
    return D + swizzle // 2, SWZ_TOKEN


def coords(dtype: str = "bfloat16") -> np.ndarray:
    """int32 (6,): COORDS with every column counted in elements of `dtype`."""
    per = ELEMENT_BYTES[dtype] // 2
    out = COORDS.copy()
    out[0::2] //= per
    return out


# ------------------------------------------------------------------ observe

def _image(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words, dtype="<u2").reshape(-1).view(np.uint8)


def _halves(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return image.view("<u2").astype(np.uint16).reshape(shape)


def _observe_model(dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    """The kernel's steps, in its order, on ptx_lab.model (maps of element type `dtype`)."""
    gmem = _image(src_tensor())
    src_map, dst_map = tensor_map(0, l2_promotion=128, dtype=dtype), tensor_map(0, dtype=dtype)
    load, store_a, store_b = coords(dtype).reshape(3, 2).tolist()
    smem = np.full(BOX_BYTES, 0xFF, dtype=np.uint8)
    bar = model.MBarrier(1)
    bar.arrive_expect_tx(src_map.box_bytes)
    smem = model.cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, src_map, *load, bar)
    flags = np.array([bar.try_wait_parity(0), bar.try_wait_parity(1)], dtype=np.uint32)
    smem_out = _halves(smem, BOX)

    tile = smem_out.copy()
    tile[REWRITTEN_ROW] = STORE_MARK | np.arange(BOX_COLS)
    smem = _image(tile)
    out = np.full(BUFFER_ROWS * ROW_BYTES, 0xFF, dtype=np.uint8)
    out = model.cp_async_bulk_tensor_2d_s2g(out, smem, 0, dst_map, *store_a)
    out = model.cp_async_bulk_tensor_2d_s2g(out, smem, 0, dst_map, *store_b)
    obs = {"smem": smem_out, "flags": np.tile(flags, (WARP, 1)), "dst": _halves(out, (BUFFER_ROWS, COLS))}
    for swizzle in SWIZZLES:
        obs.update(_observe_swizzled_model(swizzle, dtype))
    return obs


def _observe_swizzled_model(swizzle: int, dtype: str) -> dict[str, np.ndarray]:
    """tma_tile_2d_swizzled's steps on ptx_lab.model: the buffer at offset 0 of its image."""
    gmem = _image(src_tensor())
    tmap = swizzled_map(0, swizzle, dtype)
    c0, c1 = swizzled_box(swizzle)
    c0 //= ELEMENT_BYTES[dtype] // 2
    smem = np.full(SWZ_BUF_BYTES, 0xFF, dtype=np.uint8)
    bar = model.MBarrier(1)
    bar.arrive_expect_tx(tmap.box_bytes)
    smem = model.cp_async_bulk_tensor_2d_g2s(smem, gmem, 0, tmap, c0, c1, bar)
    flags = np.array([bar.try_wait_parity(0), bar.try_wait_parity(1)], dtype=np.uint32)
    out = np.full(BUFFER_ROWS * ROW_BYTES, 0xFF, dtype=np.uint8)
    out = model.cp_async_bulk_tensor_2d_s2g(out, smem, 0, tmap, c0, c1)
    return {f"sw{swizzle}_smem": _halves(smem, (SWZ_BUF_BYTES // 2,)),
            f"sw{swizzle}_flags": np.tile(flags, (WARP, 1)),
            f"sw{swizzle}_dst": _halves(out, (BUFFER_ROWS, COLS)),
            f"sw{swizzle}_buf_mod": np.zeros(1, dtype=np.uint32)}


def _observe_gpu(dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    """The kernels on the GPU; `dtype` other than bf16: the same bytes through another map type."""
    import cupy

    from ptx_lab import tensormap
    from ptx_lab.gpu import load_module

    module = load_module(SOURCE)
    src = cupy.asarray(src_tensor())
    dst = cupy.full((BUFFER_ROWS, COLS), SENTINEL, dtype=cupy.uint16)
    # A numpy array of size one goes to the kernel by value: the 128 bytes, as encoded.
    maps = [tensormap.encode(tensor_map(src.data.ptr, l2_promotion=128, dtype=dtype)),
            tensormap.encode(tensor_map(dst.data.ptr, dtype=dtype))]

    echo = module.get_function("tensormap_echo")
    received, addresses = [], []
    for tmap in maps:
        words = cupy.zeros(16, dtype=cupy.uint64)
        address = cupy.zeros(1, dtype=cupy.uint64)
        echo((1,), (WARP,), (tmap, words, address))
        received.append(cupy.asnumpy(words))
        addresses.append(int(cupy.asnumpy(address)[0]))

    smem = cupy.zeros(BOX, dtype=cupy.uint16)
    flags = cupy.zeros((WARP, len(FLAGS)), dtype=cupy.uint32)
    module.get_function("tma_tile_2d")(
        (1,), (WARP,), (maps[0], maps[1], cupy.asarray(coords(dtype)), np.uint32(REWRITTEN_ROW), smem,
                        flags))
    cupy.cuda.runtime.deviceSynchronize()
    obs = {"smem": cupy.asnumpy(smem), "flags": cupy.asnumpy(flags), "dst": cupy.asnumpy(dst),
           "map_sent": np.stack([m["opaque"][0] for m in maps]).astype(np.uint64),
           "map_received": np.stack(received).astype(np.uint64),
           "map_address_mod_64": np.array(addresses, dtype=np.uint64) % TENSOR_MAP_ALIGN}

    swizzled = module.get_function("tma_tile_2d_swizzled")
    for swizzle in SWIZZLES:
        dst = cupy.full((BUFFER_ROWS, COLS), SENTINEL, dtype=cupy.uint16)
        src_map = tensormap.encode(swizzled_map(src.data.ptr, swizzle, dtype))
        dst_map = tensormap.encode(swizzled_map(dst.data.ptr, swizzle, dtype))
        c0, c1 = swizzled_box(swizzle)
        smem = cupy.zeros(SWZ_BUF_BYTES // 2, dtype=cupy.uint16)
        flags = cupy.zeros((WARP, len(FLAGS)), dtype=cupy.uint32)
        buf_mod = cupy.full(1, 0xFFFFFFFF, dtype=cupy.uint32)
        swizzled((1,), (WARP,), (src_map, dst_map, np.int32(c0 // (ELEMENT_BYTES[dtype] // 2)),
                                 np.int32(c1), np.uint32(SWZ_BOX_ROWS * swizzle), smem, flags, buf_mod))
        cupy.cuda.runtime.deviceSynchronize()
        obs.update({f"sw{swizzle}_smem": cupy.asnumpy(smem), f"sw{swizzle}_flags": cupy.asnumpy(flags),
                    f"sw{swizzle}_dst": cupy.asnumpy(dst), f"sw{swizzle}_buf_mod": cupy.asnumpy(buf_mod)})
    return obs


def observe(backend: str) -> dict[str, np.ndarray]:
    """smem: uint16 (16, 128); flags: uint32 (32, 2); dst: uint16 (48, 512); for each swizzle S,
    sw{S}_smem: uint16 (1024,) (the raw buffer), sw{S}_flags: uint32 (32, 2), sw{S}_dst: uint16
    (48, 512), sw{S}_buf_mod: uint32 (1,); on the GPU also map_sent, map_received: uint64
    (2, 16) and map_address_mod_64: uint64 (2,)."""
    _common.check_backend(backend)
    return _observe_gpu() if backend == "gpu" else _observe_model()


# ------------------------------------------------------------------ check

def expected_box() -> np.ndarray:
    """uint16 (16, 128): the load's box; tokens past T are zeros."""
    i, j = np.indices(BOX)
    t, c = LOAD[1] + i, LOAD[0] + j
    return np.where(t < T, t * COLS + c, 0).astype(np.uint16)


def stored_box() -> np.ndarray:
    """uint16 (16, 128): the tile the stores read (the box, row REWRITTEN_ROW rewritten)."""
    box = expected_box()
    box[REWRITTEN_ROW] = STORE_MARK | np.arange(BOX_COLS)
    return box


def expected_dst() -> tuple[np.ndarray, np.ndarray]:
    """(uint16 (48, 512) dst after both stores, int8 (48, 512): which store wrote each, -1 none)."""
    dst = np.full((BUFFER_ROWS, COLS), SENTINEL, dtype=np.uint16)
    who = np.full((BUFFER_ROWS, COLS), -1, dtype=np.int8)
    box = stored_box()
    for k, (c0, c1) in enumerate((STORE_A, STORE_B)):
        for i in range(BOX_ROWS):
            for j in range(BOX_COLS):
                if c1 + i < T and c0 + j < COLS:      # clipped at the MAP's extent, not the buffer's
                    dst[c1 + i, c0 + j] = box[i, j]
                    who[c1 + i, c0 + j] = k
    return dst, who


def element(v) -> str:
    """A 16-bit pattern, and what it says about where it came from."""
    v = int(v)
    if v == SENTINEL:
        return "0xffff (sentinel: written by nothing)"
    if v == 0:
        return "0x0000 (zero)"
    if v & 0x8000:
        return f"0x{v:04x} (rewritten row, col {v & 0x7F})" if (v & ~0x7F) == STORE_MARK else f"0x{v:04x}"
    return f"0x{v:04x} (token {v // COLS}, head {v % COLS // D}, d {v % D})"


def _where_box(i: int, j: int) -> str:
    t, c = LOAD[1] + i, LOAD[0] + j
    place = f"box row {i} col {j} (token {t}, head {c // D}, d {c % D})"
    return f"{place}, past the tensor's {T} rows: zero fill" if t >= T else place


def _where_dst(who: np.ndarray):
    def where(r: int, c: int) -> str:
        place = f"dst row {r} col {c} (token {r}, head {c // D}, d {c % D})"
        k = int(who[r, c])
        if k >= 0:
            c0, c1 = (STORE_A, STORE_B)[k]
            return f"{place}, store {'AB'[k]} of box row {r - c1} col {c - c0}"
        if r >= T:
            return f"{place}, past the map's {T} rows: written by nothing"
        return f"{place}, outside both stores: written by nothing"
    return where


def swizzled_offsets(swizzle: int) -> np.ndarray:
    """int64 (16, S / 2): the shared byte of each box element, from the model (bf16 map)."""
    return model.tensor_box_smem_offsets(swizzled_map(0, swizzle))


def expected_swizzled_box(swizzle: int) -> np.ndarray:
    """uint16 (16, S / 2): q's elements in the swizzled box (all inside the tensor)."""
    c0, c1 = swizzled_box(swizzle)
    i, j = np.indices((SWZ_BOX_ROWS, swizzle // 2))
    return ((c1 + i) * COLS + c0 + j).astype(np.uint16)


def expected_swizzled_raw(swizzle: int) -> np.ndarray:
    """uint16 (1024,): the kernel's buffer after the load, as the model places the box."""
    raw = np.full(SWZ_BUF_BYTES // 2, SENTINEL, dtype=np.uint16)
    raw[swizzled_offsets(swizzle) // 2] = expected_swizzled_box(swizzle)
    return raw


def expected_swizzled_dst(swizzle: int) -> np.ndarray:
    """uint16 (48, 512): the sentinel, and q's box where the store put it back."""
    c0, c1 = swizzled_box(swizzle)
    dst = np.full((BUFFER_ROWS, COLS), SENTINEL, dtype=np.uint16)
    dst[c1:c1 + SWZ_BOX_ROWS, c0:c0 + swizzle // 2] = expected_swizzled_box(swizzle)
    return dst


def chunk_slots(raw: np.ndarray, swizzle: int) -> np.ndarray:
    """int64 (16, S / 16): which 16-byte chunk of its box row (dense order) starts at each
    16-byte slot of each row of the raw buffer `raw` (uint16 words); -1 where what starts
    there is not the first element of a chunk of that row."""
    c0, c1 = swizzled_box(swizzle)
    i, k = np.indices((SWZ_BOX_ROWS, swizzle // 16))
    t, c = np.divmod(raw[(i * swizzle + 16 * k) // 2].astype(np.int64), COLS)
    j = c - c0
    ok = (t == c1 + i) & (0 <= j) & (j < swizzle // 2) & (j % 8 == 0)
    return np.where(ok, j // 8, -1)


def _swizzled_element(swizzle: int):
    """element(), plus which element of this swizzle's box a value of q is (if it is one)."""
    c0, c1 = swizzled_box(swizzle)

    def fmt(v) -> str:
        t, c = divmod(int(v), COLS)
        if int(v) != SENTINEL and 0 <= t - c1 < SWZ_BOX_ROWS and 0 <= c - c0 < swizzle // 2:
            return f"{element(v)}, box row {t - c1} col {c - c0}"
        return element(v)
    return fmt


def _where_swizzled(swizzle: int):
    """Names box element [i][j]: its place in q, the shared byte the model puts it at, its chunk."""
    c0, c1 = swizzled_box(swizzle)
    offsets = swizzled_offsets(swizzle)

    def where(i: int, j: int) -> str:
        off, c = int(offsets[i, j]), c0 + j
        return (f"box row {i} col {j} (token {c1 + i}, head {c // D}, d {c % D}) at shared byte "
                f"{off} of the box (chunk {off % swizzle // 16} of its row; dense, chunk {2 * j // 16})")
    return where


def _where_swizzled_dst(swizzle: int):
    c0, c1 = swizzled_box(swizzle)

    def where(r: int, c: int) -> str:
        place = f"dst row {r} col {c} (token {r}, head {c // D}, d {c % D})"
        if 0 <= r - c1 < SWZ_BOX_ROWS and 0 <= c - c0 < swizzle // 2:
            return f"{place}, stored from box row {r - c1} col {c - c0}"
        return f"{place}, outside the box: written by nothing"
    return where


def _check_swizzled(chk: Checker, obs: dict[str, np.ndarray], swizzle: int) -> None:
    case, box_bytes, fmt = f"swizzle {swizzle} B", SWZ_BOX_ROWS * swizzle, _swizzled_element(swizzle)
    chk.compare(f"{case}, buffer", obs[f"sw{swizzle}_buf_mod"], np.zeros(1, dtype=np.uint32),
                lambda _: f"the buffer's shared address mod {SWZ_ALIGN} (the pattern is reported to "
                          "follow the address bits: the placements below assume 0)")
    chk.compare(f"{case}, mbarrier", obs[f"sw{swizzle}_flags"], np.tile(EXPECTED_FLAGS, (WARP, 1)),
                lambda l, k: f"lane {l} {FLAGS[k][0]}" + (
                    " (a phase that never completes: the load completed fewer than the box's "
                    f"{box_bytes} bytes, or none)" if k == 0 else ""))
    raw = np.asarray(obs[f"sw{swizzle}_smem"])
    sentinel = np.full(SWZ_BUF_BYTES // 2, SENTINEL, dtype=np.uint16)
    if raw.shape != sentinel.shape:           # reported as one failure, the shapes named
        chk.compare(f"{case}, tensor load", raw, sentinel, str)
        return
    # First the picture at chunk level (which chunk of its row each 16-byte slot holds: a
    # different swizzle shows here in a few lines), then every box element where the model
    # places it, then the rest of the buffer.
    chk.compare(f"{case}, chunks", chunk_slots(raw, swizzle), chunk_slots(expected_swizzled_raw(swizzle), swizzle),
                lambda i, k: f"box row {i} shared bytes {i * swizzle + 16 * k}..{i * swizzle + 16 * k + 15} "
                             f"of the box (slot {k} of the row)",
                lambda v: f"chunk {v}" if v >= 0 else "no chunk of this row")
    chk.compare(f"{case}, tensor load", raw[swizzled_offsets(swizzle) // 2],
                expected_swizzled_box(swizzle), _where_swizzled(swizzle), fmt)
    past = box_bytes // 2
    chk.compare(f"{case}, tensor load", raw[past:], sentinel[past:],
                lambda w: f"shared byte {2 * (past + w)}, past the box's {box_bytes} bytes: "
                          "written by nothing", fmt)
    chk.compare(f"{case}, tensor store", obs[f"sw{swizzle}_dst"], expected_swizzled_dst(swizzle),
                _where_swizzled_dst(swizzle), fmt)


def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    if "map_received" in obs:
        chk.compare("tensor map", obs["map_received"], obs["map_sent"],
                    lambda m, w: f"{('src', 'dst')[m]}_map word {w} as the kernel received it",
                    lambda v: f"0x{int(v):016x}")
        chk.compare("tensor map", obs["map_address_mod_64"], np.zeros(2, dtype=np.uint64),
                    lambda m: f"{('src', 'dst')[m]}_map's parameter address mod {TENSOR_MAP_ALIGN}")
    chk.compare("mbarrier", obs["flags"], np.tile(EXPECTED_FLAGS, (WARP, 1)),
                lambda l, k: f"lane {l} {FLAGS[k][0]}" + (
                    " (a phase that never completes: the load completed fewer than the box's "
                    f"{BOX_BYTES} bytes, or none)" if k == 0 else ""))
    chk.compare("tensor load", obs["smem"], expected_box(), _where_box, element)
    want, who = expected_dst()
    chk.compare("tensor stores", obs["dst"], want, _where_dst(who), element)
    for swizzle in SWIZZLES:
        _check_swizzled(chk, obs, swizzle)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
