"""Moved to :mod:`kernel.tools.racecheck`: run ``ptx-lab racecheck`` (or ``python -m kernel.tools.racecheck``)."""
import sys

MOVED = "kernel.racecheck moved: run `ptx-lab racecheck` (python -m kernel.tools.racecheck)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
