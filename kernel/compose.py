"""Moved to :mod:`kernel.studies.b1_composition.compose`, a finished study (outside the wheel)."""
import sys

MOVED = "kernel.compose moved: run `python -m kernel.studies.b1_composition.compose` (from a checkout)"
if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
raise ImportError(MOVED)
