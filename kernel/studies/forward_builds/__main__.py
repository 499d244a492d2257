"""The forward's builds side by side: each named build of kernel.forward timed in turn on one set of
inputs, in one process, and checked for the same o, final state and states as the first build.

    python -m kernel.studies.forward_builds --configs 1x131072 --heads 16
    python -m kernel.studies.forward_builds --configs 1x131072,32x8192 --builds auto,w1-p4-st5-g4 --reps 9
    python -m kernel.studies.forward_builds --configs 32x8192 --heads 32 --inputs op \
        --builds auto,w8-p4-st4-g4,w8-p2-st4-g4-pw2

A build is ``auto`` (the launch's auto rule for the configuration), ``auto-without-products`` (the same
build with product_warps 0), or a Config name as ``Config.name()`` writes it (w<consumer warps>-p<producer
warps>-st<stages>-g<G6 split>, then -pw<product warps>; a build of other consumer warps than the
configuration's auto choice changes the grid too). Default: auto and auto-without-products.

GPU (CuPy, torch for the inputs and the timer). Inputs as the bench draws them (seed 0), in one of two
forms (``--inputs``): ``normalised`` (the default), q and k normalised and the gate as FLA's per-64-chunk
cumsum in log2 units; or ``op``, what ``kernel.chunk_kda`` hands the one pass on raw rows: the raw q and k with
each row's rstd from the rstd pass (kernel.row_rstd) and each token's own gate, so that every build is its
token-gate and rstd build (``-tg-rs`` added to its name). Every call a training-mode forward (o, the final
state, the states and the blocks written). Printed: one line a build and configuration,
ms a call (median), us a tile of the longest sequence, and whether o, the final state and the states
equal the first build's bits (Aqk's and Akk's outputs are left out: only their diagonal blocks are
written, the rest of each is uninitialised memory).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Sequence

AUTO, WITHOUT = "auto", "auto-without-products"
COMPARED = ("o", "final_state", "states")
_NAME = re.compile(r"^w(\d+)-p(\d+)-st(\d+)-g(\d+)(?:-pw(\d+))?(-tg)?(-l2)?(-rs)?(-timing)?$")


def parse_build(name: str, auto):
    """The kernel.forward Config a build name stands for (``auto``: the configuration's ``auto``)."""
    from kernel.forward import Config

    if name == AUTO:
        return auto
    if name == WITHOUT:
        return dataclasses.replace(auto, product_warps=0)
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"build {name!r}: expected {AUTO}, {WITHOUT} or a Config name such as w1-p4-st5-g4-pw2")
    w, p, st, g, pw, tg, l2, rs, timing = m.groups()
    return Config(warps=int(w), producers=int(p), nstage=int(st), g6_split=int(g), product_warps=int(pw or 0),
                  token_gate=tg is not None, l2norm=l2 is not None, qk_rstd=rs is not None, timing=timing is not None)


INPUT_FORMS = ("normalised", "op")


def in_form(cfg, form: str):
    """``cfg`` as the inputs' form runs it: the op's form reads each token's gate and each row's rstd."""
    return dataclasses.replace(cfg, token_gate=True, qk_rstd=True) if form == "op" else cfg


def launch_choice(q, k, v, g, beta, cu_seqlens, sm_count: int, *, token_gate: bool = False, rstd=None):
    """The build the launch itself picks for these inputs on `sm_count` SMs: its own plan's
    (kernel.forward.plan_forward, as forward() makes it for this GPU)."""
    from kernel.forward import plan_forward

    return plan_forward(q, k, v, g, beta, cu_seqlens=cu_seqlens, output_final_state=True, training=True,
                        token_gate=token_gate, rstd=rstd, sm_count=sm_count).config


def parse_args(argv: Sequence[str] | None):
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.forward_builds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="1x131072", help="comma-separated BxT or varlenNxT, as ptx-lab bench takes "
                                                          "(default %(default)s)")
    ap.add_argument("--heads", type=int, default=16, help="heads (H = HV; default 16, FLA's layer)")
    ap.add_argument("--builds", default=f"{AUTO},{WITHOUT}",
                    help="comma-separated builds, the first the one the others' bits are checked against "
                         "(default %(default)s)")
    ap.add_argument("--reps", type=int, default=7, help="timed calls a build, in turn with the others (median; default 7)")
    ap.add_argument("--inputs", choices=INPUT_FORMS, default=INPUT_FORMS[0],
                    help="normalised q and k with the gate's chunk cumsum, or the op's raw rows with their rstd and "
                         "each token's gate (every build then its -tg-rs build; default %(default)s)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    return ap.parse_args(argv)


def measure(config: str, heads: int, builds: Sequence[str], reps: int, form: str = "normalised") -> list[dict]:
    import numpy as np
    import torch

    from kernel.forward import forward
    from kernel.runtime.builds import sm_count
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.inputs import chunk_gate, cu_for_kernel_a, make_inputs

    cfg = parse_config(config, 0)
    raw = make_inputs(cfg, heads, seed=0, gate_strength=1.0)
    cu = cu_for_kernel_a(raw["cu_seqlens"])
    cu_host = np.arange(cfg.B + 1) * cfg.T if cu is None else np.asarray(cu)
    if form == "op":
        from kernel.row_rstd import row_rstd

        q, k, g = raw["q"], raw["k"], raw["g"].float()
        rstd = row_rstd(q, k)
    else:
        q, k = (torch.nn.functional.normalize(raw[n].float(), dim=-1).to(torch.bfloat16) for n in ("q", "k"))
        g, rstd = chunk_gate(raw["g"]), None
    op = dict(token_gate=form == "op", rstd=rstd)
    auto = launch_choice(q, k, raw["v"], g, raw["beta"], cu, sm_count(), **op)
    sides = {name: in_form(parse_build(name, auto), form) for name in builds}

    def call(c):
        return forward(q, k, raw["v"], g, raw["beta"], cu_seqlens=cu, output_final_state=True, training=True,
                       config=c, **op)

    outs = {}
    for name, c in sides.items():   # the first call of each builds its module
        outs[name] = call(c)
        torch.cuda.synchronize()
        print(f"  {config}: {name} ({c.name()}) built", flush=True)
    times = {name: [] for name in sides}
    for _ in range(reps):
        for name, c in sides.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(c)
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    tiles = int(np.max(-(-np.diff(cu_host) // 16)))
    first = outs[builds[0]]
    rows = []
    for name, c in sides.items():
        ms = float(np.median(times[name]))
        same = {f: bool(torch.equal(getattr(outs[name], f), getattr(first, f))) for f in COMPARED}
        rows.append(dict(config=config, heads=heads, inputs=form, build=name, name=c.name(), ms=ms,
                         us_per_tile=1e3 * ms / tiles, same_bits=same))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    builds = [b.strip() for b in args.builds.split(",") if b.strip()]
    from kernel.forward import Config

    probe = Config()
    try:
        for b in builds:   # names checked before any GPU work
            parse_build(b, probe)
    except ValueError as exc:
        print(f"forward_builds: {exc}", file=sys.stderr)
        return 2
    from kernel.runtime.arrays import torch_gpu_reason

    why = torch_gpu_reason()
    if why is not None:
        print(f"forward_builds: needs torch with a CUDA GPU and CuPy ({why})", file=sys.stderr)
        return 2
    rows = []
    for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
        rows += measure(config, args.heads, builds, args.reps, args.inputs)
        for r in rows[-len(builds):]:
            same = ", ".join(f"{f} {'=' if v else '!='}" for f, v in r["same_bits"].items())
            print(f"{r['config']:>10} H{r['heads']:<3} {r['build']:<22} {r['name']:<20} {r['ms']:9.3f} ms  "
                  f"{r['us_per_tile']:7.3f} us a tile   bits against {builds[0]}: {same}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
