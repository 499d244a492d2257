"""kernel.forward_products on the GPU: against its numpy arithmetic (tests/kernel/three_pass_model.py
.operands) and, with kernel.forward_chain and the numpy o pass after it, against float64 (the case's outputs,
kernel.reference.kda_forward_reference).

The recipes are the three-pass study's (ragged with an initial state, past fp32's range, the trained-layer
gate). The kernel's exp2 is the MUFU's (a few fp32 ulps from numpy's) and its MMAs sum in another order than
numpy's float64-then-round, so a bf16 output lands one step the other side now and then: each output is held
to the model within MODEL_BOUNDS (relative Frobenius), and the three passes on the GPU to float64 within
1.25x the model's own error, as the CPU study holds the model to the one pass. The model's Aqk is the kernel's
split arithmetic (mm_split: its factorised operands two bf16 each, three MMAs). Aqk goes out in two bf16 parts:
aqk (hi) is held to the model's hi, and hi + lo to the model's fp32 Aqk within AQK_TWO_PARTS, 30x below what hi
alone leaves (1.7e-3 on the ragged recipe) and 20x above the split's own 2.5e-6; lo is at most half a bf16
step of hi (so hi + lo is the pair split_bf16 gives, up to a tie), zero where hi is. lo's bits cannot be held
to the model's: the kernel's fp32 Aqk differs from numpy's in its last bits (exp2, the sums' order), which
lo's 8 bits reach in a few percent of the elements. Aqk's and INV's diagonal blocks, which our backward
reads, are held to the one-pass forward's (kernel.forward) within 1e-2 (Aqk's operands are one bf16 each
there: in the models the two are about 3e-3 apart), and Aqk's are aqk's bits (the backward reads one bf16).

The folds: the token-gate build (each token's gate, summed over the chunk here) is held to its model the same
way; the l2norm build writes q and k as float64 normalises them (within a last bf16 bit), and its products are
held to the model on the raw rows times their rstd in fp32 (the build folds the rstd, docs/log/68).
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.ds_scan.launch import bits_to_f32
from kernel.forward import forward
from kernel.forward_chain import forward_chain
from kernel.forward_products import CHUNK_MAJOR, chunk_table, forward_products
from kernel.shapes import HEAD_DIM

from ..forward_cases import RAGGED, check_normalised, folded_rows, make_case, rel
from ..three_pass_model import case_inputs, case_of, chain, o_pass, operands

pytestmark = pytest.mark.gpu

RECIPES = ["ragged", "past fp32's range", "trained-layer gate"]
MODEL_BOUNDS = {"w": 3e-3, "u": 3e-3, "kg": 1e-3, "qg": 1e-3, "aqk": 2e-3, "decay": 1e-5}
AQK_TWO_PARTS = 5e-5     # hi + lo against the model's fp32 Aqk (relative Frobenius)


def _run(case: dict, *, token_gate: bool = False, l2norm: bool = False, training: bool = True):
    """The pass on the case; ``token_gate``: on each token's gate; ``l2norm``: on q and k not normalised (a case
    made with raw_qk)."""
    import cupy

    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    q, k = (case["q_raw"], case["k_raw"]) if l2norm else (case["q"], case["k"])
    return forward_products(dev(q), dev(k), dev(case["v"]), dev(case["g_token"] if token_gate else case["g"]),
                            dev(case["beta"]), scale=case["scale"], cu_seqlens=case["cu_seqlens"], training=training,
                            token_gate=token_gate, l2norm=l2norm)


def _model(case: dict, token_gate: bool = False) -> dict:
    return operands(*case_inputs(case, token_gate), scale=case["scale"], u_format="fp16", token_gate=token_gate)


def _host(x) -> np.ndarray:
    x = x.get()
    return bits_to_f32(x) if x.dtype == np.uint16 else x.astype(np.float32)


@pytest.fixture(scope="module", params=RECIPES)
def recipe(request):
    pytest.importorskip("torch")   # the trained-layer gate is drawn with torch
    case = case_of(request.param)
    return request.param, case, _model(case), _run(case)


def test_the_products_are_their_model(recipe):
    name, _, model, gpu = recipe
    _held_to_model(name, model, gpu)


def _held_to_model(name: str, model: dict, gpu) -> None:
    # u (fp16) as the chain reads it, times its scale: the kernel sums INV's row magnitudes in another order
    # than numpy, so where a chunk's bound sits on a power of two its scale may be the model's times 2
    np.testing.assert_array_equal(gpu.cu_chunks, model["cu_chunks"])
    scale = _host(gpu.u_scale)
    assert (scale[..., 1:] == 0).all() and np.all(np.log2(scale[..., 0]) == np.round(np.log2(scale[..., 0])))
    same = np.mean(scale[..., 0] == model["u_scale"])
    print(f"{name}: u's scale the model's in {same:.4f} of the chunks")
    assert same > 0.99
    for out, bound in MODEL_BOUNDS.items():
        ref = model["aqk_hi"] if out == "aqk" else model[out]
        got = _host(getattr(gpu, out))
        if out == "u":
            got, ref = got * scale[..., :1, None], ref * model["u_scale"][..., None, None]
        err = rel(got, ref)
        print(f"{name}: {out} {err:.2e} from the model")
        assert err < bound, f"{name}: {out} is {err:.2e} from the numpy products pass"
    _aqk_in_two_parts(name, model, gpu)


def _aqk_in_two_parts(name: str, model: dict, gpu) -> None:
    hi, lo = _host(gpu.aqk).astype(np.float64), _host(gpu.aqk_lo).astype(np.float64)
    assert np.isfinite(lo).all(), f"{name}: aqk_lo is not finite"
    assert np.all(np.abs(lo) <= 2.0 ** -8 * np.abs(hi)), f"{name}: aqk_lo is past half a bf16 step of aqk"
    assert np.all(lo[hi == 0] == 0), f"{name}: aqk_lo is not zero where aqk is (above the diagonal, past L)"
    err = rel(hi + lo, model["aqk"])
    print(f"{name}: aqk + aqk_lo {err:.2e} from the model's fp32 Aqk (aqk alone {rel(hi, model['aqk']):.2e})")
    assert err < AQK_TWO_PARTS, f"{name}: aqk + aqk_lo is {err:.2e} from the numpy products pass's Aqk"


def test_three_passes_on_the_gpu_keep_the_models_precision(recipe):
    name, case, model, gpu = recipe
    _three_passes_keep_the_models_precision(name, case, model, gpu)


def _three_passes_keep_the_models_precision(name: str, case: dict, model: dict, gpu) -> None:
    import cupy

    h0 = case["initial_state"]
    walked = forward_chain(gpu.w, gpu.u, gpu.kg, gpu.decay, gpu.u_scale, cu_chunks=gpu.cu_chunks,
                           initial_state=None if h0 is None else cupy.asarray(h0))
    states, v_new = _host(walked.states), _host(walked.v_new)
    o = o_pass(_host(gpu.qg), _host(gpu.aqk), _host(gpu.aqk_lo), states, v_new, case["lengths"])
    ref_chain = chain(model["w"], model["u"], model["kg"], model["decay"], model["cu_chunks"], h0, model["u_scale"])
    o_model = o_pass(model["qg"], model["aqk_hi"], model["aqk_lo"], ref_chain["states"], ref_chain["v_new"],
                     case["lengths"])
    for out, g, m in (("o", o, o_model), ("final", walked.final_state.get(), ref_chain["final"]),
                      ("states", states, ref_chain["states"])):
        ref = case[out]
        err_gpu, err_model = rel(g.reshape(ref.shape), ref), rel(m.reshape(ref.shape), ref)
        print(f"{name}: {out} {err_gpu:.2e} against float64 (model {err_model:.2e})")
        assert err_gpu < 1.25 * err_model and err_gpu < 1e-2, f"{name}: {out} {err_gpu:.2e} (model {err_model:.2e})"


def test_the_blocks_for_the_backward_are_the_one_passes(recipe):
    import cupy

    name, case, _, gpu = recipe
    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    one = forward(dev(case["q"]), dev(case["k"]), dev(case["v"]), dev(case["g"]), dev(case["beta"]),
                  scale=case["scale"], cu_seqlens=case["cu_seqlens"], training=True)
    for out in ("Aqk", "Akk"):
        a, b = _host(getattr(gpu, out)), _host(getattr(one, out))
        mask = np.broadcast_to(_own_blocks(case), a.shape)
        err = rel(a[mask], b[mask])
        print(f"{name}: {out}'s diagonal blocks {err:.2e} from the one pass's")
        assert err < 1e-2, f"{name}: {out}'s blocks are {err:.2e} from the one pass's"
    # Aqk's blocks are the hi part's bits (the backward reads one bf16), row by row of each chunk
    table = chunk_table(np.concatenate([[0], np.cumsum(case["lengths"])]).astype(np.int64))
    chunk = np.concatenate([np.full(L, c) for c, (_, L) in enumerate(table)])
    row = np.concatenate([np.arange(L) for _, L in table])
    token = np.concatenate([t0 + np.arange(L) for t0, L in table])
    hi = gpu.aqk.get()
    blocks = gpu.Aqk.get().reshape(-1, *hi.shape[1:3])          # [tokens, HV, 64], sequence after sequence
    mask = np.broadcast_to(_own_blocks(case)[0], blocks.shape)
    np.testing.assert_array_equal(blocks[token][mask], hi[chunk, :, row][mask], err_msg=f"{name}: Aqk's blocks")


def _own_blocks(case: dict) -> np.ndarray:
    """[1, tokens, 1, 64]: each row's own 16 x 16 block's columns, the part of Aqk and Akk the pass writes
    (the rest of each row is left as it was allocated)."""
    pos = np.concatenate([np.arange(n) for n in case["lengths"]])          # each token's place in its sequence
    return ((np.arange(64)[None, :] // 16) == ((pos[:, None] % 64) // 16))[None, :, None, :]


def test_two_calls_give_the_same_bits():
    case = case_of("ragged")
    a, b = _run(case), _run(case)
    for out in CHUNK_MAJOR:
        np.testing.assert_array_equal(_host(getattr(a, out)), _host(getattr(b, out)), err_msg=out)
    for out in ("Aqk", "Akk"):
        x, y = _host(getattr(a, out)), _host(getattr(b, out))
        mask = np.broadcast_to(_own_blocks(case), x.shape)
        np.testing.assert_array_equal(x[mask], y[mask], err_msg=out)


# ----------------------------------------------------------------------------
# the folds: each token's gate summed over the chunk (token_gate), q and k normalised here (l2norm)
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", RECIPES)
def test_the_token_gate_build_is_its_model_and_keeps_its_precision(name):
    pytest.importorskip("torch")   # the trained-layer gate is drawn with torch
    case = case_of(name)
    model, gpu = _model(case, token_gate=True), _run(case, token_gate=True)
    _held_to_model(f"{name}, token gate", model, gpu)
    _three_passes_keep_the_models_precision(f"{name}, token gate", case, model, gpu)


L2NORM_CASES = {
    "ragged, past fp32's range": dict(lengths=RAGGED + [300], H=2, seed=4, initial_state=True, out_of_range=True),
    "GVA, 2 value heads a q head": dict(lengths=[1, 17, 200], H=4, group=2, seed=6, initial_state=True),
}


@pytest.mark.parametrize("token_gate", [False, True], ids=["cumsum", "token gate"])
@pytest.mark.parametrize("name", list(L2NORM_CASES))
def test_the_l2norm_build_normalises_as_float64_and_folds_each_rows_rstd_as_its_model(name, token_gate):
    # under GVA the CTA of each query head's first value head writes its rows: every row written once. The pass
    # keeps the raw rows and scales each by its rstd in fp32 as it forms an operand, so its model takes each raw
    # row times its rstd in fp32, not rounded to bf16 (forward_cases.folded_rows, as the one pass's rstd build)
    case = make_case(**L2NORM_CASES[name], raw_qk=True)
    label = f"{name}, {'token gate' if token_gate else 'cumsum'}"
    out = _run(case, token_gate=token_gate, l2norm=True)
    check_normalised(out, case, label)
    H = case["H"]
    q, k = (x.reshape(-1, H, HEAD_DIM) for x in folded_rows(case, L2NORM_CASES[name].get("group", 1)))
    model = operands(q, k, *case_inputs(case, token_gate)[2:], scale=case["scale"], u_format="fp16",
                     token_gate=token_gate)
    _held_to_model(label, model, out)
    _three_passes_keep_the_models_precision(label, case, model, out)


def _same_inputs(case: dict, token_gate: bool) -> tuple:
    """v, g (the build's form), beta on the device."""
    import cupy

    return (cupy.asarray(case["v"]), cupy.asarray(case["g_token"] if token_gate else case["g"]),
            cupy.asarray(case["beta"]))


def test_the_folded_builds_in_inference_write_the_training_bits_and_no_rows():
    case = make_case(**L2NORM_CASES["ragged, past fp32's range"], raw_qk=True)
    train, infer = (_run(case, token_gate=True, l2norm=True, training=t) for t in (True, False))
    assert (infer.q, infer.k, infer.q_rstd, infer.k_rstd, infer.Aqk, infer.Akk) == (None,) * 6
    for field in CHUNK_MAJOR:
        np.testing.assert_array_equal(_host(getattr(infer, field)), _host(getattr(train, field)), err_msg=field)


@pytest.mark.parametrize("token_gate", [False, True], ids=["cumsum", "token gate"])
def test_without_norm_copies_the_l2norm_build_writes_the_same_rstd_and_products_and_no_rows(token_gate):
    case = make_case(**L2NORM_CASES["GVA, 2 value heads a q head"], raw_qk=True)
    full = _run(case, token_gate=token_gate, l2norm=True)
    import cupy

    alone = forward_products(cupy.asarray(case["q_raw"]), cupy.asarray(case["k_raw"]), *_same_inputs(case, token_gate),
                             scale=case["scale"], cu_seqlens=case["cu_seqlens"], training=True, token_gate=token_gate,
                             l2norm=True, norm_copies=False)
    assert alone.q is None and alone.k is None
    for field in (*CHUNK_MAJOR, "q_rstd", "k_rstd"):
        np.testing.assert_array_equal(_host(getattr(alone, field)), _host(getattr(full, field)), err_msg=field)


def test_the_folded_builds_give_the_same_bits_twice():
    case = make_case(**L2NORM_CASES["GVA, 2 value heads a q head"], raw_qk=True)
    a, b = (_run(case, token_gate=True, l2norm=True) for _ in range(2))
    for field in (*CHUNK_MAJOR, "q", "k", "q_rstd", "k_rstd"):
        np.testing.assert_array_equal(_host(getattr(a, field)), _host(getattr(b, field)), err_msg=field)
