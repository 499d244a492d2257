"""ptx_lab.processes: a tool run with a time limit, it and every process under it killed past the limit (CPU)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from ptx_lab.processes import descendants, run_tree

# a stand-in for ncu or compute-sanitizer: it starts a child of its own (the program it would watch)
# and then hangs; the child's pid goes to a file
HANGS = "sleep 60 & echo $! > {pid}; echo started; sleep 60"


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether pid has ended (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    return not _alive(pid)


def test_it_returns_what_subprocess_run_does():
    done = run_tree(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_past_the_limit_the_tools_child_dies_with_it(tmp_path):
    pid_file = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_tree(["sh", "-c", HANGS.format(pid=pid_file)], timeout=1.0)
    assert time.monotonic() - start < 30
    assert info.value.output == "started\n"   # what the tree wrote before the limit comes back
    assert gone(int(pid_file.read_text()))


def test_an_interrupt_in_the_caller_ends_the_tree_too(tmp_path, monkeypatch):
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
        run_tree(["sh", "-c", HANGS.format(pid=pid_file)], timeout=30)
    monkeypatch.setattr(subprocess.Popen, "communicate", real)
    assert gone(int(pid_file.read_text()))


def test_descendants_follow_the_parents_down():
    # sh -> sh -> sleep: both below the first shell, neither below the sleep
    proc = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30' & wait"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(descendants(proc.pid)) < 2:
            time.sleep(0.02)
        below = descendants(proc.pid)
        assert len(below) == 2 and descendants(below[-1]) == [] and os.getpid() not in below
    finally:
        for p in [*descendants(proc.pid), proc.pid]:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        proc.wait()
