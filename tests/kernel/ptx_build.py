"""A device source compiled to PTX the way the launches build it, for the tests that read its constants
or its refusals (no GPU: nvcc alone)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Sequence

from ptx_lab import CUDA_INCLUDE_DIR


def compile_ptx(source: Path, options: Sequence[str], out: Path) -> subprocess.CompletedProcess:
    """nvcc -ptx of ``source`` for sm_90a with the room's ``options`` into ``out``; the completed process
    (its return code and stderr: a refusal's static_assert or #error is in there)."""
    return subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}", *options, "-ptx",
                           str(source), "-o", str(out)], capture_output=True, text=True)


def ptx_of(source: Path, options: Sequence[str], out: Path) -> str:
    """The PTX text of a build that must compile (its stderr in the failure)."""
    proc = compile_ptx(source, options, out)
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


def ptx_constant(ptx: str, name: str) -> int:
    """An ``extern "C" __constant__`` integer of a PTX text (a zero one is written without "= 0")."""
    m = re.search(rf"\.u32 {name}(?:\s*=\s*(\d+))?;", ptx)
    assert m, f"{name} not in the PTX"
    return int(m.group(1) or 0)
