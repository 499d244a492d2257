"""Triton's compile cache cut to what a cache hit loads, so that it travels between GPU machines.

A call to the GPU machine brings back at most 64 MiB, and FLA's kernels fill Triton's cache fast:
after one session's GPU tests it held 1,187 compiled kernels in 628 MB (43 MB packed). Most of it is
text that nothing reads again: each kernel's intermediate forms (``.source``, ``.ttir``,
``.ttgir``, ``.llir``, ``.ptx``; 79% of the bytes). A cache hit needs only the kernel's metadata
(``.json``) and its binary (``.cubin``): Triton finds a kernel through its group file
(``__grp__<name>.json``), which names the group's files by path, and loads the binary named there
(``triton/compiler/compiler.py``, ``CompiledKernel``). It treats a group whose files are not all
on disk as a miss, so each group file is rewritten to name only the files kept.

Everything else in the cache (autotune records, the compiled launcher modules) is left as it is.

    python -m kernel.tools.triton_cache TRITON_CACHE_DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

__all__ = ["slim", "main", "KEPT"]

KEPT = (".json", ".cubin")      # what loading a cached kernel reads
GROUP_PREFIX = "__grp__"


def slim(cache: Path) -> tuple[int, int]:
    """Drop the files no cache hit reads from every kernel group under ``cache`` and rewrite the
    group files to name what stays (their paths unchanged). Returns (groups slimmed, bytes freed). A
    group file that cannot be read, or names a file outside its own kernel's directory, is left alone."""
    groups = freed = 0
    for group in sorted(Path(cache).glob(f"*/{GROUP_PREFIX}*.json")):
        try:
            data = json.loads(group.read_text())
            children = dict(data["child_paths"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        paths = {name: Path(p) for name, p in children.items()}
        # the paths are absolute, as written where the cache was made; the kernel's own directory
        # (named by its hash) is what must match, so that a copy of the cache unpacked elsewhere slims too
        if any(p.parent.name != group.parent.name for p in paths.values()):
            continue
        drop = {name for name, p in paths.items() if p.suffix not in KEPT}
        if not drop:
            continue
        for name in drop:
            path = group.parent / paths[name].name
            if path.exists():
                freed += path.stat().st_size
                path.unlink()
        data["child_paths"] = {name: p for name, p in children.items() if name not in drop}
        group.write_text(json.dumps(data))
        groups += 1
    return groups, freed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.tools.triton_cache", description=__doc__.split("\n")[0])
    ap.add_argument("cache", type=Path, help="Triton's cache directory (TRITON_CACHE_DIR, ~/.triton/cache)")
    a = ap.parse_args(argv)
    if not a.cache.is_dir():
        ap.error(f"{a.cache} is not a directory")
    groups, freed = slim(a.cache)
    print(f"triton cache {a.cache}: {groups} kernels slimmed to their metadata and binary, {freed / 2 ** 20:.0f} MiB "
          f"freed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
