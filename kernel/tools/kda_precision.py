"""The whole KDA backward's precision yardstick: FLA's gradients and ours against the float64 reference.

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

Beside FLA's rows, one of ours (unless ``--no-ours``): FLA's forward on the same
inputs (``kernel.tools.fla_kda.forward``: l2norm, ``chunk_kda_fwd`` with safe_gate
True), our whole backward ``kernel.kda_backward.kda_backward`` on its tensors, and
FLA's l2norm backward for dq and dk, as ``chunk_kda``'s autograd applies it (what
``kernel.chunk_kda`` does). Where ``kernel.kda_backward`` cannot be imported the
table says so and FLA's rows still come.

The "bf16 rounding" row of each case is the bf16 rounding of the exact gradient,
the error any bf16 output has at best.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from kernel.kda_backward import GRADIENTS

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


OURS = "ours (kda_backward)"


def verdict(rows: Sequence[tuple]) -> list[str]:
    """The precision target, case by case: every gradient of ours no worse than the best of FLA's rows
    of that case. rows: (recipe, shape, backward, *errors as text in GRADIENTS' order), as main prints
    them. Returns one line per case with ours and an FLA row: "met", or each gradient that is worse
    with its ratio to FLA's best; a case whose rows failed says so."""
    cases: dict = {}
    for r in rows:
        cases.setdefault((r[0], r[1]), []).append(r)
    out = []
    for (recipe, shape), rs in cases.items():
        ours = [r for r in rs if r[2] == OURS]
        fla = [r for r in rs if r[2].startswith("FLA")]
        if not ours or not fla:
            continue
        try:
            mine = [float(x) for x in ours[0][3:]]
            best = [min(float(r[3 + i]) for r in fla) for i in range(len(GRADIENTS))]
        except ValueError:
            out.append(f"{recipe} {shape}: not judged (a backward failed)")
            continue
        worse = [f"{n} {m / b:.2f}x" for n, m, b in zip(GRADIENTS, mine, best) if m > b]
        out.append(f"{recipe} {shape}: " + ("met" if not worse else "worse than FLA's best: " + ", ".join(worse)))
    return out


def recipe_inputs(recipe: str, B: int, T: int, H: int, K: int, V: int, lengths=None, seed: int = 0) -> dict:
    """One recipe's inputs (RECIPES): :func:`unit_inputs`, or kernel.reference.random_inputs (with
    ``lengths``, a packed batch and B, T ignored); cu_seqlens int64 numpy or None."""
    if recipe == "unit":
        return unit_inputs(B, T, H, K, V, lengths, seed)
    if recipe != "random_inputs":
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    from kernel.reference import random_inputs

    raw = random_inputs(B, T, H, K, V, lengths=lengths, seed=seed)
    raw["cu_seqlens"] = None if lengths is None else np.asarray(raw["cu_seqlens"], dtype=np.int64)
    return raw


def rel_fro(x, ref) -> float:
    num, den = float(np.linalg.norm(x - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def device_inputs(raw: dict) -> dict:
    """The raw inputs as both backwards get them, torch on the GPU: bf16 q, k, v, do, beta; fp32 g, dht; a
    zero fp32 initial state (so that dh0 is a gradient); cu_seqlens int64 or None."""
    import torch

    dev = "cuda"
    t = lambda x, dt: torch.from_numpy(np.ascontiguousarray(x)).to(dev, dt)
    out = {n: t(raw[n], torch.bfloat16) for n in ("q", "k", "v", "beta", "do")}
    out["g"], out["dht"] = t(raw["g"], torch.float32), t(raw["dht"], torch.float32)
    out["h0"] = torch.zeros_like(out["dht"])
    out["cu_seqlens"] = (None if raw["cu_seqlens"] is None
                         else torch.as_tensor(raw["cu_seqlens"], device=dev, dtype=torch.long))
    return out


def _host(x) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def seen_inputs(dev: dict) -> dict:
    """The rounded inputs both backwards saw, as float64 numpy (what the reference gets)."""
    return {n: _host(dev[n]) for n in ("q", "k", "v", "g", "beta", "do", "dht")}


def fla_gradients(dev: dict, *, safe_gate: bool) -> dict:
    """FLA's chunk_kda forward and backward (autograd) on device_inputs -> the gradients as float64 numpy."""
    import torch
    from fla.ops.kda import chunk_kda

    leaves = {n: dev[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "h0")}
    o, ht = chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                      initial_state=leaves["h0"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                      safe_gate=safe_gate, cu_seqlens=dev["cu_seqlens"])
    loss = (o.float() * dev["do"].float()).sum() + (ht * dev["dht"]).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {name: _host(x) for name, x in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads)}


def ours_gradients(dev: dict, kda_backward) -> dict:
    """Our whole backward (kernel.kda_backward) on FLA's forward tensors of device_inputs (FLA's chunk_kda_fwd,
    safe_gate True, after FLA's l2norm, as kernel.tools.fla_kda runs them), then FLA's l2norm backward for
    dq, dk (as chunk_kda's autograd applies it) -> the gradients as float64 numpy."""
    from kernel.tools import fla_kda

    f = fla_kda.forward(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], h0=dev["h0"],
                        cu_seqlens=dev["cu_seqlens"], safe_gate=True)
    out = kda_backward(f.q, f.k, f.v, f.g, f.beta, f.Aqk, f.Akk, dev["do"], scale=f.scale, initial_state=f.h0,
                       dht=dev["dht"], cu_seqlens=dev["cu_seqlens"])
    dq, dk = fla_kda.l2norm_backward(f, out["dq"], out["dk"])
    return {"dq": _host(dq), "dk": _host(dk), **{n: _host(out[n]) for n in ("dv", "dg", "dbeta", "dh0")}}


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
                    help="FLA's safe_gate settings to run (default both; ours always runs on FLA's safe_gate "
                         "True forward)")
    ap.add_argument("--no-ours", dest="ours", action="store_false",
                    help="leave out our backward (kernel.kda_backward); by default it runs beside FLA's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the table and the verdict there")
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

    from kernel.reference import ragged_lengths

    K = V = 128
    shapes = [("1x%d" % a.T, None)]
    if a.varlen:
        shapes.append((f"varlen{a.varlen}x{a.T}", ragged_lengths(a.varlen, a.T, seed=a.seed)))
    kda_backward, why_not_ours = None, "skipped (--no-ours)"
    if a.ours:
        try:
            from kernel.kda_backward import kda_backward
        except Exception as exc:   # the lead's module may not be there yet: FLA's rows still come
            why_not_ours = f"kernel.kda_backward cannot be imported ({exc.__class__.__name__}: {exc})"
            print(f"ours: {why_not_ours}", flush=True)
    header = ("recipe", "shape", "backward", *GRADIENTS)
    rows = []
    for recipe in a.recipes:
        for shape, lengths in shapes:
            raw = recipe_inputs(recipe, 1, a.T, a.heads, K, V, lengths, a.seed)
            dev = device_inputs(raw)
            print(f"[{recipe} {shape}] the float64 reference (CuPy)", flush=True)
            ref = reference_gradients(seen_inputs(dev), raw["cu_seqlens"])   # the rounded inputs both saw
            rows.append((recipe, shape, "bf16 rounding", *(f"{bf16_rounding(ref[n]):.2e}" for n in GRADIENTS)))
            runs = [(f"FLA safe_gate={sg}", lambda sg=sg: fla_gradients(dev, safe_gate=sg)) for sg in a.safe_gate]
            if kda_backward is not None:
                runs.append((OURS, lambda: ours_gradients(dev, kda_backward)))
            for label, run in runs:
                print(f"[{recipe} {shape}] {label} (FLA's first call on a new shape or option compiles and "
                      "autotunes its Triton kernels: minutes)", flush=True)
                try:
                    grads = run()
                except Exception as exc:
                    rows.append((recipe, shape, label, *(["failed"] * len(GRADIENTS))))
                    print(f"[{recipe} {shape}] {label} failed: {exc.__class__.__name__}: {exc}", flush=True)
                    continue
                errs = {n: rel_fro(grads[n], ref[n]) for n in GRADIENTS}
                rows.append((recipe, shape, label, *(f"{errs[n]:.2e}" for n in GRADIENTS)))
                print(f"[{recipe} {shape}] {label}: " + ", ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)
            runs.clear()
            dev.clear()
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(f"\nthe whole backward's gradients vs float64 (relative Frobenius), H = {a.heads}, K = V = {K}: FLA's "
          "chunk_kda (autograd) and ours (FLA's forward, kernel.kda_backward, FLA's l2norm backward)"
          + ("" if kda_backward is not None else f"; ours {why_not_ours}") + ":")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    judged = verdict(rows)
    if judged:
        print("\nthe target, every gradient of ours no worse than FLA's best row of the case:")
        for v in judged:
            print(f"  {v}")
    if a.json is not None:
        a.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                                      "header": list(header), "rows": [list(r) for r in rows],
                                      "verdict": judged}, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
