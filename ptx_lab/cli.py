"""The `ptx-lab` command (also `python -m ptx_lab`).

    ptx-lab show <operand> [--svg FILE] [--png FILE]
                        a fragment map (ptx_lab.fragments.show) or bank map (banks:<preset>,
                        a layout another package declares in the `ptx_lab.layouts`
                        entry-point group), as text, or drawn (ptx_lab.pictures, ptx_lab.render)
    ptx-lab <command> ...
                        a command another package declares in the `ptx_lab.commands`
                        entry-point group (ptx_lab.commands): in this project `list` and
                        `run` (experiments) and `check`, `bench`, `profile`, `racecheck`,
                        `resources` (kernel.tools); `ptx-lab --help` lists them

ptx_lab imports none of the packages that use it: a command's module is imported
when the command runs, a layout table when `show` needs the presets, so `ptx-lab --help`
works on any machine.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import commands

PROG = "ptx-lab"
EXIT_USAGE = 2  # bad name or a missing part of the project


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _show_names() -> tuple[str, ...]:
    """Every operand `show` knows: fragments' text maps, then pictures' (incl. banks:<preset>)."""
    from . import fragments, pictures

    names = list(getattr(fragments, "OPERANDS", ()))
    names += [n for n in pictures.names() if n not in names]
    return tuple(names)


def _file_ending_in(suffix: str):
    """argparse type: a file name ending in `suffix` (any case), so that --png never writes a PNG
    under another format's name, nor --svg an SVG."""
    def check(path: str) -> str:
        if not path.lower().endswith(suffix):
            raise argparse.ArgumentTypeError(f"expected a file name ending in {suffix}, got {path!r}")
        return path
    return check


def _write_pictures(operand: str, svg: str | None, png: str | None) -> int:
    """Write --svg/--png; a missing matplotlib fails before anything is written."""
    from . import pictures, render

    if png is not None:
        try:
            render.require_matplotlib()
        except render.MissingDependency as exc:
            print(f"{PROG}: --png: {exc}", file=sys.stderr)
            return EXIT_USAGE
    picture = pictures.picture(operand)
    for option, path, write in (("--svg", svg, render.write_svg), ("--png", png, render.write_png)):
        if path is None:
            continue
        try:
            write(picture, path)
        except OSError as exc:
            print(f"{PROG}: cannot write {option} {path}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {path}")
    return 0


def _canonical_operand(name: str, valid: Sequence[str], bank_prefix: str) -> str | None:
    """The operand `name` means, in any case (mma.A is mma.a); None if it names none.
    Bank maps (banks:<preset>[:<access>]) are checked by ptx_lab.pictures itself."""
    by_case = {v.lower(): v for v in valid}
    if name.lower() in by_case:
        return by_case[name.lower()]
    if name.lower().startswith(bank_prefix):
        return name.lower()
    return None


def cmd_show(args: argparse.Namespace) -> int:
    from . import fragments, pictures, render

    valid = _show_names()
    operand = _canonical_operand(args.operand, valid, pictures.BANK_PREFIX)
    if operand is None:
        print(f"{PROG}: unknown operand {args.operand!r}; valid operands: {', '.join(valid)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.svg is not None or args.png is not None:
            return _write_pictures(operand, args.svg, args.png)
        if operand in getattr(fragments, "OPERANDS", ()):
            picture = fragments.show(operand)
        else:
            picture = render.to_text(pictures.picture(operand))
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if picture is not None:
        print(picture)
    return 0


def _summary(ep) -> str:
    try:
        return commands.load(ep).summary
    except Exception as exc:   # a command whose package is missing from this tree: say so, list the rest
        return f"(not available here: {exc.__class__.__name__}: {_first_line(str(exc))})"


def _parser(found: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Verified inline-PTX tensor-core primitives: experiments, "
                               "fragment maps, and Kernel A's tools.",
        epilog=f"`{PROG} <command> --help` for a command's options.")
    # not required=True: argparse would then report a missing command before an unknown flag
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, ep in found.items():
        if name != "show":   # parsed by the command itself (main() hands it the rest of argv)
            sub.add_parser(name, help=_summary(ep), add_help=False)

    p = sub.add_parser(
        "show", help="which lane and register hold each element of an operand, or a bank map; "
                     "as text, or as a picture with --svg/--png",
        description="Print which lane:register holds each element of an operand (text), or draw "
                    "it: cells coloured by lane and labelled 'T<lane> r<register>.lo|hi'. "
                    "banks:<preset> draws a shared-memory tile coloured by bank, with the cells "
                    "of a conflicting warp access outlined in red.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="operands (any case):\n"
               "  mma.a, mma.b, mma.c (= C/D)    mma.m16n8k16 fragments\n"
               "  m8n8, m8n8.trans               one 8x8 b16 fragment\n"
               "  ldmatrix.x{1,2,4}[.trans]      each matrix as it lies in shared memory\n"
               "  stmatrix.x{1,2,4}[.trans]      the same, for stores\n"
               "  movmatrix                      M before (source) and after (destination)\n"
               "  banks:<preset>[:<access>]      a layout a package declares in the ptx_lab.layouts\n"
               "                                 entry-point group (here Kernel A's tiles:\n"
               "                                 experiments.bank_presets), coloured by bank under\n"
               "                                 one warp access: ldmatrix (x4 over the top-left\n"
               "                                 16x16), column (lane l reads [l][0]) or none;\n"
               "                                 default: column for 32-row tiles, else ldmatrix\n"
               "an unknown operand lists every valid one.\n\n"
               "examples:\n"
               "  ptx-lab show mma.c                        text: lane:register per cell\n"
               "  ptx-lab show ldmatrix.x4.trans --svg x.svg\n"
               "  ptx-lab show banks:op_pad272 --svg b.svg\n"
               "  ptx-lab show movmatrix --png m.png        needs: pip install 'ptx-lab[plot]'")
    p.add_argument("operand", help="e.g. mma.a, mma.c, ldmatrix.x4.trans, movmatrix, "
                                   "banks:<preset>[:ldmatrix|column|none]")
    p.add_argument("--svg", metavar="FILE", type=_file_ending_in(".svg"),
                   help="write the picture as SVG, to a FILE ending in .svg (no dependency)")
    p.add_argument("--png", metavar="FILE", type=_file_ending_in(".png"),
                   help="write the picture as PNG, to a FILE ending in .png (needs matplotlib)")
    p.set_defaults(func=cmd_show)
    return parser


def _run_command(name: str, ep, argv: Sequence[str]) -> int:
    try:
        command = commands.load(ep)
        fn = command.load()
    except Exception as exc:
        print(f"{PROG} {name}: cannot load {ep.value} ({exc.__class__.__name__}: {_first_line(str(exc))})",
              file=sys.stderr)
        return EXIT_USAGE
    status = fn(list(argv), prog=f"{PROG} {name}")
    return 0 if status is None else int(status)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = commands.entry_points()
    try:
        if argv and argv[0] in found and argv[0] != "show":
            status = _run_command(argv[0], found[argv[0]], argv[1:])
        else:
            parser = _parser(found)
            args = parser.parse_args(argv)
            if args.command is None:
                parser.error(f"a command is needed: one of {', '.join(sorted({*found, 'show'}))}")
            status = args.func(args)
        sys.stdout.flush()    # here, not at exit, where a reader that left could not be caught
        return status
    except BrokenPipeError:   # `ptx-lab list | head -1`: the reader left, nothing is wrong
        return commands.quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
