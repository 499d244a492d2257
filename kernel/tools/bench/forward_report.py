"""What ``ptx-lab bench --forward`` prints and writes: the progress line, the table, the plot, and the table
of earlier runs' JSON files. Reads result dicts of :func:`.forward.bench_forward_config`; needs no GPU
(matplotlib for the plot only).
"""
from __future__ import annotations

from typing import Sequence

from . import report
from .forward import FWD_CUDNN, FWD_FLA, FWD_OURS, FWD_RAW, FWD_THREE, SIDES
from .report import against_target, cell, is_bench_json, num

FORWARD_COLUMNS = ("config", "ours ms", "FLA ms", "cuDNN ms", "raw ms", "3-pass ms", "ours/FLA", "ours/cuDNN",
                   "over raw", "3-pass/raw", "ours GB", "FLA GB", "cuDNN GB", "raw GB", "3-pass GB", "ours host ms",
                   "FLA host ms", "cuDNN host ms", "raw host ms", "3-pass host ms")
LABELS = {FWD_OURS: "ours (kernel.chunk_kda)", FWD_FLA: "FLA chunk_kda", FWD_CUDNN: "cuDNN kimi_delta_attention",
          FWD_RAW: "ours raw (kernel.forward.forward)", FWD_THREE: "ours raw in three passes (kernel.three_pass_forward)"}
TITLE = "KDA's forward as a training step runs it (inputs require a gradient), ours against FLA's and cuDNN's"
LEGEND = ("ours = kernel.chunk_kda with our forward (kernel.using_forward('ours')) through the op's autograd: "
          "kernel.forward.forward on raw q and k rows with each row's rstd from the rstd pass (kernel.row_rstd), or "
          "for few long sequences the three passes, whose products pass forms the rstd; each reads each token's "
          "gate and sums it itself; FLA = fla.ops.kda.chunk_kda; "
          "both on the same leaves (requires_grad, use_qk_l2norm_in_kernel, safe_gate True, the final state), so "
          "that each keeps what its backward reads. cuDNN = cuDNN frontend's kimi_delta_attention (q, k normalised "
          "in torch inside the call; where installed). raw = kernel.forward.forward alone (training=True) on "
          "FLA's preprocessed tensors (q and k normalised, the gate's chunk cumsum: made before, not timed); over "
          "raw = ours / raw - 1: the rstd pass, what the kernels' own normalising and gate sums cost them, the op "
          "and autograd; 3-pass = "
          "kernel.three_pass_forward on the same tensors, 3-pass/raw its time over the one pass's. All timed in "
          "turn (same power state), one process per configuration. GB = peak GPU memory of one call above what was "
          "allocated before (torch's max_memory_allocated, reset before each side, plus CuPy's pool), outputs and "
          "saved tensors included; host ms = the CPU time of one call (the GPU is kept ahead of it).")


FLA_TARGET = 0.5   # issue 35: our forward over FLA's chunk_kda forward, at most; and below cuDNN's (a ratio under 1)


def verdict(results: Sequence[dict]) -> list[str]:
    """One line per configuration: ours over FLA's against FLA_TARGET, and over cuDNN's against 1 where it ran."""
    out = []
    for r in results:
        ratio = r.get("ratio") or {}
        if "error" in r or ratio.get("ours/fla") is None:
            continue
        line = f"{r.get('config', '?')}: {ratio['ours/fla']:.3f}x FLA's forward: " + against_target(ratio["ours/fla"],
                                                                                                     FLA_TARGET)
        c = ratio.get("ours/cudnn")
        line += "; cuDNN's not timed" if c is None else (f"; {c:.3f}x cuDNN's: "
                                                         + ("met" if c < 1 else "NOT met (target below 1x)"))
        out.append(line)
    return out


def forward_row(res: dict) -> list[str]:
    """One row of the table; ratios from the same run, in turn."""
    fwd, mem, ratio = res.get("forward", {}), res.get("peak_memory", {}), res.get("ratio", {})
    return [res.get("config", "?"),
            *(cell(fwd.get(n), ".3f") for n in SIDES),
            num(ratio.get("ours/fla"), ".3f"), num(ratio.get("ours/cudnn"), ".3f"), num(ratio.get("over_raw"), "+.1%"),
            num(ratio.get("three/raw"), ".3f"),
            *(cell(mem.get(n), ".2f", 1e-9, key="bytes") for n in SIDES),
            *(cell(fwd.get(n), ".2f", key="host_ms") for n in SIDES)]


def progress_line(tag: str, res: dict) -> str:
    c = dict(zip(FORWARD_COLUMNS, forward_row(res)))
    return (f"{tag}: forward ours {c['ours ms']} ms, FLA {c['FLA ms']} ms (ratio {c['ours/FLA']}), cuDNN "
            f"{c['cuDNN ms']} ms (ratio {c['ours/cuDNN']}), raw {c['raw ms']} ms (ours over raw {c['over raw']}), "
            f"three passes {c['3-pass ms']} ms ({c['3-pass/raw']} of raw); "
            f"peak memory ours {c['ours GB']} GB, FLA {c['FLA GB']} GB, cuDNN {c['cuDNN GB']} GB; host ms ours "
            f"{c['ours host ms']}, FLA {c['FLA host ms']} [{res.get('wall_s', 0):.0f} s]")


def problems(results: Sequence[dict]) -> list[str]:
    return report.problems(results, ("forward", "peak_memory"))


def notes(results: Sequence[dict]) -> list[str]:
    """The sides left out on purpose (e.g. cuDNN's with --no-cudnn), one line each."""
    return [f"{r.get('config')}: {name} skipped ({v['skipped']})" for r in results if "error" not in r
            for name, v in (r.get("forward") or {}).items() if isinstance(v, dict) and "skipped" in v]


def log_forward_table(results: Sequence[dict]) -> None:
    report.log_mode_table(results, forward_row, FORWARD_COLUMNS, LEGEND, problems(results) + notes(results),
                          verdict(results), f"targets (ours at most {FLA_TARGET}x FLA's forward, and below cuDNN's):",
                          title=TITLE + ":")


def plot_forward(results: Sequence[dict], path: str) -> None:
    """Bars per configuration: each side's median time (left) and peak memory (right)."""
    plt = report.pyplot()

    names = [r["config"] for r in results]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(9, 2.6 * len(names)), 4.5))
    for a, part, key, scale, ylabel in ((ax, "forward", "median_ms", 1.0, "ms (median)"),
                                        (ax2, "peak_memory", "bytes", 1e-9, "peak GB")):
        report.grouped_bars(a, results, part, SIDES, LABELS, key, scale)
        report.label_configs(a, names, ylabel)
    ax.set_title("training forward: time")
    ax2.set_title("training forward: peak memory")
    fig.suptitle(f"KDA forward, ours vs flash-linear-attention and cuDNN, H={report.heads_text(results)}, "
                 f"K=V=128, bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def is_forward_json(path: str) -> bool:
    """True when `path` is a --forward run's JSON file (its results say so)."""
    return is_bench_json(path, "forward")


def write_outputs(results: list[dict], runs: list[dict], plot_path: str | None, json_path: str | None, *,
                  environment: dict | None = None, args: dict | None = None) -> None:
    """The JSON file and the plot (:func:`plot_forward`), as :func:`.report.write_outputs` writes them."""
    report.write_outputs(results, runs, plot_path, json_path, plot_forward, environment=environment, args=args)


def read_runs(paths: Sequence[str]) -> tuple[list[dict], list[dict]] | None:
    return report.read_runs(paths, "bench --forward --json")


def report_from_json(paths: Sequence[str], plot_path: str | None, json_path: str | None) -> int:
    """The table (and --plot / --json) of configurations timed by earlier --forward runs."""
    return report.report_runs(paths, "bench --forward --json", log_forward_table, write_outputs, plot_path,
                              json_path)
