"""kernel.forward_output on the GPU: against its numpy arithmetic (tests/kernel/three_pass_model.py.o_pass).

The operands are the numpy first pass's and chain's on tests/kernel/forward_cases' inputs (the study's recipes:
ragged, past fp32's range, the trained-layer gate): qg, Aqk in its two bf16 parts (split_bf16 of the model's
fp32 Aqk: the products pass stores them so, and o_pass reads hi + lo), the states and v_new.

The bound (:func:`within_rounding`). Kernel and model take the same bf16 operands and differ only in how they
sum their exact products in fp32: the model each of qg S and (hi + lo) v_new whole in float64, rounded to fp32,
then their sum; the kernel 16 MMA k-steps (qg S's 8, Aqk_hi v_new's 4, Aqk_lo v_new's 4) into one fp32
accumulator, each k-step adding 16 products and the accumulator with the tensor core's own alignment and
rounding (at worst a truncation of every term below the largest one's last fp32 bit: 17 terms, 2^-23 of the
largest each). So before o's one bf16 rounding the two differ by at most 16 * 17 * 2^-23 + 3 * 2^-24
< 2^-14.9 of the terms' absolute sum M = |qg| |S| + (|Aqk_hi| + |Aqk_lo|) |v_new|, element by element; each
bf16 rounding then moves an element by at most half a bf16 ulp of itself. An element may therefore differ by
one bf16 ulp of the larger of the two, plus 2^-14 M (a 1.8x margin over 2^-14.9). A wrong fragment, operand
or row gives differences of the elements' own size; a bf16 ulp is 2^-8 of one, and the fp32 part 2^-11.7 at
the recipes' median M / |o| of about 5 (more only where o cancels). Most elements round alike (asserted: at
least 99%; the numpy model summed in the kernel's k-steps rounds all but fewer than 1 in 10,000 alike), and
the whole o is held within 1e-3 (relative Frobenius) of it. The lo part is read: without it (zeros), o moves
off the model's by a bf16 step in a share of its elements (asserted).

Rows: a sequence's last chunk has L < 64 real rows and only those are written: each length of the ragged
recipe runs alone into an o with guard rows after it, every real row written, no guard row touched. The
warp counts give the same bits (the same k-steps in the same order for every element), and so do two calls.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.ds_scan.launch import bits_to_f32
from kernel.forward_output import WARPS, Config, forward_output, launch_planned, plan_output
from kernel.runtime.arrays import bf16_bits

from ..forward_cases import D, rel
from ..three_pass_model import case_inputs, case_of, chain, o_pass, operands

pytestmark = pytest.mark.gpu

RECIPES = ["ragged", "past fp32's range", "trained-layer gate"]
MODEL_BOUND = 1e-3       # relative Frobenius
SUM_ORDER = 2.0 ** -14   # of M = |qg| |S| + |Aqk| |v_new|, an element's fp32 difference before rounding (above)
EQUAL = 0.99             # the share of elements that round alike at least
SENTINEL = 0xFFFF        # a bf16 NaN: what no row of o can hold


def bf16_ulp(x) -> np.ndarray:
    """The spacing of bf16 at |x| (8 significant bits): 2^(e - 8) for |x| in [2^(e - 1), 2^e); 0 at 0."""
    m, e = np.frexp(np.abs(np.asarray(x, dtype=np.float64)))
    return np.where(m > 0, np.ldexp(1.0, e - 8), 0.0)


def within_rounding(got, want, ops, lengths) -> None:
    """got (the kernel's o) within the module docstring's bound of want (o_pass's), both [tokens, HV, 128] bf16
    values; ops = (qg, states, aqk, aqk_lo, v_new) as the kernel takes them, lengths the sequences'."""
    qg, states, aqk, aqk_lo, v_new = (np.abs(np.asarray(x, dtype=np.float32)) for x in ops)
    # M by the o pass itself on the operands' magnitudes (its final bf16 rounding costs M 2^-9 at most)
    M = o_pass(qg, aqk, aqk_lo, states, v_new, lengths).astype(np.float64) * (1 + 2.0 ** -8)
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape and np.isfinite(got).all()
    err = rel(got, want)
    assert err < MODEL_BOUND, f"o is {err:.2e} from the numpy o pass (relative Frobenius)"
    diff = np.abs(got - want)
    bound = bf16_ulp(np.maximum(np.abs(got), np.abs(want))) + SUM_ORDER * M
    worst = np.unravel_index(np.argmax(diff - bound), diff.shape)
    assert np.all(diff <= bound), (f"o[{worst}] = {got[worst]} against {want[worst]}: {diff[worst]:.3e} is past "
                                   f"{bound[worst]:.3e}")
    equal = float(np.mean(got == want))
    assert equal >= EQUAL, f"only {equal:.4f} of o's elements are the model's bits"


def _operands(recipe: str) -> tuple[tuple, list[int]]:
    """((qg, states, aqk, aqk_lo, v_new) as bf16 values, the sequences' lengths) of a recipe."""
    case = case_of(recipe)
    ops = operands(*case_inputs(case), scale=case["scale"], u_format="fp16")   # u as kernel.forward_products stores it
    walked = chain(ops["w"], ops["u"], ops["kg"], ops["decay"], ops["cu_chunks"], case["initial_state"], ops["u_scale"])
    return ((ops["qg"], walked["states"], ops["aqk_hi"], ops["aqk_lo"], walked["v_new"]),
            [int(n) for n in case["lengths"]])


def _model(ops, lengths) -> np.ndarray:
    qg, states, aqk, aqk_lo, v_new = ops
    return o_pass(qg, aqk, aqk_lo, states, v_new, lengths)


def _device(ops):
    import cupy

    return [cupy.asarray(bf16_bits(x)) for x in ops]   # bf16 values -> their bits on the GPU


def _run(ops, lengths, config: Config | None = None, *, cu_seqlens="lengths") -> np.ndarray:
    cu = np.cumsum([0, *lengths]) if cu_seqlens == "lengths" else cu_seqlens
    return bits_to_f32(forward_output(*_device(ops), cu_seqlens=cu, config=config).get())


@pytest.fixture(scope="module", params=RECIPES)
def recipe(request):
    pytest.importorskip("torch")   # the trained-layer gate is drawn with torch
    ops, lengths = _operands(request.param)
    return request.param, ops, lengths, _model(ops, lengths), _run(ops, lengths)


@pytest.fixture(scope="module")
def ragged():
    ops, lengths = _operands("ragged")
    return ops, lengths, _run(ops, lengths)


def test_o_is_its_model(recipe):
    _, ops, lengths, model, gpu = recipe
    within_rounding(gpu, model, ops, lengths)


def test_aqks_lo_part_is_read(ragged):
    # zeros for the lo part give the o pass of Aqk in one bf16 (its model then too), a bf16 step off the
    # two-part o in a share of the elements
    ops, lengths, two_parts = ragged
    one = (*ops[:3], np.zeros_like(ops[3]), ops[4])
    alone = _run(one, lengths)
    within_rounding(alone, _model(one, lengths), one, lengths)
    share = float(np.mean(alone != two_parts))
    assert share > 0.1, f"only {share:.4f} of o's elements moved without Aqk's lo part"   # 0.38-0.39 in the model


@pytest.mark.parametrize("warps", WARPS)
def test_only_real_rows_are_written(ragged, warps):
    # each sequence alone, its chunks' operands, into an o with a chunk of guard rows after its tokens
    import cupy

    ops, lengths, batch = ragged
    chunk_of = np.cumsum([0, *(-(-n // 64) for n in lengths)])
    token_of = np.cumsum([0, *lengths])
    on_device = _device(ops)
    for n, length in enumerate(lengths):
        mine = [x[chunk_of[n]:chunk_of[n + 1]] for x in on_device]
        plan = plan_output(*mine, cu_seqlens=[0, length], config=Config(warps=warps))
        buf = cupy.full((length + 64, plan.HV, D), SENTINEL, dtype=np.uint16)
        launch_planned(plan, *mine, buf[:length])
        out = buf.get()
        assert np.all(out[length:] == SENTINEL), f"length {length}: a row past the sequence's end was written"
        assert not np.any(out[:length] == SENTINEL), f"length {length}: a real row was not written"
        np.testing.assert_array_equal(bits_to_f32(out[:length]), batch[token_of[n]:token_of[n + 1]],
                                      err_msg=f"length {length}")


def test_one_sequence_of_every_chunk_by_default(ragged):
    ops, _, _ = ragged
    tokens = 64 * ops[0].shape[0]
    within_rounding(_run(ops, [tokens], cu_seqlens=None), _model(ops, [tokens]), ops, [tokens])


def test_warp_counts_and_repeats_give_the_same_bits(ragged):
    ops, lengths, first = ragged
    runs = [_run(ops, lengths, Config(warps=w)) for w in WARPS]
    runs.append(_run(ops, lengths, Config(warps=WARPS[-1])))
    for other in runs:
        np.testing.assert_array_equal(other, first)


def test_torch_in_torch_out(ragged):
    torch = pytest.importorskip("torch")
    ops, lengths, ref = ragged
    t = [torch.from_numpy(np.asarray(x, dtype=np.float32)).cuda().bfloat16() for x in ops]
    o = forward_output(*t, cu_seqlens=np.cumsum([0, *lengths]))
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and o.device == t[0].device
    assert tuple(o.shape) == (sum(lengths), ops[0].shape[1], D)
    np.testing.assert_array_equal(o.float().cpu().numpy(), ref)
