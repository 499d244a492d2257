"""`python -m experiments [--emulate] [name ...]`: run the experiments in order, exit 1 if any fails."""
from __future__ import annotations

import argparse
import sys

from ptx_lab.commands import quiet_broken_pipe

from . import NAMES, EXPERIMENTS
from ._common import choose_backend


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    parser.add_argument("--emulate", action="store_true",
                        help="run on the CPU model (ptx_lab.model) even when a GPU is present")
    parser.add_argument("names", nargs="*", metavar="name",
                        help=f"experiments to run (default: all of {', '.join(NAMES)})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        parser.error(f"unknown experiment {unknown[0]!r}; choose from {', '.join(NAMES)}")
    try:
        backend = choose_backend(args.emulate)
        failed = 0
        for name in args.names or NAMES:
            result = EXPERIMENTS[name].run(backend)
            print(result.report())
            failed += not result.passed
        sys.stdout.flush()    # here, not at exit, where a reader that left could not be caught
    except BrokenPipeError:   # `python -m experiments | head -1`: the reader left, nothing is wrong
        return quiet_broken_pipe()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
