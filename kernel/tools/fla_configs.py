"""FLA's autotune choices from Triton's cache, as FLA config files: GPU tests then compile one config per kernel.

fla-core autotunes each Triton kernel over 6 to 36 configs, and every new specialisation (a
switch, a dtype, a head size) compiles all of them. The GPU tests exercise dozens of
specialisations, so on a fresh machine most of their time goes to compiling configs that lose.

Triton keeps each autotune result in its cache (``<kernel>.autotune.json``: the tuning key and
every config's timings). fla-core can read its choices from files instead of tuning
(``FLA_CACHE_MODE``, ``FLA_CONFIG_DIR``; fla/ops/utils/cache.py): per kernel, entries keyed by the
tuning key and a default. This module writes those files from the cache:

* an entry per tuning key seen, holding the config that won there (FLA matches a new key to it
  exactly, or by structure when only sizes differ: ``FLA_CACHE_MODE=full``);
* as the default, the config that won most often, for a specialisation never tuned.

The choices are the card's own, measured by Triton on it. Only the tests use them
(``.ci/gpu-checks``); the benchmarks let FLA tune, as its users do, and record what it chose.
``tests/fla_autotune`` keeps the H200's choices for the specialisations the GPU tests reach, so that a
fresh machine, with no cache yet, also compiles one config a kernel: ``--over`` starts from those files
and adds the cache's choices, which win where both hold a key.

    python -m kernel.tools.fla_configs TRITON_CACHE_DIR OUT_DIR [--over tests/fla_autotune]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["tuned_configs", "write_configs", "main"]

SUFFIX = ".autotune.json"


def _key_hash(key: list) -> str:
    # fla-core's AutotuneKey.key_hash: md5 of the key as compact, key-sorted JSON
    return hashlib.md5(json.dumps(key, separators=(",", ":"), sort_keys=True).encode()).hexdigest()


def _winner(configs_timings: list) -> dict[str, Any] | None:
    """The fastest config of one autotune record (Triton's rule: the least timings list), without its
    pre_hook; None where every config failed (inf)."""
    finite = [(timings, config) for config, timings in configs_timings if timings and timings[0] != float("inf")]
    if not finite:
        return None
    config = dict(min(finite, key=lambda pair: pair[0])[1])
    config.pop("pre_hook", None)
    return config


def tuned_configs(triton_cache: Path) -> dict[str, dict[str, Any]]:
    """Every kernel with autotune records under ``triton_cache`` -> its FLA config file's content."""
    records: dict[str, list[tuple[list, dict]]] = collections.defaultdict(list)
    for path in sorted(Path(triton_cache).glob(f"*/*{SUFFIX}")):
        record = json.loads(path.read_text())
        winner = _winner(record["configs_timings"])
        if winner is not None:
            records[path.name[: -len(SUFFIX)]].append((record["key"], winner))
    files = {}
    for kernel, wins in sorted(records.items()):
        counts = collections.Counter(json.dumps(config, sort_keys=True) for _, config in wins)
        # most wins first; among equals the first in sorted order, so that the file is reproducible
        default = min(counts, key=lambda text: (-counts[text], text))
        files[kernel] = {
            "kernel_name": kernel,
            "autotune_entries": {_key_hash(key): {"autotune_key": key, "config": config} for key, config in wins},
            "default_config": json.loads(default),
        }
    return files


def merged(files: dict[str, dict[str, Any]], base_dir: Path) -> dict[str, dict[str, Any]]:
    """``files`` over the config files in ``base_dir``: a kernel's entries are the union, the cache's
    winning where both hold a key; its default is the cache's where the cache tuned it."""
    out = {}
    for path in sorted(Path(base_dir).glob("*.json")):
        content = json.loads(path.read_text())
        out[content["kernel_name"]] = content
    for kernel, content in files.items():
        base = out.get(kernel, {"autotune_entries": {}})
        out[kernel] = {**content, "autotune_entries": {**base["autotune_entries"], **content["autotune_entries"]}}
    return dict(sorted(out.items()))


def write_configs(triton_cache: Path, out_dir: Path, base_dir: Path | None = None) -> list[str]:
    """Write one ``<kernel>.json`` per tuned kernel into ``out_dir`` (over ``base_dir``'s files where
    given: ``merged``); returns the kernels' names."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = tuned_configs(triton_cache)
    if base_dir is not None:
        files = merged(files, base_dir)
    for kernel, content in files.items():
        (out_dir / f"{kernel}.json").write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
    return list(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel.tools.fla_configs", description=__doc__.split("\n\n")[0])
    parser.add_argument("triton_cache", type=Path, help="Triton's cache directory (TRITON_CACHE_DIR, ~/.triton/cache)")
    parser.add_argument("out_dir", type=Path, help="where the config files go (FLA_CONFIG_DIR)")
    parser.add_argument("--over", type=Path, metavar="DIR",
                        help="config files to start from (e.g. tests/fla_autotune): the cache's choices are "
                             "added to them, and win where both have a key")
    args = parser.parse_args(argv)
    if not args.triton_cache.is_dir() and args.over is None:   # with --over, a fresh machine's missing cache is empty
        parser.error(f"triton_cache: {args.triton_cache} is not a directory")
    if args.over is not None and not args.over.is_dir():
        parser.error(f"--over: {args.over} is not a directory")
    kernels = write_configs(args.triton_cache, args.out_dir, args.over)
    print(f"fla_configs: {len(kernels)} kernels' autotune choices written to {args.out_dir}"
          + (f" ({', '.join(kernels)})" if kernels else " (no autotune records: FLA will tune)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
