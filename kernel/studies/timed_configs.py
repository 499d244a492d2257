"""What the GPU studies that time one configuration after another share: their --configs check and their loop
(the GPU check, a progress line, the configuration measured and reported, the JSON written after each, so that a
run cut off later keeps the configurations it finished)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence


def parse_configs(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated BxT configurations of ``text``, or the parser's error naming a bad one."""
    configs = [c.strip() for c in text.split(",") if c.strip()]
    for c in configs:
        B, sep, T = c.lower().partition("x")
        if not (sep and B.isdigit() and T.isdigit() and int(B) > 0 and int(T) > 0):
            parser.error(f"--configs: expected BxT, got {c!r}")
    return configs


def run_configs(name: str, configs: Sequence[str], heads: int, measure: Callable[[str], dict],
                report: Callable[[dict], str], json_path: Path | None) -> int:
    """Each configuration in turn: measured (``measure(config)``), its report printed, every row so far written to
    ``json_path``. 2 without torch on a CUDA GPU and CuPy, 0 after the last."""
    from kernel.runtime.arrays import torch_gpu_reason

    why = torch_gpu_reason()
    if why is not None:
        print(f"{name}: needs torch with a CUDA GPU and CuPy ({why})", file=sys.stderr)
        return 2
    rows = []
    for config in configs:
        print(f"{name}: {config}, {heads} heads ...", file=sys.stderr, flush=True)
        rows.append(measure(config))
        print(report(rows[-1]), flush=True)
        if json_path:
            json_path.write_text(json.dumps(rows, indent=1) + "\n")
    return 0
