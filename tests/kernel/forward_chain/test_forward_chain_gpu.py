"""kernel.forward_chain on the GPU: against its numpy arithmetic (tests/kernel/three_pass_model.py.chain)
and, with the numpy products and o passes around it, against float64 (kernel.reference.kda_forward_reference,
the case's outputs).

The operands are the numpy products pass's on tests/kernel/forward_cases' inputs (the study's recipes: ragged
with an initial state, past fp32's range, the trained-layer gate), u in fp16 with its scale as
kernel.forward_products stores it. The kernel sums its MMAs in another order
than numpy's float64-then-round, so a bf16 rounding of S or v_new can land on the other side now and then, and
the chain carries that on: the GPU is held to its model within 2e-3 (relative Frobenius; measured far below),
and its three-pass o, states and final state to float64 within 1.25x the model's own error, as the CPU study
holds the model to the one pass. Different ring depths give the same bits, and so do two calls.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.ds_scan.launch import bits_to_f32
from kernel.forward_chain import Config, NSTAGES, forward_chain
from kernel.runtime.arrays import bf16_bits

from ..forward_cases import rel
from ..three_pass_model import case_inputs, case_of, chain, o_pass, operands

pytestmark = pytest.mark.gpu

RECIPES = ["ragged", "past fp32's range", "trained-layer gate"]
MODEL_BOUND = 2e-3


def _operands(recipe: str) -> tuple[dict, dict]:
    case = case_of(recipe)
    return case, operands(*case_inputs(case), scale=case["scale"], u_format="fp16")


def _u_scale(ops: dict) -> np.ndarray:
    """[chunks, HV, 4]: the model's scale in element 0, as the chain reads it."""
    out = np.zeros((*ops["u_scale"].shape, 4), np.float32)
    out[..., 0] = ops["u_scale"]
    return out


def _run(ops: dict, h0, config: Config | None = None, *, final: bool = True) -> dict:
    import cupy

    dev = lambda x: cupy.asarray(bf16_bits(x))   # noqa: E731  bf16 values -> their bits on the GPU
    out = forward_chain(dev(ops["w"]), cupy.asarray(ops["u"].astype(np.float16)), dev(ops["kg"]),
                        cupy.asarray(ops["decay"]), cupy.asarray(_u_scale(ops)), cu_chunks=ops["cu_chunks"],
                        initial_state=None if h0 is None else cupy.asarray(h0),
                        output_final_state=final, config=config)
    return {"states": bits_to_f32(out.states.get()), "v_new": bits_to_f32(out.v_new.get()),
            "final": None if out.final_state is None else out.final_state.get()}


@pytest.fixture(scope="module", params=RECIPES)
def recipe(request):
    pytest.importorskip("torch")   # the trained-layer gate is drawn with torch
    case, ops = _operands(request.param)
    model = chain(ops["w"], ops["u"], ops["kg"], ops["decay"], ops["cu_chunks"], case["initial_state"], ops["u_scale"])
    return request.param, case, ops, model, _run(ops, case["initial_state"])


def test_the_chain_is_its_model(recipe):
    name, _, _, model, gpu = recipe
    for out in ("states", "v_new", "final"):
        err = rel(gpu[out], model[out])
        assert err < MODEL_BOUND, f"{name}: {out} is {err:.2e} from the numpy chain"


def test_three_passes_on_the_gpu_chain_keep_the_models_precision(recipe):
    name, case, ops, model, gpu = recipe
    H, lengths = case["H"], case["lengths"]
    aqk = ops["aqk_hi"], ops["aqk_lo"]
    o_gpu = o_pass(ops["qg"], *aqk, gpu["states"], gpu["v_new"], lengths)
    o_model = o_pass(ops["qg"], *aqk, model["states"], model["v_new"], lengths)
    for out, g, m in (("o", o_gpu, o_model), ("final", gpu["final"], model["final"]),
                      ("states", gpu["states"], model["states"])):
        ref = case[out]
        err_gpu, err_model = rel(g.reshape(ref.shape), ref), rel(m.reshape(ref.shape), ref)
        assert err_gpu < 1.25 * err_model and err_gpu < 1e-2, f"{name}: {out} {err_gpu:.2e} (model {err_model:.2e})"
    assert H == case["H"]


def test_ring_depths_and_repeats_give_the_same_bits():
    case, ops = _operands("ragged")
    runs = [_run(ops, case["initial_state"], Config(nstage=n)) for n in NSTAGES]
    runs.append(_run(ops, case["initial_state"], Config(nstage=NSTAGES[0])))
    for other in runs[1:]:
        for out in ("states", "v_new", "final"):
            np.testing.assert_array_equal(other[out], runs[0][out], err_msg=out)


def test_without_initial_or_final_state():
    case, ops = _operands("ragged")
    zero_h0 = np.zeros_like(case["initial_state"])
    a = _run(ops, None, final=False)
    b = _run(ops, zero_h0)
    assert a["final"] is None
    for out in ("states", "v_new"):
        np.testing.assert_array_equal(a[out], b[out], err_msg=out)


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    case, ops = _operands("ragged")
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float32)).cuda()   # noqa: E731
    out = forward_chain(t(ops["w"]).bfloat16(), t(ops["u"]).half(), t(ops["kg"]).bfloat16(), t(ops["decay"]),
                        t(_u_scale(ops)), cu_chunks=ops["cu_chunks"], initial_state=t(case["initial_state"]))
    assert out.states.dtype == torch.bfloat16 and out.final_state.dtype == torch.float32
    ref = _run(ops, case["initial_state"])
    np.testing.assert_array_equal(out.states.float().cpu().numpy(), ref["states"])
    np.testing.assert_array_equal(out.final_state.cpu().numpy(), ref["final"])
