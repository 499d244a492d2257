"""A picture (:mod:`ptx_lab.pictures`) drawn: SVG, PNG or text.

One layout (:func:`layout`, pixel coordinates) feeds both images, so the SVG
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
from typing import Union
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from .pictures import Grid, Picture

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


def require_matplotlib() -> None:
    """MissingDependency, saying how to install it, where PNG output cannot work: lets a caller
    refuse before it writes anything."""
    _agg()


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


__all__ = ["PALETTE", "HIGHLIGHT", "BLANK", "PLOT_HINT", "Scene", "MissingDependency", "require_matplotlib",
           "colour", "ink", "layout", "to_svg", "write_svg", "to_png", "write_png", "to_text"]
