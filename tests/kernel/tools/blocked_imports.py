"""Run Python code in a fresh interpreter where torch, cupy, triton, fla and matplotlib cannot be
imported: what a CPU-only machine without the optional extras sees."""
from __future__ import annotations

import subprocess
import sys

BLOCKED = ("torch", "cupy", "triton", "fla", "matplotlib")

PRELUDE = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.split('.')[0] in {BLOCKED!r}:\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
)


def run_blocked(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True)
