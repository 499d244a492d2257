"""A kernel's parameter names, read from its entry file: what a launch's argument tuple must follow,
position by position (CuPy passes the tuple as it is, so a swap of two ints would launch silently)."""
from __future__ import annotations

import re
from pathlib import Path


def parameters(source: Path, function: str) -> list[str]:
    """The names of ``function``'s parameters in ``source``, in order (the last word of each)."""
    m = re.search(rf"\b{function}\(([^)]*)\)\s*\{{", source.read_text())
    if m is None:
        raise LookupError(f"no definition of {function}( ... ) {{ in {source}")
    return [re.findall(r"\w+", p)[-1] for p in m.group(1).split(",")]


def launched(source: Path, function: str, args) -> dict:
    """{parameter name: the argument a launch passed for it}, after checking the counts agree."""
    names = parameters(source, function)
    assert len(names) == len(args), f"{function} takes {len(names)} parameters ({names}), the launch passed {len(args)}"
    return dict(zip(names, args))
