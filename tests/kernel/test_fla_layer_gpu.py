"""kernel.chunk_kda called as FLA's KimiDeltaAttention layer calls it, against FLA and float64 (GPU).

Every gradient the layer's parameters get (q, k, v, the raw gate, A_log, dt_bias, the beta
logits, the initial state) is compared with FLA's own chunk_kda on the same inputs and with a
float64 oracle: the gate and beta activations in float64 torch autograd around the float64 KDA
backward reference (kernel.reference), q and k repeated per value head with grouped value heads,
the states transposed with state_v_first. Ours must be no worse than 2x FLA's own error plus a
small floor. Under each forward setting (kernel.using_forward): with FLA's forward o and the final
state must equal FLA's bit for bit; with ours they are held to the same rule against the float64
forward (kernel.reference.kda_forward_reference on the same activated gate and beta).

Gate recipes: the layer's at initialisation (A_log = log U(1, 16), dt_bias = softplus^-1 of dt
log-uniform in [1e-3, 1e-1], the raw gate N(0, 1)), its sigmoid form with lower_bound, and the
"trained" one (the raw gate 3x larger, so that most (tile, head) pairs have a channel decaying past
2^-126 and Kernel B forms their tile products pairwise), held to the same bound.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

from .fla_requirements import skip_without_fla_gpu  # noqa: E402

K = V = 128
TIMES_FLA = 2.0        # our error may be at most this multiple of FLA's own ...
ERROR_FLOOR = 1e-3     # ... plus this (bf16 rounding of a gradient alone is ~1e-3 relative)
PARAMS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "h0")


def _layer_inputs(*, lengths, H, HV, seed, gate_scale=1.0, gate_shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    N = len(lengths)
    n = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
    dt = torch.exp(torch.empty(HV * K).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    x = {"q": n(1, T, H, K).bfloat16(), "k": n(1, T, H, K).bfloat16(), "v": n(1, T, HV, V).bfloat16(),
         "g": (gate_scale * n(1, T, HV, K) + gate_shift).bfloat16(), "beta": n(1, T, HV).bfloat16(),
         "A_log": torch.log(torch.empty(HV).uniform_(1, 16, generator=gen)),
         "dt_bias": dt + torch.log(-torch.expm1(-dt)), "h0": 0.1 * n(N, HV, V, K),
         "do": n(1, T, HV, V).bfloat16(), "dht": 0.1 * n(N, HV, V, K)}
    x["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    return x


def _run(fn, x, kw):
    dev = "cuda"
    leaves = {n: x[n].to(dev).requires_grad_() for n in PARAMS if not (n == "A_log" and kw.get("no_A_log"))}
    A_log = leaves.get("A_log")
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], A_log=A_log,
               dt_bias=leaves["dt_bias"], initial_state=leaves["h0"], output_final_state=True,
               use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
               allow_neg_eigval=kw.get("allow_neg_eigval", False), safe_gate=kw.get("safe_gate", False),
               lower_bound=kw.get("lower_bound"), state_v_first=True, cu_seqlens=x["cu_seqlens"].to(dev))
    loss = (o.float() * x["do"].to(dev).float()).sum() + (ht * x["dht"].to(dev)).sum()
    loss.backward()
    return o.detach(), ht.detach(), {n: t.grad for n, t in leaves.items()}


def _oracle(x, kw, H, HV) -> dict:
    """Every gradient in float64: activations by torch autograd around the KDA backward reference."""
    from kernel import activations
    from kernel.reference import kda_backward_reference

    G = HV // H
    d = {n: x[n].double().requires_grad_() for n in ("g", "beta", "A_log", "dt_bias")}
    A_log = None if kw.get("no_A_log") else d["A_log"]
    gate = activations.gate(d["g"], A_log, d["dt_bias"], kw.get("lower_bound"), dtype=torch.float64)
    beta = activations.beta(d["beta"], kw.get("allow_neg_eigval", False), dtype=torch.float64)
    f64 = lambda t: t.double().numpy()   # noqa: E731
    rep = lambda t: t.repeat_interleave(G, dim=2)   # noqa: E731
    ref = kda_backward_reference(f64(rep(x["q"])), f64(rep(x["k"])), f64(x["v"]), gate.detach().numpy(),
                                 beta.detach().numpy(), f64(x["do"]),
                                 initial_state=f64(x["h0"].transpose(-1, -2)), dht=f64(x["dht"].transpose(-1, -2)),
                                 cu_seqlens=x["cu_seqlens"].numpy(), qk_l2norm=True)
    out = {"q": ref["dq"].reshape(*x["q"].shape[:3], G, K).sum(3), "k": ref["dk"].reshape(*x["k"].shape[:3], G, K).sum(3),
           "v": ref["dv"], "h0": np.swapaxes(ref["dh0"], -1, -2)}
    inputs = [d["g"], d["beta"], d["dt_bias"]] + ([] if A_log is None else [A_log])
    grads = torch.autograd.grad([gate, beta], inputs,
                                grad_outputs=[torch.from_numpy(ref["dg"]), torch.from_numpy(ref["dbeta"])])
    out.update(g=grads[0].numpy(), beta=grads[1].numpy(), dt_bias=grads[2].numpy())
    if A_log is not None:
        out["A_log"] = grads[3].numpy()
    return out


def _forward_oracle(x, kw, H, HV) -> dict:
    """o and the final state ([V, K], as state_v_first gives it) in float64, on the gate and beta
    activated in float64, q and k repeated per value head."""
    from kernel import activations
    from kernel.reference import kda_forward_reference

    G = HV // H
    A_log = None if kw.get("no_A_log") else x["A_log"].double()
    gate = activations.gate(x["g"].double(), A_log, x["dt_bias"].double(), kw.get("lower_bound"), dtype=torch.float64)
    beta = activations.beta(x["beta"].double(), kw.get("allow_neg_eigval", False), dtype=torch.float64)
    f64 = lambda t: t.double().numpy()   # noqa: E731
    rep = lambda t: t.repeat_interleave(G, dim=2)   # noqa: E731
    o, final, _ = kda_forward_reference(f64(rep(x["q"])), f64(rep(x["k"])), f64(x["v"]), gate.numpy(), beta.numpy(),
                                        initial_state=f64(x["h0"].transpose(-1, -2)),
                                        cu_seqlens=x["cu_seqlens"].numpy(), qk_l2norm=True)
    return {"o": o, "final_state": np.swapaxes(final, -1, -2)}


def _rel(a, ref: np.ndarray) -> float:
    a = a.detach().double().cpu().numpy()
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


LENGTHS = [1, 15, 16, 17, 65, 200]
CASES = [
    # id, H, HV, the call's gate settings
    ("layer-defaults", 2, 2, {}),
    ("layer-defaults-gva", 2, 4, {}),
    ("safe-gate-lower-bound", 2, 2, dict(safe_gate=True, lower_bound=-5.0)),
    ("lower-bound-no-A_log-neg-eigval-gva", 1, 3, dict(lower_bound=-5.0, no_A_log=True, allow_neg_eigval=True)),
]


def _compare(name: str, x: dict, kw: dict, H: int, HV: int, forward: str) -> None:
    """FLA's chunk_kda and ours on the layer's call, with ``forward``'s forward: o and the final state
    FLA's bits (FLA's forward) or against float64 (ours), every gradient against float64."""
    from fla.ops.kda import chunk_kda as fla_chunk_kda

    from kernel import chunk_kda, using_forward
    from kernel.fla_dropin import FallbackWarning

    o_fla, ht_fla, fla = _run(fla_chunk_kda, x, kw)
    with warnings.catch_warnings(), using_forward(forward):
        warnings.simplefilter("error", FallbackWarning)   # ours must run, whatever the gates
        o_ours, ht_ours, ours = _run(chunk_kda, x, kw)
    failed = []
    if forward == "fla":
        assert torch.equal(o_ours, o_fla) and torch.equal(ht_ours, ht_fla)
    else:
        fwd = _forward_oracle(x, kw, H, HV)
        print(f"\n[{name}, our forward] relative Frobenius error vs float64: output, ours, FLA's")
        for out, got, theirs in (("o", o_ours, o_fla), ("final_state", ht_ours, ht_fla)):
            assert got.dtype == theirs.dtype and got.shape == theirs.shape, out
            e_ours, e_fla = _rel(got, fwd[out]), _rel(theirs, fwd[out])
            print(f"  {out:12s} {e_ours:.3e} {e_fla:.3e}")
            if not e_ours <= TIMES_FLA * e_fla + ERROR_FLOOR:
                failed.append(f"{out}: ours {e_ours:.3e} > {TIMES_FLA} x FLA's {e_fla:.3e} + {ERROR_FLOOR}")
    ref = _oracle(x, kw, H, HV)
    print(f"\n[{name}, {forward}'s forward] relative Frobenius error vs float64: gradient, ours, FLA's")
    for p in ref:
        assert ours[p].dtype == fla[p].dtype and ours[p].shape == fla[p].shape, p
        e_ours, e_fla = _rel(ours[p], ref[p]), _rel(fla[p], ref[p])
        print(f"  d{p:8s} {e_ours:.3e} {e_fla:.3e}")
        if not e_ours <= TIMES_FLA * e_fla + ERROR_FLOOR:
            failed.append(f"d{p}: ours {e_ours:.3e} > {TIMES_FLA} x FLA's {e_fla:.3e} + {ERROR_FLOOR}")
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("forward", ["ours", "fla"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_layers_call_matches_flas_precision(case, forward):
    skip_without_fla_gpu()
    name, H, HV, kw = case
    _compare(name, _layer_inputs(lengths=LENGTHS, H=H, HV=HV, seed=11), kw, H, HV, forward)


TRAINED = dict(gate_scale=3.0, gate_shift=0.0)   # tiles down to 2^-350: past fp32, within float64's reference


def test_the_trained_gates_pass_the_tile_range_within_the_references():
    from kernel import activations
    from kernel.reference.kda import MAX_TILE_DECAY_LOG2
    from kernel.tools.trained_layer_gate import TILE_DECAY_FLOOR, tile_decays

    x = _layer_inputs(lengths=LENGTHS, H=2, HV=2, seed=5, **TRAINED)
    gate = activations.gate(x["g"].double(), x["A_log"].double(), x["dt_bias"].double(), None, dtype=torch.float64)
    tiles = tile_decays(gate, LENGTHS)
    past = tiles < TILE_DECAY_FLOOR
    assert past.any(-1).double().mean() > 0.5, "most (tile, head) pairs should take the pairwise path"
    assert tiles.min() > -MAX_TILE_DECAY_LOG2 * math.log(2.0), "the float64 reference would refuse these gates"


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("forward", ["ours", "fla"])
def test_gates_past_the_tile_range_run_ours_at_flas_precision(forward):
    skip_without_fla_gpu()
    _compare("trained gates", _layer_inputs(lengths=LENGTHS, H=2, HV=2, seed=5, **TRAINED), {}, 2, 2, forward)
