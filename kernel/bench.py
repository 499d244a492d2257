"""Moved to :mod:`kernel.tools.bench`: run ``ptx-lab bench`` (or ``python -m kernel.tools.bench``)."""
import sys

MOVED = "kernel.bench moved: run `ptx-lab bench` (python -m kernel.tools.bench)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
