"""Moved to :mod:`kernel.tools.profile`: run ``ptx-lab profile`` (or ``python -m kernel.tools.profile``)."""
import sys

MOVED = "kernel.profile moved: run `ptx-lab profile` (python -m kernel.tools.profile)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
