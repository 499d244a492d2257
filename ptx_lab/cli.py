"""The `ptx-lab` command (also `python -m ptx_lab`).

    ptx-lab list                      experiments, one line each
    ptx-lab run <name>|all [--emulate]
                                      run experiments on the GPU if one is usable, else on
                                      the CPU model (the first line says which and why);
                                      PASS/FAIL per experiment, exit 1 on any failure
    ptx-lab show <operand> [--svg FILE] [--png FILE]
                                      a fragment map (ptx_lab.fragments.show) or bank map
                                      (banks:<preset>) as text, or drawn (ptx_lab.pictures)
    ptx-lab bench ...                 Kernel A's benchmark (kernel.bench:main), arguments passed on

Experiments, fragments and the kernel are imported inside the commands that
use them, so `ptx-lab --help` works on any machine.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import traceback
from types import ModuleType
from typing import Sequence

PROG = "ptx-lab"
EXIT_FAIL = 1   # an experiment failed
EXIT_USAGE = 2  # bad name or a missing part of the project


def _experiments() -> dict[str, ModuleType]:
    try:
        import experiments
    except ImportError as exc:
        raise SystemExit(f"{PROG}: cannot import the experiments package: {exc}") from exc
    registry = getattr(experiments, "EXPERIMENTS", None)
    if not isinstance(registry, dict):
        raise SystemExit(f"{PROG}: experiments.EXPERIMENTS (name -> module) is not defined")
    return registry


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
    from .gpu import gpu_reason

    reason = gpu_reason()
    if reason is not None:
        return "model", f"no GPU ({reason}): running {what} on the CPU model"
    return "gpu", f"GPU ({_gpu_name()}): running {what} on the GPU"


# ----------------------------------------------------------------- commands

def cmd_list(args: argparse.Namespace) -> int:
    registry = _experiments()
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


def cmd_run(args: argparse.Namespace) -> int:
    registry = _experiments()
    if args.name == "all":
        names, what = list(registry), "every experiment"
    elif args.name in registry:
        names, what = [args.name], f"experiment {args.name}"
    else:
        print(f"{PROG}: unknown experiment {args.name!r}; valid: all, {', '.join(registry)}",
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


def _show_names() -> tuple[str, ...]:
    """Every operand `show` knows: fragments' text maps, then pictures' (incl. banks:<preset>)."""
    from . import fragments, pictures

    names = list(getattr(fragments, "OPERANDS", ()))
    names += [n for n in pictures.names() if n not in names]
    return tuple(names)


def _write_pictures(operand: str, svg: str | None, png: str | None) -> int:
    """Write --svg/--png; a missing matplotlib fails before anything is written."""
    from . import pictures

    if png is not None:
        try:
            pictures._agg()
        except pictures.MissingDependency as exc:
            print(f"{PROG}: --png: {exc}", file=sys.stderr)
            return EXIT_USAGE
    picture = pictures.picture(operand)
    for option, path, write in (("--svg", svg, pictures.write_svg), ("--png", png, pictures.write_png)):
        if path is None:
            continue
        try:
            write(picture, path)
        except OSError as exc:
            print(f"{PROG}: cannot write {option} {path}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {path}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from . import fragments, pictures

    valid = _show_names()
    if args.operand not in valid and not args.operand.startswith(pictures.BANK_PREFIX):
        print(f"{PROG}: unknown operand {args.operand!r}; valid operands: {', '.join(valid)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.svg is not None or args.png is not None:
            return _write_pictures(args.operand, args.svg, args.png)
        if args.operand in getattr(fragments, "OPERANDS", ()):
            picture = fragments.show(args.operand)
        else:
            picture = pictures.to_text(pictures.picture(args.operand))
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if picture is not None:
        print(picture)
    return 0


def cmd_bench(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("kernel") is None or importlib.util.find_spec("kernel.bench") is None:
        print(f"{PROG}: bench needs kernel/bench.py, which is not in this tree", file=sys.stderr)
        return EXIT_USAGE
    bench = importlib.import_module("kernel.bench")
    status = bench.main(list(argv))
    return 0 if status is None else int(status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Verified inline-PTX tensor-core primitives: experiments, "
                               "fragment maps and Kernel A's benchmark.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    p = sub.add_parser("list", help="list the experiments with one-line summaries")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="run one experiment or all of them; exit 1 on any failure")
    p.add_argument("name", help="an experiment name (see `list`) or 'all'")
    p.add_argument("--emulate", action="store_true",
                   help="run on the CPU model even where a GPU is usable")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "show", help="which lane and register hold each element of an operand, or a bank map; "
                     "as text, or as a picture with --svg/--png",
        description="Print which lane:register holds each element of an operand (text), or draw "
                    "it: cells coloured by lane and labelled 'T<lane> r<register>.lo|hi'. "
                    "banks:<preset> draws a shared-memory tile coloured by bank, with the cells "
                    "of a conflicting warp access outlined in red.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="operands:\n"
               "  mma.a, mma.b, mma.c (= C/D)    mma.m16n8k16 fragments\n"
               "  m8n8, m8n8.trans               one 8x8 b16 fragment\n"
               "  ldmatrix.x{1,2,4}[.trans]      each matrix as it lies in shared memory\n"
               "  stmatrix.x{1,2,4}[.trans]      the same, for stores\n"
               "  movmatrix                      M before (source) and after (destination)\n"
               "  banks:<preset>[:<access>]      a ptx_lab.banks layout coloured by bank under one\n"
               "                                 warp access: ldmatrix (x4 over the top-left 16x16),\n"
               "                                 column (lane l reads [l][0]) or none; default:\n"
               "                                 column for 32-row tiles, else ldmatrix\n"
               "an unknown operand lists every valid one.\n\n"
               "examples:\n"
               "  ptx-lab show mma.c                        text: lane:register per cell\n"
               "  ptx-lab show ldmatrix.x4.trans --svg x.svg\n"
               "  ptx-lab show banks:op_pad272 --svg b.svg\n"
               "  ptx-lab show movmatrix --png m.png        needs: pip install 'ptx-lab[plot]'")
    p.add_argument("operand", help="e.g. mma.a, mma.c, ldmatrix.x4.trans, movmatrix, "
                                   "banks:<preset>[:ldmatrix|column|none]")
    p.add_argument("--svg", metavar="FILE", help="write the picture as SVG (no dependency)")
    p.add_argument("--png", metavar="FILE", help="write the picture as PNG (needs matplotlib)")
    p.set_defaults(func=cmd_show)

    # Parsed by hand in main(): everything after `bench` belongs to kernel.bench.
    sub.add_parser("bench", help="Kernel A's benchmark (kernel.bench); arguments are passed on",
                   add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `ptx-lab show mma.a | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
