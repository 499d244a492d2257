"""Pictures drawn: the SVG holds exactly the picture's cells, in the key's colour; the SVG is
valid SVG 1.1 inside its canvas; the palette is legible; PNG and text come from the same picture.

What each cell holds is test_pictures.py; here the picture is the given and the drawing is
read back (the SVG's cell groups) and compared with it.
"""
from __future__ import annotations

import importlib.util
import struct
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ptx_lab import pictures, render

SVG_NS = "{http://www.w3.org/2000/svg}"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(
    not HAS_MATPLOTLIB, reason="matplotlib is not installed (pip install 'ptx-lab[plot]')")


# ------------------------------------------------------------------ reading an SVG back

def svg_cells(svg: str) -> dict[tuple[int, int, int], dict]:
    """(panel, row, col) -> {"fill", "texts", "tip", "highlight"} for every cell group."""
    root = ET.fromstring(svg)
    cells = {}
    for g in root.iter(f"{SVG_NS}g"):
        if g.get("class") != "cell":
            continue
        _, panel, row, col = g.get("id").split("-")
        rects = g.findall(f"{SVG_NS}rect")
        cells[int(panel), int(row), int(col)] = {
            "fill": rects[0].get("fill"),
            "texts": [t.text for t in g.findall(f"{SVG_NS}text")],
            "tip": g.find(f"{SVG_NS}title").text,
            "highlight": any(r.get("stroke") == render.HIGHLIGHT for r in rects[1:]),
        }
    return cells


def svg_of(name: str) -> str:
    return render.to_svg(pictures.picture(name))


# ------------------------------------------------------------------ SVG

@pytest.mark.parametrize("name", [*pictures.OPERANDS, "banks:op_plain256", "banks:qk_stride128:column"])
def test_svg_draws_exactly_the_pictures_cells(name):
    picture = pictures.picture(name)
    svg = render.to_svg(picture)
    cells = svg_cells(svg)
    expected = [(p, r, c) for p, grid in enumerate(picture.panels) for r, c in np.ndindex(grid.shape)]
    assert sorted(cells) == expected
    for (p, r, c), cell in cells.items():
        grid = picture.panels[p]
        key = int(np.asarray(grid.keys)[r, c])
        assert cell["fill"] == (render.PALETTE[key] if key >= 0 else render.BLANK), (p, r, c)
        assert cell["texts"] == [t for t in grid.labels[r][c].split("\n") if t], (p, r, c)
        assert cell["tip"] == grid.tips[r][c], (p, r, c)
        marked = grid.highlight is not None and bool(np.asarray(grid.highlight)[r, c])
        assert cell["highlight"] == marked, (p, r, c)
    texts = {t.text for t in ET.fromstring(svg).iter(f"{SVG_NS}text")}
    for grid in picture.panels:
        assert set(grid.row_notes or ()) <= texts   # e.g. "addr T5" beside each ldmatrix row


def test_svg_is_valid_svg_11_with_title_and_viewbox():
    svg = svg_of("mma.b")
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    assert root.get("version") == "1.1"
    w, h = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    assert root[0].tag == f"{SVG_NS}title" and "m16n8k16" in root[0].text and "B" in root[0].text
    # Every drawn thing lies inside the canvas.
    for rect in root.iter(f"{SVG_NS}rect"):
        assert 0 <= float(rect.get("x")) and float(rect.get("x")) + float(rect.get("width")) <= w
        assert 0 <= float(rect.get("y")) and float(rect.get("y")) + float(rect.get("height")) <= h
    for text in root.iter(f"{SVG_NS}text"):
        assert 0 <= float(text.get("x")) <= w and 0 <= float(text.get("y")) <= h
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "row (k) \u2192" in texts and "col (n) \u2192" in texts  # axis names
    assert "colour = lane" in texts                                 # the key


def test_lane_colours_are_the_same_in_every_picture():
    fill_of_lane: dict[int, set[str]] = {}
    for name in pictures.OPERANDS:
        for cell in svg_cells(svg_of(name)).values():
            lane = int(cell["texts"][0][1:])
            fill_of_lane.setdefault(lane, set()).add(cell["fill"])
    assert sorted(fill_of_lane) == list(range(32))
    assert all(len(fills) == 1 for fills in fill_of_lane.values()), fill_of_lane
    assert len({next(iter(f)) for f in fill_of_lane.values()}) == 32  # 32 distinct colours


def test_palette_is_legible():
    assert len(set(render.PALETTE)) == 32
    assert render.HIGHLIGHT not in render.PALETTE
    for fill in render.PALETTE:
        text = render.ink(fill)
        lum = [render._luminance(c) for c in (fill, text)]
        contrast = (max(lum) + 0.05) / (min(lum) + 0.05)
        assert contrast >= 4.5, (fill, text, contrast)  # WCAG AA for normal text


def test_bank_picture_svg_has_the_bank_key_and_the_highlight_legend():
    banks = (np.arange(4 * 32).reshape(4, 32) * 2) % 32
    conflicts = np.zeros_like(banks, dtype=bool)
    conflicts[0, :] = True
    svg = render.to_svg(pictures.bank_picture("stride 2", banks, conflicts))
    assert "colour = bank" in svg and "conflicting access" in svg
    assert sum(cell["highlight"] for cell in svg_cells(svg).values()) == 32


# ------------------------------------------------------------------ text

def test_text_output_of_new_operands():
    text = render.to_text(pictures.picture("ldmatrix.x1.trans"))
    lines = text.splitlines()
    assert lines[0] == "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16"
    row1 = next(line for line in lines if line.startswith("   1 "))
    assert row1.split()[1:4] == ["T0", "r0.hi", "T4"] and row1.endswith("addr T1")


# ------------------------------------------------------------------ PNG

def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@needs_matplotlib
@pytest.mark.parametrize("name", ["mma.a", "ldmatrix.x4", "movmatrix"])
def test_png_is_a_png_of_the_layout_size(name):
    picture = pictures.picture(name)
    width, height = png_size(render.to_png(picture))
    scene = render.layout(picture)
    assert (width, height) == (scene.width, scene.height)
    assert 400 <= width <= 3000 and 300 <= height <= 2000


def test_png_without_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails
    with pytest.raises(render.MissingDependency, match=r"pip install 'ptx-lab\[plot\]'"):
        render.to_png(pictures.picture("mma.c"))
