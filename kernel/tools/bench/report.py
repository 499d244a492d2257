"""What the bench prints and writes: progress lines, the timing and precision tables, the plot,
and the tables of earlier runs' JSON files.

Earlier runs' JSON files (docs/bench) use the snapshot modes' former names
(configs.RENAMED_MODES); they are read with today's (:func:`upgrade_result`).
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

from .configs import BF16_EVERY_64, FP32_EVERY_TILE, RENAMED_MODES

ALTERNATING_A = f"kernel_a_{BF16_EVERY_64}"   # the result's "alternating" keys
ALTERNATING_FLA = "fla_dAv+dhu"
ALTERNATING_FROM_FLA = "kernel_a_from_fla"   # kernel.ds_scan.fla on FLA's own forward tensors

TABLE_COLUMNS = ("config", f"A {BF16_EVERY_64} ms", f"A {FP32_EVERY_TILE} ms", "A from FLA ms", "FLA dAv+dhu ms",
                 "FLA w_u ms", "ratio A/FLA", "A/FLA in turn", "from FLA/FLA in turn", "A GB/s", "floor ms",
                 "A/floor")
PRECISION_COLUMNS = ("config", "heads x seqs", f"A {BF16_EVERY_64} dh0", f"A {BF16_EVERY_64} snaps",
                     f"A {FP32_EVERY_TILE} dh0", f"A {FP32_EVERY_TILE} snaps",
                     f"A unsplit {BF16_EVERY_64} dh0", f"A unsplit {BF16_EVERY_64} snaps", "FLA dh0", "FLA dh",
                     "bf16(exact dh)", "mqk/inv in")


# --our-forward: whose forward kernel.chunk_kda runs in --backward's step and --layer (kernel.using_forward);
# a result without the key was recorded before the option, when kernel.chunk_kda ran FLA's forward
OUR_FORWARDS = {"ours": "our forward", "fla": "FLA's forward"}
OUR_FORWARD_BEFORE = "fla"


def our_forward_text(name: str) -> str:
    """"kernel.chunk_kda with our forward and our backward" (or FLA's forward): what "ours" ran."""
    return f"kernel.chunk_kda with {OUR_FORWARDS[name]} and our backward"


def our_forward_of(results: Sequence[dict]) -> str:
    """The forward "ours" ran in these results, as a title's words: "our forward" or "FLA's forward"; where
    merged runs differ, each with its configurations."""
    ok = [r for r in results if "error" not in r]
    by: dict[str, list[str]] = {}
    for r in ok:
        by.setdefault(r.get("our_forward", OUR_FORWARD_BEFORE), []).append(str(r.get("config", "?")))
    if len(by) < 2:
        return next((OUR_FORWARDS.get(n, n) for n in by), "-")
    return " / ".join(f"{OUR_FORWARDS.get(n, n)} ({', '.join(c)})" for n, c in sorted(by.items()))


def log(*args) -> None:
    print(*args, flush=True)


def error_text(exc: BaseException) -> str:
    """'TypeName: first line of the message', for a table cell or a progress line."""
    return f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def get(d: dict, *keys):
    """d[k0][k1]..., or None where a key is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def cell(part: dict | None, fmt: str, scale: float = 1.0, key: str = "median_ms") -> str:
    """A number, or 'missing' (the module is not there), 'failed' (it raised), '-' (not run)."""
    if not isinstance(part, dict):
        return "-"
    if part.get(key) is not None:
        return format(part[key] * scale, fmt)
    err = part.get("error")
    if err is None:
        return "-"
    return "missing" if "is missing" in err else "failed"


def num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def against_target(ratio: float, target: float) -> str:
    """"met" where ratio <= target, else "NOT met (target Tx)": a time target's word in every verdict."""
    return "met" if ratio <= target else f"NOT met (target {target}x)"


def target_verdict(config: str, ratio: float | None, ours_bytes, fla_bytes, target: float, against: str) -> str:
    """"CONFIG: time R x AGAINST: met | NOT met (target T x); memory M x AGAINST: met | NOT met", either
    part "not measured" where its numbers are missing: the line each mode's verdict prints per configuration."""
    t = "time not measured" if ratio is None else f"time {ratio:.3f}x {against}: " + against_target(ratio, target)
    m = "memory not measured" if ours_bytes is None or not fla_bytes else (
        f"memory {ours_bytes / fla_bytes:.2f}x {against}: " + ("met" if ours_bytes <= fla_bytes else "NOT met"))
    return f"{config}: {t}; {m}"


def write_json(path: str, results: list[dict], runs: list[dict], environment: dict | None, args: dict | None) -> None:
    """A run's JSON file: its environment and arguments, the runs it merged, every result."""
    with open(path, "w") as fh:
        json.dump({"environment": environment, "args": args, "runs": runs, "results": results}, fh,
                  indent=1, default=str)
    log(f"wrote {path}")


def write_outputs(results: list[dict], runs: list[dict], plot_path: str | None, json_path: str | None, draw, *,
                  environment: dict | None = None, args: dict | None = None) -> None:
    """A mode's outputs: the JSON file (this run's environment and arguments, the runs it merged, every
    result) and the plot, ``draw(the results that ran, plot_path)``, whose failure is logged rather than
    raised (the numbers are in the table and the JSON already)."""
    if json_path:
        write_json(json_path, results, runs, environment, args)
    ok = [r for r in results if "error" not in r]
    if plot_path and ok:
        plot_logged(draw, ok, plot_path)


def plot_logged(draw, results: list, plot_path: str) -> None:
    """``draw(results, plot_path)``, a failure logged rather than raised (the numbers are in the table
    and the JSON already)."""
    try:
        draw(results, plot_path)
        log(f"wrote {plot_path}")
    except Exception as exc:
        log(f"plot failed: {error_text(exc)}")


def is_bench_json(path: str, bench: str) -> bool:
    """True when `path` is a JSON file of runs whose results say they are ``bench`` ("backward", "layer")."""
    try:
        with open(path) as fh:
            rows = json.load(fh).get("results") or []
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(rows, list) and any(isinstance(r, dict) and r.get("bench") == bench for r in rows)


def report_runs(paths: Sequence[str], what: str, table, write, plot_path: str | None, json_path: str | None) -> int:
    """The table (and --plot / --json) of configurations timed by earlier runs of one mode: read them
    (``what`` names the mode's JSON in a refusal), log ``table(results)``, then ``write``."""
    read = read_runs(paths, what)
    if read is None:
        return 1
    results, runs = read
    ok = [r for r in results if "error" not in r]
    log(f"{len(ok)} config(s) from {len(paths)} file(s); each row's ratios were measured in its own run")
    table(results)
    write(results, runs, plot_path, json_path)
    return 0 if ok else 1


def problems(results: Sequence[dict], parts: Sequence[str]) -> list[str]:
    """One line per error recorded anywhere in the results: a whole configuration's, or one in
    result[part][name] for each of ``parts``."""
    out = []
    for r in results:
        if "error" in r:
            out.append(f"{r.get('config')}: {r['error']}")
            continue
        for part in parts:
            for name, v in (r.get(part) or {}).items():
                if isinstance(v, dict) and "error" in v:
                    out.append(f"{r.get('config')}: {part} {name}: {v['error']}")
    return out


def log_mode_table(results: Sequence[dict], row, columns: Sequence[str], legend: str, problem_lines: list[str],
                   verdict_lines: list[str], targets: str, title: str | None = None) -> None:
    """A mode's table (``row`` of each configuration that ran) under ``title`` if given, its legend, the
    problems, then the verdict under the ``targets`` heading."""
    log("")
    if title:
        log(title)
    log(format_table([row(r) for r in results if "error" not in r], columns))
    log(legend)
    for line in problem_lines:
        log(line)
    if verdict_lines:
        log(targets)
        for line in verdict_lines:
            log(f"  {line}")


def table_row(res: dict) -> list[str]:
    """One row of the timing table; A GB/s, floor, A/floor are for bf16-every-64
    (fp32-every-tile's when only it ran); '-' where a number is missing."""
    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    mode = BF16_EVERY_64 if get(res, "kernel_a", BF16_EVERY_64, "median_ms") is not None else FP32_EVERY_TILE
    return [
        res.get("config", "?"),
        f(get(res, "kernel_a", BF16_EVERY_64, "median_ms"), ".3f"),
        f(get(res, "kernel_a", FP32_EVERY_TILE, "median_ms"), ".3f"),
        f(get(res, "kernel_a_from_fla", "median_ms"), ".3f"),
        f(get(res, "fla", "dAv+dhu", "median_ms"), ".3f"),
        f(get(res, "fla", "recompute_w_u", "median_ms"), ".3f"),
        f(res.get("ratio_a_fla"), ".2f"),
        f(res.get("ratio_alternating"), ".2f"),
        f(res.get("ratio_alternating_from_fla"), ".2f"),
        f(get(res, "kernel_a", mode, "GBps"), ".0f"),
        f(get(res, "floor", mode, "ms"), ".3f"),
        f(get(res, "kernel_a", mode, "vs_floor"), ".2f"),
    ]


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = TABLE_COLUMNS) -> str:
    """A Markdown table, numbers right-aligned."""
    rows = [list(map(str, r)) for r in rows]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"row {r} has {len(r)} cells, header {len(header)}")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def precision_row(res: dict) -> list[str]:
    p = res.get("precision", {})

    def e(*keys):
        x = get(p, *keys)
        return "-" if x is None else f"{x:.2e}"

    b = get(p, "builder_fp32_vs_f64")
    built = "-" if b is None else f"{max(b['mqk'], b['inv']):.1e}"
    return [res.get("config", "?"), f"{p.get('heads', '-')} x {p.get('sequences', '-')}",
            e("kernel_a", BF16_EVERY_64, "dh0"), e("kernel_a", BF16_EVERY_64, "snapshots"),
            e("kernel_a", FP32_EVERY_TILE, "dh0"), e("kernel_a", FP32_EVERY_TILE, "snapshots"),
            e("kernel_a_unsplit", BF16_EVERY_64, "dh0"), e("kernel_a_unsplit", BF16_EVERY_64, "snapshots"),
            e("fla", "dh0"), e("fla", "dh"), e("yardstick", "bf16_of_exact_dh"), built]


def alternating_text(res: dict) -> str:
    alt = res.get("alternating")
    if not alt:
        return "-"
    if "error" in alt:
        return f"failed ({alt['error']})"
    text = (f"A {alt[ALTERNATING_A]['median_ms']:.3f} ms, FLA {alt[ALTERNATING_FLA]['median_ms']:.3f} ms, "
            f"ratio {res['ratio_alternating']:.3f}")
    if ALTERNATING_FROM_FLA in alt:
        text += (f"; A from FLA's tensors {alt[ALTERNATING_FROM_FLA]['median_ms']:.3f} ms, "
                 f"ratio {res['ratio_alternating_from_fla']:.3f}")
    return text


def log_precision_table(results: Sequence[dict]) -> None:
    log("")
    log("relative Frobenius error vs the float64 reference (sampled heads):")
    log(format_table([precision_row(r) for r in results], PRECISION_COLUMNS))


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or ModuleNotFoundError saying how to get it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ModuleNotFoundError("PNG plots need matplotlib: pip install -e '.[plot]'", name="matplotlib") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def grouped_bars(ax, results: Sequence[dict], part: str, names: Sequence[str], labels: dict, key: str = "median_ms",
                 scale: float = 1.0) -> tuple[list[str], float]:
    """Side by side around each configuration's tick, one bar for each of ``names`` that some result has
    (``result[part][name][key] * scale``, 0 where a result lacks it), labelled ``labels[name]``: (the names
    drawn, the bars' width)."""
    x = np.arange(len(results))
    series = [n for n in names if any(get(r, part, n, key) is not None for r in results)]
    w = 0.8 / max(1, len(series))
    for i, n in enumerate(series):
        vals = [(get(r, part, n, key) or 0.0) * scale for r in results]
        ax.bar(x + (i - (len(series) - 1) / 2) * w, vals, w, label=labels[n])
    return series, w


def label_configs(ax, names: Sequence[str], ylabel: str) -> None:
    """A per-configuration axis: the names under the ticks, ``ylabel``, and the legend where something
    is labelled (last: it lists what is drawn by then)."""
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def heads_text(results: Sequence[dict]) -> str:
    """The results' head counts for a title: "32", or "16/32" where runs differ."""
    heads = {r.get("H") for r in results}
    return "/".join(map(str, sorted(h for h in heads if h)))


def plot(results: Sequence[dict], path: str) -> None:
    """Grouped bars per config: Kernel A (each mode), FLA dAv+dhu, FLA + recompute_w_u;
    the bf16-every-64 byte floor as a tick."""
    plt = pyplot()

    series = [(f"Kernel A {BF16_EVERY_64}", ("kernel_a", BF16_EVERY_64, "median_ms")),
              (f"Kernel A {FP32_EVERY_TILE}", ("kernel_a", FP32_EVERY_TILE, "median_ms")),
              ("FLA dAv+dhu", ("fla", "dAv+dhu", "median_ms")),
              ("FLA recompute_w_u", ("fla", "recompute_w_u", "median_ms"))]
    # a series no config has (e.g. --snapshot bf16-every-64 alone) gets no bar and no legend entry
    series = [(label, keys) for label, keys in series if any(get(r, *keys) is not None for r in results)]
    names = [r["config"] for r in results]
    x = np.arange(len(names))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(names)), 4.5))
    for i, (label, keys) in enumerate(series):
        vals = [get(r, *keys) for r in results]
        ax.bar(x + (i - (len(series) - 1) / 2) * w, [v if v is not None else 0 for v in vals],
               w, label=label)
    floors = [get(r, "floor", BF16_EVERY_64, "ms") for r in results]
    if any(f is not None for f in floors):
        ax.scatter([xi - 1.5 * w for xi, f in zip(x, floors) if f is not None],
                   [f for f in floors if f is not None], marker="_", s=400, color="k",
                   label=f"byte floor ({BF16_EVERY_64})", zorder=3)
    ax.set_xticks(x)
    ax.set_xticklabels(names)
    ax.set_ylabel("ms (median)")
    ax.set_title("Kernel A vs flash-linear-attention (H200, H=32, D=128)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _renamed(d):
    """A {mode: ...} dict with the old mode names replaced by the new ones."""
    if not isinstance(d, dict):
        return d
    return {RENAMED_MODES.get(k, k): v for k, v in d.items()}


def upgrade_result(res: dict) -> dict:
    """One result of an earlier run's JSON with today's mode names (a copy; new ones unchanged)."""
    out = dict(res)
    for key in ("kernel_a", "floor", "bytes"):
        if key in out:
            out[key] = _renamed(out[key])
    if isinstance(out.get("precision"), dict) and "kernel_a" in out["precision"]:
        out["precision"] = {**out["precision"], "kernel_a": _renamed(out["precision"]["kernel_a"])}
    alt = out.get("alternating")
    if isinstance(alt, dict) and "kernel_a_fla" in alt:
        out["alternating"] = {(ALTERNATING_A if k == "kernel_a_fla" else k): v for k, v in alt.items()}
    return out


def read_runs(paths: Sequence[str], what: str, upgrade=lambda r: r) -> tuple[list[dict], list[dict]] | None:
    """(results, runs) of bench JSON files (``what``: the command that writes them, for the error),
    each result passed through ``upgrade`` and tagged with its file; None (said why) if one is not
    such a file."""
    results, runs = [], []
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
            rows = data["results"]
            if not isinstance(rows, list):
                raise TypeError("'results' is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(f"{path}: not a {what} file ({error_text(exc)})")
            return None
        # by file name only: the runs' paths are scratch folders of the machines they passed through
        name = os.path.basename(path)
        args = data.get("args")
        if isinstance(args, dict):
            args = {k: os.path.basename(v) if k in ("json", "plot") and isinstance(v, str) else v
                    for k, v in args.items()}
        runs.append({"file": name, "environment": data.get("environment"), "args": args})
        results += [{**upgrade(r), "source": name} for r in rows]
    return results, runs


def report_from_json(paths: Sequence[str], plot_path: str | None, json_path: str | None) -> int:
    """The table, precision table and plot of configs timed by earlier runs (--json files)."""
    read = read_runs(paths, "bench --json", upgrade_result)
    if read is None:
        return 1
    results, runs = read
    ok = [r for r in results if "error" not in r]
    log(f"{len(ok)} config(s) from {len(paths)} file(s); each row's ratios were measured in its own run")
    log(format_table([table_row(r) for r in ok]))
    prec = [r for r in ok if "precision" in r and "error" not in r["precision"]]
    if prec:
        log_precision_table(prec)
    for r in results:
        if "error" in r:
            log(f"{r['config']} ({r['source']}): {r['error']}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"runs": runs, "results": results}, fh, indent=1, default=str)
        log(f"wrote {json_path}")
    if plot_path and ok:
        plot_logged(plot, ok, plot_path)
    return 0 if ok else 1
