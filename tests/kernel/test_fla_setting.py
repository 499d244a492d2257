"""Which forward kernel.chunk_kda runs (kernel.fla_dropin.setting), on the CPU.

The setting itself (its default, its refusals, the context manager putting back what was there),
the call's forward as the boundary reads it for every covered call and through the patched FLA
route, and what the backward does with each forward's states: ours are [K, V] in every layout and
skip the forward-state scan; FLA's kept h only without ``state_v_first``.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")

import kernel  # noqa: E402
from kernel.fla_dropin import entry, function, patch  # noqa: E402
from kernel.fla_dropin.setting import (DEFAULT_FORWARD, FORWARDS, forward_setting, use_forward,  # noqa: E402
                                       using_forward)

K = V = 128


@pytest.fixture(autouse=True)
def _default_setting():
    use_forward(DEFAULT_FORWARD)
    yield
    use_forward(DEFAULT_FORWARD)


def test_the_default_is_ours_and_one_of_the_forwards():
    assert FORWARDS == ("ours", "fla") and DEFAULT_FORWARD == "ours" and forward_setting() == "ours"


def test_kernel_exports_the_setting():
    assert kernel.use_forward is use_forward and kernel.using_forward is using_forward
    assert kernel.forward_setting is forward_setting


@pytest.mark.parametrize("bad", ["FLA", "mine", "", None, 1])
def test_a_forward_that_is_not_one_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"forward: expected one of \('ours', 'fla'\), got "):
        use_forward(bad)
    with pytest.raises(ValueError, match=r"forward: expected one of"):
        with using_forward(bad):
            pass
    assert forward_setting() == "ours"


def test_using_forward_puts_back_what_was_there_on_an_error_too():
    with using_forward("fla"):
        assert forward_setting() == "fla"
        with using_forward("ours"):
            assert forward_setting() == "ours"
        assert forward_setting() == "fla"
    assert forward_setting() == "ours"
    use_forward("fla")
    with pytest.raises(RuntimeError, match="inside"):
        with using_forward("ours"):
            raise RuntimeError("inside")
    assert forward_setting() == "fla"


# ----------------------------------------------------------------------------
# the call's forward, read at the boundary
# ----------------------------------------------------------------------------

def _meta_inputs(B=1, T=70, H=2, HV=2):
    e = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device="meta")   # noqa: E731
    return e(B, T, H, K), e(B, T, H, K), e(B, T, HV, V), e(B, T, HV, K, dtype=torch.float32), \
        e(B, T, HV, dtype=torch.float32)


def _arguments(q, k, v, g, beta, **changes) -> dict:
    import inspect

    params = inspect.signature(entry.chunk_kda).parameters
    a = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
    kwargs = {name: changes.pop(name) for name in ("A_log", "dt_bias") if name in changes}
    return dict(a, q=q, k=k, v=v, g=g, beta=beta, kwargs=kwargs, **changes)


def _covered_calls():
    """Every kind of call the boundary admits: (id, arguments by name)."""
    x = _meta_inputs()
    cu = torch.tensor([0, 5, 69, 70])
    layer = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True, output_final_state=True)
    gva = _meta_inputs(HV=4)
    meta = lambda *s: torch.empty(*s, device="meta")   # noqa: E731
    return [
        ("defaults", _arguments(*x)),
        ("l2norm-state", _arguments(*x, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                    initial_state=meta(1, 2, K, V))),
        ("kept-states", _arguments(*x, disable_recompute=True)),
        ("safe-gate", _arguments(*x, safe_gate=True, lower_bound=-5.0)),
        ("varlen", _arguments(*x, cu_seqlens=cu.to("meta"), cu_seqlens_cpu=cu)),
        ("layer-gva", _arguments(*gva, A_log=meta(4), dt_bias=meta(4 * K), **layer)),
        ("layer-sigmoid-gate", _arguments(*gva, lower_bound=-5.0, safe_gate=True, dt_bias=meta(4 * K), **layer)),
    ]


COVERED = _covered_calls()


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("case", COVERED, ids=[c[0] for c in COVERED])
def test_every_covered_call_runs_the_forward_set(case, forward):
    # our forward covers every call the boundary admits: the setting alone decides
    _, arguments = case
    with using_forward(forward):
        call, _ = entry.check_call(dict(arguments))
    assert call.forward == forward


def test_the_patched_route_reads_the_setting_per_call(monkeypatch):
    seen = []
    monkeypatch.setattr(patch, "chunk_kda_op", lambda call, *tensors: seen.append(call.forward) or (None, None))
    routed = patch._route(lambda *a, **k: pytest.fail("a covered call went to FLA's own"))
    q, k, v, g, beta = _meta_inputs()
    q.requires_grad_()
    for forward in ("fla", "ours"):
        with using_forward(forward):
            routed(q, k, v, g, beta)
    assert seen == ["fla", "ours"]


# ----------------------------------------------------------------------------
# the backward on each forward's states
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("forward, v_first, scanned", [
    ("ours", False, False), ("ours", True, False),   # ours: [K, V] in every layout
    ("fla", False, False), ("fla", True, True),      # FLA's kept h is [V, K] with state_v_first
], ids=["ours-kv", "ours-state-v-first", "fla-kv", "fla-state-v-first"])
def test_the_backward_reads_the_forwards_states_where_they_are_ours_layout(forward, v_first, scanned, monkeypatch):
    import kernel.kda_backward as kda_backward

    from kernel.fla_dropin import Call

    handed = []

    def run(batch, q, k, v, g, beta, Aqk, Akk, do, *, states=None, **kw):
        handed.append(states)
        zero = torch.zeros(1)
        return dict(dq=zero, dk=zero, dv=zero, dg=zero, dbeta=zero, dh0=None)

    monkeypatch.setattr(kda_backward, "run", run)
    monkeypatch.setattr(kda_backward, "checked_batch", lambda *a, **k: None)
    B, T, H = 1, 70, 2
    call = Call(B=B, T=T, H=H, HV=H, N=1, offsets=None, scale=K ** -0.5, output_final_state=False,
                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=True,
                state_v_first=v_first, forward=forward, training=True, raw_qk_rows=True)
    x = torch.zeros(B, T, H, K, dtype=torch.bfloat16)
    h = torch.zeros(B, 2, H, K, V, dtype=torch.bfloat16)
    function._ours(call, x, x, x, x.float(), None, torch.zeros(B, T, H), None, None, x, x, h, None, x, None, None)
    assert handed == [None if scanned else h] and (handed[0] is None or handed[0] is h)


def test_our_forward_without_cupy_says_what_to_install_or_set(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)   # an import of it fails
    with pytest.raises(ModuleNotFoundError, match=r"kernel\.chunk_kda's forward .*use_forward\('fla'\).* needs CuPy"):
        function._torch_stream()
