"""The whole KDA backward's precision yardstick: FLA's gradients against the float64 reference.

    ptx-lab kda-precision                       # T = 8192 and a varlen batch, 2 heads, both recipes
    ptx-lab kda-precision --T 2048 --heads 1    # smaller

(also ``python -m kernel.tools.kda_precision``; needs a GPU, torch, CuPy and fla-core.)

A backward of our own must give every gradient with a relative Frobenius error
against float64 no worse than FLA's on the same inputs, on more than one input
recipe. This measures FLA's side: flash-linear-attention's ``chunk_kda``
(fla-core 0.6.0, forward and backward through torch autograd, with
``safe_gate`` True and False: both recipes' gates lie in [-5, 0], the bound
safe_gate asks of gates computed outside the kernel) on bf16 q, k, v, do, bf16 beta and fp32 g, and
:func:`kernel.reference.kda_backward_reference` in float64 (CuPy) on exactly
those rounded values, with the l2norm inside (FLA's
``use_qk_l2norm_in_kernel``). The loss is sum(o * do) + sum(S_T * dht), with a
zero initial state that requires a gradient (so FLA returns dh0).

Recipes:

* ``unit``: q, k, v, do ~ N(0, 1) (q and k unit-norm after the l2norm), g =
  logsigmoid(N(0, 1)) clamped to [-5, 0], beta ~ U(0, 1), dht ~ 0.1 N(0, 1);
* ``random_inputs``: :func:`kernel.reference.random_inputs` (the tests' and
  the bench's recipe: weaker gates, do and dht scaled by 0.1).

The last column of each row is the bf16 rounding of the exact gradient, the
error any bf16 output has at best.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

import numpy as np

GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
RECIPES = ("unit", "random_inputs")


def unit_inputs(B: int, T: int, H: int, K: int, V: int, lengths, seed: int) -> dict:
    """The ``unit`` recipe as float32 numpy arrays (the shapes of reference.random_inputs)."""
    rng = np.random.default_rng(seed)
    N = B if lengths is None else len(lengths)
    logit = rng.standard_normal((B, T, H, K))
    g = np.clip(-np.logaddexp(0.0, -logit), -5.0, 0.0)
    out = {"q": rng.standard_normal((B, T, H, K)), "k": rng.standard_normal((B, T, H, K)),
           "v": rng.standard_normal((B, T, H, V)), "g": g, "beta": rng.uniform(0.0, 1.0, (B, T, H)),
           "do": rng.standard_normal((B, T, H, V)), "dht": 0.1 * rng.standard_normal((N, H, K, V))}
    out = {name: x.astype(np.float32) for name, x in out.items()}
    out["cu_seqlens"] = None if lengths is None else np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return out


def rel_fro(x, ref) -> float:
    num, den = float(np.linalg.norm(x - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def fla_gradients(raw: dict, *, safe_gate: bool) -> tuple[dict, dict]:
    """FLA's chunk_kda forward and backward on the raw inputs -> (gradients as float64 numpy,
    the rounded inputs as float64 numpy, exactly what FLA saw)."""
    import torch
    from fla.ops.kda import chunk_kda

    dev = "cuda"
    t = lambda x, dt: torch.from_numpy(np.ascontiguousarray(x)).to(dev, dt)
    q, k, v = (t(raw[n], torch.bfloat16).requires_grad_() for n in ("q", "k", "v"))
    g = t(raw["g"], torch.float32).requires_grad_()
    beta = t(raw["beta"], torch.bfloat16).requires_grad_()
    do, dht = t(raw["do"], torch.bfloat16), t(raw["dht"], torch.float32)
    N, H, K, V = dht.shape
    h0 = torch.zeros(N, H, K, V, dtype=torch.float32, device=dev, requires_grad=True)
    cu = None if raw["cu_seqlens"] is None else torch.as_tensor(raw["cu_seqlens"], device=dev, dtype=torch.long)
    o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, safe_gate=safe_gate, cu_seqlens=cu)
    loss = (o.float() * do.float()).sum() + (ht * dht).sum()
    loss.backward()
    host = lambda x: x.detach().double().cpu().numpy()
    grads = {"dq": host(q.grad), "dk": host(k.grad), "dv": host(v.grad), "dg": host(g.grad),
             "dbeta": host(beta.grad), "dh0": host(h0.grad)}
    seen = {"q": host(q), "k": host(k), "v": host(v), "g": host(g), "beta": host(beta), "do": host(do),
            "dht": host(dht)}
    return grads, seen


def reference_gradients(seen: dict, cu_seqlens) -> dict:
    """kernel.reference.kda_backward_reference in float64 on CuPy -> float64 numpy."""
    import cupy

    from kernel.reference import kda_backward_reference

    d = {name: cupy.asarray(x) for name, x in seen.items()}
    out = kda_backward_reference(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], dht=d["dht"],
                                 cu_seqlens=cu_seqlens, qk_l2norm=True)
    return {name: cupy.asnumpy(out[name]) for name in GRADIENTS}


def bf16_rounding(x: np.ndarray) -> float:
    """Relative Frobenius error of rounding x to bf16 (what a bf16 output loses at best)."""
    import ml_dtypes

    return rel_fro(x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64), x)


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.kda_precision") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=8192, help="tokens of the equal-length case (default 8192)")
    ap.add_argument("--heads", type=int, default=2, help="H (default 2; heads are independent)")
    ap.add_argument("--varlen", type=int, default=8, metavar="N",
                    help="also a packed batch of N ragged sequences totalling T tokens (0: none; default 8)")
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    ap.add_argument("--safe-gate", nargs="+", choices=("true", "false"), default=["true", "false"],
                    help="FLA's safe_gate settings to run (default both)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.T < 1 or a.heads < 1 or a.varlen < 0:
        ap.error("--T and --heads must be >= 1, --varlen >= 0")
    a.safe_gate = [v == "true" for v in a.safe_gate]

    from ptx_lab.gpu import gpu_reason
    why = gpu_reason()
    if why:
        print(f"{prog} needs a GPU: {why}", file=sys.stderr)
        return 2
    try:
        import fla  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"{prog} needs torch and fla-core 0.6.0 ({exc}); see the README's 'Carrying fla-core'",
              file=sys.stderr)
        return 2

    from kernel.reference import ragged_lengths, random_inputs

    K = V = 128
    shapes = [("1x%d" % a.T, None)]
    if a.varlen:
        shapes.append((f"varlen{a.varlen}x{a.T}", ragged_lengths(a.varlen, a.T, seed=a.seed)))
    header = ("recipe", "shape", "safe_gate", *GRADIENTS)
    rows = []
    for recipe in a.recipes:
        for shape, lengths in shapes:
            if recipe == "unit":
                raw = unit_inputs(1, a.T, a.heads, K, V, lengths, a.seed)
            else:
                raw = random_inputs(1, a.T, a.heads, K, V, lengths=lengths, seed=a.seed)
                raw["cu_seqlens"] = None if lengths is None else np.asarray(raw["cu_seqlens"], dtype=np.int64)
            ref = None
            for safe_gate in a.safe_gate:
                print(f"[{recipe} {shape} safe_gate={safe_gate}] FLA's chunk_kda forward + backward "
                      "(a new shape or option compiles and autotunes FLA's Triton kernels first: minutes)",
                      flush=True)
                grads, seen = fla_gradients(raw, safe_gate=safe_gate)
                if ref is None:   # the same rounded inputs either way
                    print(f"[{recipe} {shape}] the float64 reference (CuPy)", flush=True)
                    ref = reference_gradients(seen, raw["cu_seqlens"])
                    rows.append((recipe, shape, "bf16 rounding", *(f"{bf16_rounding(ref[n]):.2e}" for n in GRADIENTS)))
                rows.append((recipe, shape, str(safe_gate), *(f"{rel_fro(grads[n], ref[n]):.2e}" for n in GRADIENTS)))
                print(f"[{recipe} {shape} safe_gate={safe_gate}] "
                      + ", ".join(f"{n} {rel_fro(grads[n], ref[n]):.2e}" for n in GRADIENTS), flush=True)
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(f"\nFLA chunk_kda's gradients vs float64 (relative Frobenius), H = {a.heads}, K = V = {K}:")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
