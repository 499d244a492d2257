"""``ptx-lab bench --layer``'s table, verdict, progress line and JSON (no GPU needed to render them)."""
from __future__ import annotations

import json
from typing import Sequence

from . import report
from .layer import LAYER_FLA, LAYER_OURS, SIDES, TIME_TARGET
from .report import cell, format_table, get, log, num

LAYER_COLUMNS = ("config", "FLA layer ms", "ours layer ms", "ours/FLA", "FLA GB", "ours GB", "ours/FLA GB")
LEGEND = (f"FLA layer / ours layer = fla.layers.kda.KimiDeltaAttention forward + backward (every parameter's "
          f"gradient and x's) through autograd, FLA's chunk_kda or kernel.patch_fla()'s route, timed in turn in "
          f"one process per configuration; GB = peak memory of one step as torch counts it (plus CuPy's pool's "
          f"growth); target: ours at most {TIME_TARGET}x FLA's time and no more memory")


def layer_row(res: dict) -> list[str]:
    lay, mem = res.get("layer", {}), res.get("peak_memory", {})
    ours_b, fla_b = get(mem, LAYER_OURS, "bytes"), get(mem, LAYER_FLA, "bytes")
    return [res.get("config", "?"), cell(lay.get(LAYER_FLA), ".3f"), cell(lay.get(LAYER_OURS), ".3f"),
            num(res.get("ratio"), ".3f"), cell(mem.get(LAYER_FLA), ".2f", 1e-9, key="bytes"),
            cell(mem.get(LAYER_OURS), ".2f", 1e-9, key="bytes"),
            num(None if ours_b is None or not fla_b else ours_b / fla_b, ".2f")]


def progress_line(tag: str, res: dict) -> str:
    cells = dict(zip(LAYER_COLUMNS, layer_row(res)))
    return (f"{tag}: layer forward + backward FLA {cells['FLA layer ms']} ms, ours {cells['ours layer ms']} ms "
            f"(ratio {cells['ours/FLA']}); peak memory FLA {cells['FLA GB']} GB, ours {cells['ours GB']} GB "
            f"[{res.get('wall_s', 0):.0f} s]")


def problems(results: Sequence[dict]) -> list[str]:
    out = []
    for r in results:
        if "error" in r:
            out.append(f"{r.get('config')}: {r['error']}")
            continue
        for part in ("layer", "peak_memory"):
            for name in SIDES:
                err = get(r, part, name, "error")
                if err:
                    out.append(f"{r.get('config')}: {part} {name}: {err}")
    return out


def verdict(results: Sequence[dict]) -> list[str]:
    """One line per configuration: time (ours at most TIME_TARGET of FLA's, from the same run) and
    memory (ours no more than FLA's)."""
    out = []
    for r in results:
        if "error" in r:
            continue
        ratio = r.get("ratio")
        ours_b, fla_b = get(r, "peak_memory", LAYER_OURS, "bytes"), get(r, "peak_memory", LAYER_FLA, "bytes")
        t = "time not measured" if ratio is None else (
            f"time {ratio:.3f}x FLA's: " + ("met" if ratio <= TIME_TARGET else f"NOT met (target {TIME_TARGET}x)"))
        m = "memory not measured" if ours_b is None or not fla_b else (
            f"memory {ours_b / fla_b:.2f}x FLA's: " + ("met" if ours_b <= fla_b else "NOT met"))
        out.append(f"{r.get('config', '?')}: {t}; {m}")
    return out


def log_layer_table(results: Sequence[dict]) -> None:
    ok = [r for r in results if "error" not in r]
    log("")
    log(format_table([layer_row(r) for r in ok], LAYER_COLUMNS))
    log(LEGEND)
    for line in problems(results):
        log(line)
    lines = verdict(results)
    if lines:
        log(f"targets (the layer's forward + backward at most {TIME_TARGET}x FLA's; peak memory no more):")
        for line in lines:
            log(f"  {line}")


def write_outputs(results: list[dict], runs: list[dict], plot_path: str | None, json_path: str | None, *,
                  environment: dict | None = None, args: dict | None = None) -> None:
    """The JSON file, as --backward writes its own; --layer draws no plot and says so."""
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"environment": environment, "args": args, "runs": runs, "results": results}, fh,
                      indent=1, default=str)
        log(f"wrote {json_path}")
    if plot_path:
        log(f"--layer draws no plot: {plot_path} not written (the table and the JSON hold every number)")


def is_layer_json(path: str) -> bool:
    """True when `path` is a --layer run's JSON file (its results say so)."""
    try:
        with open(path) as fh:
            rows = json.load(fh).get("results") or []
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(rows, list) and any(isinstance(r, dict) and r.get("bench") == "layer" for r in rows)


def read_runs(paths: Sequence[str]) -> tuple[list[dict], list[dict]] | None:
    return report.read_runs(paths, "bench --layer --json")


def report_from_json(paths: Sequence[str], plot_path: str | None, json_path: str | None) -> int:
    read = read_runs(paths)
    if read is None:
        return 1
    results, runs = read
    ok = [r for r in results if "error" not in r]
    log(f"{len(ok)} config(s) from {len(paths)} file(s); each row's ratio was measured in its own run")
    log_layer_table(results)
    write_outputs(results, runs, plot_path, json_path)
    return 0 if ok else 1
