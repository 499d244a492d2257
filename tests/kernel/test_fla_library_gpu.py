"""kernel.chunk_kda through torch.library on the GPU (``-m gpu``; torch CUDA, fla-core 0.6.0, CuPy).

The opcheck, fullgraph and CUDA-graph tests run under each forward setting (our forward and FLA's,
the ops' ``forward`` argument); the gate tests under the default.

* ``torch.library.opcheck`` of both ops on CUDA tensors: the schema (no output aliases an input,
  nothing is mutated), the autograd registration (forward op) and the fakes against the real ops'
  outputs. Not its AOT-dispatch check, which compares every output bit, the partly unwritten Aqk
  and Akk included (FLA's below the diagonal, ours only the diagonal blocks); the compiled-model
  tests stand for it.
* A model calling chunk_kda compiled with ``torch.compile(fullgraph=True)`` (aot_eager and
  inductor) gives eager's o, final state and every gradient, bit for bit: the op's kernels are the
  same and the model around it rounds nothing differently.
* A call whose gate is frozen (no gradient asked for g, A_log, dt_bias) skips the gate's
  activation backward and gives the other gradients of the full call, bit for bit.
* The gate activation's backward in Kernel B's epilogue (softplus and sigmoid forms, without A_log
  or dt_bias too, uniform and varlen): dg_raw, dA_log and ddt_bias equal, within rounding, FLA's
  kda_gate_bwd on our plain dg (the previous path) and the float64 autograd of kernel.activations.gate,
  and two calls give the same bits.
* A training step (forward, backward, SGD step) of a small KDA layer with the gate activated in
  the op, ``safe_gate=True, lower_bound=-5`` and a uniform batch is captured in a CUDA graph (after
  a warm-up on a side stream, as torch's documentation asks) and replayed on new data: every
  replay's loss and every parameter after it equal eager's steps on the same data, bit for bit. A
  host sync anywhere in the step would fail the capture.
* A varlen call reads its offsets from the device once per offsets tensor: a second call with the
  same tensor, forward and backward, eager or compiled, makes no host sync that torch's sync debug
  mode sees.
* Inference mode (a call no gradient can be asked of: under ``torch.no_grad``, under
  ``torch.inference_mode``, or with no input requiring grad): the op's forward runs with
  ``training=False`` and gives the training call's o and final state, bit for bit; with our forward
  its peak memory (``torch.cuda.max_memory_allocated``) is below the training call's by at least the
  states' size; compiled with ``torch.compile(fullgraph=True)`` (aot_eager and inductor) it gives
  eager's o and final state, bit for bit; the layer's no-grad forward captured in a CUDA graph
  replays as eager's; and the patched FLA op runs ours for a no-grad call (never FLA's own), o and
  the final state kernel.chunk_kda's (with FLA's forward, FLA's own to the bit).
"""
from __future__ import annotations

import contextlib
import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

from .fla_requirements import skip_without_fla_gpu  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.fla]

K = V = 128
GRADIENT_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def _inputs(*, B=2, T=200, H=2, HV=2, lengths=None, layer=False, seed=0, grad=True) -> dict:
    """CUDA leaves of one call: unit-recipe q, k, v; the gate as the layer passes it raw (``layer``)
    or logsigmoid clamped to [-5, 0]; beta raw logits (``layer``) or U(0, 1); h0 ~ 0.1 N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    if lengths is not None:
        B, T = 1, sum(lengths)
    N = B if lengths is None else len(lengths)
    n = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
    x = {"q": n(B, T, H, K).bfloat16(), "k": n(B, T, H, K).bfloat16(), "v": n(B, T, HV, V).bfloat16(),
         "initial_state": 0.1 * n(N, HV, K, V)}
    if layer:
        x["g"], x["beta"] = n(B, T, HV, K).bfloat16(), n(B, T, HV).bfloat16()
        x["A_log"] = torch.log(torch.empty(HV).uniform_(1, 16, generator=gen))
        dt = torch.exp(torch.empty(HV * K).uniform_(np.log(1e-3), np.log(1e-1), generator=gen))
        x["dt_bias"] = dt + torch.log(-torch.expm1(-dt))
    else:
        x["g"] = torch.nn.functional.logsigmoid(n(B, T, HV, K)).clamp(-5.0, 0.0)
        x["beta"] = torch.rand(B, T, HV, generator=gen)
        x["A_log"] = x["dt_bias"] = None
    x = {name: (None if t is None else t.cuda().requires_grad_(grad)) for name, t in x.items()}
    cu = None if lengths is None else torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    x["cu_seqlens"], x["cu_seqlens_cpu"] = (None, None) if cu is None else (cu.cuda(), cu)
    return x


LAYER = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True, lower_bound=-5.0, state_v_first=True, output_final_state=True)
PLAIN = dict(use_qk_l2norm_in_kernel=True, output_final_state=True, safe_gate=True, lower_bound=-5.0)

CASES = [   # (id, inputs, chunk_kda's settings)
    ("uniform", dict(), PLAIN),
    ("uniform-unbounded-gate", dict(), dict(PLAIN, safe_gate=False, lower_bound=None)),
    ("layer-gva", dict(HV=4, layer=True), LAYER),
    ("varlen", dict(lengths=[1, 63, 64, 65, 130]), PLAIN),
    ("varlen-kept-states", dict(lengths=[1, 63, 64, 65, 130]), dict(PLAIN, disable_recompute=True)),
    ("varlen-layer-gva", dict(lengths=[17, 200], HV=4, layer=True), LAYER),
]


FORWARDS = ("ours", "fla")


def _settings(call: dict, forward: str) -> dict:
    base = dict(scale=K ** -0.5, output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False, lower_bound=None,
                disable_recompute=False, state_v_first=False, forward=forward, training=True, raw_qk_rows=True)
    return dict(base, **call)


def _op_arguments(x: dict, call: dict, forward: str) -> tuple:
    from kernel.fla_dropin import library

    tensors = dict(x, offsets=x["cu_seqlens_cpu"])
    settings = _settings(call, forward)
    return (*(tensors[name] for name in library.TENSOR_ARGUMENTS), *(settings[name] for name in library.SETTINGS))


# ----------------------------------------------------------------------------
# opcheck on CUDA tensors
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck_of_the_forward_op(case, forward):
    skip_without_fla_gpu()
    _, sizes, call = case
    x = _inputs(**sizes)
    arguments = _op_arguments(x, call, forward)   # first: its import of the library registers the ops
    # Not opcheck's AOT-dispatch check: it compares every output of eager and traced runs, and the
    # forward returns Aqk and Akk partly written (FLA's below the diagonal, ours only the 16 x 16
    # diagonal blocks: all the backward reads), the rest whatever memory held. The fullgraph tests
    # below compare what the outputs mean (o, the final state, every gradient) bit for bit.
    result = torch.library.opcheck(torch.ops.ptx_lab.chunk_kda_fwd.default, arguments,
                                   test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck_of_the_backward_op(case, forward):
    skip_without_fla_gpu()
    from kernel.fla_dropin import library
    from kernel.fla_dropin.function import FORWARD_OUTPUTS

    _, sizes, call = case
    x = _inputs(grad=False, **sizes)
    settings = _settings(call, forward)
    out = dict(zip(FORWARD_OUTPUTS, torch.ops.ptx_lab.chunk_kda_fwd(*_op_arguments(x, call, forward))))
    present = lambda name: out[name] if out[name].numel() else None   # noqa: E731
    gate_in = settings["use_gate_in_kernel"]
    # q and k as _setup_context keeps them: the normalised copies where the forward made them, else the call's own
    saved = dict(x, offsets=x["cu_seqlens_cpu"], q=present("q") if out["q"].numel() else x["q"],
                 k=present("k") if out["k"].numel() else x["k"],
                 q_rstd=present("q_rstd"), k_rstd=present("k_rstd"), g_cumsum=present("g_cumsum"),
                 g_raw=x["g"] if gate_in or forward == "ours" else None, beta_activated=present("beta"),
                 Aqk=out["Aqk"], Akk=out["Akk"],
                 h=present("h"))
    gen = torch.Generator(device="cuda").manual_seed(1)
    do = torch.randn(out["o"].shape, generator=gen, device="cuda").to(out["o"].dtype)
    dht = torch.randn(out["final_state"].shape, generator=gen, device="cuda") if settings["output_final_state"] \
        else None
    need = [x[name] is not None for name in GRADIENT_INPUTS]
    arguments = (do, dht, *(saved[name] for name in library.SAVED), x["g"].dtype, need,
                 *(settings[name] for name in library.SETTINGS))
    result = torch.library.opcheck(torch.ops.ptx_lab.chunk_kda_bwd.default, arguments,
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


# ----------------------------------------------------------------------------
# torch.compile(fullgraph=True) against eager
# ----------------------------------------------------------------------------

def _model(**call):
    from kernel import chunk_kda

    def model(x: dict, w_o, w_ht):
        o, ht = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                          initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"],
                          cu_seqlens_cpu=x["cu_seqlens_cpu"], **call)
        return o, ht, (o.float() * w_o).sum() + (ht * w_ht).sum()

    return model


def _run(fn, x: dict, w_o, w_ht) -> dict:
    o, ht, loss = fn(x, w_o, w_ht)
    loss.backward()
    out = {"o": o.detach(), "final_state": ht.detach()}
    out.update({"d" + name: x[name].grad for name in GRADIENT_INPUTS if x[name] is not None})
    return out


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fullgraph_compiled_model_equals_eager(case, backend, forward):
    skip_without_fla_gpu()
    from kernel import using_forward

    _, sizes, call = case
    x_eager, x_compiled = _inputs(seed=3, **sizes), _inputs(seed=3, **sizes)
    gen = torch.Generator(device="cuda").manual_seed(5)
    w_o = torch.randn(x_eager["v"].shape, generator=gen, device="cuda").bfloat16().float()
    w_ht = 0.1 * torch.randn(x_eager["initial_state"].shape, generator=gen, device="cuda")
    with using_forward(forward):
        eager = _run(_model(**call), x_eager, w_o, w_ht)
        torch._dynamo.reset()
        compiled = _run(torch.compile(_model(**call), backend=backend, fullgraph=True), x_compiled, w_o, w_ht)
    assert set(compiled) == set(eager)
    for name, want in eager.items():
        got = compiled[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), f"{name}: max |diff| {(got.float() - want.float()).abs().max().item():.3e}"


def test_a_gradient_nobody_asked_for_is_not_computed(monkeypatch):
    # the layer's settings with the gate frozen (g, A_log, dt_bias without requires_grad): the gate's
    # activation backward (Kernel B's gate build, for the bf16 raw gate) is skipped, and the other
    # gradients are the full call's
    skip_without_fla_gpu()
    from kernel import chunk_kda, kda_backward

    real_run = kda_backward.run
    gate_passes = []

    def counting_run(*args, gate=None, **kw):
        gate_passes.append(gate is not None)
        return real_run(*args, gate=gate, **kw)

    monkeypatch.setattr(kda_backward, "run", counting_run)
    settings = dict(LAYER, output_final_state=False)
    grads = {}
    for frozen in (False, True):
        x = _inputs(B=1, T=130, H=2, HV=2, layer=True, seed=11)
        if frozen:
            for name in ("g", "A_log", "dt_bias"):
                x[name].requires_grad_(False)
        o, _ = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                         initial_state=x["initial_state"], **settings)
        o.float().square().sum().backward()
        grads[frozen] = {n: x[n].grad for n in GRADIENT_INPUTS}
    assert gate_passes == [True, False], "the gate's backward ran for the frozen gate (or not for the full call)"
    assert all(grads[True][n] is None for n in ("g", "A_log", "dt_bias"))
    for name in ("q", "k", "v", "beta", "initial_state"):
        assert torch.equal(grads[True][name], grads[False][name]), name


# ----------------------------------------------------------------------------
# the gate activation's backward in Kernel B's epilogue
# ----------------------------------------------------------------------------

GATE_FORMS = {   # (inputs' edits, chunk_kda's settings)
    "softplus": (dict(), dict(LAYER, safe_gate=False, lower_bound=None)),
    "sigmoid": (dict(), LAYER),
    "sigmoid-no-A_log": (dict(A_log=None), LAYER),
    "softplus-no-dt_bias": (dict(dt_bias=None), dict(LAYER, safe_gate=False, lower_bound=None)),
}


def _gate_grads(x: dict, settings: dict) -> dict:
    from kernel import chunk_kda

    for name in ("g", "A_log", "dt_bias"):
        if x[name] is not None:
            x[name].grad = None
    o, _ = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                     initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], **settings)
    gen = torch.Generator(device="cuda").manual_seed(9)
    (o.float() * torch.randn(o.shape, generator=gen, device="cuda")).sum().backward()
    return {name: None if x[name] is None else x[name].grad.clone() for name in ("g", "A_log", "dt_bias")}


@pytest.mark.parametrize("run_chunks", [None, 2], ids=["auto-runs", "runs-of-2"])
@pytest.mark.parametrize("lengths", [None, [17, 64, 200]], ids=["uniform", "varlen"])
@pytest.mark.parametrize("form", list(GATE_FORMS))
def test_the_gate_epilogue_gives_fla_s_gate_backward_on_our_dg_and_the_float64_one(monkeypatch, form, lengths,
                                                                                  run_chunks):
    """``run_chunks`` 2: Kernel B's CTAs each walk two chunks, so each partial-sum row of dA_log and ddt_bias
    holds a run's tokens."""
    skip_without_fla_gpu()
    from kernel import kda_backward
    from kernel.activations import gate
    from kernel.fla_dropin import function

    if run_chunks is not None:
        from .test_kda_backward_gpu import force_runs

        force_runs(monkeypatch, run_chunks)

    edits, call = GATE_FORMS[form]
    settings = dict(call, output_final_state=False)
    x = _inputs(B=2, T=200, H=2, HV=4, lengths=lengths, layer=True, seed=21)
    x.update({name: v for name, v in edits.items()})
    ours = _gate_grads(x, settings)
    again = _gate_grads(x, settings)
    for name, got in ours.items():   # two calls: the same bits (no atomics anywhere)
        assert (got is None) == (again[name] is None) and (got is None or torch.equal(got, again[name])), name

    # the previous path: Kernel B's plain dg, then FLA's kda_gate_bwd (one pass of its own); dg kept
    real_run, dgs = kda_backward.run, []

    def plain_run(*args, gate=None, **kw):
        grads = real_run(*args, **kw)
        dgs.append(grads["dg"].clone())
        if gate is None:
            return grads
        dg_raw, dA, ddt = function._fla()["gate_bwd"](g=gate.g_raw, A_log=gate.A_log, dt_bias=gate.dt_bias,
                                                      dyg=grads["dg"], lower_bound=gate.lower_bound)
        return {**grads, "dg_raw": dg_raw, "dA_log": dA, "ddt_bias": ddt}

    monkeypatch.setattr(kda_backward, "run", plain_run)
    previous = _gate_grads(x, settings)
    # float64: autograd of kernel.activations.gate on our dg
    g64 = x["g"].detach().double().requires_grad_(True)
    a64 = None if x["A_log"] is None else x["A_log"].detach().double().requires_grad_(True)
    b64 = None if x["dt_bias"] is None else x["dt_bias"].detach().double().requires_grad_(True)
    y = gate(g64, a64, b64, settings["lower_bound"], dtype=torch.float64)
    y.backward(dgs[0].double().view(y.shape))
    exact = {"g": g64.grad, "A_log": None if a64 is None else a64.grad, "dt_bias": None if b64 is None else b64.grad}
    for name, got in ours.items():
        if exact[name] is None:
            assert got is None and previous[name] is None, name
            continue
        assert got.dtype == previous[name].dtype and got.shape == previous[name].shape, name
        scale = exact[name].abs().max().item()
        # g: bf16 of fp32 values of the same function a few ulps apart (exp / log1p, and the softplus form's
        # one exponential against FLA's formulas): one bf16 step; the sums: fp32 in another order than FLA's blocks
        tol = dict(g=2 ** -7 * scale, A_log=1e-4 * scale, dt_bias=1e-4 * scale)[name]
        for other in (previous[name], exact[name]):
            err = (got.double() - other.double()).abs().max().item()
            assert err <= tol, f"{form} {name}: max |diff| {err:.3e} > {tol:.3e}"


# ----------------------------------------------------------------------------
# a training step in a CUDA graph
# ----------------------------------------------------------------------------

class _KDALayer(torch.nn.Module):
    """A small KDA layer as FLA's KimiDeltaAttention calls the op: projections to q, k, v, the raw
    gate and beta logits, the gate and beta activated in the op, the sigmoid gate bounded at -5."""

    def __init__(self, hidden: int, H: int, HV: int):
        super().__init__()
        self.H, self.HV = H, HV
        bf16 = dict(bias=False, dtype=torch.bfloat16)
        self.q, self.k = torch.nn.Linear(hidden, H * K, **bf16), torch.nn.Linear(hidden, H * K, **bf16)
        self.v, self.g = torch.nn.Linear(hidden, HV * V, **bf16), torch.nn.Linear(hidden, HV * K, **bf16)
        self.beta, self.out = torch.nn.Linear(hidden, HV, **bf16), torch.nn.Linear(HV * V, hidden, **bf16)
        self.A_log = torch.nn.Parameter(torch.log(torch.linspace(1.0, 16.0, HV)))
        self.dt_bias = torch.nn.Parameter(torch.full((HV * K,), -3.0))

    def forward(self, x):
        from kernel import chunk_kda

        B, T, _ = x.shape
        o, _ = chunk_kda(self.q(x).view(B, T, self.H, K), self.k(x).view(B, T, self.H, K),
                         self.v(x).view(B, T, self.HV, V), self.g(x).view(B, T, self.HV, K),
                         self.beta(x), A_log=self.A_log, dt_bias=self.dt_bias, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                         state_v_first=True)
        return self.out(o.reshape(B, T, self.HV * V))


def _loss(model, x, target):
    return (model(x).float() - target).square().mean()


# (B, T, H, HV): a small batch, and one sequence long enough that our forward runs the three passes in
# pieces (the chain on a second stream) and our backward splits Kernel A's scan (the summaries on a second
# stream, the fold between the passes)
GRAPH_SHAPES = {"B 2 x T 256": (2, 256, 2, 4), "one sequence of 32768": (1, 32768, 2, 4)}


@pytest.mark.parametrize("shape", GRAPH_SHAPES)
@pytest.mark.parametrize("forward", FORWARDS)
def test_a_training_step_captured_in_a_cuda_graph_replays_as_eager_steps(forward, shape):
    skip_without_fla_gpu()
    from kernel import using_forward

    B, T, H, HV = GRAPH_SHAPES[shape]
    if B == 1:   # the case covers the pieces and the split only while the rules take them here
        from kernel.ds_scan.split import auto_counts
        from kernel.runtime.builds import sm_count
        from kernel.three_pass_forward import piece_count, three_passes_pay

        assert three_passes_pay(HV, B, T, None) and piece_count(T // 64, 1) > 1
        assert auto_counts([T], HV, sm_count())[0] > 1
    with using_forward(forward):
        _training_step_in_a_cuda_graph(B, T, H, HV)


def _training_step_in_a_cuda_graph(B: int, T: int, H: int, HV: int):
    hidden, steps, warmup = 256, 6, 3
    torch.manual_seed(0)
    graphed = _KDALayer(hidden, H, HV).cuda()
    eager = copy.deepcopy(graphed)
    opt_graphed = torch.optim.SGD(graphed.parameters(), lr=0.5)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.5)
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = [(torch.randn(B, T, hidden, generator=gen, device="cuda").bfloat16(),
             torch.randn(B, T, hidden, generator=gen, device="cuda")) for _ in range(steps)]
    static_x, static_target = torch.empty_like(data[0][0]), torch.empty_like(data[0][1])

    def eager_step(i):
        opt_eager.zero_grad(set_to_none=True)
        loss = _loss(eager, *data[i])
        loss.backward()
        opt_eager.step()
        return loss.detach()

    # warm-up on a side stream (FLA's autotuning, our kernels' builds and cached tables happen here)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            static_x.copy_(data[i][0])
            static_target.copy_(data[i][1])
            opt_graphed.zero_grad(set_to_none=True)
            _loss(graphed, static_x, static_target).backward()
            opt_graphed.step()
    torch.cuda.current_stream().wait_stream(side)
    for i in range(warmup):
        eager_step(i)

    graph = torch.cuda.CUDAGraph()
    opt_graphed.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = _loss(graphed, static_x, static_target)
        static_loss.backward()
        opt_graphed.step()

    before = [p.detach().clone() for p in graphed.parameters()]
    for i in range(warmup, steps):
        static_x.copy_(data[i][0])
        static_target.copy_(data[i][1])
        graph.replay()
        want = eager_step(i)
        assert torch.equal(static_loss, want), (i, static_loss.item(), want.item())
        for (name, p), q in zip(graphed.named_parameters(), eager.parameters()):
            for what, got, expected in (("grad", p.grad, q.grad), ("value", p, q)):
                assert torch.equal(got, expected), \
                    (i, name, what, (got.float() - expected.float()).abs().max().item())
    # the replays trained: every parameter moved from where the warm-up left it
    moved = [name for (name, p), b in zip(graphed.named_parameters(), before) if not torch.equal(p, b)]
    assert moved == [name for name, _ in graphed.named_parameters()]


# ----------------------------------------------------------------------------
# inference mode: a call no gradient can be asked of
# ----------------------------------------------------------------------------

NO_GRADIENT = {   # how a call has no gradient to give: (the grad mode's context, whether the inputs require grad)
    "no_grad": (torch.no_grad, True),
    "inference_mode": (torch.inference_mode, True),
    "no-input-requires-grad": (contextlib.nullcontext, False),
}


def _call(x: dict, **call):
    from kernel import chunk_kda

    return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                     initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"],
                     **call)


@pytest.fixture
def modes(monkeypatch) -> list:
    """The ``training`` of every call the forward op runs (function.forward, which it calls by name)."""
    from kernel.fla_dropin import function

    seen, real = [], function.forward

    def recording(call, *args):
        seen.append(call.training)
        return real(call, *args)

    monkeypatch.setattr(function, "forward", recording)
    return seen


def _assert_same_bits(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name}: max |diff| {(g.float() - w.float()).abs().max().item():.3e}"


@pytest.mark.parametrize("how", list(NO_GRADIENT))
@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_call_without_gradients_gives_the_training_calls_o_and_final_state(case, forward, how, modes):
    skip_without_fla_gpu()
    from kernel import using_forward

    _, sizes, call = case
    call = dict(call, output_final_state=True)
    mode, grad = NO_GRADIENT[how]
    with using_forward(forward):
        o, ht = _call(_inputs(seed=3, **sizes), **call)
        assert o.requires_grad and ht.requires_grad
        training = {"o": o.detach(), "final_state": ht.detach()}
        x = _inputs(seed=3, grad=grad, **sizes)
        with mode():
            o, ht = _call(x, **call)
    assert not o.requires_grad and not ht.requires_grad
    assert modes == [True, False]
    _assert_same_bits({"o": o, "final_state": ht}, training)


def _peak_bytes(fn) -> int:
    """The most memory torch's allocator held while ``fn`` ran, above what it held before; what ``fn``
    returns is dropped after (a training call's graph with it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


@pytest.mark.parametrize("B, T, H, HV, three_passes", [(8, 1024, 4, 8, False), (2, 4096, 2, 4, True)],
                         ids=["one-pass", "three-passes"])
def test_inference_mode_peaks_lower_than_training_by_what_training_keeps(B, T, H, HV, three_passes):
    # out of training mode our forward writes no Aqk or Akk (bf16 [B, T, HV, 64] each) and keeps no gate
    # cumsum. The one pass (64 pairs here) also writes no states (one bf16 [K, V] per 64-token chunk and
    # value head): the peak drops by at least the states' bytes. The three passes (8 pairs) need the
    # states for their o pass in either mode, so there the peak drops by at least Aqk's and Akk's bytes
    skip_without_fla_gpu()
    from kernel import using_forward
    from kernel.shapes import CHUNK_TOKENS
    from kernel.three_pass_forward import three_passes_pay

    assert three_passes_pay(HV, B, T, None) is three_passes
    kept = 2 * B * T * HV * CHUNK_TOKENS * 2 if three_passes else B * math.ceil(T / CHUNK_TOKENS) * HV * K * V * 2
    x = _inputs(B=B, T=T, H=H, HV=HV, layer=True, seed=7)
    call = lambda: _call(x, **LAYER)   # noqa: E731
    with using_forward("ours"):
        for mode in (torch.no_grad, contextlib.nullcontext):   # the builds, FLA's autotuning, the pools
            with mode():
                _peak_bytes(call)
        with torch.no_grad():
            inference = _peak_bytes(call)
        training = _peak_bytes(call)
    assert training - inference >= kept, (training, inference, kept)


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fullgraph_compiled_call_without_gradients_equals_eager(case, backend, forward, modes):
    skip_without_fla_gpu()
    from kernel import using_forward

    _, sizes, call = case
    x = _inputs(seed=3, **sizes)
    gen = torch.Generator(device="cuda").manual_seed(5)
    w_o = torch.randn(x["v"].shape, generator=gen, device="cuda").bfloat16().float()
    w_ht = 0.1 * torch.randn(x["initial_state"].shape, generator=gen, device="cuda")
    with using_forward(forward), torch.no_grad():
        o, ht, _ = _model(**call)(x, w_o, w_ht)
        eager = {"o": o, "final_state": ht}
        torch._dynamo.reset()
        o, ht, _ = torch.compile(_model(**call), backend=backend, fullgraph=True)(x, w_o, w_ht)
    assert modes and not any(modes)
    _assert_same_bits({"o": o, "final_state": ht}, eager)


@pytest.mark.parametrize("forward", FORWARDS)
def test_an_inference_forward_captured_in_a_cuda_graph_replays_as_eager(forward, modes):
    skip_without_fla_gpu()
    from kernel import using_forward

    with using_forward(forward), torch.no_grad():
        _inference_in_a_cuda_graph()
    assert modes and not any(modes)


def _inference_in_a_cuda_graph():
    B, T, hidden, H, HV, steps, warmup = 2, 256, 256, 2, 4, 6, 3
    torch.manual_seed(0)
    layer = _KDALayer(hidden, H, HV).cuda()
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = [torch.randn(B, T, hidden, generator=gen, device="cuda").bfloat16() for _ in range(steps)]
    static_x = torch.empty_like(data[0])

    # warm-up on a side stream (FLA's autotuning, our kernels' builds and cached tables happen here)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            static_x.copy_(data[i])
            layer(static_x)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    outputs = []
    for i in range(steps):
        static_x.copy_(data[i])
        graph.replay()
        want = layer(data[i])
        assert torch.equal(static_y, want), (i, (static_y.float() - want.float()).abs().max().item())
        outputs.append(static_y.clone())
    # the replays read the new data: no two steps' outputs are the same
    assert all(not torch.equal(a, b) for a, b in zip(outputs, outputs[1:]))


@pytest.mark.parametrize("forward", FORWARDS)
def test_the_patched_fla_op_runs_ours_for_a_no_grad_call(forward, modes):
    skip_without_fla_gpu()
    import fla.ops.kda as fla_kda

    from kernel import using_forward
    from kernel.fla_dropin import patch

    flas_calls = []

    def flas_own(*args, **kwargs):
        flas_calls.append(kwargs)
        return fla_kda.chunk_kda(*args, **kwargs)

    routed = patch._route(flas_own)
    x = _inputs(HV=4, layer=True, seed=3)
    positional = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    keywords = dict(LAYER, A_log=x["A_log"], dt_bias=x["dt_bias"], initial_state=x["initial_state"])
    with using_forward(forward), torch.no_grad():
        o, ht = routed(*positional, **keywords)
        ours = _call(x, **LAYER)
        flas = fla_kda.chunk_kda(*positional, **keywords)
    assert flas_calls == [] and modes == [False, False]
    _assert_same_bits({"o": o, "final_state": ht}, {"o": ours[0], "final_state": ours[1]})
    if forward == "fla":
        _assert_same_bits({"o": o, "final_state": ht}, {"o": flas[0], "final_state": flas[1]})


# ----------------------------------------------------------------------------
# without fla-core: the preprocessing in torch
# ----------------------------------------------------------------------------

def _step_outputs(x: dict, call: dict) -> dict:
    """o, the final state and every gradient of one chunk_kda step on ``x`` (gradients cleared first), the loss a
    fixed random projection of o."""
    from kernel import chunk_kda

    for t in x.values():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.grad = None
    o, ht = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                      initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], **call)
    gen = torch.Generator(device="cuda").manual_seed(3)
    (o.float() * torch.randn(o.shape, generator=gen, device="cuda")).sum().backward()
    return {"o": o.detach().clone(), "final": ht.detach().clone(),
            **{n: x[n].grad.clone() for n in GRADIENT_INPUTS if x[n] is not None}}


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("layer-gva", "varlen-layer-gva", "varlen")],
                         ids=lambda c: c[0])
def test_our_forward_and_backward_run_without_fla_at_its_precision(monkeypatch, case):
    # fla-core made unimportable for the op: the l2norm, beta's sigmoid, the gate's cumsum (and, for a gate
    # Kernel B does not take, its backward) run as torch ops (kernel.fla_dropin.preprocess). o, the final
    # state and every gradient are FLA-preprocessing's up to the fp32 roundings of those few ops
    skip_without_fla_gpu()
    from kernel.fla_dropin import function

    _, sizes, call = case
    x = _inputs(**sizes)
    with_fla = _step_outputs(x, call)

    def no_fla():
        raise ImportError("No module named 'fla' (made unimportable by the test)")

    monkeypatch.setattr(function, "_fla", no_fla)
    without = _step_outputs(x, call)
    for name, ref in with_fla.items():
        err = float((without[name].double() - ref.double()).norm() / ref.double().norm())
        assert err < 2e-3, f"{case[0]}: {name} {err:.2e} from the run with FLA's preprocessing"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("varlen", "varlen-layer-gva")], ids=lambda c: c[0])
def test_a_varlen_call_reads_its_offsets_from_the_device_once(case, compiled):
    # reading cu_seqlens' values is a host sync (the host waits for every queued kernel, then the GPU
    # idles while it queues the rest): only a tensor's first call reads them (the boundary in eager
    # mode, the offsets op in a torch.compile graph), so a second call with it, forward and backward,
    # makes no sync that torch can see (its sync debug mode raises on any). CuPy's own calls are
    # outside that mode: the benchmarks' host time per call is their witness
    skip_without_fla_gpu()
    from kernel import chunk_kda

    _, sizes, call = case
    x = _inputs(**sizes)
    if compiled:
        torch._dynamo.reset()
        chunk_kda = torch.compile(chunk_kda, backend="aot_eager", fullgraph=True)

    def step():
        o, ht = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                          initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], **call)
        inputs = [t for t in x.values() if isinstance(t, torch.Tensor) and t.requires_grad]
        return torch.autograd.grad((o.float().square().sum() + ht.square().sum()), inputs)

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------
# the raw-row path (setting.RAW_QK_ROWS): q and k read raw with each row's rstd, no normalised copies
# ----------------------------------------------------------------------------

RAW_ROW_CASES = CASES + [("batch-one-pass", dict(B=12, T=130, H=4, HV=4), PLAIN)]   # 48 pairs: the one pass


@pytest.mark.parametrize("case", RAW_ROW_CASES, ids=lambda c: c[0])
def test_the_raw_row_path_gives_the_copies_paths_outputs_and_gradients(monkeypatch, case):
    # Both paths compute the same function; they differ in where the normalised rows are rounded (FLA's copies
    # round them to bf16, the raw-row forward folds the rstd into its fp32 factors), so within the bf16-level
    # bound every float64 comparison here uses
    skip_without_fla_gpu()
    import kernel.three_pass_forward as three_passes
    from kernel.fla_dropin import setting

    _, sizes, call = case
    x = _inputs(**sizes)
    monkeypatch.setattr(setting, "RAW_QK_ROWS", False)
    copies = _step_outputs(x, call)
    monkeypatch.setattr(setting, "RAW_QK_ROWS", True)
    passes, ran = three_passes.three_pass_forward, []
    monkeypatch.setattr(three_passes, "three_pass_forward", lambda *a, **kw: ran.append(kw) or passes(*a, **kw))
    raw = _step_outputs(x, call)
    if ran:   # the three passes: the products pass writes the rstd alone
        assert ran[0]["norm_copies"] is False and ran[0]["l2norm"] is True
    for name, ref in copies.items():
        err = float((raw[name].double() - ref.double()).norm() / ref.double().norm())
        assert err < 1e-2, f"{case[0]}: {name} {err:.2e} from the copies path"


# ----------------------------------------------------------------------------
# the pipelined backward (kernel.backward_pipeline): each group's Kernel A beside the group before's Kernel B
# ----------------------------------------------------------------------------

PIPELINE_CASES = [("uniform-4x200-2-groups", dict(B=4, T=200), PLAIN, 2),
                  ("layer-gva-6x130-3-groups", dict(B=6, T=130, HV=4, layer=True), LAYER, 3),
                  ("varlen-2-groups", dict(lengths=[1, 63, 64, 65, 130, 200]), PLAIN, 2),
                  ("varlen-layer-gva-2-groups", dict(lengths=[17, 200, 5, 130], HV=4, layer=True), LAYER, 2)]


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=lambda c: c[0])
def test_the_pipelined_backward_gives_the_bits_of_kernel_a_then_kernel_b(monkeypatch, case):
    # each group's kernels do its sequences' work with the batch's choices: o, the final state and every gradient
    # (the gate's partial sums of dA_log and ddt_bias added over the same runs in the same order) to the bit
    pytest.importorskip("cuda.bindings")
    skip_without_fla_gpu()
    from kernel import backward_pipeline
    from kernel.runtime.green_contexts import device_sms

    _, sizes, call, groups = case
    x = _inputs(**sizes)
    want = _step_outputs(x, call)
    launched, launch = [], backward_pipeline.launch
    monkeypatch.setattr(backward_pipeline, "launch",
                        lambda plan, jobs, device: launched.append(len(jobs)) or launch(plan, jobs, device))
    monkeypatch.setattr(backward_pipeline, "PIPELINE", backward_pipeline.Pipeline(a_sms=device_sms()[1], groups=groups))
    got = _step_outputs(x, call)
    assert launched == [groups]
    for name, ref in want.items():
        assert torch.equal(got[name], ref), f"{case[0]}: {name} differs from A then B"
