"""The three-pass forward's passes on the GPU, each timed in turn beside the one-pass forward
(``kernel.forward.forward``, training mode) on the same inputs, in one process.

    python -m kernel.studies.three_pass_forward.timing --configs 1x131072,32x8192 --heads 16

Inputs as the bench draws them (seed 0; ``kernel.tools.bench.inputs``): q and k normalised, FLA's gate
(the 64-chunk cumsum in log2 units). The passes run on the one pass's inputs: the products pass
(``kernel.forward_products``), the chain on its outputs (``kernel.forward_chain``), and the o pass
(``kernel.forward_output``) on the chain's. Printed: ms a call of each (median of --reps, called in turn,
each after a cold L2), their sum, the one pass's time and the sum over it, and how far the three passes'
o and final state are from the one pass's (relative Frobenius: both are roundings of the same float64
values, ~4e-3 each from it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.three_pass_forward.timing",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="1x131072", help="comma-separated bench configurations (default 1x131072)")
    p.add_argument("--heads", type=int, default=16, help="heads (default 16, the layer's)")
    p.add_argument("--reps", type=int, default=7, help="timed calls a side (default 7)")
    p.add_argument("--pieces", default="",
                   help="comma-separated piece counts: also time kernel.three_pass_forward with each (one sequence "
                        "only; e.g. 4,8,16)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    try:
        args.pieces = [int(x) for x in args.pieces.split(",") if x]
    except ValueError:
        p.error(f"--pieces takes comma-separated integers, got {args.pieces!r}")
    if any(n < 1 for n in args.pieces):
        p.error("--pieces must be >= 1")
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    return args


def measure(config: str, heads: int, reps: int, pieces: Sequence[int] = ()) -> dict:
    import torch

    from kernel.forward import forward
    from kernel.forward_chain import forward_chain
    from kernel.forward_output import forward_output
    from kernel.forward_products import forward_products
    from kernel.three_pass_forward import three_pass_forward
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.inputs import chunk_gate, cu_for_kernel_a, make_inputs
    from kernel.tools.bench.timing import cupy_on_torch_stream, time_alternating

    cfg = parse_config(config, 0)
    raw = make_inputs(cfg, heads, seed=0, gate_strength=1.0)
    cu = cu_for_kernel_a(raw["cu_seqlens"])
    q, k = (torch.nn.functional.normalize(raw[n].float(), dim=-1).to(torch.bfloat16) for n in ("q", "k"))
    g, v, beta = chunk_gate(raw["g"]), raw["v"], raw["beta"]
    cu_host = cu   # host int64 offsets or None

    def one_pass():
        return forward(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, training=True)

    def products():
        return forward_products(q, k, v, g, beta, cu_seqlens=cu, training=True)

    with cupy_on_torch_stream():
        p = products()
        walked = forward_chain(p.w, p.u, p.kg, p.decay, p.u_scale, cu_chunks=p.cu_chunks)

        def chain():
            return forward_chain(p.w, p.u, p.kg, p.decay, p.u_scale, cu_chunks=p.cu_chunks)

        def output():
            return forward_output(p.qg, walked.states, p.aqk, p.aqk_lo, walked.v_new, cu_seqlens=cu_host)

        def three():
            pp = products()
            ww = forward_chain(pp.w, pp.u, pp.kg, pp.decay, pp.u_scale, cu_chunks=pp.cu_chunks)
            return forward_output(pp.qg, ww.states, pp.aqk, pp.aqk_lo, ww.v_new, cu_seqlens=cu_host)

        def in_pieces(n):
            return lambda: three_pass_forward(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, training=True,
                                              pieces=n)

        ref = one_pass()
        o3 = output()
        whole = in_pieces(1)()
        same = {}
        for n in pieces:   # the same bits as one piece (tests/kernel/test_three_pass_forward_gpu.py)
            cut = in_pieces(n)()
            same[n] = bool(torch.equal(cut.o, whole.o) and torch.equal(cut.states, whole.states)
                           and torch.equal(cut.final_state, whole.final_state))
        torch.cuda.synchronize()
        rel = lambda a, b: float(torch.linalg.vector_norm((a.float() - b.float())) / torch.linalg.vector_norm(b.float()))  # noqa: E731
        diff = {"o": rel(o3.reshape(ref.o.shape), ref.o), "final": rel(walked.final_state, ref.final_state),
                "states": rel(walked.states.reshape(ref.states.shape), ref.states)}
        fns = {"one pass": one_pass, "products": products, "chain": chain, "o pass": output, "three passes": three}
        fns.update({f"{n} pieces": in_pieces(n) for n in pieces})
        times = time_alternating(fns, warmup=2, reps=reps)
    row = {"config": config, "heads": heads, **{f"{n} ms": t["median_ms"] for n, t in times.items()},
           "three / one": times["three passes"]["median_ms"] / times["one pass"]["median_ms"],
           "differs from the one pass": diff, "pieces": list(pieces),
           "same bits in pieces": {str(n): same[n] for n in pieces}}
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for c in args.configs:
        print(f"three-pass timing: {c}, {args.heads} heads ...", file=sys.stderr, flush=True)
        rows.append(measure(c, args.heads, args.reps, args.pieces))
    names = ("one pass", "products", "chain", "o pass", "three passes")
    print(f"{'config':>16} {'heads':>5} " + " ".join(f"{n + ' ms':>16}" for n in names) + f" {'three / one':>11}  o, final, states vs one pass")
    for r in rows:
        d = r["differs from the one pass"]
        print(f"{r['config']:>16} {r['heads']:>5} " + " ".join(f"{r[n + ' ms']:16.3f}" for n in names)
              + f" {r['three / one']:11.3f}  {d['o']:.2e}, {d['final']:.2e}, {d['states']:.2e}")
    for r in rows:
        for n in r["pieces"]:
            t = r[f"{n} pieces ms"]
            print(f"{r['config']:>16} {r['heads']:>5} in {n:>2} pieces: {t:8.3f} ms, "
                  f"{t / r['three passes ms']:.3f} of the "
                  f"passes in turn, {t / r['one pass ms']:.3f} of the one pass; one piece's bits: "
                  f"{r['same bits in pieces'][str(n)]}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
