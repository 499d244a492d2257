"""Pictures of fragment maps and shared-memory bank maps, as plain data: what each cell holds.

A *picture* is one or more grids (:class:`Grid`) whose cells carry a colour
key (a lane, or a bank: 0..31), a short label and an optional highlight. The
builders below turn the closed-form maps of :mod:`ptx_lab.fragments` into
pictures; :func:`bank_picture` does the same for any bank-per-cell array, so
a picture does not depend on how a bank map is computed.

Nothing here draws: :mod:`ptx_lab.render` turns a picture into SVG, PNG or
text, and decides what a key looks like.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from . import commands, fragments
from .banks import Access, bank_map, ldmatrix_access, shared_access
from .layouts import Layout

WARP = fragments.WARP

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
    lanes = fragments.address_lanes(num)   # refuses a num other than 1, 2, 4
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
    The arrays come from whatever computes them (ptx_lab.banks.bank_map); this only
    turns them into cells.
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
LAYOUT_GROUP = "ptx_lab.layouts"  # entry points naming {preset: Layout} tables (ptx_lab.commands)
BANK_ACCESSES = ("ldmatrix", "column", "none")
SHOWN_BYTES = 64    # row bytes drawn (more only for a wider swizzle atom): ~1300 px wide
SHOWN_ROWS = 32     # most rows drawn: one per lane


def _preset_layouts() -> dict[str, Layout]:
    """name -> layout of every preset `banks:<preset>` draws: the tables other packages declare
    in the LAYOUT_GROUP entry-point group, each a mapping of preset name -> Layout, merged.

    ptx_lab knows no kernel's tiles; a package that has some names them in its pyproject.toml
    (this project: ``kernel-a = "experiments.bank_presets:PRESETS"``)."""
    out: dict[str, Layout] = {}
    owner: dict[str, str] = {}
    for entry, ep in commands.entry_points(LAYOUT_GROUP).items():
        try:
            table = ep.load()
        except Exception as exc:   # its package is missing from this tree, or broken: say which
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ValueError(f"the {LAYOUT_GROUP} entry point {entry} = {ep.value!r} cannot be loaded "
                             f"({exc.__class__.__name__}: {first})") from exc
        if not isinstance(table, Mapping):
            raise ValueError(f"the {LAYOUT_GROUP} entry point {entry} = {ep.value!r} must name a mapping "
                             f"of preset name -> ptx_lab.layouts.Layout, got a {type(table).__name__}")
        for name, layout in table.items():
            if not (isinstance(name, str) and isinstance(layout, Layout)):
                raise ValueError(f"the {LAYOUT_GROUP} entry point {entry} = {ep.value!r} maps {name!r} to a "
                                 f"{type(layout).__name__}; expected str -> ptx_lab.layouts.Layout")
            if name in owner:
                raise ValueError(f"preset {name!r} is declared twice in {LAYOUT_GROUP}: "
                                 f"by {owner[name]} and by {entry}")
            owner[name], out[name] = entry, layout
    return out


def bank_presets() -> tuple[str, ...]:
    """Names accepted after "banks:" (empty where no layout table can be loaded)."""
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
    """The bank map of a preset layout (one a LAYOUT_GROUP table names) under one warp access.

    spec: "<preset>" or "<preset>:<access>", access one of BANK_ACCESSES. The
    default is "column" for a tile of exactly 32 rows (one per lane: the
    token-strided reads of the q/k/gc presets) and "ldmatrix" otherwise.
    At most SHOWN_ROWS rows and SHOWN_BYTES bytes per row are drawn (top-left),
    or a whole swizzle atom row where that is wider: wider pictures shrink to
    unreadable text in most viewers, and every access drawn lies in that corner.
    """
    presets = _preset_layouts()  # says why when a table cannot be loaded, rather than listing none
    preset, _, access = spec.partition(":")
    if not presets:
        raise ValueError(f"no package declares a layout in the {LAYOUT_GROUP} entry-point group, so "
                         f"there is no banks:<preset>; the names show knows: {', '.join(names())}")
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


__all__ = ["OPERANDS", "Grid", "Picture", "mma_picture", "ldst_picture", "movmatrix_picture",
           "fragment_picture", "bank_picture", "BANK_PREFIX", "BANK_ACCESSES", "LAYOUT_GROUP", "bank_presets",
           "bank_preset_picture", "names", "picture"]
