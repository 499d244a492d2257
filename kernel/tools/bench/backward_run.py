"""``ptx-lab bench --backward``, ``--layer`` and ``--forward``: the run loop, each configuration in a process of
its own.

FLA's Triton autotune keys leave out B and T (:func:`kernel.tools.fla_adapter.reset_autotune`), and
one configuration's allocator pools and compiled kernels would follow it into the next. So with more
than one configuration this process measures nothing itself: it runs ``python -m kernel.tools.bench
--backward --configs ONE --json FILE`` for each (their output streams through), then reads the files
and prints one table. ``--in-process`` measures every configuration here, one after the other.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kernel.tools.fla_adapter import FLA_VERSION

from . import backward, backward_report, forward, forward_report, layer, layer_report
from .configs import Config, parse_configs
from .device import CANNOT_RUN_EXIT, environment
from .report import log, our_forward_text
from .timing import L2_FLUSH_BYTES, run_configs


@dataclasses.dataclass(frozen=True)
class Mode:
    """What one mode measures per configuration and how its results are reported."""
    flag: str
    needs: str
    missing: Callable[[], str | None]
    measure: Callable[..., dict]          # (config, args, flush) -> result
    progress: Callable[[str, dict], str]
    table: Callable[[list], None]
    write: Callable[..., None]            # (results, runs, plot, json, *, environment, args)
    read: Callable[[list], Any]


MODES = {
    "backward": Mode("--backward", f"torch, fla-core {FLA_VERSION} (with triton) and CuPy on a CUDA GPU",
                     backward.missing_requirement, backward.bench_backward_config, backward_report.progress_line,
                     backward_report.log_backward_table, backward_report.write_outputs, backward_report.read_runs),
    "layer": Mode("--layer", f"torch, fla-core {FLA_VERSION} with flash-linear-attention's layers (and transformers), "
                  f"and CuPy on a CUDA GPU", layer.missing_requirement, layer.bench_layer_config,
                  layer_report.progress_line, layer_report.log_layer_table, layer_report.write_outputs,
                  layer_report.read_runs),
    "forward": Mode("--forward", f"torch, fla-core {FLA_VERSION} (with triton) and CuPy on a CUDA GPU",
                    forward.missing_requirement, forward.bench_forward_config, forward_report.progress_line,
                    forward_report.log_forward_table, forward_report.write_outputs, forward_report.read_runs),
}


def mode_of(args) -> Mode:
    for name in ("layer", "forward"):
        if getattr(args, name, False):
            return MODES[name]
    return MODES["backward"]


def child_argv(args, config: str, json_path: str) -> list[str]:
    """The command line of one configuration's own process: this run's options, one config."""
    argv = [sys.executable, "-m", "kernel.tools.bench", mode_of(args).flag, "--in-process", "--configs", config,
            "--json", json_path, "--heads", str(args.heads), "--warmup", str(args.warmup), "--reps", str(args.reps),
            "--seed", str(args.seed)]
    mode = mode_of(args)
    if mode is MODES["layer"]:
        argv += ["--hidden", str(args.hidden)]
    else:
        argv += ["--gate-strength", repr(args.gate_strength)]
    if mode is MODES["backward"]:
        argv += ["--gates", args.gates]
        if args.projection_scale is not None:
            argv += ["--projection-scale", repr(args.projection_scale)]
    if mode is not MODES["forward"]:
        argv += ["--our-forward", args.our_forward]
    if args.qk_copies:
        argv.append("--qk-copies")
    if args.no_fla:
        argv.append("--no-fla")
    if args.no_cudnn:
        argv.append("--no-cudnn")
    if args.no_step:
        argv.append("--no-step")
    if args.step_only:
        argv.append("--step-only")
    if getattr(args, "backward_pipeline", None) is not None:
        argv += ["--backward-pipeline", args.backward_pipeline.text()]
    return argv


def run_each_in_own_process(args, configs: Sequence[Config]) -> tuple[list[dict], list[dict]]:
    results, runs = [], []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for i, cfg in enumerate(configs):
            path = str(Path(tmp) / f"{cfg.name}.json")
            log(f"[{i + 1}/{len(configs)}] {cfg.name}: own process [{time.perf_counter() - t_all:.0f} s]")
            t0 = time.perf_counter()
            rc = subprocess.call(child_argv(args, cfg.name, path))
            read = mode_of(args).read([path]) if Path(path).exists() else None
            if rc != 0 or read is None:
                results.append({"config": cfg.name, "error": f"its process exited with {rc}"
                                + ("" if read else ", no JSON written"), "wall_s": time.perf_counter() - t0})
                log(f"[{i + 1}/{len(configs)}] {cfg.name}: FAILED ({results[-1]['error']})")
                if read is None:
                    continue
            results += [{k: v for k, v in r.items() if k != "source"} for r in read[0]]
            runs += [{"config": cfg.name, "environment": run["environment"], "args": run["args"]} for run in read[1]]
    return results, runs


def run_in_process(args, configs: Sequence[Config]) -> list[dict]:
    import torch

    mode = mode_of(args)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    results = run_configs(configs, lambda cfg: mode.measure(cfg, args, flush),
                          lambda i, tag, res: log(mode.progress(tag, res)), failed={"bench": mode.flag[2:]})
    del flush
    return results


def main_backward(args, prog: str) -> int:
    """The --backward, --layer and --forward modes of ``ptx-lab bench`` (arguments parsed by cli.parse_args)."""
    mode = mode_of(args)
    configs = parse_configs(args.configs, args.seed, log)
    why = mode.missing()
    if why:
        log(f"{prog} {mode.flag} needs {mode.needs}: {why}")
        return CANNOT_RUN_EXIT
    env = environment()
    shape = f"hidden {args.hidden}, {args.heads} heads of 128" if mode.flag == "--layer" else f"H={args.heads}, K=V=128"
    log(f"device: {env.get('device')} ({env.get('sms')} SMs), torch {env['torch']}; {shape}, "
        f"bf16; warm-up {args.warmup}, median of {args.reps}, seed {args.seed}"
        + ("" if mode.flag == "--forward" else f"; ours: {our_forward_text(args.our_forward)}"))
    if len(configs) > 1 and not args.in_process:
        results, runs = run_each_in_own_process(args, configs)
    else:
        results, runs = run_in_process(args, configs), []
    mode.table(results)
    mode.write(results, runs, args.plot, args.json, environment=env, args=dict(vars(args)))
    ok = [r for r in results if "error" not in r]
    return 0 if ok or not configs else 1
