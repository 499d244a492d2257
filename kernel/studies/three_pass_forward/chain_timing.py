"""The three-pass forward's chain alone on the GPU: ``kernel.forward_chain`` timed beside FLA's chain
(``chunk_gated_delta_rule_fwd_h``, the middle of FLA's ``chunk_kda_fwd``) on operands of the same shapes,
in turn, in one process.

    python -m kernel.studies.three_pass_forward.chain_timing --configs 1x131072,4x8192 --heads 16
    python -m kernel.studies.three_pass_forward.chain_timing --configs 32x8192 --heads 32 --no-fla --json chain.json

Each configuration BxT is B sequences of T tokens (T a multiple of 64) with H value heads. The operands
are drawn once (seed 0) with the sizes a real chunk's have, so that the state stays finite over any
number of steps: w and kg N(0, 0.01^2), u N(0, 1), decay U(0.9, 1); FLA gets the same w, u and kg
token-major, and a gate cumsum whose chunk sums are log2 of the same decays. Each side writes the
states, v_new and the final state. Printed: ms a call (median of --reps), us a 64-token step of the
longest sequence, and our time over FLA's. The design's prediction is ``ptx-lab floors --forward``'s
chain row: 0.87 us a step, measured for the serial step alone in kernel.studies.b1_composition.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from kernel.shapes import CHUNK_TOKENS, HEAD_DIM


def parse_config(text: str) -> tuple[int, int]:
    try:
        B, T = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a configuration is BxT (e.g. 1x131072), got {text!r}") from None
    if B < 1 or T < CHUNK_TOKENS or T % CHUNK_TOKENS:
        raise argparse.ArgumentTypeError(f"B >= 1 and T a positive multiple of {CHUNK_TOKENS}, got {text!r}")
    return B, T


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m kernel.studies.three_pass_forward.chain_timing",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="1x131072", help="comma-separated BxT (default 1x131072)")
    p.add_argument("--heads", type=int, default=16, help="value heads (default 16, the layer's)")
    p.add_argument("--reps", type=int, default=7, help="timed calls a side (default 7)")
    p.add_argument("--no-fla", action="store_true", help="time ours alone")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    args.configs = [parse_config(c) for c in args.configs.split(",") if c]
    if args.heads < 1 or args.reps < 1:
        p.error("--heads and --reps must be >= 1")
    return args


def operands(B: int, T: int, H: int, seed: int = 0) -> dict:
    """Ours chunk-major ([chunks, H, 64, 128]), FLA's token-major ([B, T, H, 128]): the same w, u, kg;
    decay [chunks, H, 128] and FLA's per-chunk cumsum of log2 gates with the same chunk sums."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    chunks = B * T // CHUNK_TOKENS
    shape = (chunks, H, CHUNK_TOKENS, HEAD_DIM)
    w = (0.01 * torch.randn(shape, generator=gen, device="cuda")).bfloat16()
    kg = (0.01 * torch.randn(shape, generator=gen, device="cuda")).bfloat16()
    u = torch.randn(shape, generator=gen, device="cuda").bfloat16()
    decay = 0.9 + 0.1 * torch.rand((chunks, H, HEAD_DIM), generator=gen, device="cuda")
    u_scale = torch.zeros((chunks, H, 4), device="cuda")   # ours reads u in fp16 times a power of two a chunk: 1
    u_scale[..., 0] = 1
    # FLA's gk: the chunk-local cumsum (log2), its last row log2(decay), spread evenly over the chunk
    steps = torch.arange(1, CHUNK_TOKENS + 1, device="cuda", dtype=torch.float32) / CHUNK_TOKENS
    gk = torch.log2(decay)[:, None, :, :] * steps[None, :, None, None]              # [chunks, 64, H, 128]
    token_major = lambda x: x.permute(0, 2, 1, 3).reshape(B, T, H, HEAD_DIM).contiguous()   # noqa: E731
    return {"ours": (w, u.half(), kg, decay, u_scale, [n * (T // CHUNK_TOKENS) for n in range(B + 1)]),
            "fla": (token_major(kg), token_major(w), token_major(u), gk.reshape(B, T, H, HEAD_DIM).contiguous())}


def time_config(B: int, T: int, H: int, *, reps: int, fla: bool) -> dict:
    import torch

    from kernel.forward_chain import forward_chain
    from kernel.tools.bench.timing import cupy_on_torch_stream, time_alternating

    ops = operands(B, T, H)
    w, u, kg, decay, u_scale, cu = ops["ours"]
    fns = {"ours": lambda: forward_chain(w, u, kg, decay, u_scale, cu_chunks=cu)}
    if fla:
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h

        fk, fw, fu, fg = ops["fla"]
        fns["fla"] = lambda: chunk_gated_delta_rule_fwd_h(k=fk, w=fw, u=fu, gk=fg, output_final_state=True)
    with cupy_on_torch_stream():
        out = fns["ours"]()
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out.final_state).all())
        times = time_alternating(fns, warmup=2, reps=reps)
    steps = T // CHUNK_TOKENS
    row = {"config": f"{B}x{T}", "heads": H, "steps": steps, "finite": finite,
           "ours_ms": times["ours"]["median_ms"], "ours_us_per_step": 1e3 * times["ours"]["median_ms"] / steps}
    if fla:
        row.update(fla_ms=times["fla"]["median_ms"], fla_us_per_step=1e3 * times["fla"]["median_ms"] / steps,
                   ratio=times["ours"]["median_ms"] / times["fla"]["median_ms"])
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for B, T in args.configs:
        print(f"chain_timing: {B}x{T}, {args.heads} heads ...", file=sys.stderr, flush=True)
        rows.append(time_config(B, T, args.heads, reps=args.reps, fla=not args.no_fla))
    print(f"{'config':>10} {'heads':>5} {'steps':>6} {'ours ms':>9} {'us/step':>8} {'FLA ms':>9} {'us/step':>8} {'ours/FLA':>8}")
    for r in rows:
        fla = (f"{r['fla_ms']:9.3f} {r['fla_us_per_step']:8.3f} {r['ratio']:8.3f}" if "fla_ms" in r else "")
        print(f"{r['config']:>10} {r['heads']:>5} {r['steps']:>6} {r['ours_ms']:9.3f} {r['ours_us_per_step']:8.3f} {fla}"
              + ("" if r["finite"] else "  (final state not finite)"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
