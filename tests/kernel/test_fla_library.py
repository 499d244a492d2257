"""kernel.chunk_kda's op through torch.library (CPU): the registration, the fakes, torch.compile.

The ops cannot run for real without a GPU (FLA's forward is Triton), so this side checks what
needs no kernel:

* the schemas: the forward op's tensor arguments, settings and outputs as the package names them;
* the forward's fake against FLA's own code: ``function.fla_forward`` run on meta tensors with
  every Triton launch stubbed out, so that FLA's Python allocates its outputs as it would on the
  GPU, and those shapes and dtypes are compared with the fake's, output by output, over the
  settings that change them;
* the same for our forward: ``function.our_forward`` with FLA's preprocessing so stubbed and
  kernel.forward.forward standing in by its own host checks (``plan_forward`` on the tensors it is
  handed) and outputs of the plan's shapes; the layouts it passes in and out (``state_v_first``), a
  misaligned input copied, and the states handed on as h;
* the backward's fake: every gradient like its input, absent where nobody asked;
* ``torch.library.opcheck`` of the forward op on CPU tensors with FLA's launches stubbed (opcheck
  skips meta and fake inputs altogether): the schema, the autograd registration and the fake
  against the real op's allocations; the value checks and the backward op are the GPU file's;
* ``torch.compile(fullgraph=True)`` through chunk_kda on meta tensors, with either forward: no graph
  break, the forward op in the forward graph and the backward op in the backward graph, the
  gradients' shapes eager's; the forward setting a constant of the trace (a change compiles again);
  and the patched FLA route compiles the same way;
* inference mode: the boundary's choice of the op's ``training`` argument (the grad mode and the
  differentiable inputs' requires_grad), the fake out of training mode (o and the final state alone,
  no data-dependent shape left, so a varlen call under our forward is a meta dry run), our kernel
  run in the call's mode, opcheck with ``training=False``, the autograd formula refusing inputs that
  require grad with it, and a call without gradients under ``torch.compile(fullgraph=True)``: an
  inference graph with ``training`` False, a change of the grad mode compiling again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

from kernel.fla_dropin import Call, chunk_kda, function, library, using_forward  # noqa: E402
from kernel.fla_dropin.function import FORWARD_OUTPUTS, GRADIENT_INPUTS  # noqa: E402
from kernel.fla_dropin import setting  # noqa: E402
from kernel.fla_dropin.setting import FORWARDS  # noqa: E402

K = V = 128
OPS = torch.ops.ptx_lab


def _leaf(*shape, dtype=torch.bfloat16, device="meta", grad=True):
    return torch.empty(*shape, dtype=dtype, device=device).requires_grad_(grad)


def _call_inputs(*, B=2, T=100, H=2, HV=2, lengths=None, gate_in_kernel=False, with_state=True, device="meta",
                 grad=True, g_dtype=torch.float32, beta_dtype=torch.float32):
    """The tensors of one call: q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu."""
    if lengths is not None:
        B, T = 1, sum(lengths)
    N = B if lengths is None else len(lengths)
    cu_cpu = None if lengths is None else torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    return dict(q=_leaf(B, T, H, K, device=device, grad=grad), k=_leaf(B, T, H, K, device=device, grad=grad),
                v=_leaf(B, T, HV, V, device=device, grad=grad),
                g=_leaf(B, T, HV, K, dtype=g_dtype, device=device, grad=grad),
                beta=_leaf(B, T, HV, dtype=beta_dtype, device=device, grad=grad),
                A_log=_leaf(HV, dtype=torch.float32, device=device, grad=grad) if gate_in_kernel else None,
                dt_bias=_leaf(HV * K, dtype=torch.float32, device=device, grad=grad) if gate_in_kernel else None,
                initial_state=_leaf(N, HV, K, V, dtype=torch.float32, device=device, grad=grad) if with_state else None,
                cu_seqlens=None if cu_cpu is None else cu_cpu.to(device), cu_seqlens_cpu=cu_cpu)


def _settings(**changes) -> dict:
    base = dict(scale=K ** -0.5, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False,
                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False, lower_bound=None,
                disable_recompute=False, state_v_first=False, forward="fla", training=True, raw_qk_rows=True)
    return dict(base, **changes)


def _op_arguments(x: dict, settings: dict) -> tuple:
    offsets = x["cu_seqlens_cpu"]
    tensors = dict(x, offsets=offsets)
    return (*(tensors[name] for name in library.TENSOR_ARGUMENTS), *(settings[name] for name in library.SETTINGS))


# ----------------------------------------------------------------------------
# the registration
# ----------------------------------------------------------------------------

def test_the_ops_are_registered_with_the_packages_names():
    fwd, bwd = OPS.chunk_kda_fwd.default._schema, OPS.chunk_kda_bwd.default._schema
    fwd_args = [a.name for a in fwd.arguments]
    assert fwd_args == [*library.TENSOR_ARGUMENTS, *library.SETTINGS]
    assert len(fwd.returns) == len(FORWARD_OUTPUTS) and len(bwd.returns) == len(GRADIENT_INPUTS)
    bwd_args = [a.name for a in bwd.arguments]
    assert bwd_args == ["do", "dht", *library.SAVED, "g_dtype", "need", *library.SETTINGS]
    # the settings are the Call's fields that are not sizes, each once
    assert set(library.SETTINGS) == {f.name for f in dataclasses.fields(Call)} - {"B", "T", "H", "HV", "N", "offsets"}
    assert list(GRADIENT_INPUTS) == fwd_args[:len(GRADIENT_INPUTS)]
    assert not fwd.is_mutable and not bwd.is_mutable


# ----------------------------------------------------------------------------
# the forward's fake against FLA's own allocations
# ----------------------------------------------------------------------------

@pytest.fixture
def fla_without_launches(monkeypatch):
    """FLA's Python with every Triton launch a no-op: on meta tensors it allocates its outputs as on
    the GPU and computes nothing."""
    pytest.importorskip("triton", reason="fla-core needs triton")
    pytest.importorskip("fla.ops.kda", reason="fla-core 0.6.0 is not installed")
    from triton.runtime.jit import KernelInterface

    launched = []
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: (lambda *a, **k: launched.append(self)), raising=True)
    return launched


FAKE_CASES = [   # (id, call sizes, settings)
    ("defaults", dict(), dict(use_qk_l2norm_in_kernel=False, output_final_state=False)),
    ("l2norm-state", dict(), dict()),
    ("no-initial-state", dict(with_state=False), dict()),
    ("kept-states", dict(), dict(disable_recompute=True)),
    ("layer", dict(HV=4, gate_in_kernel=True, g_dtype=torch.bfloat16, beta_dtype=torch.bfloat16),
     dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True)),
    ("layer-kept-states", dict(HV=4, gate_in_kernel=True),
     dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True, disable_recompute=True)),
    ("sigmoid-gate", dict(gate_in_kernel=True), dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0)),
    ("odd-length", dict(B=1, T=65), dict(safe_gate=True, lower_bound=-5.0)),
    ("varlen", dict(lengths=[1, 64, 65, 30]), dict()),
    ("varlen-layer", dict(lengths=[5, 130], HV=4, gate_in_kernel=True),
     dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True)),
]


def _meta_call(sizes: dict, settings: dict) -> tuple[dict, Call]:
    x = _call_inputs(grad=False, **sizes)
    B, T, H = x["q"].shape[:3]
    offsets = None if x["cu_seqlens_cpu"] is None else x["cu_seqlens_cpu"].numpy()
    N = B if offsets is None else len(offsets) - 1
    return x, Call(B=B, T=T, H=H, HV=x["v"].shape[2], N=N, offsets=offsets, **settings)


@pytest.mark.parametrize("case", FAKE_CASES, ids=[c[0] for c in FAKE_CASES])
def test_the_forward_fake_is_what_flas_code_allocates(case, fla_without_launches):
    from kernel.fla_dropin.function import fla_forward

    _, sizes, changes = case
    settings = _settings(**changes, forward="fla")
    x, call = _meta_call(sizes, settings)
    flas = fla_forward(call, *(x[name] for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                                                     "cu_seqlens", "cu_seqlens_cpu")))
    assert fla_without_launches, "no Triton launch was stubbed: FLA's code did not run"
    assert list(flas) == list(FORWARD_OUTPUTS)
    fake = OPS.chunk_kda_fwd(*_op_arguments(x, settings))   # meta tensors: the fake implementation
    for name, theirs, ours in zip(FORWARD_OUTPUTS, flas.values(), fake):
        if theirs is None:
            assert ours.numel() == 0, f"{name}: FLA makes none, the fake makes {tuple(ours.shape)}"
            continue
        assert (tuple(ours.shape), ours.dtype, ours.stride()) == (tuple(theirs.shape), theirs.dtype, theirs.stride()), \
            name
        assert ours.device.type == "meta"


def test_the_forward_fake_of_varlen_kept_states_has_an_unbacked_chunk_count(fla_without_launches):
    # FLA's states h of a varlen call hold one state per 64-token chunk of every sequence, a count of
    # cu_seqlens' values: the fake makes it an unbacked size (torch.compile's fake tensors carry it;
    # a plain meta tensor cannot)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

    from kernel.fla_dropin.function import fla_forward

    settings = _settings(disable_recompute=True)
    x, call = _meta_call(dict(lengths=[1, 64, 65, 30]), settings)
    flas = fla_forward(call, *(x[name] for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                                                     "cu_seqlens", "cu_seqlens_cpu")))
    assert flas["h"].shape[1] == 1 + 1 + 2 + 1
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake_x = {n: (None if t is None else mode.from_tensor(t)) for n, t in x.items()}
        fake = dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*_op_arguments(fake_x, settings))))
    h = fake["h"]
    assert free_unbacked_symbols(h.shape[1])
    assert (h.shape[0], *h.shape[2:]) == (flas["h"].shape[0], *flas["h"].shape[2:]) and h.dtype == flas["h"].dtype
    with pytest.raises(RuntimeError, match="data-dependent shape"):
        OPS.chunk_kda_fwd(*_op_arguments(x, settings))


# ----------------------------------------------------------------------------
# our forward's plumbing and its fake, kernel.forward standing in by its own host checks
# ----------------------------------------------------------------------------

class _DeviceArray:
    """A CPU or meta tensor shown as a device array (the CUDA array interface): what
    kernel.forward.plan_forward reads of it (shape, dtype, contiguity, address), on the host."""

    def __init__(self, t):
        typestr = {torch.bfloat16: "<u2", torch.float32: "<f4", torch.float16: "<f2"}[t.dtype]
        strides = None if t.is_contiguous() else tuple(n * t.element_size() for n in t.stride())
        self.__cuda_array_interface__ = dict(shape=tuple(t.shape), typestr=typestr, data=(t.data_ptr(), False),
                                             strides=strides, version=3)


@pytest.fixture
def our_kernel_stubbed(fla_without_launches, monkeypatch):
    """FLA's preprocessing with its launches stubbed, our kernels as :func:`_stub_our_kernels` stubs them."""
    return _stub_our_kernels(monkeypatch)


@pytest.fixture
def our_kernel_stubbed_without_fla(monkeypatch):
    """fla-core unimportable for the op (its preprocessing in torch), our kernels as
    :func:`_stub_our_kernels` stubs them: runs where triton does not."""
    def no_fla():
        raise ImportError("No module named 'fla' (made unimportable by the test)")

    monkeypatch.setattr(function, "_fla", no_fla)
    return _stub_our_kernels(monkeypatch)


def _stub_our_kernels(monkeypatch) -> list:
    """kernel.forward.forward and kernel.three_pass_forward.three_pass_forward (the same contract)
    replaced by the plan (every host check of what they are handed) and outputs of the plan's shapes
    from torch (the final state 0, 1, 2, ..., to follow its layout); CuPy's stream not touched. Returns
    the list of (arguments, plan, outputs) of each launch; the arguments' "ran" names the forward."""
    import kernel.forward as kernel_forward
    import kernel.row_rstd as row_rstd
    import kernel.three_pass_forward as three_passes
    from kernel.forward import ForwardOutputs, plan_forward

    launches = []

    def planned(q, k, v, g, beta, *, scale, initial_state, cu_seqlens, output_final_state, training,
                token_gate=False, l2norm=False, rstd=None, norm_copies=True, ran="one pass"):
        plan = plan_forward(*(_DeviceArray(x) for x in (q, k, v, g, beta)), scale=scale,
                            initial_state=None if initial_state is None else _DeviceArray(initial_state),
                            cu_seqlens=cu_seqlens, output_final_state=output_final_state, training=training,
                            token_gate=token_gate, l2norm=l2norm,
                            rstd=None if rstd is None else tuple(_DeviceArray(x) for x in rstd))
        def empty(shape, dtype):
            return None if shape is None else torch.empty(shape, dtype=dtype, device=q.device)

        final = None
        if plan.final_shape is not None:
            final = torch.arange(float(np.prod(plan.final_shape)), device=q.device).view(plan.final_shape)
        norm = plan.norm_shape
        out = ForwardOutputs(o=empty(plan.o_shape, torch.bfloat16), final_state=final,
                             states=empty(plan.states_shape, torch.bfloat16),
                             Aqk=empty(plan.blocks_shape, torch.bfloat16), Akk=empty(plan.blocks_shape, torch.bfloat16),
                             q=empty(norm if norm_copies else None, torch.bfloat16),
                             k=empty(norm if norm_copies else None, torch.bfloat16),
                             q_rstd=empty(None if norm is None else norm[:-1], torch.float32),
                             k_rstd=empty(None if norm is None else norm[:-1], torch.float32))
        launches.append((dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, training=training,
                              token_gate=token_gate, l2norm=l2norm, rstd=rstd, norm_copies=norm_copies, ran=ran),
                         plan, out))
        return out

    def rstd_pass(q, k):   # kernel.row_rstd's outputs, from torch
        return tuple(torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) for x in (q, k))

    monkeypatch.setattr(kernel_forward, "forward", planned)
    monkeypatch.setattr(row_rstd, "row_rstd", rstd_pass)
    monkeypatch.setattr(three_passes, "three_pass_forward", functools.partial(planned, ran="three passes"))
    monkeypatch.setattr(function, "_torch_stream", contextlib.nullcontext)
    return launches


def _forward_arguments(x: dict) -> tuple:
    return tuple(x[name] for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens",
                                      "cu_seqlens_cpu"))


def _fake_outputs(x: dict, settings: dict) -> dict:
    """The forward op's fake outputs by name: on the meta tensors themselves, or for a varlen call
    (whose states have a data-dependent chunk count) under a FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if x["cu_seqlens"] is None:
        return dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*_op_arguments(x, settings))))
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake_x = {n: (None if t is None else mode.from_tensor(t)) for n, t in x.items()}
        return dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*_op_arguments(fake_x, settings))))


@pytest.mark.parametrize("raw_rows", [False, True], ids=["copies", "raw-rows"])
@pytest.mark.parametrize("case", FAKE_CASES, ids=[c[0] for c in FAKE_CASES])
def test_the_forward_fake_is_what_our_forward_allocates(case, raw_rows, our_kernel_stubbed, monkeypatch):
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    _, sizes, changes = case
    settings = _settings(**changes, forward="ours", raw_qk_rows=raw_rows)   # the fake follows function.reads_raw_qk
    x, call = _meta_call(sizes, settings)
    ours = function.our_forward(call, *_forward_arguments(x))
    (handed, plan, out), = our_kernel_stubbed
    assert list(ours) == list(FORWARD_OUTPUTS)
    assert handed["training"] and plan.config is not None
    # the gate's cumsum is kept for the backward (no recompute there) where the op activates the gate; else
    # our kernels read the call's own gate (function.token_gate) and the op keeps none; the states are h
    if settings["use_gate_in_kernel"]:
        assert ours["g_cumsum"] is handed["g"] and not handed["token_gate"]
    else:
        assert ours["g_cumsum"] is None and handed["token_gate"]
    assert ours["h"] is out.states
    fake = _fake_outputs(x, settings)
    for name, theirs in ours.items():
        faked = fake[name]
        if theirs is None:
            assert faked.numel() == 0, f"{name}: ours makes none, the fake makes {tuple(faked.shape)}"
            continue
        shape = tuple(faked.shape)
        if name == "h" and x["cu_seqlens"] is not None:   # the varlen chunk count: unbacked in the fake
            assert free_unbacked_symbols(shape[1])
            shape = (shape[0], theirs.shape[1], *shape[2:])
        assert (shape, faked.dtype) == (tuple(theirs.shape), theirs.dtype), name
        if x["cu_seqlens"] is None:
            assert faked.stride() == theirs.stride(), name


@pytest.mark.parametrize("v_first", [False, True], ids=["kv", "state-v-first"])
def test_our_forward_takes_and_gives_the_states_in_the_calls_layout(v_first, our_kernel_stubbed):
    x = _call_inputs(B=2, T=70, HV=4, device="cpu", grad=False)
    h0 = torch.randn(x["initial_state"].shape)
    x["initial_state"] = h0
    call = _meta_call(dict(B=2, T=70, HV=4), _settings(state_v_first=v_first, forward="ours"))[1]
    ours = function.our_forward(call, *_forward_arguments(x))
    (handed, _, out), = our_kernel_stubbed
    # the kernel reads and writes [K, V]; the call's layout is [V, K] with state_v_first
    flip = (lambda t: t.transpose(-1, -2)) if v_first else (lambda t: t)   # noqa: E731
    assert torch.equal(handed["initial_state"], flip(h0))
    assert torch.equal(ours["final_state"], flip(out.final_state)) and ours["final_state"].is_contiguous()
    assert ours["h"] is out.states and tuple(ours["h"].shape[-2:]) == (K, V)


def test_a_misaligned_input_reaches_our_kernel_as_an_aligned_copy(our_kernel_stubbed):
    # a contiguous beta starting 4 bytes into its storage: plan_forward refuses it (16-byte cp.async)
    x = _call_inputs(B=1, T=70, device="cpu", grad=False)
    beta = torch.rand(x["beta"].numel() + 1)[1:].view(x["beta"].shape)
    assert beta.is_contiguous() and beta.data_ptr() % 16
    from kernel.forward import plan_forward

    with pytest.raises(ValueError, match=r"beta starts at address .* not a multiple of 16"):
        plan_forward(*(_DeviceArray(t) for t in (x["q"], x["k"], x["v"], x["g"], beta)))
    call = _meta_call(dict(B=1, T=70), _settings(forward="ours"))[1]
    function.our_forward(call, *_forward_arguments(dict(x, beta=beta)))
    (handed, _, _), = our_kernel_stubbed
    assert handed["beta"].data_ptr() % 16 == 0 and torch.equal(handed["beta"], beta)


def test_our_forward_passes_the_checked_host_offsets(our_kernel_stubbed):
    x, call = _meta_call(dict(lengths=[1, 64, 65, 30]), _settings(forward="ours"))
    ours = function.our_forward(call, *_forward_arguments(x))
    (_, plan, _), = our_kernel_stubbed
    assert plan.cu_seqlens.tolist() == [0, 1, 65, 130, 160] and plan.N == 4
    assert ours["h"].shape[:2] == (1, 1 + 1 + 2 + 1)


@pytest.mark.parametrize("sizes, HV, ran", [
    (dict(B=1, T=70), 4, "three passes"),                       # 4 pairs: the one pass's chain would bind
    (dict(B=2, T=70), 16, "three passes"),                      # 32 pairs, the rule's last
    (dict(B=3, T=70), 16, "one pass"),                          # 48
    (dict(lengths=[200, 10, 10, 10, 10]), 16, "three passes"),  # 16 x 240 / 200 = 19.2 pairs
    (dict(lengths=[50, 50, 50, 50, 50]), 8, "one pass"),        # 40
], ids=["1x70-hv4", "2x70-hv16", "3x70-hv16", "varlen-one-long", "varlen-even"])
def test_our_forward_runs_the_three_passes_where_few_long_sequences_make_them_pay(sizes, HV, ran,
                                                                                  our_kernel_stubbed_without_fla,
                                                                                  monkeypatch):
    # the copies path (the raw-row path: the test below)
    x, call = _meta_call(dict(sizes, HV=HV, H=HV), _settings(forward="ours", raw_qk_rows=False))
    ours = function.our_forward(call, *_forward_arguments(x))
    (handed, plan, out), = our_kernel_stubbed_without_fla
    assert handed["ran"] == ran and plan.HV == HV
    # either forward reads the call's own gate (the cumsum pass folded in); the three passes also q and k as they
    # came and hand the backward the q, k and rstd they wrote, the one pass q and k from the l2norm pass (its
    # l2norm build cost more than the pass, log 57)
    assert handed["token_gate"] and handed["g"] is x["g"] and ours["g_cumsum"] is None
    three = ran == "three passes"
    assert handed["l2norm"] == three and (handed["q"] is x["q"]) == three and handed["rstd"] is None
    if three:
        assert handed["norm_copies"] is True and ours["q"] is out.q and ours["k_rstd"] is out.k_rstd
    else:
        assert ours["q"] is handed["q"] and ours["q_rstd"] is not None and out.q is None


@pytest.mark.parametrize("sizes, HV, ran", [(dict(B=1, T=70), 4, "three passes"), (dict(B=3, T=70), 16, "one pass")],
                         ids=["1x70-hv4", "3x70-hv16"])
def test_with_raw_rows_neither_forward_writes_normalised_copies(sizes, HV, ran, our_kernel_stubbed_without_fla,
                                                                monkeypatch):
    # raw_qk_rows: the three passes form each row's rstd and hand the backward those alone, the one pass is given
    # them by the rstd pass; the backward reads the call's own rows
    x, call = _meta_call(dict(sizes, HV=HV, H=HV), _settings(forward="ours", raw_qk_rows=True))
    ours = function.our_forward(call, *_forward_arguments(x))
    (handed, plan, out), = our_kernel_stubbed_without_fla
    assert handed["ran"] == ran
    three = ran == "three passes"
    assert handed["q"] is x["q"] and handed["l2norm"] == three and (handed["rstd"] is None) == three
    assert ours["q"] is None and ours["k"] is None and out.q is None
    if three:
        assert handed["norm_copies"] is False and ours["k_rstd"] is out.k_rstd
    else:
        assert ours["q_rstd"] is handed["rstd"][0] and ours["k_rstd"] is handed["rstd"][1]


@pytest.mark.parametrize("forward", FORWARDS)
def test_the_forward_op_runs_the_forward_its_argument_names(forward, monkeypatch):
    ran = []
    for name in ("our_forward", "fla_forward"):
        monkeypatch.setattr(function, name, lambda call, *a, name=name: ran.append(name) or {})
    x, call = _meta_call(dict(), _settings(forward=forward))
    function.forward_here(call, *_forward_arguments(x))
    assert ran == [{"ours": "our_forward", "fla": "fla_forward"}[forward]]


# ----------------------------------------------------------------------------
# the backward's fake
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("need", [(True,) * 8, (False,) * 8, (True, False, True, False, True, False, True, False),
                                  (False, True, False, True, False, True, False, True)],
                         ids=["all", "none", "even", "odd"])
@pytest.mark.parametrize("gate_in_kernel", [False, True], ids=["gate-given", "gate-in-kernel"])
@pytest.mark.parametrize("forward", FORWARDS)
def test_the_backward_fake_gives_each_gradient_like_its_input(need, gate_in_kernel, forward):
    x = _call_inputs(HV=4, gate_in_kernel=gate_in_kernel, grad=False, g_dtype=torch.bfloat16,
                     beta_dtype=torch.bfloat16)
    settings = _settings(use_gate_in_kernel=gate_in_kernel, use_beta_sigmoid_in_kernel=gate_in_kernel,
                         state_v_first=gate_in_kernel, forward=forward)
    out = dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*_op_arguments(x, settings))))
    # q and k as _setup_context keeps them: the normalised copies where the forward made them, else the call's own
    saved = dict(x, q=out["q"] if out["q"].numel() else x["q"], k=out["k"] if out["k"].numel() else x["k"],
                 q_rstd=out["q_rstd"], k_rstd=out["k_rstd"],
                 g_cumsum=out["g_cumsum"] if out["g_cumsum"].numel() else None,
                 g_raw=x["g"] if gate_in_kernel or forward == "ours" else None,   # as _setup_context keeps it
                 beta_activated=out["beta"] if gate_in_kernel else None,
                 Aqk=out["Aqk"], Akk=out["Akk"], h=out["h"] if out["h"].numel() else None, offsets=None)
    do, dht = torch.empty_like(out["o"]), torch.empty_like(out["final_state"])
    grads = OPS.chunk_kda_bwd(do, dht, *(saved[name] for name in library.SAVED), x["g"].dtype, list(need),
                              *(settings[name] for name in library.SETTINGS))
    for name, wanted, grad in zip(GRADIENT_INPUTS, need, grads):
        given = x[name]
        if wanted and given is not None:
            assert (grad.shape, grad.dtype) == (given.shape, given.dtype), name
        else:
            assert grad.numel() == 0, name


# ----------------------------------------------------------------------------
# opcheck on CPU tensors, FLA's code allocating without its kernels (and ours by its plan)
# ----------------------------------------------------------------------------
# opcheck skips every check for meta or fake inputs, and the real forward needs a GPU; on CPU
# tensors with FLA's launches stubbed (and kernel.forward by its plan) the forward op runs for real
# (the allocations, no values), which is what the schema, autograd-registration and fake-tensor
# checks read. The checks that compare values (test_aot_dispatch_*) and the backward op need the
# GPU (test_fla_library_gpu.py).

OPCHECK_CPU = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture
def forward_op_on_cpu(our_kernel_stubbed, monkeypatch):
    monkeypatch.setattr(function, "forward", function.forward_here)   # the forward less its CUDA device context
    return function.forward_here


OPCHECK_CASES = [*FAKE_CASES, ("varlen-kept-states", dict(lengths=[1, 64, 65, 30]), dict(disable_recompute=True))]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=[c[0] for c in OPCHECK_CASES])
@pytest.mark.parametrize("forward", FORWARDS)
def test_opcheck_of_the_forward_op_on_cpu(case, forward, forward_op_on_cpu):
    _, sizes, changes = case
    x = _call_inputs(device="cpu", **sizes)
    result = torch.library.opcheck(OPS.chunk_kda_fwd.default, _op_arguments(x, _settings(**changes, forward=forward)),
                                   test_utils=OPCHECK_CPU)
    assert result == {name: "SUCCESS" for name in OPCHECK_CPU}


@pytest.mark.parametrize("forward", FORWARDS)
def test_opcheck_catches_a_fake_that_is_not_the_real_ops(forward, forward_op_on_cpu, monkeypatch):
    # the check above can fail: a real forward whose Aqk is one chunk column short of the fake's
    def short(*args, **kwargs):
        out = forward_op_on_cpu(*args, **kwargs)
        return dict(out, Aqk=out["Aqk"][..., 1:].contiguous())

    monkeypatch.setattr(function, "forward", short)
    x = _call_inputs(device="cpu")
    with pytest.raises(Exception, match="test_faketensor"):
        torch.library.opcheck(OPS.chunk_kda_fwd.default, _op_arguments(x, _settings(forward=forward)),
                              test_utils=("test_faketensor",))


# ----------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ----------------------------------------------------------------------------

LAYER = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True, lower_bound=-5.0, state_v_first=True, output_final_state=True)


def _model(fn=None, **call):
    fn = fn or chunk_kda

    def model(x: dict):
        o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                   initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"],
                   **call)
        loss = (o.float() * 2.0).sum()
        return loss + ht.sum() if ht is not None else loss

    return model


COMPILE_CASES = [
    ("uniform", dict(B=2, T=100, H=2, HV=2), dict(use_qk_l2norm_in_kernel=True, output_final_state=True, scale=0.1)),
    ("layer-gva", dict(B=2, T=100, H=2, HV=4, gate_in_kernel=True), LAYER),
    ("varlen-with-cpu-offsets", dict(lengths=[5, 70, 25]), dict(use_qk_l2norm_in_kernel=True)),
]
# each case under each forward, but a varlen call under ours: its states' chunk count is data-dependent,
# which the compiled graph's run on meta tensors cannot make (test_fla_library_gpu.py compiles it)
COMPILE_RUNS = [(case, forward) for case in COMPILE_CASES for forward in FORWARDS
                if not ("lengths" in case[1] and forward == "ours")]
COMPILE_IDS = [f"{case[0]}-{forward}" for case, forward in COMPILE_RUNS]


@pytest.mark.parametrize("case, forward", COMPILE_RUNS, ids=COMPILE_IDS)
def test_a_model_calling_chunk_kda_compiles_with_fullgraph(case, forward):
    # fullgraph=True raises at the first graph break; explain counts the graphs too
    _, sizes, call = case
    with using_forward(forward):
        torch._dynamo.reset()
        torch.compile(_model(**call), backend="eager", fullgraph=True)(_call_inputs(**sizes)).backward()
        torch._dynamo.reset()
        explained = torch._dynamo.explain(_model(**call))(_call_inputs(**sizes))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


WALLED = torch.compiler.disable(chunk_kda)   # chunk_kda behind the compiler's wall, as FLA's own is


def test_fullgraph_refuses_a_model_whose_chunk_kda_is_compiler_disabled():
    # the check above can fail: a compiler-disabled op is a graph break, which fullgraph refuses
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="torch.compiler.disable"):
        torch.compile(_model(WALLED, use_qk_l2norm_in_kernel=True), backend="eager", fullgraph=True)(
            _call_inputs())


def _recording_backend(graphs: dict):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def _targets(gm) -> set[str]:
    return {str(node.target) for node in gm.graph.nodes if node.op == "call_function"}


def _op_nodes(gm, target: str) -> list:
    return [node for node in gm.graph.nodes if node.op == "call_function" and str(node.target) == target]


@pytest.mark.parametrize("case, forward", COMPILE_RUNS, ids=COMPILE_IDS)
def test_fullgraph_compiles_the_forward_op_and_the_backward_op(case, forward):
    _, sizes, call = case
    x_eager, x_compiled = _call_inputs(**sizes), _call_inputs(**sizes)
    model = _model(**call)
    graphs: dict = {}
    with using_forward(forward):
        model(x_eager).backward()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=_recording_backend(graphs), fullgraph=True)
        compiled(x_compiled).backward()
    assert "ptx_lab.chunk_kda_fwd.default" in _targets(graphs["forward"])
    # the setting reached both ops as a constant of the trace
    setting = library.SETTINGS.index("forward")
    fwd, = _op_nodes(graphs["forward"], "ptx_lab.chunk_kda_fwd.default")
    bwd, = _op_nodes(graphs["backward"], "ptx_lab.chunk_kda_bwd.default")
    assert fwd.args[len(library.TENSOR_ARGUMENTS) + setting] == forward
    assert bwd.args[-len(library.SETTINGS) + setting] == forward
    raw = library.SETTINGS.index("raw_qk_rows")
    assert fwd.args[len(library.TENSOR_ARGUMENTS) + raw] is bwd.args[-len(library.SETTINGS) + raw] is True
    assert "ptx_lab.chunk_kda_bwd.default" in _targets(graphs["backward"])
    assert "ptx_lab.chunk_kda_bwd.default" not in _targets(graphs["forward"])
    for name in GRADIENT_INPUTS:
        leaf_eager, leaf_compiled = x_eager[name], x_compiled[name]
        if leaf_eager is None:
            continue
        assert leaf_eager.grad is not None and leaf_compiled.grad is not None, name
        assert (leaf_compiled.grad.shape, leaf_compiled.grad.dtype) == (leaf_eager.grad.shape, leaf_eager.grad.dtype)
        assert (leaf_eager.grad.shape, leaf_eager.grad.dtype) == (leaf_eager.shape, leaf_eager.dtype), name


def _compiled_layer_recording_graphs():
    """The layer model compiled fullgraph, with the list each graph dynamo makes is appended to (a
    recompile adds one)."""
    graphs = []
    torch._dynamo.reset()

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return torch.compile(_model(**LAYER), backend=backend, fullgraph=True), graphs


def test_a_change_of_the_forward_setting_compiles_again():
    # the setting is read at the boundary, inside the trace: dynamo guards on it, so a compiled model
    # follows a change instead of replaying the forward it was traced with
    compiled, graphs = _compiled_layer_recording_graphs()
    counts = []
    for forward in ("ours", "fla", "ours"):
        with using_forward(forward):
            compiled(_call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)).backward()
        counts.append(len(graphs))
    assert counts == [1, 2, 2]   # a change compiles again; going back reuses the first trace
    setting = len(library.TENSOR_ARGUMENTS) + library.SETTINGS.index("forward")
    assert [_op_nodes(gm, "ptx_lab.chunk_kda_fwd.default")[0].args[setting] for gm in graphs] == ["ours", "fla"]


def test_a_change_of_the_raw_row_setting_compiles_again(monkeypatch):
    # RAW_QK_ROWS is read at the boundary like the forward setting: a compiled model follows a change
    compiled, graphs = _compiled_layer_recording_graphs()
    for raw in (True, False, True):
        monkeypatch.setattr(setting, "RAW_QK_ROWS", raw)
        compiled(_call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)).backward()
    at = len(library.TENSOR_ARGUMENTS) + library.SETTINGS.index("raw_qk_rows")
    assert [_op_nodes(gm, "ptx_lab.chunk_kda_fwd.default")[0].args[at] for gm in graphs] == [True, False]


@pytest.mark.parametrize("raw", [True, False], ids=["raw-rows", "copies"])
def test_a_backward_reads_q_and_k_as_its_forward_left_them_after_the_setting_changed(raw, monkeypatch):
    # the boundary reads RAW_QK_ROWS once into the call, which both ops take as an argument: a change between a
    # forward and its backward does not hand the backward rows it does not expect
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = {}
    at = {"fwd": len(library.TENSOR_ARGUMENTS) + library.SETTINGS.index("raw_qk_rows"),
          "bwd": library.SETTINGS.index("raw_qk_rows") - len(library.SETTINGS)}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith("ptx_lab.chunk_kda_"):
                seen[name] = args[at[name.split(".")[1].rsplit("_", 1)[1]]]   # chunk_kda_fwd: "fwd"
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(setting, "RAW_QK_ROWS", raw)
    with using_forward("ours"), Record():
        loss = _model(**LAYER)(_call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True))
        monkeypatch.setattr(setting, "RAW_QK_ROWS", not raw)
        loss.backward()
    assert seen == {"ptx_lab.chunk_kda_fwd.default": raw, "ptx_lab.chunk_kda_bwd.default": raw}


def test_fullgraph_with_dynamic_shapes_serves_two_lengths_from_one_trace():
    torch._dynamo.reset()
    compiled = torch.compile(_model(**LAYER), backend="aot_eager", fullgraph=True, dynamic=True)
    for T in (100, 257):
        x = _call_inputs(B=2, T=T, H=2, HV=4, gate_in_kernel=True)
        compiled(x).backward()
        assert x["q"].grad.shape == (2, T, 2, K) and x["initial_state"].grad.shape == (2, 4, V, K)


def test_a_varlen_call_without_host_offsets_traces_their_copy_to_the_host():
    # the boundary cannot read cu_seqlens in a trace: the graph copies them to the host through the
    # offsets op (a sync the first time a tensor is read) and the op reads that copy; torch.export's
    # strict trace admits no break
    class Model(torch.nn.Module):
        def forward(self, q, k, v, g, beta, cu_seqlens):
            return chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)[0]

    x = _call_inputs(lengths=[5, 70, 25], grad=False)
    exported = torch.export.export(Model(), tuple(x[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")),
                                   strict=True)
    calls = [node for node in exported.graph.nodes if node.op == "call_function"]
    op = next(node for node in calls if str(node.target) == "ptx_lab.chunk_kda_fwd.default")
    offsets = op.args[library.TENSOR_ARGUMENTS.index("offsets")]
    assert offsets.meta["val"].device.type == "cpu" and offsets.args[0].name == "cu_seqlens"
    assert str(offsets.target) == "ptx_lab.offsets_on_host.default"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_model_reads_an_offsets_tensor_once_as_eager_calls_do(backend, offsets_reads):
    # a compiled graph calls the offsets op with the model's own tensor: it is read from the device
    # once (a host sync on a GPU), again only after an in-place write, as at the eager boundary
    reads = offsets_reads
    step = torch.compile(lambda x, cu: x + library.offsets_on_host_op(cu).to(x.dtype), backend=backend,
                         fullgraph=True)
    x, cu = torch.zeros(3), torch.tensor([0, 3, 8])
    for _ in range(3):
        assert step(x, cu).tolist() == [0.0, 3.0, 8.0]
    assert len(reads) == 1 and reads[0] is cu
    cu[1] = 5
    assert step(x, cu).tolist() == [0.0, 5.0, 8.0] and len(reads) == 2


def test_the_patched_fla_route_compiles_with_fullgraph():
    from kernel.fla_dropin import patch

    def flas_own(*args, **kwargs):   # stands in for FLA's op: a covered call never reaches it
        raise AssertionError("the routed call went to FLA's own")

    torch._dynamo.reset()
    x = _call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)
    torch.compile(_model(patch._route(flas_own), **LAYER), backend="eager", fullgraph=True)(x).backward()
    assert x["A_log"].grad.shape == x["A_log"].shape


def test_the_forward_op_checks_the_offsets_it_reads():
    # under torch.compile the boundary does not read cu_seqlens' values: the op does, before the GPU
    x = _call_inputs(lengths=[5, 70, 25], device="cpu", grad=False)
    for offsets, error in ((torch.tensor([0, 75, 5, 100]), r"cu_seqlens must be strictly increasing"),
                           (torch.tensor([0, 5, 75, 99]), r"cu_seqlens must end at the total length 100, got 99"),
                           (x["cu_seqlens_cpu"], r"^q: expected a CUDA tensor")):
        with pytest.raises(ValueError, match=error):
            OPS.chunk_kda_fwd(*_op_arguments(dict(x, cu_seqlens_cpu=offsets), _settings()))


def test_a_meta_call_is_a_dry_run_of_the_shapes():
    x = _call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)
    loss = _model(**LAYER)(x)
    loss.backward()
    for name in GRADIENT_INPUTS:
        assert x[name].grad.shape == x[name].shape and x[name].grad.dtype == x[name].dtype, name


@pytest.mark.parametrize("forward", FORWARDS)
def test_every_setting_combination_traces(forward):
    # every combination of the switches that change the outputs gets through the boundary, the fakes
    # and the autograd formula on meta tensors with the gradients like the inputs
    for l2, gate, sig, kept, vfirst, final in itertools.product((False, True), repeat=6):
        x = _call_inputs(B=1, T=70, H=2, HV=4, gate_in_kernel=gate)
        call = dict(use_qk_l2norm_in_kernel=l2, use_gate_in_kernel=gate, use_beta_sigmoid_in_kernel=sig,
                    disable_recompute=kept, state_v_first=vfirst, output_final_state=final,
                    lower_bound=-5.0 if gate else None)
        with using_forward(forward):
            _model(**call)(x).backward()
        for name in GRADIENT_INPUTS:
            if x[name] is not None:
                assert x[name].grad is not None and x[name].grad.shape == x[name].shape, (name, call)


# ----------------------------------------------------------------------------
# inference mode: the op's training argument
# ----------------------------------------------------------------------------

def test_training_mode_needs_the_grad_mode_and_an_input_that_requires_grad():
    from kernel.fla_dropin.arguments import training_mode

    leaf, plain = torch.ones(1, requires_grad=True), torch.ones(1)
    assert training_mode(True, (plain, None, leaf)) and training_mode(True, (leaf * 2,))   # a non-leaf too
    assert not training_mode(False, (plain, None, leaf))
    assert not training_mode(True, (plain, None, plain.detach(), leaf.detach()))
    assert not training_mode(True, ()) and not training_mode(True, (None,))


def _checked_call(x: dict, **call) -> Call:
    """The Call that chunk_kda's boundary makes of these inputs and keywords now."""
    import inspect

    from kernel.fla_dropin.entry import check_call

    bound = inspect.signature(chunk_kda).bind(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                              dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                                              cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"], **call)
    bound.apply_defaults()
    return check_call(dict(bound.arguments))[0]


MODE_CASES = [   # (id, the grad mode's context, the inputs that require grad, use_gate_in_kernel, training)
    ("grad", contextlib.nullcontext, GRADIENT_INPUTS, True, True),
    ("no_grad", torch.no_grad, GRADIENT_INPUTS, True, False),
    ("inference_mode", torch.inference_mode, GRADIENT_INPUTS, True, False),
    ("no-input-requires-grad", contextlib.nullcontext, (), True, False),
    ("initial-state-alone", contextlib.nullcontext, ("initial_state",), True, True),
    ("A_log-alone", contextlib.nullcontext, ("A_log",), True, True),
    # A_log without the gate in the op is not the op's input (FLA ignores it): no gradient can reach it
    ("A_log-alone-gate-given", contextlib.nullcontext, ("A_log",), False, False),
]


@pytest.mark.parametrize("case", MODE_CASES, ids=[c[0] for c in MODE_CASES])
def test_the_boundary_decides_the_calls_mode(case):
    _, mode, requiring, gate_in_kernel, training = case
    x = _call_inputs(grad=False, gate_in_kernel=True)
    for name in requiring:
        x[name].requires_grad_(True)
    call = dict(LAYER, use_gate_in_kernel=gate_in_kernel)
    with mode():
        assert _checked_call(x, **call).training is training


@pytest.mark.parametrize("case", FAKE_CASES, ids=[c[0] for c in FAKE_CASES])
@pytest.mark.parametrize("forward", FORWARDS)
def test_out_of_training_mode_the_fake_makes_o_and_the_final_state_alone(case, forward):
    # a plain meta call: no data-dependent shape is left, the states of a varlen call included
    _, sizes, changes = case
    settings = _settings(**changes, forward=forward, training=False)
    x, call = _meta_call(sizes, settings)
    fake = dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*_op_arguments(x, settings))))
    state = (V, K) if call.state_v_first else (K, V)
    made = {"o": (x["v"].shape, torch.bfloat16)}
    if call.output_final_state:
        made["final_state"] = ((call.N, call.HV, *state), torch.float32)
    for name in FORWARD_OUTPUTS:
        if name in made:
            assert (fake[name].shape, fake[name].dtype) == made[name], name
        else:
            assert fake[name].numel() == 0, f"{name}: made out of training mode, {tuple(fake[name].shape)}"
    assert set(library.RETURNED) >= set(made)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_our_forward_runs_the_kernel_in_the_calls_mode(training, our_kernel_stubbed):
    x, call = _meta_call(dict(HV=4), _settings(forward="ours", training=training))
    ours = function.our_forward(call, *_forward_arguments(x))
    (handed, plan, out), = our_kernel_stubbed
    assert handed["training"] is training
    assert (plan.states_shape is None, plan.blocks_shape is None) == (not training, not training)
    assert ours["h"] is out.states and (ours["h"] is None) is not training


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=[c[0] for c in OPCHECK_CASES])
@pytest.mark.parametrize("forward", FORWARDS)
def test_opcheck_of_the_forward_op_out_of_training_mode_on_cpu(case, forward, forward_op_on_cpu):
    _, sizes, changes = case
    x = _call_inputs(device="cpu", grad=False, **sizes)
    arguments = _op_arguments(x, _settings(**changes, forward=forward, training=False))
    result = torch.library.opcheck(OPS.chunk_kda_fwd.default, arguments, test_utils=OPCHECK_CPU)
    assert result == {name: "SUCCESS" for name in OPCHECK_CPU}
    out = dict(zip(FORWARD_OUTPUTS, OPS.chunk_kda_fwd(*arguments)))
    final = _settings(**changes)["output_final_state"]
    assert [name for name, t in out.items() if t.numel()] == ["o", "final_state"][:1 + final]


def test_the_forward_op_out_of_training_mode_refuses_inputs_that_require_grad():
    # nothing is kept for a backward: autograd's formula says so at the forward, not at the backward
    x = _call_inputs()
    arguments = _op_arguments(x, _settings(training=False))
    with pytest.raises(RuntimeError, match=r"training=False on inputs that require grad"):
        OPS.chunk_kda_fwd(*arguments)
    with torch.no_grad():
        OPS.chunk_kda_fwd(*arguments)


def _inference_model(fn=None, **call):
    fn = fn or chunk_kda

    def model(x: dict):
        return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                  initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"],
                  **call)

    return model


INFERENCE_RUNS = [(case, forward) for case in COMPILE_CASES for forward in FORWARDS]   # varlen under ours too
INFERENCE_IDS = [f"{case[0]}-{forward}" for case, forward in INFERENCE_RUNS]
NO_GRADIENT = {"no_grad": (torch.no_grad, True), "no-input-requires-grad": (contextlib.nullcontext, False)}


@pytest.mark.parametrize("how", list(NO_GRADIENT))
@pytest.mark.parametrize("case, forward", INFERENCE_RUNS, ids=INFERENCE_IDS)
def test_a_call_without_gradients_is_a_dry_run_in_inference_mode(case, forward, how):
    # a varlen call under our forward too: without its states nothing has a data-dependent shape
    _, sizes, call = case
    mode, grad = NO_GRADIENT[how]
    x = _call_inputs(grad=grad, **sizes)
    with using_forward(forward), mode():
        o, ht = _inference_model(**call)(x)
    assert o.shape == x["v"].shape and o.dtype == torch.bfloat16 and not o.requires_grad
    assert (ht is None) is not call.get("output_final_state", False)


@pytest.mark.parametrize("how", list(NO_GRADIENT))
@pytest.mark.parametrize("case, forward", INFERENCE_RUNS, ids=INFERENCE_IDS)
def test_fullgraph_compiles_a_call_without_gradients_in_inference_mode(case, forward, how):
    _, sizes, call = case
    mode, grad = NO_GRADIENT[how]
    graphs: dict = {}
    torch._dynamo.reset()
    compiled = torch.compile(_inference_model(**call), backend=_recording_backend(graphs), fullgraph=True)
    x = _call_inputs(grad=grad, **sizes)
    with using_forward(forward), mode():
        o, _ = compiled(x)
    assert o.shape == x["v"].shape
    assert "backward" not in graphs   # aot_autograd made an inference graph: nothing for a backward
    fwd, = _op_nodes(graphs["forward"], "ptx_lab.chunk_kda_fwd.default")
    settings = dict(zip(library.SETTINGS, fwd.args[len(library.TENSOR_ARGUMENTS):]))
    assert (settings["training"], settings["forward"]) == (False, forward)


def test_a_change_of_the_grad_mode_compiles_again():
    # the grad mode and requires_grad are read at the boundary, inside the trace: dynamo guards on
    # them, so a model compiled for training does not replay its training call under no_grad
    compiled, graphs = _compiled_layer_recording_graphs()
    counts = []
    for grad in (True, False, True):
        x = _call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)
        with torch.set_grad_enabled(grad):
            loss = compiled(x)
        if grad:
            loss.backward()
        counts.append(len(graphs))
    assert counts == [1, 2, 2]   # a change compiles again; going back reuses the first trace
    setting = len(library.TENSOR_ARGUMENTS) + library.SETTINGS.index("training")
    assert [_op_nodes(gm, "ptx_lab.chunk_kda_fwd.default")[0].args[setting] for gm in graphs] == [True, False]


def test_the_patched_fla_route_compiles_a_no_grad_call_through_our_op():
    from kernel.fla_dropin import patch

    def flas_own(*args, **kwargs):   # stands in for FLA's op: a covered call never reaches it, no-grad ones too
        raise AssertionError("the routed call went to FLA's own")

    torch._dynamo.reset()
    x = _call_inputs(B=2, T=100, H=2, HV=4, gate_in_kernel=True)
    with torch.no_grad():
        o, ht = torch.compile(_inference_model(patch._route(flas_own), **LAYER), backend="eager", fullgraph=True)(x)
    assert o.shape == x["v"].shape and ht.shape == x["initial_state"].shape


def test_the_backward_hands_our_kernels_aligned_inputs(monkeypatch):
    """A contiguous v and gate starting 4 bytes into their storage (slices of larger buffers): the backward's
    kernels copy 16 bytes at a time, so our backward gets aligned copies of the same values, as the forward does;
    an aligned input goes as it is. The call reads each token's gate itself (our forward, the gate not activated
    in the op: the token gate)."""
    import contextlib

    x = _call_inputs(B=1, T=70, device="cpu", grad=False)
    call = _meta_call(dict(B=1, T=70), _settings(forward="ours"))[1]
    assert function.token_gate(call)
    shift = lambda t: torch.rand(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)   # noqa: E731
    v, g = x["v"].bfloat16(), shift(x["g"])
    v = torch.rand(v.numel() + 1).bfloat16()[1:].view(v.shape)
    assert v.data_ptr() % 16 and g.data_ptr() % 16 and v.is_contiguous() and g.is_contiguous()
    handed = {}

    def ours(call, q, k, v, g_cumsum, *rest, **kw):
        handed.update(q=q, v=v, g=g_cumsum)
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros(v.shape[:3]),
                torch.zeros_like(g_cumsum), None, None, None)

    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(function, "_ours", ours)
    q = x["q"].bfloat16()
    rstd = torch.ones(q.shape[:3])
    function.backward(call, (True,) * 8, g.dtype, torch.zeros(v.shape, dtype=torch.bfloat16), None, q, rstd, q, rstd,
                      v, None, g, x["beta"], None, None, None, None, None, None, None, None, None)
    assert handed["v"].data_ptr() % 16 == 0 and torch.equal(handed["v"], v)
    assert handed["g"].data_ptr() % 16 == 0 and torch.equal(handed["g"], g)
    assert handed["q"] is q   # aligned already: no copy
