"""KDA's precision yardstick: FLA's gradients, o and final state and ours against the float64 reference.

    ptx-lab kda-precision                       # T = 8192 and a varlen batch, 2 heads, every recipe
    ptx-lab kda-precision --T 2048 --heads 1    # smaller
    ptx-lab kda-precision --recipes trained-layer   # FLA's layer gate, grown: tiles past our range
    ptx-lab kda-precision --recipes layer-call --heads 16   # the same, called as the layer calls the op

(also ``python -m kernel.tools.kda_precision``; needs a GPU, torch, CuPy and fla-core.)

A backward of our own must give every gradient with a relative Frobenius error
against float64 no worse than FLA's on the same inputs, on more than one input
recipe. This measures FLA's side: flash-linear-attention's ``chunk_kda``
(fla-core 0.6.0, forward and backward through torch autograd, with
``safe_gate`` True and False: the unit and random_inputs recipes' gates lie in
[-5, 0], the bound safe_gate asks of gates computed outside the kernel) on bf16 q, k, v, do, bf16 beta and fp32 g, and
:func:`kernel.reference.kda_backward_reference` in float64 (CuPy) on exactly
those rounded values, with the l2norm inside (FLA's
``use_qk_l2norm_in_kernel``). The loss is sum(o * do) + sum(S_T * dht), with a
zero initial state that requires a gradient (so FLA returns dh0).

Recipes:

* ``unit``: q, k, v, do ~ N(0, 1) (q and k unit-norm after the l2norm), g =
  logsigmoid(N(0, 1)) clamped to [-5, 0], beta ~ U(0, 1), dht ~ 0.1 N(0, 1);
* ``random_inputs``: :func:`kernel.reference.random_inputs` (the tests' and
  the bench's recipe: weaker gates, do and dht scaled by 0.1);
* ``trained-layer``: the unit recipe with the gate of FLA's KimiDeltaAttention
  layer at its defaults, its projection's output grown ``--projection-scale``
  (4) times (:mod:`kernel.tools.trained_layer_gate`): unbounded below, so that
  some 16-token tiles decay a channel past 2^-126. The tool takes the gate
  activated (:func:`kernel.activations.gate` of the recipe's raw projection),
  not the layer's raw one with ``use_gate_in_kernel``, so dA_log and dt_bias
  are not in its table (``layer-call``'s has them). FLA runs only with safe_gate False (its safe_gate
  asks for gates in [-5, 0]); ours is ``kernel.chunk_kda`` on the same call (our
  backward, and our forward, or FLA's with ``--our-forward fla``), its
  tiles spanning more than 110 (log2, ``kernel.shapes.SPAN_LIMIT``) taking Kernel
  B's pairwise path. Should ``kernel.chunk_kda`` ever run FLA's backward for a case
  (its FallbackWarning), the tool labels that row "chunk_kda: FLA's backward
  (fallback)", never "ours", and judges nothing
  there.
* ``layer-call``: the trained-layer recipe called as FLA's layer calls the op: the raw
  gate projection (bf16) with ``A_log`` and ``dt_bias`` and ``use_gate_in_kernel``, beta as
  logits ~ N(0, 1) with ``use_beta_sigmoid_in_kernel``. dg and dbeta are then the gradients of
  the raw projection and the logits, and the table's dA_log and ddt_bias columns are filled
  (dA_log has one entry per head: ``--heads`` sets how many sums it averages). The float64
  reference activates the rounded raw inputs in float64 (:func:`kernel.activations.gate`,
  the sigmoid) and chains its gradients back through torch's float64 autograd
  (:func:`layer_call_chain`). FLA runs with safe_gate False; ours is ``kernel.chunk_kda`` (its forward
  ``--our-forward``'s, as for ``trained-layer``).

Beside FLA's rows, one of ours (unless ``--no-ours``; for ``trained-layer``, see
above): FLA's forward on the same
inputs (``kernel.tools.fla_kda.forward``: l2norm, ``chunk_kda_fwd`` with safe_gate
True), our whole backward ``kernel.kda_backward.kda_backward`` on its tensors, and
FLA's l2norm backward for dq and dk, as ``chunk_kda``'s autograd applies it (what
``kernel.chunk_kda`` does). Where ``kernel.kda_backward`` cannot be imported the
table says so and FLA's rows still come. That row's forward is FLA's whatever ``--our-forward`` says: it
measures our backward on FLA's tensors; ``kernel.chunk_kda``'s rows (``trained-layer``, ``layer-call``) run
the forward ``--our-forward`` names (``kernel.using_forward``; ours by default).

Every recipe also gets a row of ``kernel.chunk_kda`` (unless ``--no-ours``), our forward (or the one
``--our-forward`` names; ``--passes`` picks the one pass or the three passes where the rule would pick the
other) and our backward, so that the forward's outputs are judged too: the table's
``o`` and ``ht`` columns are the output and the final state against the float64 forward
(:func:`kernel.reference.kda_forward_reference` on the same rounded inputs), for FLA's rows and the
``chunk_kda`` rows; the row of ``kernel.kda_backward`` on FLA's forward has none there ("-"): its
forward is FLA's.

The "bf16 rounding" row of each case is the bf16 rounding of the exact gradient (and of o),
the error any bf16 output has at best.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from kernel.kda_backward import GRADIENTS

TRAINED_LAYER = "trained-layer"
LAYER_CALL = "layer-call"
RECIPES = ("unit", "random_inputs", TRAINED_LAYER, LAYER_CALL)
LAYER_GATES = (TRAINED_LAYER, LAYER_CALL)       # the recipes with the layer's gate (unbounded below)
PARAMETERS = ("dA_log", "ddt_bias")             # the gate's parameters' gradients (layer-call only)
OUTPUTS = ("o", "ht")                           # the forward's: the output and the final state (fp32)
COLUMNS = (*GRADIENTS, *PARAMETERS, *OUTPUTS)
NOT_THERE = "-"                                 # a column a recipe has no gradient for


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
# --our-forward: kernel.chunk_kda's forward in the OURS_DROPIN rows (kernel.using_forward), as the table words it
OUR_FORWARDS = {"ours": "our forward", "fla": "FLA's forward"}
OURS_DROPIN = "ours (chunk_kda)"
# --passes: which of our forwards kernel.chunk_kda's rows run, as the value of the rule's knob
# (kernel.three_pass_forward.THREE_PASS_MAX_PAIRS) that forces it: None keeps the rule, which at this table's
# few heads and one sequence takes the three passes where a model's 32 heads at 32x8192 take the one pass
PASSES = {"rule": None, "one": 0, "three": sys.maxsize}
PASSES_WORDS = {"rule": "the rule's passes", "one": "the one pass", "three": "the three passes"}
FALLBACK = "chunk_kda: FLA's backward (fallback)"


def _error_cell(row: tuple, i: int) -> str:
    """Column i of COLUMNS in a row (recipe, shape, backward, *errors); NOT_THERE past its end."""
    return row[3 + i] if 3 + i < len(row) else NOT_THERE


def verdict(rows: Sequence[tuple]) -> list[str]:
    """The precision target, case by case: every gradient of ours no worse than the best of FLA's rows
    of that case. rows: (recipe, shape, backward, *errors as text in GRADIENTS' order), as main prints
    them. Returns one line per case with ours and an FLA row: "met", or each gradient that is worse
    with its ratio to FLA's best; a case whose rows failed says so, and so does one where
    kernel.chunk_kda's backward was FLA's (the FALLBACK row: FLA's numbers, not ours)."""
    cases: dict = {}
    for r in rows:
        cases.setdefault((r[0], r[1]), []).append(r)
    out = []
    for (recipe, shape), rs in cases.items():
        ours = [r for r in rs if r[2] in (OURS, OURS_DROPIN)]
        fla = [r for r in rs if r[2].startswith("FLA")]
        if not ours and any(r[2] == FALLBACK for r in rs):
            out.append(f"{recipe} {shape}: not judged (kernel.chunk_kda ran FLA's backward: a FallbackWarning)")
            continue
        if not ours or not fla:
            continue
        worse, failed = [], False
        for mine_row in ours:   # each of ours (kernel.kda_backward on FLA's forward, kernel.chunk_kda) on its own
            judged = [i for i in range(len(COLUMNS)) if _error_cell(mine_row, i) != NOT_THERE
                      and all(_error_cell(r, i) != NOT_THERE for r in fla)]
            try:
                mine = [float(_error_cell(mine_row, i)) for i in judged]
                best = [min(float(_error_cell(r, i)) for r in fla) for i in judged]
            except ValueError:
                failed = True
                continue
            label = f"{mine_row[2]} " if len(ours) > 1 else ""
            worse += [f"{label}{COLUMNS[i]} {m / b:.2f}x" for i, m, b in zip(judged, mine, best) if m > b]
        if failed and not worse:
            out.append(f"{recipe} {shape}: not judged (a backward failed)")
            continue
        out.append(f"{recipe} {shape}: " + ("met" if not worse else "worse than FLA's best: " + ", ".join(worse)))
    return out


def recipe_inputs(recipe: str, B: int, T: int, H: int, K: int, V: int, lengths=None, seed: int = 0,
                  projection_scale: float | None = None) -> dict:
    """One recipe's inputs (RECIPES): :func:`unit_inputs`, kernel.reference.random_inputs (with
    ``lengths``, a packed batch and B, T ignored), or :func:`trained_layer_inputs` (``projection_scale``
    its gate's, default the recipe's; no other recipe takes it); cu_seqlens int64 numpy or None."""
    if recipe in LAYER_GATES:
        return trained_layer_inputs(B, T, H, K, V, lengths, seed, projection_scale, layer_call=recipe == LAYER_CALL)
    if projection_scale is not None:
        raise ValueError(f"projection_scale belongs to the {TRAINED_LAYER!r} and {LAYER_CALL!r} recipes, got it "
                         f"with {recipe!r}")
    if recipe == "unit":
        return unit_inputs(B, T, H, K, V, lengths, seed)
    if recipe != "random_inputs":
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    from kernel.reference import random_inputs

    raw = random_inputs(B, T, H, K, V, lengths=lengths, seed=seed)
    raw["cu_seqlens"] = None if lengths is None else np.asarray(raw["cu_seqlens"], dtype=np.int64)
    return raw


def trained_layer_inputs(B: int, T: int, H: int, K: int, V: int, lengths, seed: int,
                         projection_scale: float | None = None, layer_call: bool = False) -> dict:
    """The ``trained-layer`` recipe as float32 numpy arrays: :func:`unit_inputs` (the same draws of q, k, v,
    beta, do, dht for the same seed) with g the activated gate
    of :func:`kernel.tools.trained_layer_gate.trained_layer_gate` (H value heads, the layer's K = 128,
    its raw projection in bf16 as a bf16 layer passes it). Needs torch (on the CPU).

    With ``layer_call`` (the ``layer-call`` recipe) also what the layer passes the op: ``g_raw`` (the
    bf16 projection's values), ``A_log``, ``dt_bias``, and ``beta_raw``, logits ~ N(0, 1) (drawn
    from seed + 1, so that the other draws stay the unit recipe's)."""
    from kernel.shapes import HEAD_DIM
    from kernel.tools.trained_layer_gate import PROJECTION_SCALE, trained_layer_gate

    if K != HEAD_DIM:
        raise ValueError(f"K must be the layer's head dimension {HEAD_DIM} for the {TRAINED_LAYER!r} recipe, got {K}")
    out = unit_inputs(B, T, H, K, V, lengths, seed)
    scale = PROJECTION_SCALE if projection_scale is None else projection_scale
    gate = trained_layer_gate(B, T, H, H, lengths=lengths, seed=seed, projection_scale=scale)
    out["g"] = gate["g"].numpy()
    if layer_call:
        out["g_raw"] = gate["g_raw"].float().numpy()
        out["A_log"], out["dt_bias"] = gate["A_log"].numpy(), gate["dt_bias"].numpy()
        out["beta_raw"] = np.random.default_rng(seed + 1).standard_normal(out["beta"].shape).astype(np.float32)
    return out


def rel_fro(x, ref) -> float:
    num, den = float(np.linalg.norm(x - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def device_inputs(raw: dict) -> dict:
    """The raw inputs as both backwards get them, torch on the GPU: bf16 q, k, v, do, beta; fp32 g, dht; a
    zero fp32 initial state (so that dh0 is a gradient); cu_seqlens int64 or None. For layer-call, g and
    beta are the bf16 raw projection and logits, and fp32 A_log and dt_bias come too."""
    import torch

    dev = "cuda"
    t = lambda x, dt: torch.from_numpy(np.ascontiguousarray(x)).to(dev, dt)
    out = {n: t(raw[n], torch.bfloat16) for n in ("q", "k", "v", "beta", "do")}
    out["g"], out["dht"] = t(raw["g"], torch.float32), t(raw["dht"], torch.float32)
    if "g_raw" in raw:   # layer-call: the raw projection and beta's logits, as the layer passes them
        out["g"], out["beta"] = t(raw["g_raw"], torch.bfloat16), t(raw["beta_raw"], torch.bfloat16)
        out["A_log"], out["dt_bias"] = t(raw["A_log"], torch.float32), t(raw["dt_bias"], torch.float32)
    out["h0"] = torch.zeros_like(out["dht"])
    out["cu_seqlens"] = (None if raw["cu_seqlens"] is None
                         else torch.as_tensor(raw["cu_seqlens"], device=dev, dtype=torch.long))
    return out


def _host(x) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def seen_inputs(dev: dict) -> dict:
    """The rounded inputs both backwards saw, as float64 numpy (what the reference gets)."""
    names = ("q", "k", "v", "g", "beta", "do", "dht") + (("A_log", "dt_bias") if "A_log" in dev else ())
    return {n: _host(dev[n]) for n in names}


def fla_gradients(dev: dict, *, safe_gate: bool) -> dict:
    """FLA's chunk_kda forward and backward (autograd) on device_inputs -> the gradients as float64 numpy."""
    from fla.ops.kda import chunk_kda

    return autograd_gradients(chunk_kda, dev, safe_gate=safe_gate)


def dropin_gradients(dev: dict) -> tuple[dict, bool]:
    """kernel.chunk_kda (our backward; the forward the process's setting names, kernel.use_forward) on FLA's
    call with safe_gate False -> (the gradients as float64 numpy, whether its backward fell back to FLA's)."""
    from kernel import chunk_kda

    return catching_fallback(lambda: autograd_gradients(chunk_kda, dev, safe_gate=False))


@contextlib.contextmanager
def forcing_passes(passes: str) -> Iterator[None]:
    """kernel.chunk_kda's forward for a block: the rule's choice ("rule"), the one pass ("one") or the three
    passes ("three"), through the rule's knob; the knob's value before comes back after, on an error too."""
    import kernel.three_pass_forward as three_passes

    before = three_passes.THREE_PASS_MAX_PAIRS
    if PASSES[passes] is not None:
        three_passes.THREE_PASS_MAX_PAIRS = PASSES[passes]
    try:
        yield
    finally:
        three_passes.THREE_PASS_MAX_PAIRS = before


def catching_fallback(run):
    """(run(), whether kernel.chunk_kda warned that FLA's path ran: a FallbackWarning). The drop-in warns
    once per process, and a table needs it per case, so it forgets its warnings first; other warnings
    pass on."""
    import warnings

    from kernel.fla_dropin import FallbackWarning, forget_warnings

    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
    fell_back = False
    for w in caught:
        if issubclass(w.category, FallbackWarning):
            fell_back = True
            print(f"  kernel.chunk_kda: {w.message}", flush=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, fell_back


def autograd_gradients(chunk_kda, dev: dict, *, safe_gate: bool) -> dict:
    """A chunk_kda of FLA's signature (FLA's or kernel's), forward and backward through autograd on
    device_inputs -> the gradients as float64 numpy."""
    import torch

    layer_call = "A_log" in dev
    names = ("q", "k", "v", "g", "beta", "h0") + (("A_log", "dt_bias") if layer_call else ())
    leaves = {n: dev[n].detach().clone().requires_grad_() for n in names}
    gate = (dict(A_log=leaves["A_log"], dt_bias=leaves["dt_bias"], use_gate_in_kernel=True,
                 use_beta_sigmoid_in_kernel=True) if layer_call else {})
    o, ht = chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                      initial_state=leaves["h0"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                      safe_gate=safe_gate, cu_seqlens=dev["cu_seqlens"], **gate)
    loss = (o.float() * dev["do"].float()).sum() + (ht * dev["dht"]).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {**{name: _host(x) for name, x in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0", *PARAMETERS), grads)},
            "o": _host(o), "ht": _host(ht)}


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
    """kernel.reference.kda_backward_reference in float64 on CuPy -> float64 numpy, with the forward's o and
    ht from the same scan (its with_forward). For layer-call (A_log in ``seen``) on the gate and beta activated in float64,
    then chained back to the raw inputs (:func:`layer_call_chain`)."""
    import cupy

    from kernel.reference import kda_backward_reference

    layer_call = "A_log" in seen
    g, beta = (layer_call_activations(seen) if layer_call else (seen["g"], seen["beta"]))
    d = {name: cupy.asarray(x) for name, x in dict(seen, g=g, beta=beta).items()}
    out = kda_backward_reference(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], dht=d["dht"],
                                 cu_seqlens=cu_seqlens, qk_l2norm=True, with_forward=True)
    grads = {name: cupy.asnumpy(out[name]) for name in (*GRADIENTS, *OUTPUTS)}   # the zero initial state, as both
                                                                                 # forwards get
    if layer_call:
        grads.update(layer_call_chain(seen, grads["dg"], grads["dbeta"]))
    return grads


def layer_call_activations(seen: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the gate, beta) in float64 from the layer-call inputs ``seen`` (float64 numpy): the layer's
    softplus gate of the raw projection with A_log and dt_bias, the sigmoid of beta's logits."""
    import torch

    from kernel.activations import gate

    t = {n: torch.from_numpy(seen[n]) for n in ("g", "beta", "A_log", "dt_bias")}
    g = gate(t["g"], t["A_log"], t["dt_bias"], dtype=torch.float64)
    return g.numpy(), torch.sigmoid(t["beta"]).numpy()


def layer_call_chain(seen: dict, dg: np.ndarray, dbeta: np.ndarray) -> dict:
    """The float64 gradients of the layer-call inputs from those of the activated gate and beta, by torch's
    float64 autograd through :func:`kernel.activations.gate` and the sigmoid (independent of the
    kernels' and of activations.gate_backward): dg, dbeta (the raw projection's and the logits'),
    dA_log, ddt_bias."""
    import torch

    from kernel.activations import gate

    leaf = {n: torch.from_numpy(seen[n]).clone().requires_grad_() for n in ("g", "beta", "A_log", "dt_bias")}
    g = gate(leaf["g"], leaf["A_log"], leaf["dt_bias"], dtype=torch.float64)
    beta = torch.sigmoid(leaf["beta"])
    grads = torch.autograd.grad((g, beta), list(leaf.values()), (torch.from_numpy(dg), torch.from_numpy(dbeta)))
    return {name: x.numpy() for name, x in zip(("dg", "dbeta", *PARAMETERS), grads)}


def backwards_of(recipe: str, safe_gates: Sequence[bool], ours: bool) -> list[tuple[str, bool | None]]:
    """The backwards a case of ``recipe`` runs, as (row label, FLA's safe_gate or None for ours): FLA's at
    each of ``safe_gates``, less safe_gate True for the trained-layer recipes (it promises gates in [-5, 0],
    which their gates leave), then, with ``ours``, ours: kernel.kda_backward on FLA's safe_gate True
    forward (not for the trained-layer recipes), and kernel.chunk_kda (safe_gate False), our forward and
    our backward, for every recipe."""
    rows: list[tuple[str, bool | None]] = [(f"FLA safe_gate={sg}", sg) for sg in safe_gates
                                           if not (sg and recipe in LAYER_GATES)]
    if ours:
        rows += ([] if recipe in LAYER_GATES else [(OURS, None)]) + [(OURS_DROPIN, None)]
    return rows


def per_head_line(grads_by_label: dict, ref_dA: np.ndarray) -> str:
    """dA_log head by head (each one sum over every token and channel of the head): in how many heads
    ours is at least as close to float64 as FLA's row, and the median of ours' error over FLA's."""
    fla = [g["dA_log"] for label, g in grads_by_label.items() if label.startswith("FLA") and "dA_log" in g]
    ours = [g["dA_log"] for label, g in grads_by_label.items() if label in (OURS, OURS_DROPIN) and "dA_log" in g]
    if not fla or not ours:
        return "dA_log per head: not compared (a row is missing)"
    e_ours, e_fla = np.abs(ours[0] - ref_dA), np.abs(fla[0] - ref_dA)
    both_exact = (e_ours == 0) & (e_fla == 0)   # a tie, not a ratio of 0
    ratio = np.median(np.where(both_exact, 1.0, e_ours / np.maximum(e_fla, np.finfo(np.float64).tiny)))
    return (f"dA_log per head: ours at least as close as FLA's in {int((e_ours <= e_fla).sum())} of {ref_dA.size} "
            f"heads; median |error| ours / FLA's {ratio:.2f}")


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
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES),
                    help=f"input recipes (default all). {TRAINED_LAYER}: FLA's layer gate, its projection grown "
                         "(kernel.tools.trained_layer_gate); some of its 16-token tiles decay a channel past "
                         "2^-126, and Kernel B forms the tile products pairwise past a span of 110 "
                         "(log2, kernel.shapes.SPAN_LIMIT); a row whose backward fell back "
                         f"to FLA's would be labelled so and not judged. {LAYER_CALL}: the same gates passed as "
                         "the layer passes them (the raw projection with A_log and dt_bias, beta as logits, both "
                         "activated in the op), with dA_log and ddt_bias in the table")
    ap.add_argument("--projection-scale", type=float, metavar="X",
                    help=f"the {TRAINED_LAYER} and {LAYER_CALL} recipes' growth of the gate projection's output "
                         "(default "
                         "the recipe's, 4; 2 puts single gates below -5.46 but, in every draw measured, no tile "
                         "past the range)")
    ap.add_argument("--safe-gate", nargs="+", choices=("true", "false"), default=["true", "false"],
                    help="FLA's safe_gate settings to run (default both; True is left out for the "
                         f"{TRAINED_LAYER} recipe, whose gates leave [-5, 0]; ours runs on FLA's safe_gate "
                         f"True forward, or for {TRAINED_LAYER} as kernel.chunk_kda with safe_gate False)")
    ap.add_argument("--no-ours", dest="ours", action="store_false",
                    help=f"leave out our backward (kernel.kda_backward; kernel.chunk_kda for {TRAINED_LAYER}); by "
                         "default it runs beside FLA's")
    ap.add_argument("--our-forward", choices=tuple(OUR_FORWARDS), default="ours",
                    help=f"the forward kernel.chunk_kda runs in the {TRAINED_LAYER} and {LAYER_CALL} rows "
                         "(kernel.using_forward): ours (default) or fla (FLA's forward, our backward); the other "
                         "recipes' row of ours is kernel.kda_backward on FLA's forward tensors either way")
    ap.add_argument("--passes", choices=tuple(PASSES), default="rule",
                    help="which of our forwards kernel.chunk_kda's rows run: the rule's choice (default; "
                         "kernel.three_pass_forward.three_passes_pay, which at a few heads and one sequence takes "
                         "the three passes), the one pass (kernel.forward, what 32 heads at 32x8192 run) or the "
                         "three passes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the table and the verdict there")
    a = ap.parse_args(argv)
    if a.T < 1 or a.heads < 1 or a.varlen < 0:
        ap.error("--T and --heads must be >= 1, --varlen >= 0")
    if a.projection_scale is not None and not (math.isfinite(a.projection_scale) and a.projection_scale > 0):
        ap.error(f"--projection-scale must be finite and > 0, got {a.projection_scale}")
    if a.projection_scale is not None and not set(LAYER_GATES) & set(a.recipes):
        ap.error(f"--projection-scale belongs to the {TRAINED_LAYER} and {LAYER_CALL} recipes, which --recipes "
                 f"leaves out")
    if a.passes != "rule" and a.our_forward != "ours":
        ap.error(f"--passes {a.passes} chooses among our forwards, and --our-forward {a.our_forward} runs FLA's")
    a.safe_gate = [v == "true" for v in a.safe_gate]

    from ptx_lab.gpu import gpu_reason
    why = gpu_reason()
    if why:
        print(f"{prog} needs a GPU: {why}", file=sys.stderr)
        return 2
    try:
        import fla  # noqa: F401
        import torch
    except ImportError as exc:
        print(f"{prog} needs torch and fla-core 0.6.0 ({exc}); see the README's 'Carrying fla-core'",
              file=sys.stderr)
        return 2

    from kernel.reference import ragged_lengths
    from kernel.reference.kda import MAX_TILE_DECAY_LOG2

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
    header = ("recipe", "shape", "backward", *COLUMNS)
    rows = []
    gates, fallbacks = {}, {}     # the trained-layer cases' gate statistics, and whether chunk_kda fell back
    for recipe in a.recipes:
        scale = a.projection_scale if recipe in LAYER_GATES else None
        for shape, lengths in shapes:
            case = f"{recipe} {shape}"
            raw = recipe_inputs(recipe, 1, a.T, a.heads, K, V, lengths, a.seed, projection_scale=scale)
            if recipe in LAYER_GATES:
                from kernel.tools.trained_layer_gate import gate_statistics

                gates[case] = gate_statistics(torch.from_numpy(raw["g"]), lengths or [a.T])
                print(f"[{case}] gates: " + ", ".join(f"{n} {v:.3g}" for n, v in gates[case].items()), flush=True)
                if gates[case]["min_tile"] < -MAX_TILE_DECAY_LOG2 * math.log(2.0):
                    print(f"[{case}] skipped: a tile decays a channel by e^{gates[case]['min_tile']:.4g}, past the "
                          f"float64 reference's 2^-{MAX_TILE_DECAY_LOG2:g} (a smaller --projection-scale)", flush=True)
                    continue
            dev = device_inputs(raw)
            print(f"[{case}] the float64 reference (CuPy)", flush=True)
            ref = reference_gradients(seen_inputs(dev), raw["cu_seqlens"])   # the rounded inputs both saw
            rows.append((recipe, shape, "bf16 rounding",   # ht is an fp32 output: no bf16 rounding
                         *(f"{bf16_rounding(ref[n]):.2e}" if n in ref and n != "ht" else NOT_THERE
                           for n in COLUMNS)))
            per_case = {}
            for label, safe_gate in backwards_of(recipe, a.safe_gate, kda_backward is not None):
                print(f"[{case}] {label} (FLA's first call on a new shape or option compiles and "
                      "autotunes its Triton kernels: minutes)", flush=True)
                try:
                    if label == OURS:
                        grads = ours_gradients(dev, kda_backward)
                    elif label == OURS_DROPIN:
                        import kernel

                        with kernel.using_forward(a.our_forward), forcing_passes(a.passes):
                            grads, fallbacks[case] = dropin_gradients(dev)
                        label = FALLBACK if fallbacks[case] else label
                    else:
                        grads = fla_gradients(dev, safe_gate=safe_gate)
                except Exception as exc:
                    rows.append((recipe, shape, label, *("failed" if n in ref else NOT_THERE for n in COLUMNS)))
                    print(f"[{case}] {label} failed: {exc.__class__.__name__}: {exc}", flush=True)
                    continue
                errs = {n: rel_fro(grads[n], ref[n]) for n in COLUMNS if n in ref and n in grads}
                rows.append((recipe, shape, label, *(f"{errs[n]:.2e}" if n in errs else NOT_THERE for n in COLUMNS)))
                print(f"[{case}] {label}: " + ", ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)
                per_case[label] = grads
            if "dA_log" in ref:
                print(f"[{case}] {per_head_line(per_case, ref['dA_log'])}", flush=True)
            dev.clear()
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(f"\nthe whole backward's gradients and the forward's o and ht vs float64 (relative Frobenius), H = "
          f"{a.heads}, K = V = {K}: FLA's chunk_kda (autograd) and ours: {OURS} (FLA's forward, kernel.kda_backward, "
          f"FLA's l2norm backward; not for {TRAINED_LAYER} and {LAYER_CALL}) and {OURS_DROPIN} (kernel.chunk_kda with "
          f"{OUR_FORWARDS[a.our_forward]}"
          + (f", {PASSES_WORDS[a.passes]}" if a.passes != "rule" else "")
          + " and our backward); "
          f"{NOT_THERE}: a gradient the recipe has not, or o and ht where the row's forward is FLA's)"
          + ("" if kda_backward is not None else f"; ours {why_not_ours}") + ":")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    if fallbacks:
        print("\nkernel.chunk_kda's backward (on the trained-layer gates, tiles spanning more than 110 "
              "(log2) take Kernel B's pairwise path):")
        for case, fell_back in fallbacks.items():
            print(f"  {case}: " + ("FLA's ran (a FallbackWarning): the row is FLA's backward, not ours" if fell_back
                                   else "ours ran")
                  + (f" ({gates[case]['tile_channels_past']:.2e} of the tile decays past 2^-126)" if case in gates
                     else ""))
    judged = verdict(rows)
    if judged:
        print("\nthe target, every gradient (and o and ht) of each row of ours no worse than FLA's best row of the "
              "case:")
        for v in judged:
            print(f"  {v}")
    if a.json is not None:
        a.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                                      "header": list(header), "rows": [list(r) for r in rows],
                                      "verdict": judged, "gates": gates, "fallback": fallbacks}, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
