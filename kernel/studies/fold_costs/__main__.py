"""The folds' costs: each build that takes a pass into itself (the gate's chunk cumsum: ``token_gate``; the l2norm
of q and k: ``l2norm``), timed in turn beside its plain build and beside the passes the folds remove, in one
process: the one-pass forward's and the three passes' products pass's four builds, and the token-gate builds of the
backward's two readers of the gate, Kernel A and Kernel B.

    python -m kernel.studies.fold_costs --configs 32x8192,1x131072 [--heads 32] [--reps 7] [--json FILE]

Inputs as the bench draws them (seed 0) for the forwards: q and k as drawn (the l2norm builds' inputs) and
normalised (the others'), the gate as drawn, each token's natural-log gate (the token-gate builds'), and its
64-chunk cumsum in log2 units (the others'); every call training mode. Kernels A and B run as ``kernel.kda_backward``
runs them on our forward's tensors (kernel.tools.source_ab's inputs and calls: bf16 dS every tile; rstd given and
bf16 dq, dk for Kernel B), on each token's gate or its cumsum. The passes: the l2norm of q and of k and the gate's
chunk cumsum as ``kernel.chunk_kda`` runs them (FLA's Triton kernels where fla-core imports, else torch).

Printed per configuration: each build's ms and its cost over the plain build, each pass's ms, and a fold's net:
its builds' costs less the passes it removes (negative: the fold pays). The l2norm has one reader (the forward
kernel that runs); the gate's cumsum three (that forward kernel, Kernel A and Kernel B), so fold A's net is taken
over all three where the backward's are measured. The products pass is the three passes' only reader of g, q and
k (docs/kda_forward.md section 8, "Folds A and B in the three passes"). GPU, CuPy and torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ..timed_configs import parse_configs, run_configs

# the builds of the forward kernels, by their forms (token_gate, l2norm), the plain one first; the backward's
# readers have the first two
FORMS = {"plain": (False, False), "token gate": (True, False), "l2norm": (False, True),
         "token gate + l2norm": (True, True)}
FORWARDS = ("one pass", "products pass")
BACKWARDS = ("Kernel A", "Kernel B")
KERNELS = FORWARDS + BACKWARDS
# the passes each fold removes (the l2norm's is two calls: q's and k's)
REMOVED = {"token gate": ("cumsum",), "l2norm": ("l2norm q", "l2norm k"),
           "token gate + l2norm": ("cumsum", "l2norm q", "l2norm k")}


def forms_of(kernel: str) -> list[str]:
    """The builds a kernel is timed in: the forwards' four, the backward's readers' plain and token gate."""
    return list(FORMS) if kernel in FORWARDS else ["plain", "token gate"]


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.fold_costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="32x8192,1x131072", help="comma-separated BxT (default %(default)s)")
    p.add_argument("--heads", type=int, default=32, help="heads, H = HV (default 32, the bench's)")
    p.add_argument("--reps", type=int, default=7, help="timed calls a side, in turn (median; default 7)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    args.configs = parse_configs(p, args.configs)
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in args.kernels if k not in KERNELS]
    if bad:
        p.error(f"--kernels: unknown {bad}, expected some of {list(KERNELS)}")
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    return args


def costs(row: dict) -> dict:
    """{kernel: {form: its build's ms less the plain build's}} of one configuration's timings (``row[kernel][form]``)."""
    return {kernel: {form: row[kernel][form] - row[kernel]["plain"] for form in forms_of(kernel) if form != "plain"}
            for kernel in KERNELS if kernel in row}


def nets(row: dict) -> dict:
    """{forward kernel: {fold: its builds' costs less the passes it removes}} of one configuration's timings: the
    forward kernel's build, and for the gate's fold also Kernel A's and Kernel B's token-gate builds where the row
    has them (they read the gate too, and the pass goes for all three at once)."""
    c = costs(row)
    backward = sum(c[k]["token gate"] for k in BACKWARDS if k in c)
    out = {}
    for kernel in FORWARDS:
        if kernel not in row:
            continue
        out[kernel] = {form: c[kernel][form] + (backward if FORMS[form][0] else 0.0)
                       - sum(row["passes"][p] for p in REMOVED[form]) for form in REMOVED}
    return out


def report(row: dict) -> str:
    """One configuration's table: each build's ms and its cost over the plain one; each forward build's net."""
    c, net = costs(row), nets(row)
    readers = " (with Kernel A's and B's token-gate costs)" if any(k in row for k in BACKWARDS) else ""
    lines = [f"{row['config']}, H = {row['heads']}: the passes the folds remove ({row['passes by']}'s): "
             + ", ".join(f"{n} {ms:.3f} ms" for n, ms in row["passes"].items()),
             f"| kernel | build | ms | over plain | net of the passes it removes{readers} |", "|---|---|---:|---:|---:|"]
    for kernel in KERNELS:
        if kernel not in row:
            continue
        for form in forms_of(kernel):
            over = "" if form == "plain" else f"{c[kernel][form]:+.3f}"
            cell = f"{net[kernel][form]:+.3f}" if kernel in net and form != "plain" else ""
            lines.append(f"| {kernel} | {form} | {row[kernel][form]:.3f} | {over} | {cell} |")
    return "\n".join(lines)


def measure(config: str, heads: int, reps: int, kernels: Sequence[str]) -> dict:
    import numpy as np
    import torch

    from kernel.ds_scan import launch as kernel_a
    from kernel.fla_dropin.function import around_our_kernels
    from kernel.forward import forward
    from kernel.forward_products import forward_products
    from kernel.shapes import CHUNK_TOKENS
    from kernel.tools import source_ab
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

    spec = source_ab.parse_spec(config, "b")
    x = source_ab.drawn_inputs(spec, heads) if any(k in kernels for k in BACKWARDS) else None
    cu = np.arange(spec.B + 1, dtype=np.int64) * spec.T

    def kernel_a_call(token_gate, _l2norm):
        flat = {n: x[n].reshape(1, spec.B * spec.T, *x[n].shape[2:])
                for n in ("q", "k", "g_token" if token_gate else "g", "beta", "Aqk", "Akk", "do")}
        g = flat["g_token" if token_gate else "g"]
        return lambda: kernel_a.launch(flat["q"], flat["k"], g, flat["beta"], flat["Aqk"], flat["Akk"], flat["do"],
                                       scale=source_ab.D ** -0.5, dht=x["dht"], cu_seqlens=cu, qk_l2norm=False,
                                       snapshot_dtype="bfloat16", snapshot_every=1, fla_inputs=True,
                                       token_gate=token_gate)

    def kernel_b_call(token_gate, _l2norm):
        inputs = dict(x, g=x["g_token"]) if token_gate else x
        return source_ab.kernel_b_call(spec, heads, inputs, token_gate=token_gate)[0]

    makers = {"one pass": one_pass, "products pass": products, "Kernel A": kernel_a_call, "Kernel B": kernel_b_call}
    for kernel in kernels:
        fns.update({f"{kernel}: {form}": makers[kernel](*FORMS[form]) for form in forms_of(kernel)})
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
        row[kernel] = {form: times[f"{kernel}: {form}"]["median_ms"] for form in forms_of(kernel)}
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_configs("fold_costs", args.configs, args.heads,
                       lambda c: measure(c, args.heads, args.reps, args.kernels), report, args.json)


if __name__ == "__main__":
    sys.exit(main())
