"""Pictures of fragment and bank maps: SVG cells against the PTX ISA formulas, PNG, CLI.

Expected lanes and registers are written out here from the ISA's closed forms
(g = lane // 4, t = lane % 4), not taken from ptx_lab.fragments, so a picture
that drew the wrong map would fail.
"""
from __future__ import annotations

import importlib.util
import struct
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ptx_lab import cli, pictures

SVG_NS = "{http://www.w3.org/2000/svg}"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(
    not HAS_MATPLOTLIB, reason="matplotlib is not installed (pip install 'ptx-lab[plot]')")
HALF = ("lo", "hi")


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
            "highlight": any(r.get("stroke") == pictures.HIGHLIGHT for r in rects[1:]),
        }
    return cells


def svg_of(name: str) -> str:
    return pictures.to_svg(pictures.picture(name))


def label(lane: int, reg: int, half: int | None) -> list[str]:
    return [f"T{lane}", f"r{reg}" + ("" if half is None else f".{HALF[half]}")]


# ------------------------------------------------------------------ closed forms (ISA)

def isa_mma_c(r: int, c: int) -> tuple[int, int, None]:
    """C[r][c] (16x8 fp32): lane 4(r % 8) + (c % 8) // 2, register 2(r // 8) + c % 2."""
    return 4 * (r % 8) + (c % 8) // 2, 2 * (r // 8) + c % 2, None


def isa_mma_a(r: int, c: int) -> tuple[int, int, int]:
    """A[r][c] (16x16): a0 rows 0..7 cols 0..7, a1 rows 8..15, a2 cols 8..15, a3 both."""
    return 4 * (r % 8) + (c % 8) // 2, (r // 8) + 2 * (c // 8), c % 2


def isa_mma_b(k: int, n: int) -> tuple[int, int, int]:
    """B[k][n] (16x8): lane 4n + (k % 8) // 2, register k // 8, half k % 2."""
    return 4 * n + (k % 8) // 2, k // 8, k % 2


def isa_m8n8(r: int, c: int) -> tuple[int, int, int]:
    return 4 * r + c // 2, 0, c % 2


def isa_m8n8_trans(r: int, c: int) -> tuple[int, int, int]:
    return 4 * c + r // 2, 0, r % 2


MMA_CASES = {"mma.a": (16, 16, isa_mma_a), "mma.b": (16, 8, isa_mma_b), "mma.c": (16, 8, isa_mma_c),
             "m8n8": (8, 8, isa_m8n8), "m8n8.trans": (8, 8, isa_m8n8_trans)}


# ------------------------------------------------------------------ SVG: fragment maps

@pytest.mark.parametrize("operand", sorted(MMA_CASES))
def test_svg_has_one_cell_per_element_labelled_by_the_isa(operand):
    rows, cols, isa = MMA_CASES[operand]
    cells = svg_cells(svg_of(operand))
    assert sorted(cells) == [(0, r, c) for r in range(rows) for c in range(cols)]
    for (_, r, c), cell in cells.items():
        assert cell["texts"] == label(*isa(r, c)), (r, c)


def test_svg_mma_c_known_cells():
    cells = svg_cells(svg_of("mma.c"))
    assert cells[0, 0, 0]["texts"] == ["T0", "r0"]
    assert cells[0, 3, 5]["texts"] == ["T14", "r1"]
    assert cells[0, 9, 2]["texts"] == ["T5", "r2"]
    assert cells[0, 15, 7]["texts"] == ["T31", "r3"]
    assert cells[0, 9, 2]["tip"] == "C[9][2]: lane 5, register 2"


def test_svg_mma_a_tip_names_the_bits():
    cells = svg_cells(svg_of("mma.a"))
    assert cells[0, 8, 9]["texts"] == ["T0", "r3.hi"]
    assert cells[0, 8, 9]["tip"] == "A[8][9]: lane 0, register 3, bits 16..31"


@pytest.mark.parametrize("instr", ["ldmatrix", "stmatrix"])
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_svg_ldmatrix_stmatrix_one_panel_per_matrix(instr, num, trans):
    name = f"{instr}.x{num}" + (".trans" if trans else "")
    isa = isa_m8n8_trans if trans else isa_m8n8
    cells = svg_cells(svg_of(name))
    assert sorted(cells) == [(i, r, c) for i in range(num) for r in range(8) for c in range(8)]
    for (i, r, c), cell in cells.items():
        lane, _, half = isa(r, c)
        assert cell["texts"] == label(lane, i, half), (i, r, c)  # register i holds matrix i
    # Row r of matrix i lives at the address lane 8i + r supplies.
    svg = svg_of(name)
    for i in range(num):
        for r in range(8):
            assert f">addr T{8 * i + r}<" in svg


def test_svg_movmatrix_source_and_destination():
    cells = svg_cells(svg_of("movmatrix"))
    assert len(cells) == 2 * 64
    for r in range(8):
        for c in range(8):
            assert cells[0, r, c]["texts"] == label(*isa_m8n8(r, c))
            assert cells[1, r, c]["texts"] == label(*isa_m8n8_trans(r, c))


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
    assert len(set(pictures.PALETTE)) == 32
    assert pictures.HIGHLIGHT not in pictures.PALETTE
    for fill in pictures.PALETTE:
        text = pictures.ink(fill)
        lum = [pictures._luminance(c) for c in (fill, text)]
        contrast = (max(lum) + 0.05) / (min(lum) + 0.05)
        assert contrast >= 4.5, (fill, text, contrast)  # WCAG AA for normal text


def test_text_output_of_new_operands():
    text = pictures.to_text(pictures.picture("ldmatrix.x1.trans"))
    lines = text.splitlines()
    assert lines[0] == "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16"
    row1 = next(line for line in lines if line.startswith("   1 "))
    assert row1.split()[1:4] == ["T0", "r0.hi", "T4"] and row1.endswith("addr T1")


# ------------------------------------------------------------------ bank pictures

def test_bank_picture_labels_banks_and_outlines_conflicts():
    banks = (np.arange(4 * 32).reshape(4, 32) * 2) % 32          # a 2-way conflicting stride
    conflicts = np.zeros_like(banks, dtype=bool)
    conflicts[0, :] = True
    svg = pictures.to_svg(pictures.bank_picture("stride 2", banks, conflicts))
    cells = svg_cells(svg)
    assert len(cells) == banks.size
    for (_, r, c), cell in cells.items():
        assert cell["texts"] == [str(banks[r, c])]
        assert cell["fill"] == pictures.PALETTE[banks[r, c]]
        assert cell["highlight"] == conflicts[r, c]
    assert "colour = bank" in svg and "conflicting access" in svg


def test_bank_picture_errors_name_the_argument():
    with pytest.raises(ValueError, match="banks"):
        pictures.bank_picture("t", np.full((2, 2), 32))
    with pytest.raises(ValueError, match="conflicts"):
        pictures.bank_picture("t", np.zeros((2, 2), dtype=int), np.zeros((3, 2), dtype=bool))


def test_grid_errors_name_the_argument():
    with pytest.raises(ValueError, match="labels"):
        pictures.Grid("t", np.zeros((2, 2), dtype=int), [["a", "b"]])
    with pytest.raises(ValueError, match="highlight"):
        pictures.Grid("t", np.zeros((1, 2), dtype=int), [["a", "b"]], highlight=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="operand"):
        pictures.fragment_picture("mma.d")


# ------------------------------------------------------------------ PNG

def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@needs_matplotlib
@pytest.mark.parametrize("name", ["mma.a", "ldmatrix.x4", "movmatrix"])
def test_png_is_a_png_of_the_layout_size(name):
    picture = pictures.picture(name)
    width, height = png_size(pictures.to_png(picture))
    scene = pictures.layout(picture)
    assert (width, height) == (scene.width, scene.height)
    assert 400 <= width <= 3000 and 300 <= height <= 2000


def test_png_without_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails
    with pytest.raises(pictures.MissingDependency, match=r"pip install 'ptx-lab\[plot\]'"):
        pictures.to_png(pictures.picture("mma.c"))


# ------------------------------------------------------------------ CLI

def test_cli_writes_svg_and_png(tmp_path, capsys):
    svg, png = tmp_path / "c.svg", tmp_path / "c.png"
    args = ["show", "mma.c", "--svg", str(svg)] + (["--png", str(png)] if HAS_MATPLOTLIB else [])
    assert cli.main(args) == 0
    assert svg_cells(svg.read_text())[0, 9, 2]["texts"] == ["T5", "r2"]
    out = capsys.readouterr().out
    assert f"wrote {svg}" in out
    if HAS_MATPLOTLIB:
        assert png_size(png.read_bytes())[0] > 400 and f"wrote {png}" in out


def test_cli_text_stays_the_default(capsys):
    from ptx_lab import fragments

    assert cli.main(["show", "mma.c"]) == 0
    assert capsys.readouterr().out == fragments.show("mma.c") + "\n"
    assert cli.main(["show", "movmatrix"]) == 0
    assert capsys.readouterr().out.startswith("movmatrix.sync.aligned.m8n8.trans.b16")


def test_cli_unknown_operand(capsys):
    assert cli.main(["show", "mma.x", "--svg", "never.svg"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown operand 'mma.x'" in err
    for name in ("mma.a", "ldmatrix.x4.trans", "stmatrix.x2", "movmatrix"):
        assert name in err


def test_cli_unwritable_path(tmp_path, capsys):
    missing = tmp_path / "no such dir" / "x.svg"
    assert cli.main(["show", "mma.a", "--svg", str(missing)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"cannot write --svg {missing}" in err and "No such file or directory" in err


def test_cli_png_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    svg, png = tmp_path / "a.svg", tmp_path / "a.png"
    assert cli.main(["show", "mma.a", "--svg", str(svg), "--png", str(png)]) == cli.EXIT_USAGE
    assert "pip install 'ptx-lab[plot]'" in capsys.readouterr().err
    assert not png.exists() and not svg.exists()  # fails before writing anything
    assert cli.main(["show", "mma.a", "--svg", str(svg)]) == 0  # --svg alone still works
    assert svg.exists()


# ------------------------------------------------------------------ bank presets (ptx_lab.banks)

def banks_module():
    return pytest.importorskip("ptx_lab.banks", reason="ptx_lab/banks.py is not in this tree")


def test_banks_plain_rows_ldmatrix_conflicts_8_way():
    """256-byte rows: every row starts in bank 0, so the 8 rows of each ldmatrix phase collide.

    Closed form: cell (r, c) of bf16 rows of 256 bytes is at byte 256r + 2c, bank (c // 2) % 32;
    ldmatrix.x4 in mma-A order reads matrix i = r // 8 + 2 (c // 8) of the 16x16 block from
    lane 8i + r % 8.
    """
    banks_module()
    picture = pictures.picture("banks:op_plain256")
    assert "ldmatrix.x4" in picture.title and "8-way" in picture.title
    cells = svg_cells(pictures.to_svg(picture))
    rows, cols = picture.panels[0].shape
    assert (rows, cols) == (16, 32) and len(cells) == rows * cols
    for (_, r, c), cell in cells.items():
        bank = (c // 2) % 32
        assert cell["fill"] == pictures.PALETTE[bank]
        in_block = c < 16
        lane = 8 * (r // 8 + 2 * (c // 8)) + r % 8
        assert cell["texts"] == ([str(bank), f"T{lane}"] if in_block else [str(bank)]), (r, c)
        assert cell["highlight"] == in_block, (r, c)


def test_banks_padded_rows_are_conflict_free():
    banks_module()
    picture = pictures.picture("banks:op_pad272")
    assert "4 wavefronts (1-way)" in picture.title
    assert not np.asarray(picture.panels[0].highlight).any()
    column = pictures.picture("banks:qk_stride130")  # lane l reads [l][0]: odd half-stride
    assert "1-way" in column.title and not np.asarray(column.panels[0].highlight).any()
    plain = pictures.picture("banks:qk_stride128:column")  # 256-byte rows: all in bank 0
    assert "32-way" in plain.title
    assert np.asarray(plain.panels[0].highlight)[:, 0].all()


def test_cli_banks(tmp_path, capsys):
    banks_module()
    svg = tmp_path / "b.svg"
    assert cli.main(["show", "banks:op_pad272", "--svg", str(svg)]) == 0
    assert len(svg_cells(svg.read_text())) == 16 * 32
    assert cli.main(["show", "banks:op_pad272"]) == 0
    assert "4 wavefronts" in capsys.readouterr().out
    assert cli.main(["show", "banks:nope"]) == cli.EXIT_USAGE
    assert "preset must be one of" in capsys.readouterr().err
    assert cli.main(["show", "banks:op_pad272:diagonal"]) == cli.EXIT_USAGE
    assert "access (after banks:op_pad272:) must be one of ldmatrix, column, none" in capsys.readouterr().err
    assert cli.main(["show", "banks:qk_stride130:ldmatrix"]) == cli.EXIT_USAGE
    assert "16-byte aligned" in capsys.readouterr().err
