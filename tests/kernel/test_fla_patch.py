"""kernel.patch_fla: FLA's KDA op routed to ours in every module that holds it, and back.

CPU, with fla-core installed (it imports without a GPU): the switch replaces FLA's function in
fla.ops.kda, in FLA's own modules and in a module that imported it by name, a module imported
after the switch gets the routed op, the undo and the context manager put FLA's back, a call this
op does not cover goes to FLA's own with one warning naming the argument, and a call without
gradients (no_grad, inference_mode, no input requiring grad) runs ours, in inference mode. The GPU
half (a layer trained through the switch) is in tests/kernel/test_fla_layer_gpu.py; a no-grad call
through the switch on the GPU in tests/kernel/test_fla_library_gpu.py.
"""
import contextlib
import importlib
import sys
import types
import warnings

import pytest

torch = pytest.importorskip("torch")

import kernel  # noqa: E402
from kernel import fla_dropin  # noqa: E402


def _fla():
    pytest.importorskip("triton", reason="fla-core needs triton")
    return pytest.importorskip("fla.ops.kda", reason="fla-core 0.6.0 is not installed")


@pytest.fixture(autouse=True)
def _unpatched():
    fla_dropin.unpatch_fla()
    yield
    fla_dropin.unpatch_fla()


def test_without_fla_the_switch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla.ops.kda", None)   # an import of it fails
    with pytest.raises(ImportError, match="install fla-core 0.6.0"):
        kernel.patch_fla()
    assert not fla_dropin.is_patched()


def test_the_switch_reaches_every_holder_and_the_undo_every_one():
    fla_kda = _fla()
    original = fla_kda.chunk_kda
    user = types.ModuleType("a_users_model")
    user.kda_op = original                       # as `from fla.ops.kda import chunk_kda as kda_op`
    sys.modules[user.__name__] = user
    try:
        holders = [(m, n) for m in list(sys.modules.values()) if m is not None
                   for n, v in getattr(m, "__dict__", {}).items() if v is original]
        assert (fla_kda, "chunk_kda") in holders and (user, "kda_op") in holders
        kernel.patch_fla()
        kernel.patch_fla()                       # idempotent
        routed = fla_kda.chunk_kda
        assert routed is not original and routed.__kernel_routes__ is original
        assert all(getattr(m, n) is routed for m, n in holders)
        from fla.ops.kda import chunk_kda as later   # a module imported after the switch
        assert later is routed
        kernel.unpatch_fla()
        assert all(getattr(m, n) is original for m, n in holders)
        kernel.unpatch_fla()                     # idempotent
    finally:
        del sys.modules[user.__name__]


def test_the_context_manager_restores_the_state_before_it():
    fla_kda = _fla()
    original = fla_kda.chunk_kda
    with kernel.patched_fla():
        assert fla_kda.chunk_kda is not original
        with kernel.patched_fla():
            pass
        assert fla_kda.chunk_kda is not original   # an inner block leaves the outer one patched
    assert fla_kda.chunk_kda is original


def test_a_call_not_covered_runs_flas_own_with_one_warning_naming_the_argument():
    # the routing around a function that records its calls in place of FLA's (FLA's own would run
    # Triton, which a CPU does not have): which path a call takes is what is checked here
    seen = []
    routed = fla_dropin.patch._route(lambda *a, **k: seen.append(sorted(k)) or "fla's")
    q = torch.zeros(1, 8, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    args = (q, q.detach(), q.detach(), torch.zeros(1, 8, 2, 128), torch.zeros(1, 8, 2))
    fla_dropin.forget_warnings()
    with pytest.warns(fla_dropin.FallbackWarning, match=r"FLA's own chunk_kda runs .*does not cover chunk_size=32"):
        assert routed(*args, chunk_size=32) == "fla's"
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # the second time: no warning
        assert routed(*args, chunk_size=32) == "fla's"
    with pytest.warns(fla_dropin.FallbackWarning, match=r"q: expected a CUDA tensor"):
        assert routed(*args) == "fla's"      # covered, but on the CPU: FLA's own
    with torch.no_grad(), pytest.warns(fla_dropin.FallbackWarning, match=r"does not cover cp_context"):
        assert routed(*args, cp_context=object()) == "fla's"   # no graph to build: the same rule
    assert seen == [["chunk_size"], ["chunk_size"], [], ["cp_context"]]


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "no-input-requires-grad"])
def test_a_call_without_gradients_runs_ours_in_inference_mode(how, monkeypatch):
    # our forward out of training mode keeps nothing for a backward: such a call no longer needs
    # FLA's own; meta tensors pass the boundary (our op's fakes would serve them)
    routed = fla_dropin.patch._route(lambda *a, **k: "fla's")
    ours = []
    monkeypatch.setattr(fla_dropin.patch, "chunk_kda_op", lambda call, *tensors: ours.append(call) or "ours")
    q = torch.zeros(1, 8, 2, 128, dtype=torch.bfloat16, device="meta", requires_grad=how != "no-input-requires-grad")
    args = (q, q.detach(), q.detach(), torch.zeros(1, 8, 2, 128, device="meta"), torch.zeros(1, 8, 2, device="meta"))
    mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(how, contextlib.nullcontext)
    with mode(), warnings.catch_warnings():
        warnings.simplefilter("error")       # covered: no fallback, no warning
        assert routed(*args) == "ours"
    assert [call.training for call in ours] == [False]
    q.requires_grad_(True)
    assert routed(*args) == "ours" and ours[-1].training     # with a gradient to ask for: training mode


def test_import_kernel_still_needs_no_torch_for_the_switch_names():
    assert set(kernel.__all__) >= {"chunk_kda", "patch_fla", "unpatch_fla", "patched_fla"}
    assert importlib.import_module("kernel").patch_fla is fla_dropin.patch_fla


def test_flas_own_layer_module_gets_the_routed_op():
    fla_kda = _fla()
    layer = pytest.importorskip("fla.layers.kda", reason="flash-linear-attention (with transformers) is not installed")
    original = fla_kda.chunk_kda
    assert layer.chunk_kda is original
    with kernel.patched_fla():
        assert layer.chunk_kda is fla_kda.chunk_kda is not original   # the name the layer's forward calls
    assert layer.chunk_kda is original
