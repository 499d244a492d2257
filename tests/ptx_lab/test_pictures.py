"""Pictures of fragment and bank maps as data: every cell's key, label, tip and highlight
against the PTX ISA formulas and the bank closed forms.

Expected lanes and registers are written out here from the ISA's closed forms
(g = lane // 4, t = lane % 4), not taken from ptx_lab.fragments, so a picture
that held the wrong map would fail. How a picture is drawn is test_render.py.
"""
from __future__ import annotations

from importlib import metadata

import numpy as np
import pytest

from ptx_lab import commands, pictures

HALF = ("lo", "hi")


# ------------------------------------------------------------------ reading a picture's cells

def cells_of(picture: pictures.Picture) -> dict[tuple[int, int, int], dict]:
    """(panel, row, col) -> {"key", "texts", "tip", "highlight"} for every cell of every panel."""
    cells = {}
    for p, grid in enumerate(picture.panels):
        for r, c in np.ndindex(grid.shape):
            cells[p, r, c] = {
                "key": int(np.asarray(grid.keys)[r, c]),
                "texts": [t for t in grid.labels[r][c].split("\n") if t],
                "tip": grid.tips[r][c] if grid.tips is not None else None,
                "highlight": grid.highlight is not None and bool(np.asarray(grid.highlight)[r, c]),
            }
    return cells


def cells_named(name: str) -> dict[tuple[int, int, int], dict]:
    return cells_of(pictures.picture(name))


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


# ------------------------------------------------------------------ fragment maps

@pytest.mark.parametrize("operand", sorted(MMA_CASES))
def test_one_cell_per_element_labelled_by_the_isa(operand):
    rows, cols, isa = MMA_CASES[operand]
    cells = cells_named(operand)
    assert sorted(cells) == [(0, r, c) for r in range(rows) for c in range(cols)]
    for (_, r, c), cell in cells.items():
        assert cell["texts"] == label(*isa(r, c)), (r, c)


def test_mma_c_known_cells():
    cells = cells_named("mma.c")
    assert cells[0, 0, 0]["texts"] == ["T0", "r0"]
    assert cells[0, 3, 5]["texts"] == ["T14", "r1"]
    assert cells[0, 9, 2]["texts"] == ["T5", "r2"]
    assert cells[0, 15, 7]["texts"] == ["T31", "r3"]
    assert cells[0, 9, 2]["tip"] == "C[9][2]: lane 5, register 2"


def test_mma_a_tip_names_the_bits():
    cells = cells_named("mma.a")
    assert cells[0, 8, 9]["texts"] == ["T0", "r3.hi"]
    assert cells[0, 8, 9]["tip"] == "A[8][9]: lane 0, register 3, bits 16..31"


@pytest.mark.parametrize("instr", ["ldmatrix", "stmatrix"])
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_stmatrix_one_panel_per_matrix(instr, num, trans):
    name = f"{instr}.x{num}" + (".trans" if trans else "")
    isa = isa_m8n8_trans if trans else isa_m8n8
    picture = pictures.picture(name)
    cells = cells_of(picture)
    assert sorted(cells) == [(i, r, c) for i in range(num) for r in range(8) for c in range(8)]
    for (i, r, c), cell in cells.items():
        lane, _, half = isa(r, c)
        assert cell["texts"] == label(lane, i, half), (i, r, c)  # register i holds matrix i
    # Row r of matrix i lives at the address lane 8i + r supplies.
    for i, grid in enumerate(picture.panels):
        assert list(grid.row_notes) == [f"addr T{8 * i + r}" for r in range(8)]


def test_movmatrix_source_and_destination():
    cells = cells_named("movmatrix")
    assert len(cells) == 2 * 64
    for r in range(8):
        for c in range(8):
            assert cells[0, r, c]["texts"] == label(*isa_m8n8(r, c))
            assert cells[1, r, c]["texts"] == label(*isa_m8n8_trans(r, c))


def test_every_fragment_cell_is_keyed_by_its_lane():
    # the key decides the colour: the same lane, the same key, in every picture
    for name in pictures.OPERANDS:
        for cell in cells_named(name).values():
            assert cell["key"] == int(cell["texts"][0][1:]), name


def test_axis_names_and_key():
    picture = pictures.picture("mma.b")
    assert "m16n8k16" in picture.title and "B" in picture.title
    grid = picture.panels[0]
    assert (grid.row_name, grid.col_name) == ("row (k)", "col (n)")
    assert picture.key_name == "lane" and picture.highlight_note is None


# ------------------------------------------------------------------ bank pictures

def test_bank_picture_labels_banks_and_marks_conflicts():
    banks = (np.arange(4 * 32).reshape(4, 32) * 2) % 32          # a 2-way conflicting stride
    conflicts = np.zeros_like(banks, dtype=bool)
    conflicts[0, :] = True
    picture = pictures.bank_picture("stride 2", banks, conflicts)
    cells = cells_of(picture)
    assert len(cells) == banks.size
    for (_, r, c), cell in cells.items():
        assert cell["texts"] == [str(banks[r, c])]
        assert cell["key"] == banks[r, c]
        assert cell["highlight"] == conflicts[r, c]
    assert picture.key_name == "bank" and picture.highlight_note == "conflicting access"


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


# ------------------------------------------------------------------ bank presets (the ptx_lab.layouts group)

def presets_module():
    return pytest.importorskip("experiments.bank_presets", reason="experiments/ is not in this tree: no "
                                                                 "package declares the presets")


def test_from_a_checkout_the_kernel_a_presets_are_found():
    presets = presets_module()
    found = commands._checkout_entry_points(pictures.LAYOUT_GROUP)
    assert found is not None, "ptx_lab was not imported from this checkout"
    assert {ep.name: ep.value for ep in found} == {"kernel-a": "experiments.bank_presets:PRESETS"}
    assert pictures.bank_presets() == tuple(presets.PRESETS)
    assert pictures.names() == pictures.OPERANDS + tuple(f"banks:{p}" for p in presets.PRESETS)
    # the commands' reader, the same code, keeps the groups apart
    assert "kernel-a" not in commands.entry_points() and "show" not in commands.entry_points(pictures.LAYOUT_GROUP)


def test_a_layout_group_with_no_entries_leaves_no_presets(monkeypatch):
    monkeypatch.setattr(pictures, "LAYOUT_GROUP", "ptx_lab.no_such_group")
    assert pictures.bank_presets() == () and pictures.names() == pictures.OPERANDS
    with pytest.raises(ValueError, match="no package declares a layout in the ptx_lab.no_such_group entry-point "
                                         "group, so there is no banks:<preset>; the names show knows: mma.a, "):
        pictures.picture("banks:op_pad272")


def _declare(monkeypatch, **tables: str) -> None:
    """The layout group holds exactly `tables` (entry name -> "module:attribute")."""
    eps = {name: metadata.EntryPoint(name, value, pictures.LAYOUT_GROUP) for name, value in tables.items()}
    real = commands.entry_points
    monkeypatch.setattr(commands, "entry_points",
                        lambda group=commands.GROUP: eps if group == pictures.LAYOUT_GROUP else real(group))


@pytest.mark.parametrize("tables, message", [
    ({"gone": "experiments.gone:PRESETS"},
     "entry point gone = 'experiments.gone:PRESETS' cannot be loaded \\(ModuleNotFoundError: "),
    ({"odd": "math:pi"}, "must name a mapping of preset name -> ptx_lab.layouts.Layout, got a float"),
    ({"env": "os:environ"}, "maps '[^']*' to a str; expected str -> ptx_lab.layouts.Layout"),
    ({"a": "experiments.bank_presets:PRESETS", "b": "experiments.bank_presets:PRESETS"},
     "preset 'qk_stride128' is declared twice in ptx_lab.layouts: by a and by b"),
])
def test_a_bad_layout_table_is_named(monkeypatch, tables, message):
    if "experiments" in str(tables):
        presets_module()
    _declare(monkeypatch, **tables)
    with pytest.raises(ValueError, match=message):
        pictures.picture("banks:op_pad272")
    assert pictures.bank_presets() == ()      # the operands are still listed, without bank maps


def test_banks_plain_rows_ldmatrix_conflicts_8_way():
    """256-byte rows: every row starts in bank 0, so the 8 rows of each ldmatrix phase collide.

    Closed form: cell (r, c) of bf16 rows of 256 bytes is at byte 256r + 2c, bank (c // 2) % 32;
    ldmatrix.x4 in mma-A order reads matrix i = r // 8 + 2 (c // 8) of the 16x16 block from
    lane 8i + r % 8.
    """
    presets_module()
    picture = pictures.picture("banks:op_plain256")
    assert "ldmatrix.x4" in picture.title and "8-way" in picture.title
    cells = cells_of(picture)
    rows, cols = picture.panels[0].shape
    assert (rows, cols) == (16, 32) and len(cells) == rows * cols
    for (_, r, c), cell in cells.items():
        bank = (c // 2) % 32
        assert cell["key"] == bank
        in_block = c < 16
        lane = 8 * (r // 8 + 2 * (c // 8)) + r % 8
        assert cell["texts"] == ([str(bank), f"T{lane}"] if in_block else [str(bank)]), (r, c)
        assert cell["highlight"] == in_block, (r, c)


def test_banks_padded_rows_are_conflict_free():
    presets_module()
    picture = pictures.picture("banks:op_pad272")
    assert "4 wavefronts (1-way)" in picture.title
    assert not np.asarray(picture.panels[0].highlight).any()
    column = pictures.picture("banks:qk_stride130")  # lane l reads [l][0]: odd half-stride
    assert "1-way" in column.title and not np.asarray(column.panels[0].highlight).any()
    plain = pictures.picture("banks:qk_stride128:column")  # 256-byte rows: all in bank 0
    assert "32-way" in plain.title
    assert np.asarray(plain.panels[0].highlight)[:, 0].all()
