"""Shared-memory tile layouts: CuTe's swizzles, the Hopper GMMA atoms, and (row, col) -> byte.

:func:`swizzle` is CuTe's ``Swizzle<B, M, S>``: XOR bits [M+S, M+S+B) of an
offset into bits [M, M+B). :class:`Layout` maps a tile's (row, col) to a byte
address: row/column strides (in elements, possibly hierarchical like a CuTe
layout), the element size, and an optional swizzle of the byte offset.
:func:`row_major` builds a plain (possibly padded) tile; :func:`gmma_k` /
:func:`gmma_mn` build the Hopper GMMA atoms (INTER, SW32, SW64, SW128) tiled
over a tile. What a layout costs in bank conflicts is ``ptx_lab.banks``'s
business (:func:`ptx_lab.banks.bank_map`); this module only says where each
element lies.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


# ================================================================== swizzles

@dataclasses.dataclass(frozen=True)
class Swizzle:
    """CuTe's Swizzle<B, M, S>: XOR bits [M+S, M+S+B) of an offset into bits [M, M+B).

    With S >= B the source and target bit fields do not overlap, so the
    function is its own inverse and permutes every aligned block of
    ``atom_size`` offsets (bits >= M+S+B and < M are left alone). B = 0 is
    the identity. The offset's unit is whatever the caller uses; the GMMA
    atoms below (GMMA_SWIZZLES) apply it to byte offsets.
    """
    bits: int    # B: how many bits are XORed
    base: int    # M: the lowest target bit (2**M units move together)
    shift: int   # S: distance from the target bits up to the source bits

    def __post_init__(self) -> None:
        for name, v in (("bits", self.bits), ("base", self.base), ("shift", self.shift)):
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer; got {v!r}")
        if self.shift < self.bits:
            raise ValueError(f"shift must be >= bits (CuTe requires |S| >= B so the fields "
                             f"do not overlap); got bits={self.bits}, shift={self.shift}")

    @property
    def atom_size(self) -> int:
        """Offsets [k * atom, (k+1) * atom) map onto themselves."""
        return 1 << (self.base + self.shift + self.bits)

    def __call__(self, offset):
        mask = ((1 << self.bits) - 1) << (self.base + self.shift)   # the source field yyy
        if isinstance(offset, (int, np.integer)):
            return int(offset) ^ ((int(offset) & mask) >> self.shift)
        o = np.asarray(offset, dtype=np.int64)
        return o ^ ((o & mask) >> self.shift)

    def __str__(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


def swizzle(B: int, M: int, S: int) -> Swizzle:
    """CuTe's Swizzle<B, M, S> as a function of an offset: swizzle(3, 4, 3)(off)."""
    return Swizzle(B, M, S)


# Hopper GMMA shared-memory atoms (CuTe's Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom),
# as swizzles of the *byte* offset. Every atom is 8 rows ("K-major": rows of
# the non-contiguous mode) of 16 << B bytes. INTER = Swizzle<0,4,3> XORs no bits
# at all: its only effect is the *interleaving*, i.e. each 8-row x 16-byte core
# matrix of the tile is 128 contiguous bytes, so the 8 rows an ldmatrix phase
# reads fill all 32 banks once, whatever the tile's size. SW32/64/128 also XOR
# the 16-byte chunk index (bits 4..) with the row within the atom (bits 7..).
GMMA_SWIZZLES: dict[str, Swizzle] = {
    "INTER": Swizzle(0, 4, 3),
    "SW32": Swizzle(1, 4, 3),
    "SW64": Swizzle(2, 4, 3),
    "SW128": Swizzle(3, 4, 3),
}
GMMA_ATOM_ROWS = 8
CORE_ROW_BYTES = 16   # the 16-byte unit (bits 0..3) every GMMA swizzle leaves whole


# ================================================================== layouts

Mode = tuple[int, int]   # (extent, stride in elements)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Logical (row, col) of a tile -> byte address in shared memory.

    The row index is split into digits by ``row_modes`` (first mode fastest,
    CuTe's convention), each digit times its stride in elements; the same for
    columns. offset = sum of digit * stride; address = swizzle(base + offset
    * elem_bytes). A plain row-major tile has one mode each: ((rows, stride),)
    and ((cols, 1),).
    """
    name: str
    shape: tuple[int, int]             # (rows, cols) in elements
    elem_bytes: int
    row_modes: tuple[Mode, ...]
    col_modes: tuple[Mode, ...]
    swizzle: Swizzle | None = None     # applied to the byte address
    base: int = 0                      # byte address of the unswizzled element (0, 0)

    def __post_init__(self) -> None:
        if self.elem_bytes not in (1, 2, 4, 8, 16):
            raise ValueError(f"elem_bytes must be 1, 2, 4, 8 or 16; got {self.elem_bytes!r}")
        for axis, n, modes in (("row_modes", self.shape[0], self.row_modes),
                               ("col_modes", self.shape[1], self.col_modes)):
            if math.prod(e for e, _ in modes) != n:
                raise ValueError(f"{axis}: extents {[e for e, _ in modes]} must multiply to "
                                 f"the {axis[:3]} count {n}")
        if self.base % (self.swizzle.atom_size if self.swizzle else 1) or self.base < 0:
            raise ValueError(f"base must be a non-negative multiple of the swizzle's atom "
                             f"({self.swizzle.atom_size if self.swizzle else 1} bytes); got {self.base}")

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    def offset(self, row, col):
        """Element offset before swizzling (ints or integer arrays, broadcast)."""
        row, col = self._check_index(row, col)
        return _mode_offset(row, self.row_modes) + _mode_offset(col, self.col_modes)

    def address(self, row, col):
        """Byte address of element (row, col); arrays broadcast like numpy."""
        scalar = isinstance(row, (int, np.integer)) and isinstance(col, (int, np.integer))
        byte = self.base + self.offset(row, col) * self.elem_bytes
        if self.swizzle is not None:
            byte = self.swizzle(byte)
        return int(byte) if scalar else np.asarray(byte, dtype=np.int64)

    def addresses(self) -> np.ndarray:
        """int64 (rows, cols): the byte address of every element."""
        r, c = np.meshgrid(np.arange(self.rows), np.arange(self.cols), indexing="ij")
        return self.address(r, c)

    def transpose(self, name: str | None = None) -> "Layout":
        """The same bytes seen as the transposed tile: t.address(c, r) == self.address(r, c)."""
        return dataclasses.replace(self, name=name or f"{self.name}, transposed",
                                   shape=(self.cols, self.rows),
                                   row_modes=self.col_modes, col_modes=self.row_modes)

    @property
    def cosize_bytes(self) -> int:
        """Bytes from base to one past the last element (the footprint with padding)."""
        return int(self.addresses().max()) + self.elem_bytes - self.base

    def _check_index(self, row, col):
        r, c = np.asarray(row), np.asarray(col)
        for name, v, n in (("row", r, self.rows), ("col", c, self.cols)):
            if v.dtype.kind not in "iu":
                raise ValueError(f"{name} must be integer; got dtype {v.dtype}")
            if v.size and (v.min() < 0 or v.max() >= n):
                raise ValueError(f"{name} must lie in 0..{n - 1} for {self.name!r}; "
                                 f"got {int(v.min())}..{int(v.max())}")
        return r.astype(np.int64), c.astype(np.int64)


def _mode_offset(index: np.ndarray, modes: Sequence[Mode]) -> np.ndarray:
    out = np.zeros_like(index)
    for extent, stride in modes:
        out = out + (index % extent) * stride
        index = index // extent
    return out


def row_major(rows: int, cols: int, row_stride: int, elem_bytes: int = 2, *,
              swizzle: Swizzle | None = None, name: str | None = None) -> Layout:
    """rows x cols, element (r, c) at r * row_stride + c elements; padding = row_stride - cols."""
    if row_stride < cols:
        raise ValueError(f"row_stride ({row_stride}) must be >= cols ({cols})")
    return Layout(name or f"row-major {rows}x{cols}, stride {row_stride}", (rows, cols),
                  elem_bytes, ((rows, row_stride),), ((cols, 1),), swizzle)


def _gmma(kind: str, elem_bytes: int) -> tuple[Swizzle, int]:
    if kind not in GMMA_SWIZZLES:
        raise ValueError(f"kind must be one of {tuple(GMMA_SWIZZLES)}; got {kind!r}")
    swz = GMMA_SWIZZLES[kind]
    return swz, (CORE_ROW_BYTES << swz.bits) // elem_bytes   # contiguous elements per atom row


def _check_order(order: str) -> None:
    if order not in ("col", "row"):
        raise ValueError(f"order must be 'col' (CuTe's tile_to_shape default: atoms run down "
                         f"the rows first) or 'row'; got {order!r}")


def gmma_k(kind: str, rows: int, cols: int, elem_bytes: int = 2, *, order: str = "col",
           name: str | None = None) -> Layout:
    """K-major GMMA atoms tiled over a rows x cols tile (cols contiguous, e.g. [N][K]).

    Atom: 8 rows x (16 << B) bytes, Swizzle<B,4,3> of the byte offset. `order`
    is the order of the atoms: "col" = down the rows first (tile_to_shape's
    default), "row" = along the columns first.
    """
    swz, run = _gmma(kind, elem_bytes)
    _check_order(order)
    if rows % GMMA_ATOM_ROWS or cols % run:
        raise ValueError(f"a {kind} K-major atom is {GMMA_ATOM_ROWS} x {run} elements; "
                         f"rows ({rows}) and cols ({cols}) must be multiples of it")
    atom = GMMA_ATOM_ROWS * run
    if order == "col":
        row_modes = ((GMMA_ATOM_ROWS, run), (rows // GMMA_ATOM_ROWS, atom))
        col_modes = ((run, 1), (cols // run, rows * run))
    else:
        row_modes = ((GMMA_ATOM_ROWS, run), (rows // GMMA_ATOM_ROWS, cols * GMMA_ATOM_ROWS))
        col_modes = ((run, 1), (cols // run, atom))
    return Layout(name or f"K_{kind} over [{rows}, {cols}]", (rows, cols), elem_bytes,
                  row_modes, col_modes, swz)


def gmma_mn(kind: str, rows: int, cols: int, elem_bytes: int = 2, *, order: str = "col",
            name: str | None = None) -> Layout:
    """MN-major GMMA atoms over a rows x cols tile (rows contiguous, e.g. [M][K] stored K-outer).

    The transpose of :func:`gmma_k`: runs of (16 << B) bytes go down the rows,
    8 of them side by side make an atom. Built as the K-major layout of the
    transposed tile, with the atom order flipped (down this tile's rows first is
    along the K-major tile's columns first).
    """
    _, run = _gmma(kind, elem_bytes)
    _check_order(order)
    if rows % run or cols % GMMA_ATOM_ROWS:
        raise ValueError(f"a {kind} MN-major atom is {run} x {GMMA_ATOM_ROWS} elements; "
                         f"rows ({rows}) and cols ({cols}) must be multiples of it")
    k_major = gmma_k(kind, cols, rows, elem_bytes, order="row" if order == "col" else "col")
    return k_major.transpose(name or f"MN_{kind} over [{rows}, {cols}]")


__all__ = ["Swizzle", "swizzle", "GMMA_SWIZZLES", "GMMA_ATOM_ROWS", "CORE_ROW_BYTES",
           "Mode", "Layout", "row_major", "gmma_k", "gmma_mn"]
