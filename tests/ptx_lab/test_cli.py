"""The ptx-lab command: its own errors, `show`, and the subcommands other packages declare."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from ptx_lab import cli, commands, fragments, pictures, render

REPO = Path(__file__).resolve().parents[2]
DECLARED = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][commands.GROUP]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOOLS = ("check", "bench", "profile", "racecheck", "resources", "floors", "kda-precision", "cp-check", "source-ab", "stalls")


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          **kwargs)


# ------------------------------------------------------------------ its own errors

def test_an_unknown_flag_is_named(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--bogus"])
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ptx-lab: error: unrecognized arguments: --bogus" in err
    assert "required" not in err


def test_no_command_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == cli.EXIT_USAGE
    assert "a command is needed: one of bench, check, cp-check, floors, kda-precision, list, profile, racecheck, resources, run, show, source-ab, stalls" \
        in capsys.readouterr().err


# ------------------------------------------------------------------ show

@pytest.mark.parametrize("typed, meant", [("mma.A", "mma.a"), ("MMA.C", "mma.c"), ("M8N8.Trans", "m8n8.trans")])
def test_operand_names_in_any_case(typed, meant, capsys):
    assert cli.main(["show", typed]) == 0
    assert capsys.readouterr().out == fragments.show(meant) + "\n"


def test_bank_maps_in_any_case(capsys):
    assert cli.main(["show", "banks:op_pad272"]) == 0
    lower = capsys.readouterr().out
    assert cli.main(["show", "Banks:OP_pad272:LDMATRIX"]) == 0
    assert capsys.readouterr().out == lower             # ldmatrix is that preset's default access


def test_an_unknown_operand_is_still_refused(capsys):
    assert cli.main(["show", "mma.d"]) == cli.EXIT_USAGE
    assert "unknown operand 'mma.d'; valid operands: mma.a," in capsys.readouterr().err


def test_show_writes_svg_and_png(tmp_path, capsys):
    svg, png = tmp_path / "c.svg", tmp_path / "c.png"
    args = ["show", "mma.c", "--svg", str(svg)] + (["--png", str(png)] if HAS_MATPLOTLIB else [])
    assert cli.main(args) == 0
    assert svg.read_text() == render.to_svg(pictures.picture("mma.c"))
    out = capsys.readouterr().out
    assert f"wrote {svg}" in out
    if HAS_MATPLOTLIB:
        assert png.read_bytes()[:8] == PNG_MAGIC and f"wrote {png}" in out


def test_show_text_stays_the_default(capsys):
    assert cli.main(["show", "mma.c"]) == 0
    assert capsys.readouterr().out == fragments.show("mma.c") + "\n"
    assert cli.main(["show", "movmatrix"]) == 0
    assert capsys.readouterr().out.startswith("movmatrix.sync.aligned.m8n8.trans.b16")


def test_show_unknown_operand_lists_the_valid_ones(capsys):
    assert cli.main(["show", "mma.x", "--svg", "never.svg"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown operand 'mma.x'" in err
    for name in ("mma.a", "ldmatrix.x4.trans", "stmatrix.x2", "movmatrix"):
        assert name in err


def test_show_unwritable_path(tmp_path, capsys):
    missing = tmp_path / "no such dir" / "x.svg"
    assert cli.main(["show", "mma.a", "--svg", str(missing)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"cannot write --svg {missing}" in err and "No such file or directory" in err


def test_show_png_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    svg, png = tmp_path / "a.svg", tmp_path / "a.png"
    assert cli.main(["show", "mma.a", "--svg", str(svg), "--png", str(png)]) == cli.EXIT_USAGE
    assert "pip install 'ptx-lab[plot]'" in capsys.readouterr().err
    assert not png.exists() and not svg.exists()  # fails before writing anything
    assert cli.main(["show", "mma.a", "--svg", str(svg)]) == 0  # --svg alone still works
    assert svg.exists()


@pytest.mark.parametrize("option, name, suffix", [("--png", "x.jpg", ".png"), ("--svg", "x.png", ".svg")])
def test_show_refuses_a_file_name_of_another_format(option, name, suffix, tmp_path, capsys):
    path = tmp_path / name
    with pytest.raises(SystemExit) as exc:
        cli.main(["show", "mma.c", option, str(path)])
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument {option}: expected a file name ending in {suffix}, got '{path}'" in err
    assert not path.exists()


def test_show_takes_the_suffix_in_any_case(tmp_path, capsys):
    svg = tmp_path / "c.SVG"
    assert cli.main(["show", "mma.c", "--svg", str(svg)]) == 0
    assert svg.read_text() == render.to_svg(pictures.picture("mma.c"))


def test_show_bank_maps(tmp_path, capsys):
    svg = tmp_path / "b.svg"
    assert cli.main(["show", "banks:op_pad272", "--svg", str(svg)]) == 0
    assert svg.read_text() == render.to_svg(pictures.picture("banks:op_pad272"))
    assert cli.main(["show", "banks:op_pad272"]) == 0
    assert "4 wavefronts" in capsys.readouterr().out
    assert cli.main(["show", "banks:nope"]) == cli.EXIT_USAGE
    assert "preset must be one of" in capsys.readouterr().err
    assert cli.main(["show", "banks:op_pad272:diagonal"]) == cli.EXIT_USAGE
    assert "access (after banks:op_pad272:) must be one of ldmatrix, column, none" in capsys.readouterr().err
    assert cli.main(["show", "banks:qk_stride130:ldmatrix"]) == cli.EXIT_USAGE
    assert "16-byte aligned" in capsys.readouterr().err


def test_show_without_layouts_says_which_names_exist(monkeypatch, capsys):
    monkeypatch.setattr(pictures, "LAYOUT_GROUP", "ptx_lab.no_such_group")
    assert cli.main(["show", "banks:op_pad272"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no package declares a layout in the ptx_lab.no_such_group entry-point group" in err
    assert "the names show knows: mma.a, mma.b, mma.c," in err and "banks:" not in err.partition("knows:")[2]
    assert cli.main(["show", "mma.a"]) == 0                  # the fragment maps need no layout


# ------------------------------------------------------------------ subcommands of other packages

def test_every_tool_and_experiment_command_is_declared():
    assert set(DECLARED) == {"list", "run", *TOOLS}
    assert set(commands.entry_points()) >= set(DECLARED)
    for name in DECLARED:
        command = commands.load(commands.entry_points()[name])
        assert isinstance(command, commands.Command) and command.summary and "\n" not in command.summary
        assert callable(command.load())


def test_from_a_checkout_the_pyproject_declares_the_commands():
    # a plain copy of the tree has no entry-point metadata: ptx_lab reads the table itself
    eps = commands._checkout_entry_points()
    assert eps is not None, "ptx_lab was not imported from this checkout"
    assert {ep.name: ep.value for ep in eps} == DECLARED
    assert commands._checkout_entry_points(pyproject=REPO / "no" / "pyproject.toml") is None


def test_the_installed_metadata_declares_the_same_commands():
    try:
        installed = {ep.name: ep.value for ep in metadata.distribution(commands.DISTRIBUTION).entry_points
                     if ep.group == commands.GROUP}
    except metadata.PackageNotFoundError:
        installed = {}
    if not installed:
        pytest.skip("ptx-lab is not pip-installed here with its ptx_lab.commands entry points (a plain copy of "
                    "the tree, or an install made before they existed: pip install -e . again)")
    assert installed == DECLARED


def test_help_lists_the_commands_without_importing_them():
    code = ("import sys\n"
            "from ptx_lab import cli\n"
            "try:\n"
            "    cli.main(['--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('MODULES', sorted(m for m in sys.modules if m.startswith(('kernel.tools.', 'experiments.'))))\n")
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    help_text, _, modules = proc.stdout.rpartition("MODULES ")
    for name in (*DECLARED, "show"):
        assert f"\n    {name}" in help_text, name
    # the Commands' own modules only: no tool and no experiment was imported
    assert modules.strip() == "['experiments.commands']"


@pytest.mark.parametrize("name", [*TOOLS, "list", "run"])
def test_a_subcommands_help_names_what_was_typed(name, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ptx-lab {name} ")


def test_python_m_ptx_lab_is_the_same_command():
    proc = _python("-m", "ptx_lab", "resources", "--jobs", "0")
    assert proc.returncode == 2
    assert "usage: ptx-lab resources " in proc.stderr and "argument --jobs: must be >= 1" in proc.stderr


def test_a_command_that_cannot_load_says_so(capsys):
    ep = metadata.EntryPoint("gone", "kernel.tools.gone:GONE", commands.GROUP)
    assert cli._run_command("gone", ep, []) == cli.EXIT_USAGE
    assert "ptx-lab gone: cannot load kernel.tools.gone:GONE (ModuleNotFoundError" in capsys.readouterr().err
    with pytest.raises(ValueError, match="module:function"):
        commands.Command("a summary", "no_colon")


def test_a_reader_that_leaves_is_not_an_error():
    # `ptx-lab list | head -1`: stdout's reader is gone before the command writes
    for args in (["-m", "ptx_lab", "list"], ["-m", "ptx_lab", "show", "mma.a"]):
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err
        assert err == "", err


def test_list_prints_every_experiment(capsys):
    from experiments import NAMES

    assert cli.main(["list"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(NAMES)
