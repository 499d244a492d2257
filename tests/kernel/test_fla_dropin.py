"""kernel.chunk_kda: FLA's chunk_kda signature, its refusals (CPU), and its gradients (GPU).

CPU: the signature is fla-core 0.6.0's, argument for argument; every argument it
does not cover is refused by name before the GPU is touched; every covered call
gets past the checks; ``import kernel`` stays free of torch.

GPU (``-m gpu``; needs torch CUDA, fla-core 0.6.0, CuPy and kernel.kda_backward),
under each forward setting (kernel.using_forward): with FLA's forward o and the final
state are FLA's to the bit; with ours, their relative Frobenius error against the
float64 forward reference is no worse than 2x FLA's own plus a small floor. Either
way every gradient (q, k, v, g, beta, initial_state) of L = sum(o * do) +
sum(S_T * dht) has a relative Frobenius error against the float64 reference no worse
than 2x FLA's own on the same inputs plus a small floor.
"""
from __future__ import annotations

import inspect
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernel.kda_backward import GRADIENTS

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

from .fla_requirements import skip_without_fla_gpu  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# fla-core 0.6.0's fla.ops.kda.chunk_kda, read from its source: (name, default), in order
FLA_PARAMETERS = (
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
    ("g", inspect.Parameter.empty), ("beta", inspect.Parameter.empty),
    ("scale", None), ("initial_state", None), ("output_final_state", False),
    ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False), ("use_beta_sigmoid_in_kernel", False),
    ("allow_neg_eigval", False), ("safe_gate", False), ("lower_bound", None), ("disable_recompute", False),
    ("return_intermediate_states", False), ("state_v_first", False), ("cu_seqlens", None),
    ("cu_seqlens_cpu", None), ("cp_context", None), ("use_graph", False), ("max_num_seqs", None),
)
K = V = 128


def _chunk_kda():
    from kernel import chunk_kda

    return chunk_kda


def _cpu_inputs(B=1, T=8, H=2, Kd=K, Vd=V, HV=None, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    HV = HV or H
    q = torch.randn(B, T, H, Kd, generator=gen).to(dtype)
    k = torch.randn(B, T, H, Kd, generator=gen).to(dtype)
    v = torch.randn(B, T, HV, Vd, generator=gen).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, Kd, generator=gen)).clamp(min=-5)
    beta = torch.rand(B, T, HV, generator=gen)
    return q, k, v, g, beta


# ----------------------------------------------------------------------------
# CPU: the signature and the import
# ----------------------------------------------------------------------------

def test_the_signature_is_flas():
    params = list(inspect.signature(_chunk_kda()).parameters.values())
    assert [(p.name, p.default) for p in params[:-1]] == list(FLA_PARAMETERS)
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD      # A_log, dt_bias, chunk_size, ...


def test_the_signature_is_that_of_the_installed_fla():
    pytest.importorskip("triton", reason="fla-core needs triton")
    fla_kda = pytest.importorskip("fla.ops.kda", reason="fla-core is not installed")
    theirs = inspect.signature(inspect.unwrap(fla_kda.chunk_kda)).parameters
    ours = inspect.signature(_chunk_kda()).parameters
    assert [(p.name, p.kind, p.default) for p in theirs.values()] == \
           [(p.name, p.kind, p.default) for p in ours.values()]
    assert [(n, d) for n, d in ((p.name, p.default) for p in theirs.values()) if n != "kwargs"] == \
           list(FLA_PARAMETERS)


def test_import_kernel_needs_no_torch_and_chunk_kda_is_one_object_in_any_order():
    code = ("import sys, inspect\n"
            "import kernel\n"
            "assert 'torch' not in sys.modules, 'import kernel loaded torch'\n"
            "{first}\n"
            "from kernel import chunk_kda\n"
            "from kernel.fla_dropin import chunk_kda as function\n"
            "assert chunk_kda is function is kernel.chunk_kda and callable(chunk_kda)\n"
            "assert list(inspect.signature(chunk_kda).parameters)[:5] == ['q', 'k', 'v', 'g', 'beta']\n"
            "print('ok')\n")
    for first in ("pass", "import kernel.fla_dropin", "from kernel.fla_dropin import library"):
        proc = subprocess.run([sys.executable, "-c", code.format(first=first)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", (first, proc.stderr)


# ----------------------------------------------------------------------------
# CPU: the refusals, each by name
# ----------------------------------------------------------------------------

REFUSED_ARGUMENTS = [
    ("return_intermediate_states", True),
    ("cp_context", object()),
    ("use_graph", True),
    ("max_num_seqs", 4),
    ("chunk_size", 32),
]


@pytest.mark.parametrize("name, value", REFUSED_ARGUMENTS, ids=[n for n, _ in REFUSED_ARGUMENTS])
def test_an_argument_not_covered_is_refused_by_name(name, value):
    q, k, v, g, beta = _cpu_inputs()
    with pytest.raises(ValueError, match=rf"does not cover {name}=.*; \w+"):
        _chunk_kda()(q, k, v, g, beta, **{name: value})


@pytest.mark.parametrize("shape, match", [
    (dict(Kd=64), r"q\.shape\[-1\] \(the key head dim\)=64"),
    (dict(Vd=256), r"v\.shape\[-1\] \(the value head dim\)=256"),
    (dict(HV=3), r"v\.shape\[2\]: the value heads \(3\) must be a multiple of q's heads \(2\)"),
    (dict(HV=1), r"v\.shape\[2\]: the value heads \(1\) must be a multiple of q's heads \(2\)"),
], ids=["key-head-dim", "value-head-dim", "value-heads-not-a-multiple", "fewer-value-heads"])
def test_a_shape_not_covered_is_refused_by_name(shape, match):
    q, k, v, g, beta = _cpu_inputs(**shape)
    with pytest.raises(ValueError, match=match):
        _chunk_kda()(q, k, v, g, beta)


LAYER_RULES = [   # FLA's own rules for what its layer passes: (the call's extra arguments, error, message)
    (dict(allow_neg_eigval=True), ValueError, r"allow_neg_eigval=True needs use_beta_sigmoid_in_kernel=True"),
    (dict(use_gate_in_kernel=True), ValueError, r"A_log: it must be given with use_gate_in_kernel=True unless "
                                                r"lower_bound is set"),
    (dict(use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2)), ValueError,
     r"lower_bound: it must be set with safe_gate=True and use_gate_in_kernel=True"),
    (dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0), ValueError,
     r"lower_bound must be in FLA's safe range \[-5, 0\)"),
    (dict(use_gate_in_kernel=True, A_log=torch.zeros(3)), ValueError, r"A_log: expected 2 floating values"),
    (dict(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2, 64)), ValueError,
     r"dt_bias: expected 256 floating values"),
    (dict(use_gate_in_kernel=True, A_log=[0.0, 0.0]), TypeError, r"A_log must be a torch tensor or None"),
    (dict(lower_bound="x"), TypeError, r"lower_bound must be a real number or None, got 'x'"),
    (dict(lower_bound=0.5), ValueError, r"lower_bound must be finite and < 0"),
    (dict(lower_bound=math.nan), ValueError, r"lower_bound must be finite and < 0"),
    (dict(state_v_first=True, transpose_state_layout=True), ValueError, r"state_v_first and the deprecated "
                                                                          r"transpose_state_layout are both given"),
    (dict(state_v_first="yes"), TypeError, r"state_v_first must be True or False, got 'yes'"),
    (dict(use_gate_in_kernel=1), TypeError, r"use_gate_in_kernel must be True or False, got 1"),
]


def test_a_float16_beta_is_refused_unless_the_op_applies_its_sigmoid():
    q, k, v, g, beta = _cpu_inputs()
    with pytest.raises(ValueError, match=r"does not cover beta\.dtype=torch\.float16; cast beta to torch\.float32"):
        _chunk_kda()(q, k, v, g, beta.half())
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
        _chunk_kda()(q, k, v, g, beta.half(), use_beta_sigmoid_in_kernel=True)


@pytest.mark.parametrize("extra, error, match", LAYER_RULES, ids=[str(sorted(e)) for e, _, _ in LAYER_RULES])
def test_flas_rules_for_the_layers_arguments_name_the_argument(extra, error, match):
    with pytest.raises(error, match=match):
        _chunk_kda()(*_cpu_inputs(), **extra)


def test_transpose_state_layout_is_state_v_first_with_flas_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="renamed to state_v_first"):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            _chunk_kda()(*_cpu_inputs(), transpose_state_layout=True)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_q_k_v_must_be_bf16(name):
    q, k, v, g, beta = _cpu_inputs()
    args = dict(q=q, k=k, v=v)
    args[name] = args[name].float()
    with pytest.raises(ValueError, match=rf"does not cover {name}\.dtype=torch\.float32; cast {name} to "
                                         r"torch\.bfloat16"):
        _chunk_kda()(g=g, beta=beta, **args)


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match=r"does not know: \['use_gate'\]"):
        _chunk_kda()(*_cpu_inputs(), use_gate=True)


BAD_CALLS = [   # (what the call passes, the error type, what the message must say)
    (dict(scale=0.0), ValueError, r"scale must be finite and > 0"),
    (dict(scale=-1.0), ValueError, r"scale must be finite and > 0"),
    (dict(scale=math.nan), ValueError, r"scale must be finite and > 0"),
    (dict(scale=math.inf), ValueError, r"scale must be finite and > 0"),
    (dict(scale="abc"), TypeError, r"scale must be a real number or None, got 'abc'"),
    (dict(output_final_state="yes"), TypeError, r"output_final_state must be True or False, got 'yes'"),
    (dict(use_qk_l2norm_in_kernel=1), TypeError, r"use_qk_l2norm_in_kernel must be True or False, got 1"),
    (dict(safe_gate=None), TypeError, r"safe_gate must be True or False, got None"),
    (dict(cu_seqlens=[0, 4, 8]), TypeError, r"cu_seqlens must be a torch tensor .* got builtins\.list"),
    (dict(cu_seqlens=torch.tensor([0, 6, 4, 8])), ValueError, r"cu_seqlens must be strictly increasing"),
    (dict(cu_seqlens=torch.tensor([1, 4, 8])), ValueError, r"cu_seqlens must start at 0, got 1"),
    (dict(cu_seqlens=torch.tensor([0, 4, 7])), ValueError, r"cu_seqlens must end at the total length 8, got 7"),
    (dict(cu_seqlens=torch.tensor([0, 4, 8]), cu_seqlens_cpu=torch.tensor([0, 4, 9])), ValueError,
     r"cu_seqlens must end at the total length 8, got 9"),
]


@pytest.mark.parametrize("extra, error, match", BAD_CALLS, ids=[str(list(e.items())[-1]) for e, _, _ in BAD_CALLS])
def test_a_bad_argument_is_refused_by_name_before_the_gpu(extra, error, match):
    with pytest.raises(error, match=match):
        _chunk_kda()(*_cpu_inputs(), **extra)


def test_an_empty_sequence_axis_is_refused():
    with pytest.raises(ValueError, match=r"q must have B, T, H >= 1 .* got shape \(1, 0, 2, 128\)"):
        _chunk_kda()(*_cpu_inputs(T=0))


def test_a_numpy_q_is_named_as_such():
    q, k, v, g, beta = _cpu_inputs()
    with pytest.raises(TypeError, match=r"q must be a torch tensor, got numpy\.ndarray"):
        _chunk_kda()(q.float().numpy(), k, v, g, beta)


@pytest.mark.parametrize("low", [-5.0, -5.46, -20.0, -1e6])
def test_no_gate_is_refused(low):
    # a tile whose gates pass fp32's range for the factorised products takes Kernel B's pairwise path,
    # decided on the device: no value of the gate is refused or checked on the host
    q, k, v, g, beta = _cpu_inputs()
    g[0, 3, 1, 7] = low
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
        _chunk_kda()(q, k, v, g, beta)


@pytest.mark.parametrize("case, match", [
    ("g-shape", r"g: expected \[B, T, HV, K\]"),
    ("beta-shape", r"beta: expected \[B, T, HV\]"),
    ("qk-shape", r"q and k must have the same shape"),
    ("varlen-batch", r"cu_seqlens: the batch size must be 1"),
    ("h0-count", r"initial_state: expected \[N, HV, K, V\] = \[3, 2, 128, 128\]"),
    ("h0-dtype", r"initial_state: expected torch\.float32"),
])
def test_inconsistent_inputs_name_the_argument(case, match):
    q, k, v, g, beta = _cpu_inputs(B=1, T=8)
    kw = {}
    if case == "g-shape":
        g = g[..., :64]
    elif case == "beta-shape":
        beta = beta[:, :4]
    elif case == "qk-shape":
        k = k[:, :4]
    elif case == "varlen-batch":
        q, k, v, g, beta = _cpu_inputs(B=2, T=8)
        kw["cu_seqlens"] = torch.tensor([0, 8, 16])
    elif case == "h0-count":
        kw["cu_seqlens"] = torch.tensor([0, 2, 5, 8])
        kw["initial_state"] = torch.zeros(1, 2, K, V)
    elif case == "h0-dtype":
        kw["initial_state"] = torch.zeros(1, 2, K, V, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        _chunk_kda()(q, k, v, g, beta, **kw)



def test_the_offsets_are_read_once_per_tensor_until_it_is_written(offsets_reads):
    # reading a device tensor's values is a host sync: a model's layers share one offsets tensor a
    # batch, so its values are read once, and again only after an in-place write
    reads = offsets_reads
    q, k, v, g, beta = _cpu_inputs(B=1, T=8)
    cu = torch.tensor([0, 2, 5, 8])
    for _ in range(3):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            _chunk_kda()(q, k, v, g, beta, cu_seqlens=cu)
    assert len(reads) == 1
    cu[1] = 6   # an in-place write: read again, and refused on its new values
    with pytest.raises(ValueError, match=r"cu_seqlens must be strictly increasing"):
        _chunk_kda()(q, k, v, g, beta, cu_seqlens=cu)
    assert len(reads) == 2
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):   # equal values, another tensor
        _chunk_kda()(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 2, 5, 8]))
    assert len(reads) == 3
    q2, k2, v2, g2, beta2 = _cpu_inputs(B=1, T=9)   # the kept copy is still checked against each call
    with pytest.raises(ValueError, match=r"cu_seqlens must end at the total length 9, got 8"):
        _chunk_kda()(q2, k2, v2, g2, beta2, cu_seqlens=torch.tensor([0, 2, 5, 8]))


def test_every_covered_call_gets_past_the_checks():
    # FLA's defaults passed explicitly (as code written for FLA may), the covered options on:
    # the only complaint left is that CPU tensors cannot run FLA's forward
    q, k, v, g, beta = _cpu_inputs(B=1, T=8)
    defaults = {name: d for name, d in FLA_PARAMETERS if d is not inspect.Parameter.empty}
    covered = dict(defaults, scale=0.1, initial_state=torch.zeros(3, 2, K, V), output_final_state=True,
                   use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5.0, disable_recompute=True,
                   cu_seqlens=torch.tensor([0, 2, 5, 8]), cu_seqlens_cpu=torch.tensor([0, 2, 5, 8]),
                   chunk_size=64, A_log=None, dt_bias=None)
    for kw in (defaults, covered):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            _chunk_kda()(q, k, v, g, beta, **kw)
    # FLA's layer: the gate and beta activations in the op, state_v_first, with and without GVA
    for HV in (2, 4):
        q, k, v, g, beta = _cpu_inputs(B=1, T=8, HV=HV)
        layer = dict(A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * K), initial_state=torch.zeros(1, HV, V, K),
                     output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                     use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True)
        for extra in ({}, dict(safe_gate=True, lower_bound=-5.0), dict(lower_bound=-3.0, A_log=None)):
            with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
                _chunk_kda()(q, k, v, g, beta, **dict(layer, **extra))


# ----------------------------------------------------------------------------
# GPU: the gradients against FLA's and float64
# ----------------------------------------------------------------------------

TIMES_FLA = 2.0        # our error may be at most this multiple of FLA's own ...
ERROR_FLOOR = 1e-3     # ... plus this (bf16 rounding of a gradient alone is ~1e-3 relative)


def _unit_inputs(lengths, B, T, H, seed):
    """q, k, v, do ~ N(0, 1), g = logsigmoid(N(0, 1)) clamped to [-5, 0], beta ~ U(0, 1),
    h0 ~ 0.1 N(0, 1), dht ~ 0.1 N(0, 1); rounded as the layer gets them."""
    gen = torch.Generator().manual_seed(seed)
    if lengths is not None:
        B, T = 1, sum(lengths)
    N = B if lengths is None else len(lengths)
    n = lambda *s: torch.randn(*s, generator=gen)
    x = {"q": n(B, T, H, K).bfloat16(), "k": n(B, T, H, K).bfloat16(), "v": n(B, T, H, V).bfloat16(),
         "g": torch.nn.functional.logsigmoid(n(B, T, H, K)).clamp(-5.0, 0.0),
         "beta": torch.rand(B, T, H, generator=gen).bfloat16(), "h0": 0.1 * n(N, H, K, V),
         "do": n(B, T, H, V).bfloat16(), "dht": 0.1 * n(N, H, K, V)}
    x["cu_seqlens"] = None if lengths is None else torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
    return x


def _run(fn, x, *, with_state: bool, **kw):
    dev = "cuda"
    leaves = {n: x[n].to(dev).requires_grad_() for n in ("q", "k", "v", "g", "beta")}
    h0 = x["h0"].to(dev).requires_grad_() if with_state else None
    cu = None if x["cu_seqlens"] is None else x["cu_seqlens"].to(dev)
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], initial_state=h0,
               output_final_state=with_state, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **kw)
    loss = (o.float() * x["do"].to(dev).float()).sum()
    if with_state:
        loss = loss + (ht * x["dht"].to(dev)).sum()
    loss.backward()
    grads = {"d" + n: t.grad for n, t in leaves.items()}
    if with_state:
        grads["dh0"] = h0.grad
    return o.detach(), (None if ht is None else ht.detach()), grads


def _reference(x, *, with_state: bool) -> dict:
    from kernel.reference import kda_backward_reference

    f64 = lambda t: t.double().numpy()
    return kda_backward_reference(f64(x["q"]), f64(x["k"]), f64(x["v"]), f64(x["g"]), f64(x["beta"]),
                                  f64(x["do"]), initial_state=f64(x["h0"]) if with_state else None,
                                  dht=f64(x["dht"]) if with_state else None,
                                  cu_seqlens=None if x["cu_seqlens"] is None else x["cu_seqlens"].numpy(),
                                  qk_l2norm=True)


def _forward_reference(x, *, with_state: bool) -> dict:
    """o and the final state in float64 (kernel.reference.kda_forward_reference, the l2norm in it)."""
    from kernel.reference import kda_forward_reference

    f64 = lambda t: t.double().numpy()   # noqa: E731
    o, final, _ = kda_forward_reference(f64(x["q"]), f64(x["k"]), f64(x["v"]), f64(x["g"]), f64(x["beta"]),
                                        initial_state=f64(x["h0"]) if with_state else None,
                                        cu_seqlens=None if x["cu_seqlens"] is None else x["cu_seqlens"].numpy(),
                                        qk_l2norm=True)
    return {"o": o, "final_state": final}


def _rel(a, ref: np.ndarray) -> float:
    a = a.detach().double().cpu().numpy()
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


CASES = [
    # id, lengths (None: equal length B x T), B, T, safe_gate, disable_recompute, with initial/final state
    ("2x200-safe", None, 2, 200, True, False, True),
    ("2x200-unsafe", None, 2, 200, False, False, True),
    ("varlen-safe", [1, 15, 16, 17, 65, 200], None, None, True, False, True),
    ("varlen-unsafe", [1, 15, 16, 17, 65, 200], None, None, False, False, True),
    ("varlen-safe-kept-states", [1, 15, 16, 17, 65, 200], None, None, True, True, True),
    ("1x130-no-state", None, 1, 130, True, False, False),
]


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("forward", ["ours", "fla"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_flas_precision(case, forward):
    skip_without_fla_gpu()
    from fla.ops.kda import chunk_kda as fla_chunk_kda

    from kernel import using_forward

    name, lengths, B, T, safe_gate, disable_recompute, with_state = case
    x = _unit_inputs(lengths, B, T, H=2, seed=7)
    kw = dict(safe_gate=safe_gate, lower_bound=-5.0 if safe_gate else None, disable_recompute=disable_recompute)
    o_fla, ht_fla, fla = _run(fla_chunk_kda, x, with_state=with_state, **kw)
    with using_forward(forward):
        o_ours, ht_ours, ours = _run(_chunk_kda(), x, with_state=with_state, **kw)
    ref = _reference(x, with_state=with_state)

    failed = []
    if forward == "fla":   # the same forward kernels on the same inputs
        assert torch.equal(o_ours, o_fla)
        assert (ht_ours is None and ht_fla is None) or torch.equal(ht_ours, ht_fla)
    else:
        fwd = _forward_reference(x, with_state=with_state)
        print(f"\n[{name}, our forward] relative Frobenius error vs float64: output, ours, FLA's")
        for out, got, theirs in (("o", o_ours, o_fla), ("final_state", ht_ours, ht_fla)):
            if theirs is None:
                assert got is None, out
                continue
            assert got.dtype == theirs.dtype and got.shape == theirs.shape, out
            e_ours, e_fla = _rel(got, fwd[out]), _rel(theirs, fwd[out])
            print(f"  {out:12s} {e_ours:.3e} {e_fla:.3e}")
            if not e_ours <= TIMES_FLA * e_fla + ERROR_FLOOR:
                failed.append(f"{out}: ours {e_ours:.3e} > {TIMES_FLA} x FLA's {e_fla:.3e} + {ERROR_FLOOR}")

    print(f"\n[{name}, {forward}'s forward] relative Frobenius error vs float64: gradient, ours, FLA's, ours vs FLA's")
    for grad in (g for g in GRADIENTS if g in ref and (with_state or g != "dh0")):
        assert ours[grad].dtype == fla[grad].dtype and ours[grad].shape == fla[grad].shape, grad
        e_ours, e_fla = _rel(ours[grad], ref[grad]), _rel(fla[grad], ref[grad])
        between = _rel(ours[grad], fla[grad].double().cpu().numpy())
        print(f"  {grad:6s} {e_ours:.3e} {e_fla:.3e} {between:.3e}")
        if not e_ours <= TIMES_FLA * e_fla + ERROR_FLOOR:
            failed.append(f"{grad}: ours {e_ours:.3e} > {TIMES_FLA} x FLA's {e_fla:.3e} + {ERROR_FLOOR}")
    assert not failed, failed
