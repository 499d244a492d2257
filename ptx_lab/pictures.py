"""Pictures of fragment maps and shared-memory bank maps, as SVG, PNG or text.

A *picture* is one or more grids (:class:`Grid`) whose cells carry a colour
key (a lane, or a bank: 0..31), a short label and an optional highlight. The
builders below turn the closed-form maps of :mod:`ptx_lab.fragments` into
pictures; :func:`bank_picture` does the same for any bank-per-cell array, so
the renderer does not depend on how a bank map is computed.

One layout (:func:`layout`, pixel coordinates) feeds both outputs, so the SVG
and the PNG show the same thing:

* SVG is written by hand (no dependency). Every cell is a ``<g class="cell"
  id="cell-<panel>-<row>-<col>">`` holding a ``<title>`` tooltip, a ``<rect>``
  and its label as ``<text>``, which keeps the file testable and searchable.
* PNG goes through matplotlib's Agg canvas (the optional ``plot`` extra); no
  pyplot, so no global state changes in the caller.

Colours: 8 hues x 4 shades, hue = key // 4 and shade = key % 4. For a lane
that is hue = g (the ISA's group, lane // 4) and shade = t (lane % 4): the four
lanes of a group look alike, and the groups, which are the rows or columns of
every m8n8 layout, stand apart. Lane 5 has the same colour in every picture.
No hue is red: red is kept for the highlight (bank conflicts).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from . import fragments
from .banks import Access, bank_map, ldmatrix_access, shared_access
from .layouts import Layout

WARP = fragments.WARP
PLOT_HINT = "pip install 'ptx-lab[plot]'"

# ------------------------------------------------------------------ palette

# Eight hues, none of them red (red marks highlighted cells). Dark enough that
# white text reads on the full-strength shade.
_HUES = ("#1f5fa6",  # blue
         "#c9650a",  # orange
         "#23803a",  # green
         "#7440b0",  # purple
         "#7a4e2d",  # brown
         "#b8327f",  # magenta
         "#127f86",  # teal
         "#5c6470")  # slate grey
_TINTS = (0.0, 0.32, 0.58, 0.80)  # how much white is mixed in, shade 0..3
HIGHLIGHT = "#e0001b"


def _mix_with_white(hex_colour: str, amount: float) -> str:
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


PALETTE: tuple[str, ...] = tuple(_mix_with_white(_HUES[k // 4], _TINTS[k % 4]) for k in range(32))
BLANK = "#ffffff"  # a cell with no key (key < 0)


def colour(key: int) -> str:
    """Fill colour of a lane or bank number (0..31); keys < 0 are blank."""
    if key < 0:
        return BLANK
    if key >= len(PALETTE):
        raise ValueError(f"key must be < {len(PALETTE)} (a lane or a bank); got {key}")
    return PALETTE[key]


def _luminance(hex_colour: str) -> float:
    """WCAG relative luminance: decides black or white text on a fill."""
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(int(hex_colour[i:i + 2], 16)) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ink(fill: str) -> str:
    """Black or white, whichever contrasts more with `fill`."""
    lum = _luminance(fill)
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


# ------------------------------------------------------------------ data

@dataclass(frozen=True)
class Grid:
    """One panel: a rows x cols grid of coloured, labelled cells.

    keys: int (rows, cols), colour key per cell (lane or bank; < 0 = blank).
    labels: the text of each cell; "\\n" splits it into a bold first line and
    a smaller second line. tips: tooltip per cell (SVG <title>); defaults to
    the label. highlight: bool (rows, cols), drawn with a thick red border.
    block: a thicker line every `block` rows/cols (the 8x8 sub-matrices);
    row_block, when given, replaces it for rows.
    row_notes: text to the right of each row (e.g. which lane gives its address).
    """

    title: str
    keys: np.ndarray
    labels: Sequence[Sequence[str]]
    row_name: str = "row"
    col_name: str = "col"
    highlight: np.ndarray | None = None
    tips: Sequence[Sequence[str]] | None = None
    block: int = 8
    row_notes: Sequence[str] | None = None
    row_block: int | None = None

    def __post_init__(self) -> None:
        keys = np.asarray(self.keys)
        if keys.ndim != 2 or not np.issubdtype(keys.dtype, np.integer):
            raise ValueError(f"keys: expected a 2-D integer array, got {keys.dtype} {keys.shape}")
        shape = keys.shape
        if len(self.labels) != shape[0] or any(len(row) != shape[1] for row in self.labels):
            raise ValueError(f"labels: expected {shape[0]} rows of {shape[1]} strings")
        if self.tips is not None and (len(self.tips) != shape[0]
                                      or any(len(row) != shape[1] for row in self.tips)):
            raise ValueError(f"tips: expected {shape[0]} rows of {shape[1]} strings")
        if self.highlight is not None and np.shape(self.highlight) != shape:
            raise ValueError(f"highlight: expected shape {shape}, got {np.shape(self.highlight)}")
        if self.row_notes is not None and len(self.row_notes) != shape[0]:
            raise ValueError(f"row_notes: expected {shape[0]} strings, got {len(self.row_notes)}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(np.shape(self.keys))  # type: ignore[return-value]


@dataclass(frozen=True)
class Picture:
    """Panels under one title, with a colour key for `key_name` ("lane" or "bank").

    notes: lines under the title (formulas, how to read a cell).
    columns: panels per row of the layout.
    highlight_note: legend text for highlighted cells (None: no such entry).
    """

    title: str
    panels: tuple[Grid, ...]
    key_name: str = "lane"
    notes: tuple[str, ...] = ()
    columns: int = 2
    highlight_note: str | None = None


# ------------------------------------------------------------------ fragment pictures

_HALF = ("lo", "hi")


def _cell_label(lane: int, reg: int, half: int | None) -> str:
    """"T5\\nr1.hi": lane on the first line, register (and which 16 bits) on the second."""
    return f"T{lane}\nr{reg}" + ("" if half is None else f".{_HALF[half]}")


def _cell_tip(where: str, lane: int, reg: int, half: int | None) -> str:
    bits = "" if half is None else (", bits 0..15" if half == 0 else ", bits 16..31")
    return f"{where}: lane {lane}, register {reg}{bits}"


def _grid_from_cells(title: str, rows: int, cols: int, matrix: str,
                     cells: Sequence[tuple[int, int, int, int, int | None]], **kw) -> Grid:
    """Grid from (row, col, lane, register, half) tuples; every cell must appear once."""
    keys = np.full((rows, cols), -1, dtype=np.int64)
    labels = [[""] * cols for _ in range(rows)]
    tips = [[""] * cols for _ in range(rows)]
    for row, col, lane, reg, half in cells:
        if keys[row, col] != -1:
            raise AssertionError(f"{title}: cell [{row}][{col}] held twice")
        keys[row, col] = lane
        labels[row][col] = _cell_label(lane, reg, half)
        tips[row][col] = _cell_tip(f"{matrix}[{row}][{col}]", lane, reg, half)
    if (keys < 0).any():
        raise AssertionError(f"{title}: some cell is held by no lane")
    return Grid(title=title, keys=keys, labels=labels, tips=tips, **kw)


def _operand_cells(operand: str) -> list[tuple[int, int, int, int, int | None]]:
    fmap = fragments.fragment_map(operand)  # (32, regs, elems, 2)
    per_reg = fmap.shape[2]
    return [(int(fmap[lane, r, h, 0]), int(fmap[lane, r, h, 1]), lane, r, None if per_reg == 1 else h)
            for lane, r, h in np.ndindex(fmap.shape[:3])]


_GT = "g = lane // 4, t = lane % 4"
_HALVES = "r<i>.lo = bits 0..15 of register i, .hi = bits 16..31"

# operand -> (title, matrix name, row axis, col axis, notes)
_MMA = {
    "mma.a": ("mma.sync.aligned.m16n8k16 \u2014 operand A (16x16, row-major, bf16/f16)", "A",
              "row (m)", "col (k)",
              ("lane holds 4 b32 registers r0..r3 of two 16-bit elements: "
               "r, h -> A[g + 8(r & 1)][2t + h + 8(r >> 1)]", _GT + "; " + _HALVES)),
    "mma.b": ("mma.sync.aligned.m16n8k16 \u2014 operand B (16x8, K x N, .col, bf16/f16)", "B",
              "row (k)", "col (n)",
              ("lane holds 2 b32 registers r0, r1 of two 16-bit elements: "
               "r, h -> B[2t + h + 8r][g]", _GT + "; " + _HALVES)),
    "mma.c": ("mma.sync.aligned.m16n8k16 \u2014 operand C / D (16x8 fp32 accumulator)", "C",
              "row (m)", "col (n)",
              ("lane holds 4 f32 registers r0..r3: r -> C[g + 8(r >> 1)][2t + (r & 1)]", _GT)),
    "m8n8": ("m8n8 fragment (ldmatrix / stmatrix register, movmatrix source)", "M",
             "row", "col",
             ("lane holds 1 b32 register r0 of two 16-bit elements: h -> M[g][2t + h]",
              _GT + "; " + _HALVES)),
    "m8n8.trans": ("m8n8.trans fragment (.trans forms, movmatrix destination)", "M",
                   "row", "col",
                   ("lane holds 1 b32 register r0 of two 16-bit elements: h -> M[2t + h][g]",
                    _GT + "; " + _HALVES)),
}


def mma_picture(operand: str) -> Picture:
    """Picture of a fragments.OPERANDS operand: mma.a, mma.b, mma.c, m8n8, m8n8.trans."""
    if operand not in _MMA:
        raise ValueError(f"operand must be one of {', '.join(_MMA)}; got {operand!r}")
    title, matrix, row_name, col_name, notes = _MMA[operand]
    rows, cols, _, _ = fragments.SHAPES[operand]
    grid = _grid_from_cells(f"{matrix} ({rows}x{cols})", rows, cols, matrix,
                            _operand_cells(operand), row_name=row_name, col_name=col_name)
    return Picture(title=title, panels=(grid,), notes=notes, columns=1)


def _matrix_cells(num: int, trans: bool, i: int) -> list[tuple[int, int, int, int, int | None]]:
    lmap = fragments.ldmatrix_map(num, trans)  # (32, num, 2, 3): (matrix, row, col)
    return [(int(lmap[lane, i, h, 1]), int(lmap[lane, i, h, 2]), lane, i, h)
            for lane in range(WARP) for h in range(2)]


def ldst_picture(instr: str, num: int, trans: bool) -> Picture:
    """ldmatrix / stmatrix .x{num}[.trans]: each 8x8 matrix as it lies in shared memory.

    Panel i is matrix i; every cell names the lane and register that receives
    (ldmatrix) or supplies (stmatrix) it, and each row says which lane's
    address it lives at: the address is the part of these instructions that
    is easy to get wrong.
    """
    if instr not in ("ldmatrix", "stmatrix"):
        raise ValueError(f"instr must be 'ldmatrix' or 'stmatrix'; got {instr!r}")
    fragments._check_num(num)
    lanes = fragments.address_lanes(num)
    verb = "receives" if instr == "ldmatrix" else "supplies"
    form = "M[2t + h][g]" if trans else "M[g][2t + h]"
    arrow = "matrix {i} \u2192 r{i}" if instr == "ldmatrix" else "r{i} \u2192 matrix {i}"
    panels = tuple(
        _grid_from_cells(f"{arrow.format(i=i)} (row addresses from lanes {8 * i}..{8 * i + 7})",
                         8, 8, f"matrix {i}", _matrix_cells(num, trans, i),
                         row_notes=tuple(f"addr T{int(lanes[i, r])}" for r in range(8)))
        for i in range(num))
    suffix = ".trans" if trans else ""
    title = f"{instr}.sync.aligned.m8n8.x{num}{suffix}.shared.b16"
    notes = (f"row r of matrix i is the 16 bytes at the address in lane 8i + r; "
             f"register i of every lane {verb} matrix i: h -> {form}",
             _GT + "; " + _HALVES)
    return Picture(title=title, panels=panels, notes=notes, columns=2 if num == 4 else num)


def movmatrix_picture() -> Picture:
    """movmatrix.trans: where each element of M sits before (source) and after (destination)."""
    src = _grid_from_cells("source: fragment of M (m8n8)", 8, 8, "M", _operand_cells("m8n8"))
    dst = _grid_from_cells("destination: the same M, now as the fragment of M^T",
                           8, 8, "M", _operand_cells("m8n8.trans"))
    notes = ("both panels index M itself: cell [i][j] shows which lane and half holds M[i][j]",
             "source h -> M[g][2t + h]; destination h -> M[2t + h][g] (= M^T[g][2t + h])",
             _GT + "; " + _HALVES)
    return Picture(title="movmatrix.sync.aligned.m8n8.trans.b16 d, a", panels=(src, dst),
                   notes=notes, columns=2)


def _ldst_builders() -> dict[str, Callable[[], Picture]]:
    out: dict[str, Callable[[], Picture]] = {}
    for instr in ("ldmatrix", "stmatrix"):
        for num in (1, 2, 4):
            for trans in (False, True):
                name = f"{instr}.x{num}" + (".trans" if trans else "")
                out[name] = lambda i=instr, n=num, t=trans: ldst_picture(i, n, t)
    return out


_BUILDERS: dict[str, Callable[[], Picture]] = {
    **{op: (lambda o=op: mma_picture(o)) for op in fragments.OPERANDS},
    **_ldst_builders(),
    "movmatrix": movmatrix_picture,
}
OPERANDS: tuple[str, ...] = tuple(_BUILDERS)  # everything fragment_picture draws


def fragment_picture(operand: str) -> Picture:
    """The picture for any name in OPERANDS (e.g. "mma.c", "ldmatrix.x4.trans", "movmatrix")."""
    if operand not in _BUILDERS:
        raise ValueError(f"operand must be one of {', '.join(OPERANDS)}; got {operand!r}")
    return _BUILDERS[operand]()


# ------------------------------------------------------------------ bank pictures

def bank_picture(title: str, banks: np.ndarray, conflicts: np.ndarray | None = None,
                 lanes: np.ndarray | None = None, *, notes: Sequence[str] = (),
                 row_name: str = "row", col_name: str = "col", block: int = 0,
                 row_block: int | None = None,
                 highlight_note: str = "conflicting access") -> Picture:
    """A shared-memory tile coloured and labelled by bank, conflicting cells outlined red.

    banks: int (rows, cols), the bank (0..31) of each cell, or < 0 for a cell
    not drawn. conflicts: bool (rows, cols), the cells a warp access touches in
    a bank some other lane of the same access also hits at another address.
    lanes: int (rows, cols), the lane whose request covers the cell (< 0: none);
    touched cells get "T<lane>" under the bank, so the access itself is visible.
    The arrays come from whatever computes them (ptx_lab.banks); this only draws.
    """
    banks = np.asarray(banks)
    if banks.ndim != 2 or not np.issubdtype(banks.dtype, np.integer):
        raise ValueError(f"banks: expected a 2-D integer array, got {banks.dtype} {banks.shape}")
    if banks.max(initial=-1) >= 32:
        raise ValueError(f"banks: values must be < 32; got {int(banks.max())}")
    if conflicts is not None:
        conflicts = np.asarray(conflicts, dtype=bool)
        if conflicts.shape != banks.shape:
            raise ValueError(f"conflicts: expected shape {banks.shape}, got {conflicts.shape}")
    if lanes is not None:
        lanes = np.asarray(lanes)
        if lanes.shape != banks.shape or not np.issubdtype(lanes.dtype, np.integer):
            raise ValueError(f"lanes: expected an integer array of shape {banks.shape}, "
                             f"got {lanes.dtype} {lanes.shape}")
    rows, cols = banks.shape
    labels = [[""] * cols for _ in range(rows)]
    tips = [[""] * cols for _ in range(rows)]
    for r, c in np.ndindex(rows, cols):
        b = int(banks[r, c])
        lane = -1 if lanes is None else int(lanes[r, c])
        labels[r][c] = ("" if b < 0 else str(b)) + (f"\nT{lane}" if lane >= 0 else "")
        tips[r][c] = (f"[{r}][{c}]: bank {b}" + (f", read by lane {lane}" if lane >= 0 else "")
                      + (", conflicts" if conflicts is not None and conflicts[r, c] else ""))
    grid = Grid(title=f"{rows} x {cols} cells", keys=banks.astype(np.int64), labels=labels,
                tips=tips, highlight=conflicts, row_name=row_name, col_name=col_name, block=block,
                row_block=row_block)
    return Picture(title=title, panels=(grid,), key_name="bank", notes=tuple(notes), columns=1,
                   highlight_note=highlight_note if conflicts is not None else None)


BANK_PREFIX = "banks:"  # `ptx-lab show banks:<preset>[:<access>]`
BANK_ACCESSES = ("ldmatrix", "column", "none")
SHOWN_BYTES = 64    # row bytes drawn (more only for a wider swizzle atom): ~1300 px wide
SHOWN_ROWS = 32     # most rows drawn: one per lane


def _preset_layouts() -> Mapping[str, Layout]:
    """name -> layout of every preset `banks:<preset>` draws (ptx_lab.bank_presets)."""
    try:
        from .bank_presets import PRESETS
    except ImportError as exc:
        raise ValueError(f"bank maps need ptx_lab/bank_presets.py, which cannot be imported: {exc}") from exc
    return PRESETS


def bank_presets() -> tuple[str, ...]:
    """Names accepted after "banks:" (empty where ptx_lab.bank_presets is missing)."""
    try:
        return tuple(_preset_layouts())
    except ValueError:
        return ()


def _ldmatrix_rows(layout: Layout) -> list[int]:
    """Row addresses of ldmatrix.x4 over the top-left 16x16 block, in mma-A order.

    Matrix 0 = rows 0..7 x cols 0..7, 1 = rows 8..15, 2 = cols 8..15, 3 = both
    (the A fragment's a0..a3). An ldmatrix "row" is 8 elements contiguous in
    memory: along a row for a row-contiguous layout, down a column for an
    MN-major one (then the picture shows what ldmatrix.trans reads).
    """
    if layout.elem_bytes != 2 or layout.rows < 16 or layout.cols < 16:
        raise ValueError(f"access 'ldmatrix' reads a 16x16 block of 2-byte elements; "
                         f"{layout.name!r} is {layout.rows}x{layout.cols} of {layout.elem_bytes}-byte")
    a = layout.address
    along_cols = a(0, 1) - a(0, 0) == 2
    out = []
    for i in range(4):
        r0, c0 = 8 * (i & 1), 8 * (i >> 1)
        for j in range(8):
            rr, cc = (r0 + j, c0) if along_cols else (r0, c0 + j)
            start = a(rr, cc)
            run = [a(rr, cc + e) if along_cols else a(rr + e, cc) for e in range(8)]
            if run != [start + 2 * e for e in range(8)]:
                raise ValueError(f"access 'ldmatrix': in {layout.name!r} the 8 elements from "
                                 f"[{rr}][{cc}] are not 16 contiguous bytes")
            out.append(start)
    return out


def _preset_access(layout: Layout, access: str) -> tuple[Access | None, str]:
    """(the access, or None for "none"; one line saying what the warp does)."""
    if access == "none":
        return None, "no access drawn"
    if access == "ldmatrix":
        acc = ldmatrix_access(_ldmatrix_rows(layout), 4)
        return acc, ("access: ldmatrix.x4 over the top-left 16x16 block (matrix i from lanes "
                     "8i..8i+7; the mma A order), one phase per 8x8 matrix")
    n = min(WARP, layout.rows)
    addrs = [layout.address(l, 0) if l < n else None for l in range(WARP)]
    acc = shared_access(addrs, layout.elem_bytes)
    return acc, (f"access: lane l reads element [l][0] ({layout.elem_bytes} bytes, "
                 f"{acc.kind}): one column, one row per lane")


def bank_preset_picture(spec: str) -> Picture:
    """The bank map of a ptx_lab.bank_presets layout under one warp access.

    spec: "<preset>" or "<preset>:<access>", access one of BANK_ACCESSES. The
    default is "column" for a tile of exactly 32 rows (one per lane: the
    token-strided reads of the q/k/gc presets) and "ldmatrix" otherwise.
    At most SHOWN_ROWS rows and SHOWN_BYTES bytes per row are drawn (top-left),
    or a whole swizzle atom row where that is wider: wider pictures shrink to
    unreadable text in most viewers, and every access drawn lies in that corner.
    """
    presets = _preset_layouts()  # says so when the presets are missing, rather than listing none
    preset, _, access = spec.partition(":")
    if preset not in presets:
        raise ValueError(f"preset must be one of {', '.join(presets)}; got {preset!r}")
    layout = presets[preset]
    access = access or ("column" if layout.rows == WARP else "ldmatrix")
    if access not in BANK_ACCESSES:
        raise ValueError(f"access (after banks:{preset}:) must be one of "
                         f"{', '.join(BANK_ACCESSES)}; got {access!r}")
    acc, what = _preset_access(layout, access)
    rows = min(layout.rows, SHOWN_ROWS)
    swz = getattr(layout, "swizzle", None)
    row_bytes = max(SHOWN_BYTES, (16 << swz.bits) if swz is not None else 0)
    cols = min(layout.cols, row_bytes // layout.elem_bytes)
    bm = bank_map(layout, rows, cols, acc)
    shown = ("" if (rows, cols) == layout.shape
             else f"; drawn: the top-left {rows} x {cols} of [{layout.rows}, {layout.cols}]")
    notes = (what, f"bank = (byte address // 4) % 32; T<lane> = the lane whose request covers "
                   f"the cell{shown}")
    # Thick lines every 16 bytes along a row (an ldmatrix row, a swizzle unit) and
    # every 8 rows (an 8x8 matrix, a GMMA atom).
    return bank_picture(bm.title, bm.banks, bm.conflicts, bm.lanes, notes=notes,
                        block=16 // layout.elem_bytes if layout.elem_bytes < 16 else 0, row_block=8,
                        highlight_note="in a conflicting bank")


def names() -> tuple[str, ...]:
    """Every name picture() accepts: OPERANDS, then banks:<preset> for each preset."""
    return OPERANDS + tuple(BANK_PREFIX + p for p in bank_presets())


def picture(name: str) -> Picture:
    """Dispatch a `ptx-lab show` name: a fragment operand or "banks:<preset>[:<access>]"."""
    if name.startswith(BANK_PREFIX):
        return bank_preset_picture(name[len(BANK_PREFIX):])
    return fragment_picture(name)


# ------------------------------------------------------------------ layout

FONT = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str = "none"
    stroke: str = "none"
    width: float = 0.0


@dataclass(frozen=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    stroke: str = "#000000"
    width: float = 1.0


@dataclass(frozen=True)
class Text:
    """Text centred vertically on y; anchor: "start", "middle" or "end"; rotate in degrees (ccw)."""

    x: float
    y: float
    text: str
    size: float
    anchor: str = "middle"
    bold: bool = False
    fill: str = "#000000"
    rotate: float = 0.0


@dataclass
class Group:
    """A cell: its shapes plus an id and a tooltip (SVG <g> with <title>)."""

    ident: str
    tip: str
    shapes: list = field(default_factory=list)


Shape = Union[Rect, Line, Text, Group]


@dataclass
class Scene:
    width: float
    height: float
    title: str
    shapes: list[Shape]


# Pixel sizes. The PNG is drawn at 100 dpi, so these are also PNG pixels.
MARGIN = 24
TITLE_SIZE = 21
NOTE_SIZE = 14
PANEL_TITLE_SIZE = 15
TICK_SIZE = 13
AXIS_SIZE = 13
LABEL_SIZE = 15      # first line of a cell (the lane)
SUBLABEL_SIZE = 12   # second line (register and half)
GAP = 36             # between panels, and before the key
CHAR_W = 0.57        # text width per character, in units of font size (for sizing only)
BOLD_W = 0.72        # the same for bold (DejaVu Sans Bold digits are wide)


def _text_width(text: str, size: float, bold: bool = False) -> float:
    """A generous estimate: too wide leaves margin, too narrow clips or overlaps."""
    return len(text) * size * (BOLD_W if bold else CHAR_W)


def _cell_size(grid: Grid) -> tuple[float, float]:
    """Wide enough for the longest label line at its font size; two-line labels are taller."""
    lines = [line for row in grid.labels for label in row for line in label.split("\n")[:1]]
    sublines = [label.split("\n")[1] for row in grid.labels for label in row if "\n" in label]
    need = max([_text_width(t, LABEL_SIZE, bold=True) for t in lines] +
               [_text_width(t, SUBLABEL_SIZE) for t in sublines] + [0.0])
    width = max(36.0, math.ceil(need + 14))
    height = 46.0 if sublines else 30.0
    return width, height


@dataclass(frozen=True)
class _PanelBox:
    grid: Grid
    cell_w: float
    cell_h: float
    left: float   # row axis name + row ticks
    top: float    # panel title + col axis name + col ticks
    right: float  # row notes

    @property
    def width(self) -> float:
        return self.left + self.grid.shape[1] * self.cell_w + self.right

    @property
    def height(self) -> float:
        return self.top + self.grid.shape[0] * self.cell_h


def _panel_box(grid: Grid) -> _PanelBox:
    cell_w, cell_h = _cell_size(grid)
    rows = grid.shape[0]
    left = 24 + _text_width(str(rows - 1), TICK_SIZE) + 8
    right = 0.0
    if grid.row_notes:
        right = 10 + max(_text_width(n, TICK_SIZE) for n in grid.row_notes)
    box = _PanelBox(grid, cell_w, cell_h, left, 26 + 20 + 20, right)
    title_w = _text_width(grid.title, PANEL_TITLE_SIZE, bold=True)
    if title_w > box.width:  # a long panel title widens the right margin, never overlaps
        box = _PanelBox(grid, cell_w, cell_h, left, box.top, right + title_w - box.width)
    return box


def _cell_shapes(p: int, r: int, c: int, grid: Grid, x: float, y: float, w: float, h: float) -> Group:
    key = int(np.asarray(grid.keys)[r, c])
    fill = colour(key)
    label = grid.labels[r][c]
    tip = grid.tips[r][c] if grid.tips is not None else label.replace("\n", " ")
    group = Group(f"cell-{p}-{r}-{c}", tip, [Rect(x, y, w, h, fill, "#ffffff", 1.0)])
    text_ink = ink(fill)
    first, _, second = label.partition("\n")
    if second:
        group.shapes.append(Text(x + w / 2, y + h * 0.36, first, LABEL_SIZE, bold=True, fill=text_ink))
        group.shapes.append(Text(x + w / 2, y + h * 0.74, second, SUBLABEL_SIZE, fill=text_ink))
    elif first:
        group.shapes.append(Text(x + w / 2, y + h / 2, first, LABEL_SIZE, bold=True, fill=text_ink))
    if grid.highlight is not None and bool(np.asarray(grid.highlight)[r, c]):
        inset = 2.5
        group.shapes.append(Rect(x + inset, y + inset, w - 2 * inset, h - 2 * inset,
                                 "none", HIGHLIGHT, 4.0))
    return group


def _panel_shapes(p: int, box: _PanelBox, x0: float, y0: float) -> list[Shape]:
    grid = box.grid
    rows, cols = grid.shape
    gx, gy = x0 + box.left, y0 + box.top
    gw, gh = cols * box.cell_w, rows * box.cell_h
    out: list[Shape] = [Text(x0, y0 + 11, grid.title, PANEL_TITLE_SIZE, anchor="start", bold=True),
                        Text(gx + gw / 2, y0 + 36, f"{grid.col_name} \u2192", AXIS_SIZE),
                        Text(x0 + 9, gy + gh / 2, f"{grid.row_name} \u2192", AXIS_SIZE, rotate=-90)]
    for c in range(cols):
        out.append(Text(gx + (c + 0.5) * box.cell_w, gy - 10, str(c), TICK_SIZE, fill="#333333"))
    for r in range(rows):
        out.append(Text(gx - 6, gy + (r + 0.5) * box.cell_h, str(r), TICK_SIZE, anchor="end",
                        fill="#333333"))
        if grid.row_notes:
            out.append(Text(gx + gw + 8, gy + (r + 0.5) * box.cell_h, grid.row_notes[r], TICK_SIZE,
                            anchor="start", fill="#333333"))
    for r, c in np.ndindex(rows, cols):
        out.append(_cell_shapes(p, r, c, grid, gx + c * box.cell_w, gy + r * box.cell_h,
                                box.cell_w, box.cell_h))
    row_block = grid.block if grid.row_block is None else grid.row_block
    if row_block:
        for r in range(row_block, rows, row_block):
            out.append(Line(gx, gy + r * box.cell_h, gx + gw, gy + r * box.cell_h, "#000000", 2.5))
    if grid.block:
        for c in range(grid.block, cols, grid.block):
            out.append(Line(gx + c * box.cell_w, gy, gx + c * box.cell_w, gy + gh, "#000000", 2.5))
    out.append(Rect(gx, gy, gw, gh, "none", "#000000", 1.5))
    return out


KEY_CELL = (40.0, 26.0)


def _key_size(picture: Picture) -> tuple[float, float]:
    w = max(4 * KEY_CELL[0] + 30, _text_width(f"colour = {picture.key_name}", PANEL_TITLE_SIZE, bold=True))
    h = 26 + 22 + 8 * KEY_CELL[1] + (46 if picture.highlight_note else 0)
    if picture.highlight_note:
        w = max(w, 36 + _text_width(picture.highlight_note, TICK_SIZE))
    return w, h


def _key_shapes(picture: Picture, x0: float, y0: float) -> list[Shape]:
    """The colour key: 8 rows (hue: key // 4) x 4 columns (shade: key % 4), numbers inside."""
    kw, kh = KEY_CELL
    name = picture.key_name
    out: list[Shape] = [Text(x0, y0 + 11, f"colour = {name}", PANEL_TITLE_SIZE, anchor="start", bold=True),
                        Text(x0, y0 + 34, f"row: {name} // 4, column: {name} % 4", 12,
                             anchor="start", fill="#333333")]
    top = y0 + 48
    for key in range(32):
        g, t = divmod(key, 4)
        x, y = x0 + t * kw, top + g * kh
        fill = colour(key)
        out.append(Rect(x, y, kw, kh, fill, "#ffffff", 1.0))
        out.append(Text(x + kw / 2, y + kh / 2, str(key), TICK_SIZE, bold=True, fill=ink(fill)))
    if picture.highlight_note:
        y = top + 8 * kh + 14
        out.append(Rect(x0 + 2, y + 2, kw - 4, kh - 4, "#ffffff", HIGHLIGHT, 4.0))
        out.append(Text(x0 + kw + 8, y + kh / 2, picture.highlight_note, TICK_SIZE, anchor="start"))
    return out


def layout(picture: Picture) -> Scene:
    """Place title, notes, panels (picture.columns per row) and the colour key, in pixels."""
    if not picture.panels:
        raise ValueError("picture: has no panels")
    boxes = [_panel_box(g) for g in picture.panels]
    ncol = max(1, min(picture.columns, len(boxes)))
    col_w = [max(b.width for b in boxes[j::ncol]) for j in range(ncol)]
    row_h = [max(b.height for b in boxes[i:i + ncol]) for i in range(0, len(boxes), ncol)]
    shapes: list[Shape] = [Text(MARGIN, MARGIN + 12, picture.title, TITLE_SIZE, anchor="start", bold=True)]
    y = MARGIN + 12 + 18
    for note in picture.notes:
        y += 20
        shapes.append(Text(MARGIN, y, note, NOTE_SIZE, anchor="start", fill="#222222"))
    top = y + 28
    for k, box in enumerate(boxes):
        i, j = divmod(k, ncol)
        x = MARGIN + sum(col_w[:j]) + GAP * j
        shapes += _panel_shapes(k, box, x, top + sum(row_h[:i]) + GAP * i)
    panels_w = sum(col_w) + GAP * (ncol - 1)
    key_w, key_h = _key_size(picture)
    shapes += _key_shapes(picture, MARGIN + panels_w + GAP, top)
    text_w = max([_text_width(picture.title, TITLE_SIZE, bold=True)] +
                 [_text_width(n, NOTE_SIZE) for n in picture.notes])
    width = max(MARGIN + panels_w + GAP + key_w, MARGIN + text_w) + MARGIN
    height = top + max(sum(row_h) + GAP * (len(row_h) - 1), key_h) + MARGIN
    return Scene(math.ceil(width), math.ceil(height), picture.title, shapes)


# ------------------------------------------------------------------ SVG

def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _svg_shape(shape: Shape) -> list[str]:
    if isinstance(shape, Group):
        inner = [f"  {line}" for s in shape.shapes for line in _svg_shape(s)]
        return [f'<g class="cell" id={quoteattr(shape.ident)}>',
                f"  <title>{escape(shape.tip)}</title>", *inner, "</g>"]
    if isinstance(shape, Rect):
        return [f'<rect x="{_num(shape.x)}" y="{_num(shape.y)}" width="{_num(shape.w)}" '
                f'height="{_num(shape.h)}" fill="{shape.fill}" stroke="{shape.stroke}" '
                f'stroke-width="{_num(shape.width)}"/>']
    if isinstance(shape, Line):
        return [f'<line x1="{_num(shape.x1)}" y1="{_num(shape.y1)}" x2="{_num(shape.x2)}" '
                f'y2="{_num(shape.y2)}" stroke="{shape.stroke}" stroke-width="{_num(shape.width)}"/>']
    # Text: y is the visual centre; the baseline sits 0.35 em lower (no dominant-baseline,
    # which some SVG 1.1 viewers ignore).
    base = shape.y + 0.35 * shape.size
    attrs = (f'x="{_num(shape.x)}" y="{_num(base)}" font-size="{_num(shape.size)}" '
             f'text-anchor="{shape.anchor}" fill="{shape.fill}"')
    if shape.bold:
        attrs += ' font-weight="bold"'
    if shape.rotate:
        # SVG rotates clockwise for positive angles; Text.rotate is counter-clockwise.
        # Turned a quarter clockwise, the glyphs stand to the right of their baseline,
        # so the baseline goes 0.35 em left of the wanted centre (and right for ccw).
        bx = shape.x - math.copysign(0.35 * shape.size, -shape.rotate)
        attrs = (f'x="{_num(bx)}" y="{_num(shape.y)}" font-size="{_num(shape.size)}" '
                 f'text-anchor="{shape.anchor}" fill="{shape.fill}" '
                 f'transform="rotate({_num(-shape.rotate)} {_num(bx)} {_num(shape.y)})"')
    return [f"<text {attrs}>{escape(shape.text)}</text>"]


def to_svg(picture: Picture) -> str:
    """The picture as a standalone SVG 1.1 document (a str)."""
    scene = layout(picture)
    head = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{scene.width}" '
        f'height="{scene.height}" viewBox="0 0 {scene.width} {scene.height}" '
        f'font-family={quoteattr(FONT)}>',
        f"<title>{escape(scene.title)}</title>",
        f'<rect x="0" y="0" width="{scene.width}" height="{scene.height}" fill="#ffffff"/>',
    ]
    body = [line for shape in scene.shapes for line in _svg_shape(shape)]
    return "\n".join(head + body + ["</svg>", ""])


def write_svg(picture: Picture, path: str | Path) -> Path:
    """Write the SVG to `path`; OSError (e.g. a missing directory) propagates."""
    path = Path(path)
    path.write_text(to_svg(picture), encoding="utf-8")
    return path


# ------------------------------------------------------------------ PNG

class MissingDependency(RuntimeError):
    """An optional dependency (matplotlib, for PNG) is not installed."""


def _agg():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as exc:
        raise MissingDependency(f"PNG output needs matplotlib ({exc}); {PLOT_HINT}") from exc
    return Figure, FigureCanvasAgg, Rectangle


DPI = 100  # 1 layout pixel = 1 PNG pixel


def _draw(ax, shape: Shape, Rectangle) -> None:
    pt = 72 / DPI  # font sizes are in pixels; matplotlib wants points
    if isinstance(shape, Group):
        for s in shape.shapes:
            _draw(ax, s, Rectangle)
    elif isinstance(shape, Rect):
        ax.add_patch(Rectangle((shape.x, shape.y), shape.w, shape.h,
                               facecolor=shape.fill if shape.fill != "none" else "none",
                               edgecolor=shape.stroke if shape.stroke != "none" else "none",
                               linewidth=shape.width * pt, joinstyle="miter"))
    elif isinstance(shape, Line):
        ax.plot([shape.x1, shape.x2], [shape.y1, shape.y2], color=shape.stroke,
                linewidth=shape.width * pt, solid_capstyle="butt")
    else:
        ha = {"start": "left", "middle": "center", "end": "right"}[shape.anchor]
        if shape.rotate:
            ax.text(shape.x, shape.y, shape.text, fontsize=shape.size * pt, ha="center",
                    va="center", rotation=shape.rotate, color=shape.fill,
                    fontweight="bold" if shape.bold else "normal")
        else:
            ax.text(shape.x, shape.y + 0.35 * shape.size, shape.text, fontsize=shape.size * pt,
                    ha=ha, va="baseline", color=shape.fill,
                    fontweight="bold" if shape.bold else "normal")


def to_png(picture: Picture) -> bytes:
    """The picture as PNG bytes, drawn from the same layout as the SVG (needs matplotlib)."""
    Figure, FigureCanvasAgg, Rectangle = _agg()
    scene = layout(picture)
    fig = Figure(figsize=(scene.width / DPI, scene.height / DPI), dpi=DPI, facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, scene.width)
    ax.set_ylim(scene.height, 0)
    ax.set_axis_off()
    for shape in scene.shapes:
        _draw(ax, shape, Rectangle)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white", metadata={"Title": scene.title})
    return buf.getvalue()


def write_png(picture: Picture, path: str | Path) -> Path:
    """Render, then write; MissingDependency before touching `path`, OSError from writing."""
    data = to_png(picture)
    path = Path(path)
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------ text

def to_text(picture: Picture) -> str:
    """Plain-text version: each panel as a grid of one-line labels ("T5 r1.hi")."""
    lines = [picture.title, *picture.notes]
    for grid in picture.panels:
        rows, cols = grid.shape
        flat = [[label.replace("\n", " ") for label in row] for row in grid.labels]
        width = max(len(s) for row in flat for s in row) + 2
        lines += ["", grid.title,
                  f"{grid.row_name[:4]:>4}" + "".join(f"{c:>{width}}" for c in range(cols))]
        for r in range(rows):
            mark = ["*" if grid.highlight is not None and grid.highlight[r, c] else "" for c in range(cols)]
            row = "".join(f"{flat[r][c] + mark[c]:>{width}}" for c in range(cols))
            note = f"   {grid.row_notes[r]}" if grid.row_notes else ""
            lines.append(f"{r:>4}{row}{note}")
    if picture.highlight_note:
        lines += ["", f"* = {picture.highlight_note}"]
    return "\n".join(lines)


__all__ = ["PALETTE", "HIGHLIGHT", "PLOT_HINT", "OPERANDS", "Grid", "Picture", "Scene",
           "MissingDependency", "colour", "ink", "mma_picture", "ldst_picture",
           "movmatrix_picture", "fragment_picture", "bank_picture", "BANK_PREFIX",
           "BANK_ACCESSES", "bank_presets", "bank_preset_picture", "names", "picture", "layout", "to_svg",
           "write_svg", "to_png", "write_png", "to_text"]
