"""What other packages provide to `ptx-lab` (its subcommands, the layouts `show` draws), found
through entry points.

A package adds a subcommand by naming a :class:`Command` in the ``ptx_lab.commands``
entry-point group of its ``pyproject.toml``::

    [project.entry-points."ptx_lab.commands"]
    check = "kernel.tools:CHECK"

``ptx-lab --help`` loads only the Command (its one-line summary); the module that does
the work is imported when the command runs. ptx_lab itself imports none of its users.
Other groups are read the same way (:func:`entry_points` takes the group): the
``ptx_lab.layouts`` tables that `ptx-lab show banks:<preset>` draws (ptx_lab.pictures).

Where the entry points come from: the installed distributions' metadata, except that
ptx-lab's own are read from the ``pyproject.toml`` of the checkout ptx_lab was
imported from, when it was imported from one. That file is what the metadata is built
from, so this is the same declaration; a plain copy of the tree (no ``pip install``) has
no metadata at all, and an editable install's metadata is a snapshot taken at install
time that misses entry points added since.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Callable

GROUP = "ptx_lab.commands"
DISTRIBUTION = "ptx-lab"
CHECKOUT_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: a summary for ``ptx-lab --help`` and the function that runs it.

    ``target`` is ``"module:function"``; the function takes ``(argv: list[str], prog: str)``,
    parses argv with an argparse parser whose ``prog`` is ``prog`` (so that its usage line
    names what the user typed, ``ptx-lab check``), and returns the exit status.
    """
    summary: str
    target: str

    def __post_init__(self) -> None:
        module, sep, function = self.target.partition(":")
        if not (module and sep and function):
            raise ValueError(f"Command.target must be 'module:function', got {self.target!r}")

    def load(self) -> Callable[..., int | None]:
        """The function (its module imported now)."""
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module), function)


def _checkout_entry_points(group: str = GROUP,
                           pyproject: Path = CHECKOUT_PYPROJECT) -> list[metadata.EntryPoint] | None:
    """`group` as this checkout's pyproject.toml declares it; None outside a ptx-lab checkout."""
    if not pyproject.is_file():
        return None
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != DISTRIBUTION:
        return None
    declared = project.get("entry-points", {}).get(group, {})
    return [metadata.EntryPoint(name, value, group) for name, value in declared.items()]


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()     # PEP 503


def _is_ours(ep: metadata.EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and _normalized(dist.name) == _normalized(DISTRIBUTION)


def entry_points(group: str = GROUP) -> dict[str, metadata.EntryPoint]:
    """name -> entry point of everything declared in `group` (by default the commands),
    sorted by name (not loaded).

    Sorted because installed metadata lists a group alphabetically and a pyproject.toml in
    the order written: the help reads the same either way."""
    from_checkout = _checkout_entry_points(group)
    out: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=group):
        if from_checkout is not None and _is_ours(ep):
            continue
        out.setdefault(ep.name, ep)
    for ep in from_checkout or ():
        out[ep.name] = ep
    return dict(sorted(out.items()))


def load(ep: metadata.EntryPoint) -> Command:
    """The Command an entry point names; TypeError if it names something else."""
    command = ep.load()
    if not isinstance(command, Command):
        raise TypeError(f"entry point {ep.name} = {ep.value!r} is a {type(command).__name__}, "
                        f"not a ptx_lab.commands.Command")
    return command


def quiet_broken_pipe() -> int:
    """Call after catching BrokenPipeError (``ptx-lab list | head -1``): the reader left and
    nothing is wrong. Points stdout at /dev/null, so that the flush at exit does not raise
    again, and returns the exit status 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # no real file descriptor behind sys.stdout (e.g. captured)
        sys.stdout = open(os.devnull, "w")
    return 0
