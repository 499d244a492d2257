"""Running a tool that starts the program it watches (ncu, compute-sanitizer), with a time limit.

``subprocess.run(..., timeout=...)`` kills only the process it started. ncu and compute-sanitizer start
the program they profile or check as a child of their own, and that child, which holds the GPU, would
outlive them and keep holding it for whatever runs next. :func:`run_tree` kills the tool and every
process under it. The tool stays in the caller's process group, so a terminal's Ctrl-C and a
``timeout`` command around the caller still reach all of them.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Sequence

__all__ = ["run_tree", "descendants"]


def run_tree(args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)``, but past ``timeout``
    (or on an exception in the caller, such as KeyboardInterrupt) the process and all its descendants are
    killed; subprocess.TimeoutExpired is raised then, with what they had written (``output``, ``stderr``)."""
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
    except BaseException:
        _kill_tree(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` now (Linux: from each process's parent in /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):   # a process that ended while we read
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> None:
    # all of them found first: once the tool dies its children move to another parent
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:   # ended just now
            pass
