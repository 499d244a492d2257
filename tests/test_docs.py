"""The commands in docs/*.md still run and still print what the docs say.

The convention (also stated at the top of docs/walkthrough.md):

* A fenced block whose info string is ``console`` is a transcript, and every
  one of them is run. ``$ `` starts a command; lines starting with ``> ``
  right after it continue the same command (a here-document, a long line);
  every other line, up to the next ``$ ``, is the output the command must
  print (stdout and stderr together). A line that is exactly ``...`` stands
  for any number of output lines, including none. Trailing spaces and
  trailing blank lines are ignored; everything else must match exactly, and
  the command must exit 0.
* Commands run with bash from the repository root, on the CPU: CUDA devices
  are hidden, so anything that would need a GPU fails instead of quietly
  printing other numbers. ``python`` and ``ptx-lab`` are the interpreter
  running this test (``ptx-lab`` = ``python -m ptx_lab``, as the README says),
  so the venv's packages are used even where the console script is not
  installed.
* A path under ``docs/img/`` in a command is redirected to a temporary
  directory (and the directory is named ``docs/img/`` again in what the
  command prints): running the docs never rewrites the committed images, and
  each image command is shown to still produce its file. Commands that write there
  are skipped, with the reason, where matplotlib is not installed (CI installs it).
* Every image a doc shows (``![...](img/NAME)``) sits directly next to (only
  blank lines between) a console block with the command that made it,
  ``docs/img/NAME`` by name; every file in docs/img is shown somewhere.
* A link whose text is one code span and whose target is a file of the
  repository, ``[`consumer_tile`](../kernel/dstate_scan.cu)``, is a pointer
  into the source: the named text must still occur in that file (the kernel
  is tuned concurrently; a rename must update the walkthrough). Docs point at
  names, never at line numbers.

Numbers only a GPU can produce (timings, ncu counters) are never in console
blocks; the docs quote them with command, date and card, or link BENCHMARKS.md.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
IMG = DOCS / "img"
DOC_FILES = sorted(DOCS.glob("*.md"))
ELLIPSIS = "..."
TIMEOUT_S = 300
IMG_PREFIX = "docs/img/"

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w.+-]*)")
IMAGE = re.compile(r"!\[[^\]]*\]\((img/[^)\s]+)\)")
SOURCE_POINTER = re.compile(r"\[`([^`]+)`\]\(([^)\s#]+)\)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")
LINE_NUMBER_POINTER = re.compile(r"\.(?:cu|cuh|py):\d+|#L\d+")


# ------------------------------------------------------------------ parsing

@dataclasses.dataclass
class Command:
    doc: Path
    line: int              # 1-based line of the `$ ` prompt
    command: str
    expected: list[str]

    @property
    def writes_image(self) -> bool:
        return IMG_PREFIX in self.command


@dataclasses.dataclass
class Block:
    doc: Path
    start: int             # 1-based line of the opening fence
    end: int               # 1-based line of the closing fence
    info: str
    lines: list[str]

    @property
    def commands(self) -> list[Command]:
        return parse_console(self)


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of `doc` (info string lower-cased)."""
    out: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{doc.name}:{start + 1}: fence never closed")
        out.append(Block(doc, start + 1, i + 1, info, body))
        i += 1
    return out


def parse_console(block: Block) -> list[Command]:
    cmds: list[Command] = []
    for k, text in enumerate(block.lines):
        where = f"{block.doc.name}:{block.start + 1 + k}"
        if text.startswith("$ "):
            cmds.append(Command(block.doc, block.start + 1 + k, text[2:], []))
        elif not cmds:
            raise AssertionError(f"{where}: a console block must start with a `$ ` command, got {text!r}")
        elif text.startswith("> ") and not cmds[-1].expected:
            cmds[-1].command += "\n" + text[2:]
        elif text == ">" and not cmds[-1].expected:
            cmds[-1].command += "\n"
        else:
            cmds[-1].expected.append(text)
    if not cmds:
        raise AssertionError(f"{block.doc.name}:{block.start}: empty console block")
    return cmds


def console_blocks() -> list[Block]:
    return [b for doc in DOC_FILES for b in blocks(doc) if b.info == "console"]


# ------------------------------------------------------------------ matching

def _norm(lines: list[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and out[-1] == "":
        out.pop()
    return out


def matches(expected: list[str], got: list[str]) -> bool:
    """Line-by-line equality where an `...` line matches any run of lines (also none)."""
    exp, out = _norm(expected), _norm(got)

    def at(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(out)
        if exp[i] == ELLIPSIS:
            return any(at(i + 1, k) for k in range(j, len(out) + 1))
        return j < len(out) and exp[i] == out[j] and at(i + 1, j + 1)

    return at(0, 0)


def test_matcher():
    assert matches(["a", "b"], ["a", "b", ""])
    assert matches(["a", "...", "z"], ["a", "z"])
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert matches(["...", "c"], ["a", "b", "c"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "b"])
    assert not matches(["a", "...", "z"], ["a", "b"])
    assert matches(["x  "], ["x"])


# ------------------------------------------------------------------ running

def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _shims(bin_dir: Path) -> None:
    """`python` and `ptx-lab` in bin_dir: the interpreter running the tests."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, args in (("python", ""), ("python3", ""), ("ptx-lab", " -m ptx_lab")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run(cmd: Command, tmp: Path) -> subprocess.CompletedProcess:
    bin_dir = tmp / "bin"
    _shims(bin_dir)
    out_dir = tmp / "img"
    out_dir.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               CUDA_VISIBLE_DEVICES="", MPLBACKEND="Agg", COLUMNS="100", LC_ALL="C.UTF-8")
    script = cmd.command.replace(IMG_PREFIX, f"{out_dir}/")
    proc = subprocess.run(["bash", "-c", "set -o pipefail\n" + script], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT_S)
    proc.stdout = proc.stdout.replace(f"{out_dir}/", IMG_PREFIX)
    return proc


BLOCKS = console_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.doc.name}:{b.start}" for b in BLOCKS])
def test_console_block(block: Block, tmp_path: Path):
    cmds = block.commands
    if any(c.writes_image for c in cmds) and not _has_matplotlib():
        pytest.skip("matplotlib is not installed (CI installs it): image commands not run")
    for cmd in cmds:
        proc = run(cmd, tmp_path)
        got = proc.stdout.splitlines()
        where = f"{cmd.doc.relative_to(REPO)}:{cmd.line}: $ {cmd.command}"
        assert proc.returncode == 0, f"{where}\nexited {proc.returncode}:\n{proc.stdout}"
        assert matches(cmd.expected, got), (
            f"{where}\n--- the doc says\n" + "\n".join(cmd.expected)
            + "\n--- the command printed\n" + proc.stdout)
        for name in re.findall(re.escape(IMG_PREFIX) + r"([\w.-]+)", cmd.command):
            made = tmp_path / "img" / name
            assert made.is_file() and made.stat().st_size > 0, f"{where}\ndid not write {IMG_PREFIX}{name}"
            if name.endswith(".png"):
                assert made.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{where}: {name} is not a PNG"


def test_there_are_console_blocks():
    assert any(b.doc.name == "walkthrough.md" for b in BLOCKS), "docs/walkthrough.md has no console blocks"


# ------------------------------------------------------------------ images

def _image_refs() -> list[tuple[Path, int, str]]:
    refs = []
    for doc in DOC_FILES:
        for n, text in enumerate(doc.read_text().splitlines(), 1):
            refs += [(doc, n, m) for m in IMAGE.findall(text)]
    return refs


def _neighbour_blocks(doc: Path, line: int) -> list[Block]:
    """Console blocks separated from `line` by blank lines only."""
    lines = doc.read_text().splitlines()
    out = []
    for b in blocks(doc):
        if b.info != "console":
            continue
        between = lines[b.end:line - 1] if b.end < line else lines[line:b.start - 1]
        if all(not t.strip() for t in between):
            out.append(b)
    return out


def test_every_image_has_its_command_next_to_it():
    for doc, line, rel in _image_refs():
        where = f"{doc.name}:{line}: {rel}"
        assert (DOCS / rel).is_file(), f"{where}: the image is not committed"
        made_here = [c for b in _neighbour_blocks(doc, line) for c in b.commands
                     if f"docs/{rel}" in c.command]
        assert made_here, f"{where}: no console block right next to it runs a command that writes docs/{rel}"


def test_every_committed_image_is_shown():
    shown = {rel for _, _, rel in _image_refs()}
    for path in sorted(IMG.glob("*")) if IMG.is_dir() else []:
        assert f"img/{path.name}" in shown, f"docs/img/{path.name} is committed but no doc shows it"


# ------------------------------------------------------------------ pointers into the source

def test_source_pointers_name_what_is_there():
    for doc in DOC_FILES:
        text = doc.read_text()
        for name, target in SOURCE_POINTER.findall(text):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.is_file(), f"{doc.name}: [`{name}`]({target}): no such file"
            assert name in path.read_text(), (
                f"{doc.name}: [`{name}`]({target}): `{name}` no longer occurs in "
                f"{path.relative_to(REPO)}; update the walkthrough")


def test_links_resolve_and_no_line_numbers():
    for doc in DOC_FILES:
        text = doc.read_text()
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: link to {target}: no such file"
        bad = LINE_NUMBER_POINTER.findall(text)
        assert not bad, f"{doc.name}: points at line numbers {bad}; name the function or constant instead"
