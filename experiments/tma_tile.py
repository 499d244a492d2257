"""
cp.async.bulk.tensor: a whole 16 x 128 tile of q in one instruction, tensor map from the host
=============================================================================================

What and why
------------
Kernel A loads, per 16-token tile, one head's rows of q, k, gc and do: 16 rows
of 128 bf16 (256 bytes), the rows ``H * 256`` bytes apart because the heads of
a token sit side by side. With ``cp.async`` that is 16 lane-copies per row;
with one ``cp.async.bulk`` per row (experiment ``bulk_copy``) it is 16 copies
that one lane issues one after another, which BENCHMARKS.md (log entry 13)
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
"""
from __future__ import annotations

import re

import numpy as np

from ptx_lab import CUDA_INCLUDE_DIR, model
from ptx_lab.tensormap import ELEMENT_BYTES, TENSOR_MAP_ALIGN, TensorMap2D

from . import _common
from ._common import WARP, Checker

NAME = "tma_tile"
SUMMARY = "cp.async.bulk.tensor.2d box of q (16 x 128 bf16): zero fill past T, clipped stores"

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

FLAGS = (("wait(0) for the load's phase returned", 1),
         ("try_wait(1) after the load: phase 1 is current", 0))
FLAG_NAMES = ("FLAG_LOADED", "FLAG_P1_AFTER_LOAD")
EXPECTED_FLAGS = np.array([want for _, want in FLAGS], dtype=np.uint32)

SOURCE = TMA_PROBES_CU.read_text()
# The kernel and this file must agree on the box, the marks and the order of coords and flags.
for _line in (f"BOX_ROWS = {BOX_ROWS};", f"BOX_COLS = {BOX_COLS};", "SENTINEL = 0xffffu;",
              "STORE_MARK = 0xc000u;"):
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
    return {"smem": smem_out, "flags": np.tile(flags, (WARP, 1)),
            "dst": _halves(out, (BUFFER_ROWS, COLS))}


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
    return {"smem": cupy.asnumpy(smem), "flags": cupy.asnumpy(flags), "dst": cupy.asnumpy(dst),
            "map_sent": np.stack([m["opaque"][0] for m in maps]).astype(np.uint64),
            "map_received": np.stack(received).astype(np.uint64),
            "map_address_mod_64": np.array(addresses, dtype=np.uint64) % TENSOR_MAP_ALIGN}


def observe(backend: str) -> dict[str, np.ndarray]:
    """smem: uint16 (16, 128); flags: uint32 (32, 2); dst: uint16 (48, 512); on the GPU also
    map_sent, map_received: uint64 (2, 16) and map_address_mod_64: uint64 (2,)."""
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
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
