"""kernel.tools.pytest_ledger: a real pytest, in a subprocess, on a small tree of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.tools.pytest_ledger import read_ledger, tree_fingerprint

REPO = Path(__file__).resolve().parents[3]

SUITE = '''
import os
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup fails")

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_skips():
    pytest.skip("not here")

def test_setup_errors(broken):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_counts(n):
    assert n > 0

def test_stops_the_run():
    if os.environ.get("STOP_HERE"):
        raise KeyboardInterrupt
'''


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir(parents=True)
    (tmp_path / "tests" / "test_suite.py").write_text(SUITE)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    return tmp_path


def _pytest(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    environ.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "kernel.tools.pytest_ledger", "-q",
                           "-p", "no:cacheprovider", *args], cwd=root, env=environ, capture_output=True, text=True)


def test_each_outcome_is_recorded_under_the_trees_fingerprint(tmp_path):
    root = _tree(tmp_path)
    ledger = root / "out" / "ledger.txt"
    run = _pytest(root, "--ledger", str(ledger))
    assert run.returncode == 1, run.stdout + run.stderr
    tree, outcomes = read_ledger(ledger)
    assert tree == tree_fingerprint(root)
    name = "tests/test_suite.py::"
    assert outcomes == {name + "test_passes": "passed", name + "test_fails": "failed",
                        name + "test_skips": "skipped", name + "test_setup_errors": "error",
                        name + "test_counts[1]": "passed", name + "test_counts[2]": "passed",
                        name + "test_stops_the_run": "passed"}
    assert "this run 4 passed, 1 failed, 1 error, 1 skipped; 3 of the 7 tests this run selected have not passed" \
        in run.stdout


def test_a_second_run_leaves_out_what_passed_and_reruns_the_rest(tmp_path):
    root = _tree(tmp_path)
    ledger = root / "ledger.txt"
    _pytest(root, "--ledger", str(ledger))
    run = _pytest(root, "--ledger", str(ledger))
    assert "4 deselected" in run.stdout, run.stdout
    assert "this run 1 failed, 1 error, 1 skipped" in run.stdout
    assert "4 more had passed in earlier runs of this tree" in run.stdout
    lines = ledger.read_text().splitlines()
    assert len(lines) == 1 + 7 + 3   # the header, the first run's seven, the second's three


def test_an_interrupted_run_keeps_the_tests_that_finished(tmp_path):
    root = _tree(tmp_path)
    ledger = root / "ledger.txt"
    run = _pytest(root, "--ledger", str(ledger), STOP_HERE="1")
    assert run.returncode == 2, run.stdout + run.stderr      # pytest's "interrupted"
    _, outcomes = read_ledger(ledger)
    assert len(outcomes) == 6 and not any(n.endswith("test_stops_the_run") for n in outcomes)
    finish = _pytest(root, "--ledger", str(ledger), "-k", "stops_the_run or counts")
    assert "this run 1 passed; all 1 tests this run selected passed" in finish.stdout, finish.stdout


def test_a_ledger_of_another_tree_is_refused(tmp_path):
    root = _tree(tmp_path)
    ledger = root / "ledger.txt"
    _pytest(root, "--ledger", str(ledger))
    (root / "tests" / "test_suite.py").write_text(SUITE + "\n# changed\n")
    run = _pytest(root, "--ledger", str(ledger))
    assert run.returncode == 4, run.stdout + run.stderr      # pytest's usage error
    assert "ran on other code" in run.stderr


def test_the_fingerprint_follows_the_sources_not_the_caches(tmp_path):
    root = _tree(tmp_path)
    before = tree_fingerprint(root)
    (root / "tests" / "__pycache__").mkdir()
    (root / "tests" / "__pycache__" / "x.py").write_text("cached")
    (root / "tests" / "notes.txt").write_text("not a source")
    assert tree_fingerprint(root) == before
    (root / "tests" / "test_suite.py").write_text(SUITE + " ")
    assert tree_fingerprint(root) != before


def test_a_malformed_ledger_line_is_named(tmp_path):
    path = tmp_path / "ledger.txt"
    path.write_text("# tree abc\nmaybe tests/x.py::t\n")
    with pytest.raises(ValueError, match="not a ledger line: 'maybe tests/x.py::t'"):
        read_ledger(path)


def test_under_xdist_the_controller_writes_each_test_once(tmp_path):
    pytest.importorskip("xdist")
    root = _tree(tmp_path)
    ledger = root / "ledger.txt"
    run = _pytest(root, "--ledger", str(ledger), "-n", "2")
    lines = [line for line in ledger.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == 7, run.stdout + run.stderr
    again = _pytest(root, "--ledger", str(ledger), "-n", "2")
    assert "this run 1 failed, 1 error, 1 skipped; 3 of the 3 tests this run selected have not passed" in again.stdout, \
        again.stdout


def test_under_xdist_a_ledger_outside_the_tree_needs_the_equals_form(tmp_path):
    # with no test path on the command line, xdist's workers read "--ledger FILE"'s FILE as the test path
    # (their rootdir then FILE's folder): the equals form works, and the other stops with the cause named
    pytest.importorskip("xdist")
    root = _tree(tmp_path / "tree")
    ledger = tmp_path / "out" / "ledger.txt"
    apart = _pytest(root, "--ledger", str(ledger), "-n", "2")
    assert apart.returncode != 0 and f"Write --ledger={ledger} (with '=')" in apart.stdout + apart.stderr, \
        apart.stdout + apart.stderr
    ledger.unlink()
    joined = _pytest(root, f"--ledger={ledger}", "-n", "2")
    lines = [line for line in ledger.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == 7, joined.stdout + joined.stderr
