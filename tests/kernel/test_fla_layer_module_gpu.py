"""FLA's own KimiDeltaAttention layer, one training step through FLA's path and through
kernel.patched_fla(), against a float64 oracle of the layer (GPU; issue 34, item 6).

The layer at its defaults (the softplus gate, unbounded below) and with safe_gate=True,
lower_bound=-5 (the sigmoid gate), with and without grouped value heads, on a batch, on packed
sequences (cu_seqlens, as FLA's trainer passes them) and on a padded batch (attention_mask), built
from one seed: one forward and backward through FLA's path, one from identical parameters inside
kernel.patched_fla(), and the float64 oracle (tests/kernel/kda_layer_oracle.py) on the same
parameters and hidden states. Every parameter's gradient and the input's is compared with the
oracle's (relative Frobenius error): ours must be no worse than 2x FLA's own plus a floor.

Precision: FLA's trainer (flame, on torchtitan) trains under FSDP2 with
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): every parameter, A_log and
dt_bias included, is cast to bf16 for the forward and the backward, so the layer runs in bf16 and
its gradients come out in bf16 ("bf16" here, a bf16 copy of the layer). torchtitan runs a model
without FSDP under torch.autocast(bfloat16) with fp32 parameters instead, as this project's training
study does ("autocast"): there A_log, dt_bias and the norm's weight keep fp32 gradients, which no
bf16 rounding hides. Both run on bf16 hidden states; the oracle reads the parameters as they are.

Inside the switch our backward must really run: the layer's module holds the routed op, the
drop-in's backward (kernel.kda_backward.run) runs once for the step and never for FLA's, and these
gates, in range, give no FallbackWarning. The step runs with the forward setting as it stands (the
default: our forward). With FLA's forward (``kernel.use_forward("fla")``) the output equals FLA's bit
for bit, and so do the gradients of the parameters after the KDA op (g_proj, o_norm, o_proj), which
see only the forward; with ours the output is held to the gradients' rule against the float64 layer.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

from . import kda_layer_oracle as oracle  # noqa: E402
from .fla_requirements import skip_without_fla_gpu  # noqa: E402

HIDDEN = 256
HEADS = 2
HEAD_DIM = 128          # our backward's head size
BATCH = (2, 192)        # B, T of the batch layout
LENGTHS = [1, 15, 17, 64, 131]      # the packed layout's sequences
PADDED = (2, 160, 40)   # B, T, left padding of the second row in the padded layout
SEEDS = dict(layer=0, hidden=1, do=2)
TIMES_FLA = 2.0         # our error may be at most this multiple of FLA's own ...
ERROR_FLOOR = 1e-3      # ... plus this (a gradient's bf16 rounding alone is ~1e-3 relative)
ORACLE_GUARD = 0.1      # FLA's own errors stay below this: an oracle that is not the layer puts both far off
AFTER_THE_OP = ("g_proj.0.weight", "g_proj.1.weight", "g_proj.1.bias", "o_norm.weight", "o_proj.weight")

GATES = [("defaults", {}), ("safe-gate", dict(safe_gate=True, lower_bound=-5.0))]
V_HEADS = [None, 4]
LAYOUTS = ["batch", "varlen", "padded"]
PRECISIONS = ["bf16", "autocast"]
CASES = [(gate, kw, hv, layout, precision) for gate, kw in GATES for hv in V_HEADS for layout in LAYOUTS
         for precision in PRECISIONS]


def _case_id(case) -> str:
    gate, _, hv, layout, precision = case
    return f"{gate}-{'gva' if hv else 'mha'}-{layout}-{precision}"


def _layer(gate_kw: dict, num_v_heads, precision: str):
    from fla.layers.kda import KimiDeltaAttention

    torch.manual_seed(SEEDS["layer"])
    layer = KimiDeltaAttention(hidden_size=HIDDEN, num_heads=HEADS, head_dim=HEAD_DIM, num_v_heads=num_v_heads,
                               mode="chunk", **gate_kw).cuda().train()
    return layer.bfloat16() if precision == "bf16" else layer


def _inputs(layout: str):
    """(hidden states bf16, do fp32, the layer's keyword arguments for the layout), on the GPU."""
    kw = {}
    if layout == "batch":
        shape = (*BATCH, HIDDEN)
    elif layout == "varlen":
        shape = (1, sum(LENGTHS), HIDDEN)
        kw["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=torch.long, device="cuda")
    else:
        B, T, pad = PADDED
        shape = (B, T, HIDDEN)
        mask = torch.ones(B, T, dtype=torch.long, device="cuda")
        mask[1, :pad] = 0
        kw["attention_mask"] = mask
    x = torch.randn(shape, generator=torch.Generator().manual_seed(SEEDS["hidden"])).bfloat16().cuda()
    do = torch.randn(shape, generator=torch.Generator().manual_seed(SEEDS["do"])).cuda()
    return x, do, kw


def _step(layer, x, do, kw: dict, precision: str):
    """One forward and backward as training runs it: the output and every gradient by name."""
    x = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "autocast"):
        out, _, _ = layer(x, **kw)
    (out.float() * do).sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    grads["hidden_states"] = x.grad
    missing = [name for name, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing}"
    return out.detach(), grads


def _oracle(layer, x, do, kw: dict):
    """The float64 output and gradients, and the gate parameters' term magnitudes
    (oracle.gate_term_magnitudes); a padded batch is packed first, as the layer unpads it."""
    if "attention_mask" not in kw:
        cu = kw.get("cu_seqlens")
        return (*oracle.layer_gradients(layer, x, do, cu), oracle.gate_term_magnitudes(layer, x, do, cu))
    keep = kw["attention_mask"].bool().cpu()
    cu = torch.cat([torch.zeros(1, dtype=torch.long), keep.sum(1).cumsum(0)])
    packed_x, packed_do = x.cpu()[keep][None], do.cpu()[keep][None]
    out, grads = oracle.layer_gradients(layer, packed_x, packed_do, cu)
    full = torch.zeros(x.shape, dtype=torch.float64)
    full[keep] = out[0]
    dx = torch.zeros(x.shape, dtype=torch.float64)
    dx[keep] = grads["hidden_states"][0]
    return full, {**grads, "hidden_states": dx}, oracle.gate_term_magnitudes(layer, packed_x, packed_do, cu)


def _floor(name: str, ref: dict, magnitudes: dict) -> float:
    """ERROR_FLOOR, relative to the gradient; for A_log and dt_bias, sums over every token whose terms
    cancel, ERROR_FLOOR of their terms' magnitudes (oracle.gate_term_magnitudes), as a relative error.

    Why: A_log's gradient is 2 numbers here (one per head), each a sum 10 to 2000 times smaller than
    its terms, so its relative error is the gate gradient's error magnified that much, in a random
    direction. Against the cancelled sum, ours and FLA's are two draws of that noise: the draws over
    seeds are in docs/log/39-the-targets-measured.md.
    """
    if name not in magnitudes:
        return ERROR_FLOOR
    return ERROR_FLOOR * float(torch.linalg.norm(magnitudes[name]) / torch.linalg.norm(ref[name]))


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.detach().to("cpu", torch.float64)
    return float(torch.linalg.norm(a - ref) / torch.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_layer_step_through_the_switch_matches_flas_precision(case, monkeypatch):
    skip_without_fla_gpu(layers=True)
    import fla.layers.kda as fla_layer_module

    import kernel
    import kernel.kda_backward
    from kernel.fla_dropin import FallbackWarning, forget_warnings, forward_setting, is_patched

    gate, gate_kw, num_v_heads, layout, precision = case
    layer = _layer(gate_kw, num_v_heads, precision)
    x, do, kw = _inputs(layout)

    ran = []
    real_run = kernel.kda_backward.run

    def counted_run(*args, **kwargs):
        ran.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(kernel.kda_backward, "run", counted_run)

    assert not is_patched()
    out_fla, fla = _step(copy.deepcopy(layer), x, do, kw, precision)
    assert not ran, "FLA's path ran our backward"
    forget_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)   # these gates stay in range: ours must run
        with kernel.patched_fla():
            assert is_patched()
            assert getattr(fla_layer_module.chunk_kda, "__kernel_routes__", None) is not None
            out_ours, ours = _step(copy.deepcopy(layer), x, do, kw, precision)
    assert not is_patched()
    assert len(ran) == 1, f"our backward ran {len(ran)} times in the patched step"

    forward = forward_setting()
    if forward == "fla":
        assert torch.equal(out_ours, out_fla), "the forward is FLA's: the output must be FLA's bit for bit"
        for name in AFTER_THE_OP:
            assert torch.equal(ours[name], fla[name]), f"d{name} sees only the forward, yet differs from FLA's"

    out_ref, ref, magnitudes = _oracle(layer, x, do, kw)
    e_out, e_out_ours = _rel(out_fla, out_ref), _rel(out_ours, out_ref)
    print(f"\n[{_case_id(case)}, {forward}'s forward] relative Frobenius error vs the float64 layer: output, "
          f"ours {e_out_ours:.3e}, FLA's {e_out:.3e}")
    print(f"  {'gradient':22s} {'ours':>10s} {'FLA':>10s} {'floor':>10s}")
    failed = []
    if not e_out_ours <= TIMES_FLA * e_out + ERROR_FLOOR:
        failed.append(f"output: ours {e_out_ours:.3e} > {TIMES_FLA} x FLA's {e_out:.3e} + {ERROR_FLOOR}")
    for name in ref:
        assert ours[name].shape == fla[name].shape == ref[name].shape and ours[name].dtype == fla[name].dtype, name
        e_ours, e_fla = _rel(ours[name], ref[name]), _rel(fla[name], ref[name])
        floor = _floor(name, ref, magnitudes)
        print(f"  d{name:21s} {e_ours:10.3e} {e_fla:10.3e} {floor:10.3e}")
        if not e_ours <= TIMES_FLA * e_fla + floor:
            failed.append(f"d{name}: ours {e_ours:.3e} > {TIMES_FLA} x FLA's {e_fla:.3e} + {floor:.3e}")
        if not e_fla < ORACLE_GUARD:
            failed.append(f"d{name}: FLA's own error {e_fla:.3e} >= {ORACLE_GUARD}: is the oracle the layer?")
    assert e_out < ORACLE_GUARD, f"FLA's output is {e_out:.3e} off the float64 layer: is the oracle the layer?"
    assert not failed, failed
