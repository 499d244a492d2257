"""Moved to :mod:`kernel.tools.check`: run ``ptx-lab check`` (or ``python -m kernel.tools.check``)."""
import sys

MOVED = "kernel.check moved: run `ptx-lab check` (python -m kernel.tools.check)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
