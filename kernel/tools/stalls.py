"""What binds each kernel of the whole backward: one ncu run over ``kernel.kda_backward`` (with
``--forward``, over our forward, ``kernel.forward.forward``, instead; with ``--three-pass``, over
``kernel.three_pass_forward``, each pass once over the whole batch).

    ptx-lab stalls [--config 4x8192] [--heads 32] [--json FILE]   (or python -m kernel.tools.stalls)
    ptx-lab stalls --forward --config 32x8192 --heads 16           # the forward at the layer's size
    ptx-lab stalls --three-pass --config 1x131072 --heads 16       # the three passes, where the op runs them

The tool runs itself again as a child under Nsight Compute (``ncu --clock-control none``,
so the clocks stay where an unprofiled run has them). The child makes one whole backward
on FLA's forward tensors when fla-core is installed, else (or with ``--inputs drawn``) on
tensors of the same shapes and magnitudes drawn here: the kernels branch on no value, so
their instruction streams are the same. ncu profiles each of our three kernels' launches alone, replaying it once per
group of counters, so the kernels that run side by side at B = 1 are measured one at a
time:

    forward-state scan  kda_forward_states   the state entering every 64-token chunk
    Kernel A            kda_dstate_scan      the backward dS scan
    Kernel B            kda_token_gradients  the per-token gradients
    (--forward) the forward  kda_forward     o, the final state, and what the backward reads
    (--three-pass) products pass  kda_forward_products   every chunk's w, u, kg, qg, Aqk, decay
                   chain          kda_forward_chain      the states and v_new, 64 tokens a step
                   o pass         kda_forward_output     o from the states

For each, the table gives its time under ncu, registers, dynamic shared memory, grid,
warps resident per scheduler, instructions issued per scheduler and cycle, DRAM and
tensor-pipe use, and the three largest stall reasons in warps stalled per issued
instruction (ncu's ``smsp__average_warps_issue_stalled_*_per_issue_active``). The
binding stall is the largest reason other than "selected" (a warp issuing, not waiting).
When it is "not_selected" the warps were ready and the scheduler was busy: the kernel
is issue-bound. Needs a GPU, torch and ncu on PATH.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from ptx_lab import ncu

BACKWARD_KERNELS = {"kda_forward_states": "forward-state scan", "kda_dstate_scan": "Kernel A",
                    "kda_token_gradients": "Kernel B"}
FORWARD_KERNELS = {"kda_forward": "the forward"}
THREE_PASS_KERNELS = {"kda_forward_products": "products pass", "kda_forward_chain": "chain",
                      "kda_forward_output": "o pass"}
KERNELS = {**BACKWARD_KERNELS, **FORWARD_KERNELS, **THREE_PASS_KERNELS}
KERNEL_REGEX = "|".join(BACKWARD_KERNELS)
FORWARD_REGEX = "^kda_forward$"   # whole: kda_forward_states starts with the same name
THREE_PASS_REGEX = "^(" + "|".join(THREE_PASS_KERNELS) + ")$"

# ncu's stall reasons on sm_90 (the WarpStateStats section's), each as warps stalled per issued instruction
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
ISSUING = "selected"        # the cycles a warp issues: not a stall
ISSUE_BOUND = "not_selected"


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


SUMMARY_METRICS = {
    "time_ns": "gpu__time_duration.sum",
    "registers": "launch__registers_per_thread",
    "shared_bytes": "launch__shared_mem_per_block_dynamic",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "warps_per_sm": "sm__warps_active.avg.per_cycle_active",
    "issue_per_cycle": "smsp__issue_active.avg.per_cycle_active",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "instructions": "smsp__inst_executed.sum",
}
METRICS = tuple(SUMMARY_METRICS.values()) + tuple(stall_metric(r) for r in STALL_REASONS)
SCHEDULERS_PER_SM = 4


def stalls_of(metrics: dict) -> dict[str, float]:
    """The stall reasons ncu measured (warps per issued instruction), largest first."""
    found = {r: metrics.get(stall_metric(r)) for r in STALL_REASONS}
    return dict(sorted(((r, v) for r, v in found.items() if v is not None), key=lambda rv: -rv[1]))


def binding_stall(stalls: dict[str, float]) -> str | None:
    """The largest stall reason other than a warp issuing; None where ncu measured none."""
    return next((r for r in stalls if r != ISSUING), None)


def summarize(launch: ncu.Launch) -> dict:
    """One launch's row: our name for the kernel, the summary metrics, its stalls and the binding one."""
    m = launch.metrics
    row = {"kernel": KERNELS.get(launch.kernel, launch.kernel), "function": launch.kernel}
    row.update({key: m.get(name) for key, name in SUMMARY_METRICS.items()})
    if row["warps_per_sm"] is not None:
        row["warps_per_scheduler"] = row["warps_per_sm"] / SCHEDULERS_PER_SM
    stalls = stalls_of(m)
    row["stalls"] = stalls
    row["binding"] = binding_stall(stalls)
    if row["binding"] == ISSUE_BOUND:
        row["binding_note"] = "issue-bound: warps were ready, the scheduler issued another"
    return row


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


TABLE_COLUMNS = ("kernel", "ms under ncu", "registers", "shared KB", "grid", "warps / scheduler",
                 "issued / cycle", "DRAM %", "tensor pipe %", "binding stall", "next two")


def table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table (kernel.tools.bench's format_table)."""
    from kernel.tools.bench.report import format_table

    cells = []
    for r in rows:
        binding = r["binding"]
        rest = [(k, v) for k, v in r["stalls"].items() if k not in (binding, ISSUING)][:2]
        cells.append([
            r["kernel"],
            _fmt(None if r["time_ns"] is None else r["time_ns"] / 1e6, ".3f"),
            _fmt(r["registers"], ".0f"),
            _fmt(None if r["shared_bytes"] is None else r["shared_bytes"] / 1024, ".1f"),
            _fmt(r["grid"], ".0f"),
            _fmt(r.get("warps_per_scheduler"), ".2f"),
            _fmt(r["issue_per_cycle"], ".3f"),
            _fmt(r["dram_pct"], ".1f"),
            _fmt(r["tensor_pct"], ".1f"),
            "-" if binding is None else f"{binding} {r['stalls'][binding]:.2f}",
            ", ".join(f"{k} {v:.2f}" for k, v in rest) or "-",
        ])
    return format_table(cells, TABLE_COLUMNS)


# ------------------------------------------------------------------------ the child: one backward
def _drawn_forward_tensors(raw: dict, seed: int) -> tuple:
    """q, k, v, g, beta, Aqk, Akk with the shapes and magnitudes of FLA's forward tensors: g as
    FLA's per-64-chunk cumsum in log2 units, Aqk and Akk 64 wide a token, small."""
    import torch

    from kernel.tools.bench.inputs import chunk_gate

    B, T, H, D = raw["q"].shape
    g = chunk_gate(raw["g"])
    device = raw["q"].device
    gen = torch.Generator(device=device).manual_seed(seed + 1)

    def small():
        return (0.1 * torch.randn((B, T, H, 64), generator=gen, device=device)).to(torch.bfloat16)

    return raw["q"], raw["k"], raw["v"], g, raw["beta"], small(), small()


def _forward_child(raw: dict, cu_host) -> None:
    """One training-mode forward (every output written) on the bench's inputs: q and k normalised, g as
    FLA's per-64-chunk cumsum in log2 units (what kernel.chunk_kda hands the kernel)."""
    import torch

    from kernel.forward import forward
    from kernel.tools.bench.inputs import chunk_gate

    q, k = (torch.nn.functional.normalize(raw[n].float(), dim=-1).to(torch.bfloat16) for n in ("q", "k"))
    forward(q, k, raw["v"], chunk_gate(raw["g"]), raw["beta"], cu_seqlens=cu_host, output_final_state=True,
            training=True)
    torch.cuda.synchronize()


def _three_pass_child(raw: dict, cu_host) -> None:
    """The three passes in training mode on _forward_child's inputs, each pass once over the whole batch (no
    pieces: ncu replays each launch alone, so pieces would only multiply the launches)."""
    import torch

    from kernel.three_pass_forward import three_pass_forward
    from kernel.tools.bench.inputs import chunk_gate

    q, k = (torch.nn.functional.normalize(raw[n].float(), dim=-1).to(torch.bfloat16) for n in ("q", "k"))
    three_pass_forward(q, k, raw["v"], chunk_gate(raw["g"]), raw["beta"], cu_seqlens=cu_host,
                       output_final_state=True, training=True, pieces=1)
    torch.cuda.synchronize()


def _child(config: str, heads: int, seed: int, inputs: str, forward: bool = False, three_pass: bool = False) -> None:
    import torch

    from kernel.kda_backward import kda_backward
    from kernel.runtime.arrays import torch_stream_for_cupy
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.inputs import cu_for_fla, cu_for_kernel_a, make_inputs

    cfg = parse_config(config, seed)
    raw = make_inputs(cfg, heads, seed=seed, gate_strength=1.0)
    cu_fla, cu_host = cu_for_fla(raw["cu_seqlens"]), cu_for_kernel_a(raw["cu_seqlens"])
    if forward or three_pass:
        (_three_pass_child if three_pass else _forward_child)(raw, cu_host)
        return
    tensors = None
    if inputs in ("auto", "fla"):
        try:
            from kernel.tools import fla_kda

            f = fla_kda.forward(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"],
                                h0=torch.zeros_like(raw["dht"]), cu_seqlens=cu_fla, safe_gate=True)
            tensors = (f.q, f.k, f.v, f.g, f.beta, f.Aqk, f.Akk)
            print("stalls: inputs are FLA's forward tensors", flush=True)
        except ImportError as exc:
            if inputs == "fla":
                raise SystemExit(f"stalls: --inputs fla, but fla-core is not importable ({exc})")
            print(f"stalls: fla-core is not importable ({exc}); inputs drawn here", flush=True)
    if tensors is None:
        tensors = _drawn_forward_tensors(raw, seed)
    with torch_stream_for_cupy("ptx-lab stalls"):
        kda_backward(*tensors, raw["do"], dht=raw["dht"], cu_seqlens=cu_host)
    torch.cuda.synchronize()


def parse_args(argv: Sequence[str] | None, prog: str = "python -m kernel.tools.stalls"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="4x8192", help="BxT or varlenNxT, as ptx-lab bench takes (default 4x8192)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inputs", choices=("auto", "fla", "drawn"), default="auto",
                    help="FLA's forward tensors (fla), ones of their shapes drawn here (drawn), or fla where "
                         "fla-core imports (auto)")
    ap.add_argument("--forward", action="store_true",
                    help="profile our forward (kernel.forward.forward, training mode) instead of the backward's "
                         "three kernels; --inputs does not apply (the forward reads the inputs drawn here)")
    ap.add_argument("--three-pass", action="store_true",
                    help="profile the three-pass forward (kernel.three_pass_forward, training mode, each pass once) "
                         "instead; --inputs does not apply")
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds ncu may run")
    ap.add_argument("--json", default=None, help="write the rows and ncu's command here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from kernel.tools.bench.configs import parse_config

    try:
        parse_config(args.config, args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    if args.heads < 1:
        ap.error("--heads must be at least 1")
    if args.forward and args.three_pass:
        ap.error("--forward and --three-pass: one forward a run (the one pass, or the three passes)")
    return args


def child_command(args) -> list[str]:
    return [sys.executable, "-m", "kernel.tools.stalls", "--child", "--config", args.config,
            "--heads", str(args.heads), "--seed", str(args.seed), "--inputs", args.inputs,
            *(("--forward",) if args.forward else ()), *(("--three-pass",) if args.three_pass else ())]


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.stalls") -> int:
    args = parse_args(argv, prog)
    if args.child:
        _child(args.config, args.heads, args.seed, args.inputs, args.forward, args.three_pass)
        return 0
    if ncu.ncu_path() is None:
        print("stalls: ncu is not on PATH (Nsight Compute, part of the CUDA toolkit)", file=sys.stderr)
        return 2
    from ptx_lab.gpu import gpu_reason

    problem = gpu_reason()
    if problem:
        print(f"stalls: needs a GPU ({problem})", file=sys.stderr)
        return 2
    what, regex = "one kda_backward", KERNEL_REGEX
    if args.forward:
        what, regex = "one forward (kernel.forward.forward)", FORWARD_REGEX
    elif args.three_pass:
        what, regex = "one three-pass forward (kernel.three_pass_forward, each pass once)", THREE_PASS_REGEX
    print(f"stalls: {args.config}, H = {args.heads}: {what} under ncu --clock-control none "
          f"({len(METRICS)} metrics; each kernel is replayed once per counter group)", flush=True)
    # the child imports this checkout's kernel package wherever ncu starts it
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    prof = ncu.profile(child_command(args), METRICS, regex, timeout=args.timeout, env=env)
    if prof.error:
        print(f"stalls: {prof.error}", file=sys.stderr)
        return 1
    if prof.dropped:
        print("stalls: ncu does not know " + ", ".join(prof.dropped) + " (left out)")
    rows = [summarize(launch) for launch in prof.launches]
    print(table(rows))
    for r in rows:
        if r.get("binding_note"):
            print(f"{r['kernel']}: {r['binding_note']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": args.config, "heads": args.heads, "forward": args.forward,
                       "three_pass": args.three_pass,
                       "ncu_command": list(prof.command),
                       "dropped": prof.dropped, "rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
