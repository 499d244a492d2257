"""`ptx-lab list` and `ptx-lab run` (experiments.commands), and `python -m experiments` into a closed pipe."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from experiments import EXPERIMENTS, NAMES, _common, commands
from ptx_lab import cli

REPO = Path(__file__).resolve().parents[2]


def test_run_one_on_the_model(capsys):
    assert cli.main(["run", "ldmatrix", "--emulate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--emulate: running experiment ldmatrix on the CPU model"
    assert out[1] == "PASS  ldmatrix" and out[-1] == "1 passed, 0 failed"


def test_an_unknown_experiment_lists_the_valid_ones(capsys):
    assert cli.main(["run", "ldmatrx"]) == commands.EXIT_USAGE
    assert capsys.readouterr().err == f"ptx-lab run: unknown experiment 'ldmatrx'; valid: all, {', '.join(NAMES)}\n"


def test_a_failure_and_a_raise_are_reported_and_counted(monkeypatch, capsys):
    monkeypatch.setattr(EXPERIMENTS["movmatrix"], "run",
                        lambda backend: _common.Result("movmatrix", backend, ["lane 0 r0.lo: got 1, expected 2"], 1))
    assert commands.run_main(["movmatrix", "--emulate"]) == commands.EXIT_FAIL
    out = capsys.readouterr().out
    assert "FAIL  movmatrix\n      lane 0 r0.lo: got 1, expected 2\n" in out and "0 passed, 1 failed" in out

    def boom(backend):
        raise RuntimeError("no such register")

    monkeypatch.setattr(EXPERIMENTS["movmatrix"], "run", boom)
    assert commands.run_main(["movmatrix", "--emulate"]) == commands.EXIT_FAIL
    assert "      raised RuntimeError: no such register" in capsys.readouterr().out


def test_python_m_experiments_into_a_reader_that_left():
    # `python -m experiments | head -1`: the reader is gone before the first line is written
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "--emulate", "ldmatrix", "movmatrix"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert err == "", err
