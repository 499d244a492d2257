"""`ptx-lab bench` (also `python -m kernel.tools.bench`): arguments and the run loop.

    ptx-lab bench                       # the five configs, H = 32, HEAD_DIM = 128
    ptx-lab bench --quick               # 4x8192 and 1x32768, few repetitions
    ptx-lab bench --configs 32x8192,varlen64x262144 --precision --json out.json
    ptx-lab bench --from-json a.json b.json --plot p.png    # earlier runs' tables, no GPU
    ptx-lab bench --backward --json b.json --plot b.png      # the whole backward: ours vs FLA (.backward_run)
    ptx-lab bench --layer --json l.json                      # FLA's KDA layer, its path vs ours (.layer)
    ptx-lab bench --forward --json f.json --plot f.png       # the training forward: ours vs FLA's, cuDNN's (.forward)
    ptx-lab bench --backward --our-forward fla               # the step with kernel.chunk_kda on FLA's forward
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from kernel.ds_scan.config import parse_knobs
from kernel.shapes import HEAD_DIM

from .inputs import GATE_RECIPES
from .layer import HIDDEN as LAYER_HIDDEN, LAYER_HEADS
from .configs import (BACKWARD_CONFIGS, BF16_EVERY_64, DEFAULT_CONFIGS, FP32_EVERY_TILE, MODES, QUICK_CONFIGS, RENAMED_MODES,
                      parse_configs)
from .measure import bench_config, fla_import, kernel_a_import, precision_config
from .report import (OUR_FORWARDS, PRECISION_COLUMNS, TABLE_COLUMNS, alternating_text, error_text, format_table, get,
                     log, log_precision_table, plot, precision_row, report_from_json, table_row)
from . import backward_report, forward_report, layer_report
from .backward_run import main_backward
from .device import CANNOT_RUN_EXIT, environment
from .timing import L2_FLUSH_BYTES, log_failure, run_configs

PROG = "python -m kernel.tools.bench"
SNAPSHOT_CHOICES = ("both", *MODES)
BENCH_HEADS = 32   # the heads of 128 every mode but --layer times at


def _snapshot_mode(text: str) -> str:
    if text in RENAMED_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is now {RENAMED_MODES[text]!r} (choose from "
                                         f"{', '.join(map(repr, SNAPSHOT_CHOICES))})")
    return text


def pipeline_argument(text: str):
    """An A_SMS,GROUPS argument (kernel.backward_pipeline.Pipeline.parse), refused as argparse refuses: the bench's
    --backward-pipeline and the layer profile's."""
    from kernel.backward_pipeline import Pipeline

    try:
        return Pipeline.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_args(argv: Sequence[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description="Kernel A (dstate scan) vs flash-linear-attention dAv+dhu on one GPU.")
    p.add_argument("--backward", action="store_true",
                   help="the whole KDA backward instead of Kernel A: ours (kernel.kda_backward) against FLA's "
                        "chunk_kda_bwd with safe_gate True and False, their peak memory, Kernel A's share, the "
                        "byte floor, and the chunk_kda training step (FLA's vs kernel.chunk_kda, its forward "
                        "--our-forward's); each "
                        "configuration in its own process (default configs " + ",".join(BACKWARD_CONFIGS) + ")")
    p.add_argument("--layer", action="store_true",
                   help="FLA's KDA layer (fla.layers.kda.KimiDeltaAttention at its defaults, bf16): its forward + "
                        "backward through autograd with FLA's chunk_kda against kernel.patch_fla()'s route, timed "
                        "in turn, and each one's peak memory; then the op's backward alone on the layer's own call, FLA's "
                        "against ours and our bare kernel.kda_backward.run (the wrapper's cost); each configuration "
                        "in its own process (default "
                        "configs " + ",".join(BACKWARD_CONFIGS) + "; needs flash-linear-attention and transformers)")
    p.add_argument("--forward", action="store_true",
                   help="KDA's forward as a training step runs it (inputs that require a gradient): kernel.chunk_kda "
                        "with our forward against FLA's chunk_kda and cuDNN frontend's kimi_delta_attention (where "
                        "installed, unless --no-cudnn), timed in turn, and our bare kernel.forward.forward on the "
                        "same tensors (the wrapper's share); each one's peak memory and host time; each "
                        "configuration in its own process (default configs " + ",".join(BACKWARD_CONFIGS) + ")")
    p.add_argument("--our-forward", choices=tuple(OUR_FORWARDS), default="ours",
                   help="--backward's step and --layer: the forward kernel.chunk_kda runs (kernel.using_forward): "
                        "ours (default) or fla (FLA's forward, our backward)")
    p.add_argument("--qk-copies", action="store_true",
                   help="--backward's step, --forward and --layer: kernel.chunk_kda on its copies path (q and k "
                        "normalised into bf16 copies before the kernels: kernel.fla_dropin.setting.RAW_QK_ROWS off) "
                        "instead of its raw-row path, to compare the two")
    p.add_argument("--hidden", type=int, default=LAYER_HIDDEN,
                   help=f"--layer: the layer's hidden size (default {LAYER_HIDDEN}, FLA's)")
    p.add_argument("--in-process", action="store_true",
                   help="--backward, --layer, --forward: measure every configuration in this process, one after "
                        "the other")
    p.add_argument("--no-step", action="store_true", help="--backward: skip the forward + backward step")
    p.add_argument("--step-only", action="store_true",
                   help="--backward: the forward + backward step alone (and each side's backward through autograd): "
                        "no bare backwards, pieces or the FLA forward they read (FLA's backward kernels then "
                        "compile in the step's first call)")
    p.add_argument("--backward-pipeline", type=pipeline_argument, metavar="A_SMS,GROUPS",
                   help="--backward's step: also kernel.chunk_kda with its backward pipelined "
                        "(kernel.backward_pipeline: the batch in GROUPS groups, each group's Kernel A on A_SMS SMs "
                        "beside the group before's Kernel B on the rest), timed in turn with the others")
    p.add_argument("--configs", default=None,
                   help="comma-separated BxT or varlenNxTOTAL (default: "
                        + ",".join(DEFAULT_CONFIGS) + ")")
    p.add_argument("--quick", action="store_true",
                   help="small subset (" + ",".join(QUICK_CONFIGS) + "), few repetitions")
    p.add_argument("--heads", type=int, default=None,
                   help=f"H (default {BENCH_HEADS}; --layer {LAYER_HEADS}, FLA's layer's); HEAD_DIM is fixed at {HEAD_DIM}")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3, quick 1)")
    p.add_argument("--reps", type=int, default=None, help="timed calls, median reported "
                                                         "(default 20, quick 5)")
    p.add_argument("--snapshot", type=_snapshot_mode, choices=SNAPSHOT_CHOICES, default="both",
                   help=f"Kernel A's snapshot modes: {BF16_EVERY_64} = bf16 every 64 tokens (FLA's dh "
                        f"layout), {FP32_EVERY_TILE} = fp32 after every 16-token tile (default both)")
    p.add_argument("--vsplit", default="auto", choices=("auto", "1", "2", "4", "8"),
                   help="Kernel A's V split (default auto)")
    p.add_argument("--segments", default="auto",
                   help="Kernel A's sequence split (kernel.ds_scan.split): 'auto' (split where the grid would not fill "
                        "the SMs), or S segments per sequence (1: never split)")
    p.add_argument("--tune", nargs="*", default=[], metavar="KNOB=N",
                   help="Kernel A build knobs (kernel.ds_scan.config.Config), e.g. ksplit=2 producers=8")
    p.add_argument("--no-alternate", action="store_true",
                   help=f"skip the alternating timing (Kernel A's {BF16_EVERY_64} and FLA's dAv+dhu called "
                        "in turn, the same number of times, after the separate timings)")
    p.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention")
    p.add_argument("--no-cudnn", action="store_true",
                   help="--backward, --forward: leave cuDNN frontend's KDA op out (it runs where installed)")
    p.add_argument("--no-kernel", action="store_true", help="skip Kernel A")
    p.add_argument("--cupti", action="store_true",
                   help="also take kernel-only times with torch.profiler (CUPTI); off by default: "
                        "on the device machine a profiled run stalled past 4 minutes")
    p.add_argument("--precision", action="store_true",
                   help="relative Frobenius errors vs the float64 reference on sampled heads")
    p.add_argument("--precision-heads", type=int, default=2,
                   help="heads (the first ones) used by --precision (default 2)")
    p.add_argument("--precision-seqs", type=int, default=None,
                   help="at most this many sequences (the first ones) for --precision "
                        "(default all)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--gate-strength", type=float, default=1.0,
                   help="gate strength of kernel.reference.random_inputs (default 1)")
    p.add_argument("--gates", choices=GATE_RECIPES, default=GATE_RECIPES[0],
                   help="--backward: the gates' recipe. clamped (default): logsigmoid gates in [-5, 0], FLA "
                        "with safe_gate True and False; trained-layer: FLA's layer gate with its projection "
                        "grown (kernel.tools.trained_layer_gate), unbounded below, so that some 16-token tiles "
                        "decay a channel past 2^-126; FLA then runs with safe_gate False only")
    p.add_argument("--projection-scale", type=float, default=None, metavar="X",
                   help="--gates trained-layer: the gate projection's growth (default the recipe's, 4)")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="bar chart of the timings")
    p.add_argument("--json", metavar="FILE", default=None, help="write every number as JSON")
    p.add_argument("--from-json", metavar="FILE", nargs="+", default=None,
                   help="time nothing: print the tables (and --plot / --json) of earlier runs' JSON "
                        "files, one row per config, e.g. configs timed in separate processes. Each "
                        "row's ratios come from its own run; no GPU needed")
    args = p.parse_args(argv)
    modes = [f"--{m}" for m in ("backward", "layer", "forward") if getattr(args, m)]
    if len(modes) > 1:
        p.error(f"{' and '.join(modes)} are {('two', 'three')[len(modes) - 2]} modes: pick one")
    if args.our_forward != "ours" and not (args.backward or args.layer):
        p.error("--our-forward picks kernel.chunk_kda's forward in --backward's step and --layer: add one of them")
    if args.heads is None:
        args.heads = LAYER_HEADS if args.layer else BENCH_HEADS
    if args.hidden < 1 or (args.hidden != LAYER_HIDDEN and not args.layer):
        p.error("--hidden takes an integer >= 1, with --layer")
    if args.configs is None:
        args.configs = ",".join(QUICK_CONFIGS if args.quick else BACKWARD_CONFIGS if modes else DEFAULT_CONFIGS)
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.reps is None:
        args.reps = 5 if args.quick else 20
    if args.heads < 1 or args.reps < 1 or args.warmup < 0 or args.precision_heads < 1:
        p.error("--heads, --reps, --precision-heads must be >= 1 and --warmup >= 0")
    if args.step_only and (args.no_step or not (args.backward or args.from_json)):
        p.error("--step-only times --backward's step alone: add --backward, without --no-step")
    if args.gates != GATE_RECIPES[0] and not (args.backward or args.from_json):
        p.error(f"--gates {args.gates} times the whole backward: add --backward")
    if args.projection_scale is not None and (args.gates != "trained-layer" or not args.projection_scale > 0):
        p.error("--projection-scale takes a number > 0, with --gates trained-layer")
    args.vsplit = args.vsplit if args.vsplit == "auto" else int(args.vsplit)
    if args.segments != "auto":
        try:
            args.segments = int(args.segments)
        except ValueError:
            args.segments = -1
        if args.segments < 1:
            p.error("--segments takes 'auto' or an integer >= 1")
    args.tuning = parse_knobs(args.tune)
    args.modes = list(MODES) if args.snapshot == "both" else [args.snapshot]
    return args


def _progress_line(tag: str, res: dict) -> str:
    cells = dict(zip(TABLE_COLUMNS, table_row(res)))
    extra = ""
    if "precision" in res and "error" not in res["precision"]:
        extra = "; precision " + " ".join(
            f"{h}={c}" for h, c in zip(PRECISION_COLUMNS[2:], precision_row(res)[2:]))
    ko = {m: get(res, "kernel_a", m, "kernel_only", "ms") for m in MODES}
    ko["FLA"] = get(res, "fla", "dAv+dhu", "kernel_only", "ms")
    ko_txt = ", ".join(f"{m} {v:.3f}" for m, v in ko.items() if v is not None)
    return (f"{tag}: A (vsplit {res.get('vsplit', '-')}, segments {res.get('segments', '-')}) {BF16_EVERY_64} {cells[TABLE_COLUMNS[1]]} ms, "
            f"{FP32_EVERY_TILE} {cells[TABLE_COLUMNS[2]]} ms, "
            f"FLA dAv+dhu {cells['FLA dAv+dhu ms']} ms (w_u {cells['FLA w_u ms']}), "
            f"floor {cells['floor ms']} ms, A/floor {cells['A/floor']}, "
            f"in turn: {alternating_text(res)} "
            f"[{res['wall_s']:.0f} s]; kernels only (CUPTI): {ko_txt or '-'}{extra}")


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    if args.from_json:
        if args.layer or all(layer_report.is_layer_json(path) for path in args.from_json):
            return layer_report.report_from_json(args.from_json, args.plot, args.json)
        if args.forward or all(forward_report.is_forward_json(path) for path in args.from_json):
            return forward_report.report_from_json(args.from_json, args.plot, args.json)
        if args.backward or all(backward_report.is_backward_json(path) for path in args.from_json):
            return backward_report.report_from_json(args.from_json, args.plot, args.json)
        return report_from_json(args.from_json, args.plot, args.json)
    if args.qk_copies:
        from kernel.fla_dropin import setting

        setting.RAW_QK_ROWS = False
        log("kernel.chunk_kda on its copies path (--qk-copies)")
    if args.backward or args.layer or args.forward:
        return main_backward(args, prog)
    configs = parse_configs(args.configs, args.seed, log)

    try:
        import torch
    except ImportError as exc:
        log(f"{prog} needs torch and a CUDA GPU: torch is not installed ({exc})")
        return CANNOT_RUN_EXIT
    if not torch.cuda.is_available():
        log(f"{prog} needs torch and a CUDA GPU: torch sees no CUDA device")
        return CANNOT_RUN_EXIT

    env = environment()
    log(f"device: {env.get('device')} ({env.get('sms')} SMs, L2 "
        f"{(env.get('l2_bytes') or 0) / 2**20:.0f} MiB), torch {env['torch']}")
    dstate_scan = None
    if not args.no_kernel:
        dstate_scan, why = kernel_a_import()
        log("Kernel A: kernel.ds_scan.dstate_scan" if dstate_scan else f"Kernel A not available ({why})")
    fla, why = None, "skipped (--no-fla)"
    if not args.no_fla:
        fla, why = fla_import()
        log(f"FLA: {why}" if fla else f"flash-linear-attention not found ({why})")
    env["fla"] = why if fla else None
    log(f"H={args.heads}, HEAD_DIM={HEAD_DIM}, modes={args.modes}, vsplit={args.vsplit}, segments={args.segments}, "
        f"tuning={args.tuning or 'defaults'}, warm-up "
        f"{args.warmup}, median of {args.reps}; seed {args.seed}")

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def precision(cfg, res, tag):
        try:
            res["precision"] = precision_config(cfg, args, dstate_scan, fla)
        except Exception as exc:
            res["precision"] = {"error": log_failure(f"{tag}: precision", exc)}

    def progress(i, tag, res):
        log(_progress_line(tag, res))
        if i == 0 and "l2_note" in res:
            log(f"    {res['l2_note']}")

    results = run_configs(configs, lambda cfg: bench_config(cfg, args, dstate_scan, fla, flush), progress,
                          failed={}, after=precision if args.precision else None)

    ok = [r for r in results if "error" not in r]
    log("")
    log(format_table([table_row(r) for r in ok]))
    log(f"A = Kernel A (vsplit {args.vsplit}); ratio, A GB/s, floor and A/floor use {BF16_EVERY_64} (bf16 "
        "snapshot every 64 tokens, FLA's dh layout); floor = device copy of the same bytes; "
        f"'A/FLA in turn' = both called alternately, {args.reps} times each (same power state).")
    if args.precision:
        log_precision_table([r for r in ok if "precision" in r])
    for r in results:
        if "error" in r:
            log(f"{r['config']}: {r['error']}")

    del flush
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "args": dict(vars(args)), "results": results}, fh,
                      indent=1, default=str)
        log(f"wrote {args.json}")
    if args.plot and ok:
        try:
            plot(ok, args.plot)
            log(f"wrote {args.plot}")
        except Exception as exc:
            log(f"plot failed: {error_text(exc)}")
    return 0 if ok or not configs else 1


if __name__ == "__main__":
    sys.exit(main())
