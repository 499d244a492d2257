"""Moved to :mod:`kernel.tools.resources`: run ``ptx-lab resources`` (or ``python -m kernel.tools.resources``)."""
import sys

MOVED = "kernel.resources moved: run `ptx-lab resources` (python -m kernel.tools.resources)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
