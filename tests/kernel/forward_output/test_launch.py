"""kernel.forward_output on the CPU: the plan's checks, each refusal naming its argument, the chunk table,
and the knob. The arguments are stand-ins for GPU arrays (no memory), so every check runs without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward_output import WARPS, Config, all_variants, options, plan_output
from kernel.forward_products.launch import chunk_table

from ..ds_scan.test_fla import DeviceArray

D, R = 128, 64
BF16 = np.uint16


def _args(chunks=5, HV=3):
    return {"qg": DeviceArray((chunks, HV, R, D), BF16), "states": DeviceArray((chunks, HV, D, D), BF16),
            "aqk": DeviceArray((chunks, HV, R, R), BF16), "aqk_lo": DeviceArray((chunks, HV, R, R), BF16),
            "v_new": DeviceArray((chunks, HV, R, D), BF16)}


def _plan(a, **over):
    args = {**a, **over}
    return plan_output(args.pop("qg"), args.pop("states"), args.pop("aqk"), args.pop("aqk_lo"), args.pop("v_new"),
                       **args)


def test_one_sequence_of_every_chunk_by_default():
    plan = _plan(_args(chunks=7, HV=2))
    assert (plan.chunks, plan.HV, plan.N, plan.tokens, plan.ctas) == (7, 2, 1, 7 * R, 14)
    np.testing.assert_array_equal(plan.cu_seqlens, [0, 7 * R])
    assert plan.config == Config() and not plan.torch_out


def test_sequences_by_their_tokens():
    # ceil(len / 64) chunks a sequence: 1 + 1 + 2 + 4 = 8
    cu = np.cumsum([0, 1, 64, 65, 200])
    plan = _plan(_args(chunks=8, HV=4), cu_seqlens=cu, config=Config(warps=8))
    assert plan.N == 4 and plan.tokens == 330 and plan.ctas == 32 and plan.config.warps == 8
    assert plan.cu_seqlens.dtype == np.int64
    assert _plan(_args(chunks=8), cu_seqlens=cu.tolist()).tokens == 330


def test_the_kernels_chunk_table_follows_the_operands_chunks():
    # the products pass's table, whose chunk c is the operands' chunk c: its first token and its real rows
    plan = _plan(_args(chunks=8), cu_seqlens=np.cumsum([0, 1, 64, 65, 200]))
    table = chunk_table(plan.cu_seqlens)
    assert table.shape == (plan.chunks, 2) and table.dtype == np.int32
    np.testing.assert_array_equal(table, [[0, 1], [1, 64], [65, 64], [129, 1], [130, 64], [194, 64], [258, 64],
                                          [322, 8]])


@pytest.mark.parametrize("cu, words", [
    ([0, 3, 3, 9], "strictly increasing"),
    ([1, 9], "start at 0"),
    ([0, 64, 129], "lays out 3 chunks"),        # 1 + 2, the operands have 5
    ([0, 320, 321], "the operands have 5"),     # 5 + 1
    ([0], "at least 2 offsets"),
    (np.array([[0, 9]]), "1-D"),
    ([0.0, 320.0], "integers"),
])
def test_bad_cu_seqlens_are_named(cu, words):
    # the checks are kernel.shapes.check_cu_seqlens's, the one check of a cu_seqlens, and the o pass's own two
    with pytest.raises((ValueError, TypeError), match="cu_seqlens") as e:
        _plan(_args(chunks=5), cu_seqlens=cu)
    assert words in str(e.value)


def test_cu_seqlens_past_int32_tokens_are_refused():
    chunks = -(-2**31 // R)
    with pytest.raises(ValueError, match="cu_seqlens ends at 2147483648 tokens"):
        _plan(_args(chunks=chunks, HV=1), cu_seqlens=[0, 2**31])


def test_cu_seqlens_on_the_device_are_refused_with_why():
    with pytest.raises(TypeError, match="cu_seqlens must be host integers"):
        _plan(_args(chunks=5), cu_seqlens=DeviceArray((2,), np.int64))


@pytest.mark.parametrize("name, bad, words", [
    ("qg", DeviceArray((5, 3, 16, D), BF16), "qg must be [chunks, HV, 64, 128]"),
    ("qg", DeviceArray((5, 3, R, D), np.float32), "qg must be bf16"),
    ("states", DeviceArray((5, 3, R, D), BF16), "states must have shape (5, 3, 128, 128)"),
    ("states", DeviceArray((5, 3, D, D), np.float32), "states must be bf16"),
    ("aqk", DeviceArray((5, 3, R, D), BF16), "aqk must have shape (5, 3, 64, 64)"),
    ("aqk", DeviceArray((5, 3, R, R), np.float32), "aqk must be bf16"),
    ("aqk_lo", DeviceArray((5, 3, R, D), BF16), "aqk_lo must have shape (5, 3, 64, 64)"),
    ("aqk_lo", DeviceArray((5, 2, R, R), BF16), "aqk_lo must have shape (5, 3, 64, 64)"),
    ("aqk_lo", DeviceArray((5, 3, R, R), np.float32), "aqk_lo must be bf16"),
    ("aqk_lo", DeviceArray((5, 3, R, R), BF16, strides=(3 * R * R * 2, R * R * 2, 2, R * 2)), "C-contiguous"),
    ("v_new", DeviceArray((5, 2, R, D), BF16), "v_new must have shape (5, 3, 64, 128)"),
    ("v_new", DeviceArray((5, 3, R, D), BF16, strides=(3 * R * D * 2, R * D * 2, 2, R * 2)), "C-contiguous"),
])
def test_bad_arrays_are_named(name, bad, words):
    with pytest.raises((ValueError, TypeError)) as e:
        _plan(_args(), **{name: bad})
    assert words in str(e.value)


def test_host_arrays_are_refused_with_advice():
    with pytest.raises(TypeError, match="host memory") as e:
        _plan(_args(), states=np.zeros((5, 3, D, D), np.uint16))
    assert str(e.value).startswith("states is a numpy.ndarray")
    assert "o_pass of tests/kernel/three_pass_model.py" in str(e.value)


@pytest.mark.parametrize("name", ["aqk", "aqk_lo"])
def test_arrays_on_two_devices_are_refused(name):
    a = _args()
    a[name] = DeviceArray((5, 3, R, R), BF16, device=1)
    with pytest.raises(ValueError, match="one device") as e:
        _plan(a)
    assert f"{name}: device 1" in str(e.value) and "aqk, aqk_lo and v_new" in str(e.value)


def test_the_grid_is_checked():
    with pytest.raises(ValueError, match="chunks \\* HV = 2147483648"):
        _plan(_args(chunks=2**17, HV=2**14))


def test_the_knob():
    assert [c.warps for c in all_variants()] == list(WARPS)
    assert [c.threads for c in all_variants()] == [32 * w for w in WARPS]
    assert "-DFO_WARPS=8" in options(Config(warps=8)) and "-ftz=true" in options(Config())
    assert "-lineinfo" not in options(Config()) and "-lineinfo" in options(Config(lineinfo=True))
    with pytest.raises(ValueError, match="Config.warps must be one of"):
        Config(warps=2)
    with pytest.raises(ValueError, match="Config.warps"):
        Config(warps=True)
    with pytest.raises(ValueError, match="Config.lineinfo must be True or False"):
        Config(lineinfo=1)
    with pytest.raises(TypeError, match="kernel.forward_output.Config"):
        _plan(_args(), config="w4")
