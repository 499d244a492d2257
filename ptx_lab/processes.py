"""Running a tool that starts the program it watches (ncu, compute-sanitizer), with a time limit.

``subprocess.run(..., timeout=...)`` kills only the process it started. ncu and compute-sanitizer start
the program they profile or check as a child of their own, and that child, which holds the GPU, would
outlive them and keep holding it for whatever runs next. :func:`run_in_own_group` starts the tool in a
process group of its own and kills the whole group past the limit.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Sequence

__all__ = ["run_in_own_group"]


def run_in_own_group(args: Sequence[str], *, timeout: float,
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)``, but past ``timeout``
    every process of the group it started is killed; subprocess.TimeoutExpired is raised then, with what
    the group had written (``output``, ``stderr``)."""
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
    except BaseException:   # Ctrl-C: the group is not in the terminal's foreground group, so it is ours to end
        _kill_group(proc)
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:   # the group ended just now
        pass
