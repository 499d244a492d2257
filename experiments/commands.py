"""`ptx-lab list` and `ptx-lab run`: the experiments as subcommands of the ptx-lab command.

pyproject.toml declares LIST and RUN in the `ptx_lab.commands` entry-point group;
ptx_lab loads this module for `ptx-lab --help` (it imports no experiment) and calls
:func:`list_main` or :func:`run_main` when the command runs.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from types import ModuleType
from typing import Sequence

from ptx_lab.commands import Command

EXIT_FAIL = 1   # an experiment failed
EXIT_USAGE = 2  # bad name

LIST = Command("list the experiments with one-line summaries", "experiments.commands:list_main")
RUN = Command("run one experiment or all of them; exit 1 on any failure", "experiments.commands:run_main")


def _registry() -> dict[str, ModuleType]:
    from . import EXPERIMENTS

    return EXPERIMENTS


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _gpu_name() -> str:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # the name is decoration; the run does not depend on it
        return "CUDA device"


def _choose_backend(emulate: bool, what: str) -> tuple[str, str]:
    """("gpu" | "model", the line that says so and why)."""
    if emulate:
        return "model", f"--emulate: running {what} on the CPU model"
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        return "model", f"no GPU ({reason}): running {what} on the CPU model"
    return "gpu", f"GPU ({_gpu_name()}): running {what} on the GPU"


def list_main(argv: Sequence[str] | None = None, prog: str = "ptx-lab list") -> int:
    argparse.ArgumentParser(prog=prog, description=LIST.summary).parse_args(argv)
    registry = _registry()
    width = max((len(name) for name in registry), default=0)
    for name, module in registry.items():
        print(f"{name:<{width}}  {_first_line(getattr(module, 'SUMMARY', ''))}")
    return 0


def _run_one(module: ModuleType, backend: str) -> tuple[bool, list[str], list[str]]:
    """(passed, failure lines, extra lines: notes and table of experiments that have them)."""
    try:
        result = module.run(backend)
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]  # the innermost frame
        return False, [f"raised {exc.__class__.__name__}: {exc}",
                       f"  at {where.filename}:{where.lineno} in {where.name}"], []
    failures = [str(f) for f in getattr(result, "failures", [])]
    extra = [str(n) for n in getattr(result, "notes", [])]
    table = getattr(result, "table", None)
    if table:
        extra += str(table).splitlines()
    return bool(result.passed) and not failures, failures, extra


def run_main(argv: Sequence[str] | None = None, prog: str = "ptx-lab run") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run experiments on the GPU if one is usable, else on the CPU model "
                               "(the first line says which and why); PASS/FAIL per experiment.")
    parser.add_argument("name", help="an experiment name (see `list`) or 'all'")
    parser.add_argument("--emulate", action="store_true",
                        help="run on the CPU model even where a GPU is usable")
    args = parser.parse_args(argv)
    registry = _registry()
    if args.name == "all":
        names, what = list(registry), "every experiment"
    elif args.name in registry:
        names, what = [args.name], f"experiment {args.name}"
    else:
        print(f"{prog}: unknown experiment {args.name!r}; valid: all, {', '.join(registry)}",
              file=sys.stderr)
        return EXIT_USAGE
    backend, line = _choose_backend(args.emulate, what)
    print(line, flush=True)
    n_failed = 0
    for name in names:
        ok, failures, extra = _run_one(registry[name], backend)
        n_failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
        for line in (*failures, *extra):
            print(f"      {line}")
        sys.stdout.flush()
    print(f"{len(names) - n_failed} passed, {n_failed} failed")
    return EXIT_FAIL if n_failed else 0
