"""Single-warp (and one warpgroup) experiments: each primitive run on data whose answer is known.

One literate file per experiment (read it top to bottom as a lesson, run it as
``python -m experiments.<name> [--emulate]``). ``EXPERIMENTS`` maps each name
to its module, in the order they build on each other; ``python -m experiments``
runs them all. ``experiments.commands`` makes them the ``ptx-lab list`` and
``ptx-lab run`` commands.
"""
from __future__ import annotations

from importlib import import_module
from types import ModuleType

NAMES = ("ldmatrix", "stmatrix", "movmatrix", "mma_m16n8k16", "accumulator_as_a", "two_part_operand", "cp_async",
         "bulk_copy", "banks", "tma_tile", "wgmma")


def __getattr__(name: str) -> dict[str, ModuleType]:
    # Imported lazily so that `python -m experiments.<name>` does not import
    # the module it is about to run as __main__ a second time.
    if name == "EXPERIMENTS":
        return {n: import_module(f"{__name__}.{n}") for n in NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAMES", "EXPERIMENTS"]
