"""kernel.three_pass_forward on the GPU: kernel.forward's contract, held to the same float64 bounds as the one
pass (tests/kernel/forward/test_launch_gpu.py's _check), INV's diagonal blocks the one pass's bits and Aqk's
nearer float64 than the one pass's, inference, torch in and out; and with the gate's cumsum and the l2norm
folded into the products pass (token_gate, l2norm), the same precision. Each pass is tested in its own room;
this is their composition."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward import forward
from kernel.three_pass_forward import three_pass_forward

from .forward.test_launch_gpu import D, _check, _host
from .forward_cases import RAGGED, check_normalised, exact_row_outputs, make_case, rel
from .forward_states_cases import as_torch

pytestmark = pytest.mark.gpu

CASES = {
    "ragged, h0": dict(lengths=RAGGED, H=2, seed=4, initial_state=True),
    "B 2 x T 200": dict(B=2, T=200, H=2, seed=5),
    "GVA, 3 value heads a q head": dict(lengths=RAGGED, H=6, group=3, seed=12, initial_state=True),
    "past fp32's range": dict(lengths=RAGGED + [300], H=2, seed=5, out_of_range=True, initial_state=True),
}


def _run(case: dict, fn=three_pass_forward, *, training: bool = True, final: bool = True, **forms):
    """``fn`` on the case; ``forms``: token_gate (on each token's gate), l2norm (on q and k not normalised, a case
    made with raw_qk), pieces."""
    import cupy

    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    l2norm, token_gate = forms.get("l2norm", False), forms.get("token_gate", False)
    q, k = (case["q_raw"], case["k_raw"]) if l2norm else (case["q"], case["k"])
    return fn(dev(q), dev(k), dev(case["v"]), dev(case["g_token"] if token_gate else case["g"]), dev(case["beta"]),
              scale=case["scale"], initial_state=dev(case["initial_state"]), cu_seqlens=case["cu_seqlens"],
              output_final_state=final, training=training, **forms)


@pytest.mark.parametrize("name", list(CASES))
def test_the_three_passes_match_float64_and_write_the_one_passs_blocks(name):
    case = make_case(**CASES[name])
    three = _run(case)
    _check(three, case, f"three passes, {name}")
    one = _host(_run(case, forward))
    # our backward reads them. INV's: the same bits as the one pass writes (Lkk's operands are one bf16 in both).
    # Aqk's: the products pass's operands are two bf16 each where the one pass's are one, so its blocks are the
    # float64 values within little more than their bf16 store (the model: 0.62-0.64x the one pass's error on
    # these cases)
    m, got = case["blocks"], _host(three)
    x, y = np.where(m, got["Akk"], 0), np.where(m, one["Akk"], 0)
    assert np.array_equal(x, y), f"{name}: Akk's diagonal blocks differ from the one pass's"
    want = np.where(m, case["Aqk"], 0)
    e3, e1 = (rel(np.where(m, out["Aqk"], 0), want) for out in (got, one))
    print(f"{name}: Aqk's diagonal blocks {e3:.3e} against float64, the one pass's {e1:.3e}")
    assert e3 < 0.8 * e1, f"{name}: Aqk's diagonal blocks {e3:.3e} against float64, the one pass's {e1:.3e}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_three_passes_keep_the_one_passs_precision(name):
    # u leaves the products pass in fp16 (log 49), Aqk's operands are two bf16 each and so is Aqk in the o pass:
    # in the model the three passes' o is then 0.82-0.83x the one pass's error on these cases (0.94-0.95x with
    # Aqk in one bf16 there), the final state and the states within 1.01x; on the GPU o is held to 0.9x, the
    # others to 1.08x
    case = make_case(**CASES[name])
    three, one = _host(_run(case)), _host(_run(case, forward))
    for out, bound in (("o", 0.9), ("final", 1.08), ("states", 1.08)):
        want = case[out]
        e3, e1 = (rel(x[out].reshape(want.shape), want) for x in (three, one))
        print(f"{name}: {out} three passes {e3:.3e}, one pass {e1:.3e} against float64")
        assert e3 < bound * e1, f"{name}: {out}: the three passes' {e3:.3e} against the one pass's {e1:.3e}"


def test_inference_writes_o_and_the_final_state_alone_with_the_same_bits():
    case = make_case(lengths=RAGGED, H=2, seed=8, initial_state=True)
    train, infer = _run(case), _run(case, training=False)
    assert (infer.states, infer.Aqk, infer.Akk) == (None, None, None)
    assert np.array_equal(infer.o.get(), train.o.get()) and np.array_equal(infer.final_state.get(), train.final_state.get())
    assert _run(case, training=False, final=False).final_state is None


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    case = make_case(lengths=RAGGED, H=2, seed=9, initial_state=True)
    out_t = three_pass_forward(as_torch(case["q"], True), as_torch(case["k"], True), as_torch(case["v"], True),
                               as_torch(case["g"], False), as_torch(case["beta"], False), scale=case["scale"],
                               initial_state=as_torch(case["initial_state"], False),
                               cu_seqlens=torch.from_numpy(case["cu_seqlens"]).cuda(), output_final_state=True,
                               training=True)
    # every output asked for comes back a torch CUDA tensor; the l2norm build's q, k and rstd are not asked for
    assert all(isinstance(x, torch.Tensor) and x.is_cuda for x in out_t[:5])
    assert (out_t.q, out_t.k, out_t.q_rstd, out_t.k_rstd) == (None,) * 4
    assert out_t.o.dtype == out_t.states.dtype == out_t.Aqk.dtype == torch.bfloat16 and out_t.o.shape[-1] == D
    out_c = _run(case)
    assert np.array_equal(out_t.o.view(torch.int16).cpu().numpy().view(np.uint16), out_c.o.get())
    assert np.array_equal(out_t.states.view(torch.int16).cpu().numpy().view(np.uint16), out_c.states.get())
    assert np.array_equal(out_t.final_state.cpu().numpy(), out_c.final_state.get())


PIECES_CASES = {
    "one sequence, h0": dict(lengths=[64 * 37 + 5], H=2, seed=21, initial_state=True),
    "GVA, past fp32's range": dict(lengths=[64 * 11 + 40], H=6, group=3, seed=22, out_of_range=True),
}


def _pieces(case: dict, pieces: int, *, training: bool = True, final: bool = True):
    import cupy

    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    return three_pass_forward(dev(case["q"]), dev(case["k"]), dev(case["v"]), dev(case["g"]), dev(case["beta"]),
                              scale=case["scale"], initial_state=dev(case["initial_state"]),
                              cu_seqlens=case["cu_seqlens"], output_final_state=final, training=training,
                              pieces=pieces)


@pytest.mark.parametrize("name", list(PIECES_CASES))
def test_one_sequence_in_pieces_gives_the_same_bits_as_in_one(name):
    # the chain hands its fp32 state from piece to piece through memory, and the products and o passes
    # compute each chunk on its own, so any cut gives the bits of the whole: a cut that lost or reordered
    # a chunk, or a chain that ran before its products, would not
    case = make_case(**PIECES_CASES[name])
    whole = _host(_pieces(case, 1))
    _check(_pieces(case, 1), case, f"{name}, one piece")
    for count in (2, 3, 7):
        cut = _host(_pieces(case, count))
        for field in ("o", "final", "states", "Aqk", "Akk"):
            # Aqk's and INV's rows are written in their diagonal blocks' columns alone
            x, y = (np.where(case["blocks"], a[field], 0) if field in ("Aqk", "Akk") else a[field] for a in (cut, whole))
            assert np.array_equal(x, y), f"{name}, {count} pieces: {field} differs from one piece's"


def test_pieces_without_the_final_state_or_training():
    case = make_case(**PIECES_CASES["one sequence, h0"])
    whole = _pieces(case, 1)
    cut = _pieces(case, 4, training=False, final=False)
    assert (cut.states, cut.Aqk, cut.Akk, cut.final_state) == (None, None, None, None)
    assert np.array_equal(cut.o.get(), whole.o.get())


def test_pieces_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    case = make_case(**PIECES_CASES["one sequence, h0"])
    t = lambda x, bits: as_torch(case[x], bits)   # noqa: E731
    out_t = three_pass_forward(t("q", True), t("k", True), t("v", True), t("g", False), t("beta", False),
                               scale=case["scale"], initial_state=t("initial_state", False),
                               cu_seqlens=torch.from_numpy(case["cu_seqlens"]).cuda(), output_final_state=True,
                               training=True, pieces=3)
    # every output asked for comes back a torch CUDA tensor; the l2norm build's q, k and rstd are not asked for
    assert all(isinstance(x, torch.Tensor) and x.is_cuda for x in out_t[:5])
    assert (out_t.q, out_t.k, out_t.q_rstd, out_t.k_rstd) == (None,) * 4
    whole = _pieces(case, 1)
    assert np.array_equal(out_t.o.view(torch.int16).cpu().numpy().view(np.uint16), whole.o.get())
    assert np.array_equal(out_t.states.view(torch.int16).cpu().numpy().view(np.uint16), whole.states.get())
    assert np.array_equal(out_t.final_state.cpu().numpy(), whole.final_state.get())


def test_the_chain_of_pieces_runs_on_a_stream_of_the_devices_highest_priority():
    # the chain's stream is one per device, non-blocking, at the top of the range the driver reports
    # (cudaDeviceGetStreamPriorityRange through cuda-bindings; torch's own streams stop at -3, the H200's
    # range goes to -5), whatever number builds.HIGHEST_PRIORITY asked for
    torch = pytest.importorskip("torch")
    cudart = pytest.importorskip("cuda.bindings.runtime")
    import cupy

    from kernel.runtime import builds

    device = cupy.cuda.Device().id
    stream = builds.serial_stream(device)
    assert stream is builds.serial_stream(device) and stream is not builds.side_stream(device)
    err, least, greatest = cudart.cudaDeviceGetStreamPriorityRange()
    assert err == cudart.cudaError_t.cudaSuccess and greatest < least
    assert torch.cuda.ExternalStream(stream.ptr).priority == greatest


# ----------------------------------------------------------------------------
# the folds: each token's gate summed over the chunk, q and k normalised in the products pass
# ----------------------------------------------------------------------------

FOLDS = {"token gate": dict(token_gate=True), "l2norm": dict(l2norm=True),
         "token gate and l2norm": dict(token_gate=True, l2norm=True)}


@pytest.mark.parametrize("fold", list(FOLDS))
@pytest.mark.parametrize("name", ["ragged, h0", "GVA, 3 value heads a q head", "past fp32's range"])
def test_the_folded_three_passes_keep_their_precision(name, fold):
    # the gate's sums round differently (the model: 0.9999-1.0004x the cumsum form's errors): held to 1.02x.
    # The l2norm build folds each row's rstd into its fp32 operands where the plain build reads the rows normalised
    # and rounded to bf16, so both are measured against float64 on the raw rows normalised unrounded, toward which
    # the fold computes. It must come nearer: 0.84x (o, final) and 0.91x (states) in the one pass's model on these
    # cases, held to 0.95x
    case = make_case(**CASES[name], raw_qk=True)
    folded = _run(case, **FOLDS[fold])
    _check(folded, case, f"three passes, {name}, {fold}")
    got, plain = _host(folded), _host(_run(case))
    l2norm = FOLDS[fold].get("l2norm", False)
    refs, bound = (exact_row_outputs(case, CASES[name].get("group", 1)), 0.95) if l2norm else (case, 1.02)
    for out in ("o", "final", "states"):
        want = refs[out]
        e_fold, e_plain = (rel(x[out].reshape(want.shape), want) for x in (got, plain))
        print(f"{name}, {fold}: {out} {e_fold:.3e}, the plain build's {e_plain:.3e} against float64")
        assert e_fold < bound * e_plain, f"{name}, {fold}: {out} {e_fold:.3e} against the plain build's {e_plain:.3e}"
    if l2norm:
        check_normalised(folded, case, f"three passes, {name}")
    else:
        assert (folded.q, folded.k, folded.q_rstd, folded.k_rstd) == (None,) * 4


def test_the_folded_passes_in_pieces_give_the_bits_of_one():
    case = make_case(**PIECES_CASES["GVA, past fp32's range"], raw_qk=True)
    whole, cut = (_run(case, token_gate=True, l2norm=True, pieces=n) for n in (1, 3))
    for field in ("o", "final_state", "states", "q", "k", "q_rstd", "k_rstd"):
        assert np.array_equal(getattr(whole, field).get(), getattr(cut, field).get()), field
