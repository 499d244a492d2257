"""A device source compiled to PTX as kernel.tools.resources builds it, for the tests that read its
constants (resources.ptx_constant) or its refusals (no GPU: nvcc alone)."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Sequence

from kernel.tools.resources import _nvcc_cmd, ptx_constant

__all__ = ["compile_ptx", "ptx_of", "ptx_constant"]


def compile_ptx(source: Path, options: Sequence[str], out: Path) -> subprocess.CompletedProcess:
    """nvcc -ptx of ``source`` for sm_90a with the room's ``options`` into ``out``; the completed process
    (its return code and stderr: a refusal's static_assert or #error is in there)."""
    return subprocess.run(_nvcc_cmd(source, options, out, "-ptx"), capture_output=True, text=True)


def ptx_of(source: Path, options: Sequence[str], out: Path) -> str:
    """The PTX text of a build that must compile (its stderr in the failure)."""
    proc = compile_ptx(source, options, out)
    assert proc.returncode == 0, proc.stderr
    return out.read_text()
