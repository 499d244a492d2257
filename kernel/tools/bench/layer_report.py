"""``ptx-lab bench --layer``'s table, verdict, progress line and JSON (no GPU needed to render them)."""
from __future__ import annotations

from typing import Sequence

from . import report
from .layer import (BACKWARD_TARGET, LAYER_FLA, LAYER_OURS, OP_BARE, OP_FLA, OP_OURS, TIME_TARGET,
                    WRAPPER_TARGET)
from .report import against_target, cell, get, is_bench_json, log, num, our_forward_of, target_verdict, write_json

LAYER_COLUMNS = ("config", "FLA layer ms", "ours layer ms", "ours/FLA", "FLA GB", "ours GB", "ours/FLA GB",
                 "FLA bwd ms", "ours bwd ms", "ours/FLA bwd", "bare ms", "wrapper", "ours bwd host ms")
LEGEND = (f"FLA layer / ours layer = fla.layers.kda.KimiDeltaAttention forward + backward (every parameter's "
          f"gradient and x's) through autograd, FLA's chunk_kda or kernel.patch_fla()'s route (kernel.chunk_kda, its "
          f"forward the title's: --our-forward), timed in turn in "
          f"one process per configuration; GB = peak memory of one step as torch counts it (plus CuPy's pool's "
          f"growth); bwd = the op's backward alone through autograd on the layer's own chunk_kda call (its "
          f"settings: the gate and beta in the op, state_v_first), FLA's and ours, timed in turn with bare = "
          f"kernel.kda_backward.run on the arguments our op hands it; wrapper = ours bwd / bare - 1; host ms = "
          f"the CPU time of one call of our op's backward (the GPU is kept ahead of it, so it is not in the GPU "
          f"times). Targets: the "
          f"layer at most {TIME_TARGET}x FLA's time and no more memory; the backward at most {BACKWARD_TARGET}x "
          f"FLA's; the wrapper at most {WRAPPER_TARGET:.0%}")


def layer_row(res: dict) -> list[str]:
    lay, mem = res.get("layer", {}), res.get("peak_memory", {})
    ours_b, fla_b = get(mem, LAYER_OURS, "bytes"), get(mem, LAYER_FLA, "bytes")
    return [res.get("config", "?"), cell(lay.get(LAYER_FLA), ".3f"), cell(lay.get(LAYER_OURS), ".3f"),
            num(res.get("ratio"), ".3f"), cell(mem.get(LAYER_FLA), ".2f", 1e-9, key="bytes"),
            cell(mem.get(LAYER_OURS), ".2f", 1e-9, key="bytes"),
            num(None if ours_b is None or not fla_b else ours_b / fla_b, ".2f"),
            *op_backward_cells(res)]


def op_backward_cells(res: dict) -> list[str]:
    """The op's backward alone: FLA's, ours, the ratio, our bare backward, the wrapper's share."""
    op = res.get("op_backward", {})
    return [cell(op.get(OP_FLA), ".3f"), cell(op.get(OP_OURS), ".3f"), num(res.get("backward_ratio"), ".3f"),
            cell(op.get(OP_BARE), ".3f"), num(res.get("wrapper"), "+.1%"),
            cell(op.get(OP_OURS), ".2f", key="host_ms")]


def progress_line(tag: str, res: dict) -> str:
    cells = dict(zip(LAYER_COLUMNS, layer_row(res)))
    return (f"{tag}: layer forward + backward FLA {cells['FLA layer ms']} ms, ours {cells['ours layer ms']} ms "
            f"(ratio {cells['ours/FLA']}); peak memory FLA {cells['FLA GB']} GB, ours {cells['ours GB']} GB; "
            f"the op's backward FLA {cells['FLA bwd ms']} ms, ours {cells['ours bwd ms']} ms (ratio "
            f"{cells['ours/FLA bwd']}), bare {cells['bare ms']} ms (wrapper {cells['wrapper']}) "
            f"[{res.get('wall_s', 0):.0f} s]")


def problems(results: Sequence[dict]) -> list[str]:
    return report.problems(results, ("layer", "peak_memory", "op_backward"))


def verdict(results: Sequence[dict]) -> list[str]:
    """One line per configuration: time (ours at most TIME_TARGET of FLA's, from the same run) and
    memory (ours no more than FLA's)."""
    out = []
    for r in results:
        if "error" in r:
            continue
        ours_b, fla_b = get(r, "peak_memory", LAYER_OURS, "bytes"), get(r, "peak_memory", LAYER_FLA, "bytes")
        out.append(target_verdict(r.get("config", "?"), r.get("ratio"), ours_b, fla_b, TIME_TARGET, "FLA's"))
        if "op_backward" in r:
            out.append(backward_verdict(r))
    return out


def backward_verdict(r: dict) -> str:
    """"CONFIG: backward R x FLA's: met | NOT met (target T x); wrapper W: met | NOT met", either part
    "not measured" where its numbers are missing."""
    ratio, wrapper = r.get("backward_ratio"), r.get("wrapper")
    b = "backward not measured" if ratio is None else (
        f"backward {ratio:.3f}x FLA's: " + against_target(ratio, BACKWARD_TARGET))
    w = "wrapper not measured" if wrapper is None else (
        f"wrapper {wrapper:+.1%} of our bare backward: "
        + ("met" if wrapper <= WRAPPER_TARGET else f"NOT met (target {WRAPPER_TARGET:.0%})"))
    return f"{r.get('config', '?')}: {b}; {w}"


def title(results: Sequence[dict]) -> str:
    """The table's title: what "ours" ran (kernel.chunk_kda's forward)."""
    return (f"FLA's KDA layer, forward + backward; ours is kernel.patch_fla()'s route: kernel.chunk_kda with "
            f"{our_forward_of(results)} and our backward:")


def log_layer_table(results: Sequence[dict]) -> None:
    report.log_mode_table(results, layer_row, LAYER_COLUMNS, LEGEND, problems(results), verdict(results),
                          f"targets (the layer's forward + backward at most {TIME_TARGET}x FLA's; peak memory no "
                          f"more; the op's backward at most {BACKWARD_TARGET}x FLA's, its wrapper at most "
                          f"{WRAPPER_TARGET:.0%} of our bare backward):", title=title(results))


def write_outputs(results: list[dict], runs: list[dict], plot_path: str | None, json_path: str | None, *,
                  environment: dict | None = None, args: dict | None = None) -> None:
    """The JSON file, as --backward writes its own; --layer draws no plot and says so."""
    if json_path:
        write_json(json_path, results, runs, environment, args)
    if plot_path:
        log(f"--layer draws no plot: {plot_path} not written (the table and the JSON hold every number)")


def is_layer_json(path: str) -> bool:
    """True when `path` is a --layer run's JSON file (its results say so)."""
    return is_bench_json(path, "layer")


def read_runs(paths: Sequence[str]) -> tuple[list[dict], list[dict]] | None:
    return report.read_runs(paths, "bench --layer --json")


def report_from_json(paths: Sequence[str], plot_path: str | None, json_path: str | None) -> int:
    return report.report_runs(paths, "bench --layer --json", log_layer_table, write_outputs, plot_path, json_path)
