"""ptx_lab.processes: a tool run with a time limit, its whole process group killed past it (CPU)."""
from __future__ import annotations

import subprocess
import time

import pytest

from ptx_lab.processes import run_in_own_group

from .test_ncu import _alive


def test_it_returns_what_subprocess_run_does():
    done = run_in_own_group(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_past_the_limit_the_tools_child_dies_with_it(tmp_path):
    pid_file = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_in_own_group(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo started; sleep 60"], timeout=1.0)
    assert time.monotonic() - start < 30
    assert info.value.output == "started\n"   # what the group wrote before the limit comes back
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def test_an_interrupt_ends_the_group_too(tmp_path, monkeypatch):
    # Ctrl-C reaches the caller only (the group is not the terminal's): the caller must end the group
    pid_file = tmp_path / "child.pid"
    real = subprocess.Popen.communicate

    def interrupted(self, timeout=None):
        deadline = time.monotonic() + 5
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_in_own_group(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; sleep 60"], timeout=30)
    monkeypatch.setattr(subprocess.Popen, "communicate", real)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)
