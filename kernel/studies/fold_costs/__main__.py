"""The folds' costs: each build of the one-pass forward and of the three passes' products pass that takes a pass
into itself (the gate's chunk cumsum: ``token_gate``; the l2norm of q and k: ``l2norm``), timed in turn beside the
plain build and beside the passes the folds remove, in one process.

    python -m kernel.studies.fold_costs --configs 32x8192,1x131072 [--heads 32] [--reps 7] [--json FILE]

Inputs as the bench draws them (seed 0): q and k as drawn (the l2norm builds' inputs) and normalised (the others'),
the gate as drawn, each token's natural-log gate (the token-gate builds'), and its 64-chunk cumsum in log2 units
(the others'). Every call is training mode (the states and blocks written, and the l2norm builds' q, k and rstd).
The passes: the l2norm of q and of k and the gate's chunk cumsum as ``kernel.chunk_kda`` runs them (FLA's Triton
kernels where fla-core imports, else the same math in torch).

Printed per configuration: each build's ms and its cost over the plain build, each pass's ms, and a fold's net:
its build's cost less the passes it removes (negative: the fold pays). The products pass is the three passes'
only reader of g, q and k, so its cost is the three passes' (docs/kda_forward.md section 8, "Folds A and B in
the three passes"). GPU, CuPy and torch.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

# the builds of each kernel, by their forms (token_gate, l2norm), the plain one first
FORMS = {"plain": (False, False), "token gate": (True, False), "l2norm": (False, True),
         "token gate + l2norm": (True, True)}
KERNELS = ("one pass", "products pass")
# the passes each fold removes (the l2norm's is two calls: q's and k's)
REMOVED = {"token gate": ("cumsum",), "l2norm": ("l2norm q", "l2norm k"),
           "token gate + l2norm": ("cumsum", "l2norm q", "l2norm k")}


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.fold_costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="32x8192,1x131072", help="comma-separated BxT (default %(default)s)")
    p.add_argument("--heads", type=int, default=32, help="heads, H = HV (default 32, the bench's)")
    p.add_argument("--reps", type=int, default=7, help="timed calls a side, in turn (median; default 7)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in args.kernels if k not in KERNELS]
    if bad:
        p.error(f"--kernels: unknown {bad}, expected some of {list(KERNELS)}")
    for c in args.configs:
        B, sep, T = c.lower().partition("x")
        if not (sep and B.isdigit() and T.isdigit() and int(B) > 0 and int(T) > 0):
            p.error(f"--configs: expected BxT, got {c!r}")
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    return args


def nets(row: dict) -> dict:
    """{kernel: {fold: its build's ms less the plain build's, less the passes it removes}} of one configuration's
    timings (``row[kernel][form]`` and ``row["passes"][name]``, ms)."""
    out = {}
    for kernel in KERNELS:
        if kernel not in row:
            continue
        base = row[kernel]["plain"]
        out[kernel] = {form: row[kernel][form] - base - sum(row["passes"][p] for p in REMOVED[form])
                       for form in REMOVED}
    return out


def report(row: dict) -> str:
    """One configuration's table: each build's ms, its cost over the plain one, and its net."""
    net = nets(row)
    lines = [f"{row['config']}, H = {row['heads']}: the passes the folds remove ({row['passes by']}'s): "
             + ", ".join(f"{n} {ms:.3f} ms" for n, ms in row["passes"].items()),
             "| kernel | build | ms | over plain | net of the passes it removes |", "|---|---|---:|---:|---:|"]
    for kernel in KERNELS:
        if kernel not in row:
            continue
        base = row[kernel]["plain"]
        for form in FORMS:
            ms = row[kernel][form]
            cell = "" if form == "plain" else f"{net[kernel][form]:+.3f}"
            lines.append(f"| {kernel} | {form} | {ms:.3f} | {ms - base:+.3f} | {cell} |")
    return "\n".join(lines)


def measure(config: str, heads: int, reps: int, kernels: Sequence[str]) -> dict:
    import torch

    from kernel.fla_dropin.function import around_our_kernels
    from kernel.forward import forward
    from kernel.forward_products import forward_products
    from kernel.shapes import CHUNK_TOKENS
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.inputs import chunk_gate, make_inputs
    from kernel.tools.bench.timing import cupy_on_torch_stream, time_alternating

    cfg = parse_config(config, 0)
    raw = make_inputs(cfg, heads, seed=0, gate_strength=1.0)
    q_raw, k_raw = raw["q"], raw["k"]   # bf16, as drawn
    q_unit, k_unit = (torch.nn.functional.normalize(x.float(), dim=-1).to(torch.bfloat16) for x in (q_raw, k_raw))
    g_token = raw["g"].float().contiguous()
    g_cumsum = chunk_gate(raw["g"])
    v, beta = raw["v"], raw["beta"]
    pre = around_our_kernels()
    fns = {"l2norm q": lambda: pre["l2norm_fwd"](q_raw), "l2norm k": lambda: pre["l2norm_fwd"](k_raw),
           "cumsum": lambda: pre["local_cumsum"](g=g_token, scale=pre["rcp_ln2"], chunk_size=CHUNK_TOKENS,
                                                  cu_seqlens=None, chunk_indices=None)}

    def one_pass(token_gate, l2norm):
        q, k = (q_raw, k_raw) if l2norm else (q_unit, k_unit)
        g = g_token if token_gate else g_cumsum
        return lambda: forward(q, k, v, g, beta, output_final_state=True, training=True, token_gate=token_gate,
                               l2norm=l2norm)

    def products(token_gate, l2norm):
        q, k = (q_raw, k_raw) if l2norm else (q_unit, k_unit)
        g = g_token if token_gate else g_cumsum
        return lambda: forward_products(q, k, v, g, beta, training=True, token_gate=token_gate, l2norm=l2norm)

    makers = {"one pass": one_pass, "products pass": products}
    for kernel in kernels:
        fns.update({f"{kernel}: {form}": makers[kernel](*f) for form, f in FORMS.items()})
    with cupy_on_torch_stream():
        for name, fn in fns.items():   # each build compiles once, before any timing
            fn()
            torch.cuda.synchronize()
            print(f"  {config}: {name} ready", file=sys.stderr, flush=True)
        times = time_alternating(fns, warmup=1, reps=reps)
    row = {"config": config, "heads": heads, "reps": reps,
           "passes": {n: times[n]["median_ms"] for n in ("cumsum", "l2norm q", "l2norm k")},
           "passes by": "FLA" if pre["l2norm_fwd"].__module__.startswith("fla") else "torch"}
    for kernel in kernels:
        row[kernel] = {form: times[f"{kernel}: {form}"]["median_ms"] for form in FORMS}
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as exc:
        print(f"fold_costs: needs torch with a CUDA GPU and CuPy ({exc})", file=sys.stderr)
        return 2
    rows = []
    for config in args.configs:
        print(f"fold_costs: {config}, {args.heads} heads ...", file=sys.stderr, flush=True)
        rows.append(measure(config, args.heads, args.reps, args.kernels))
        print(report(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
