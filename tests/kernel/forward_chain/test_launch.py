"""kernel.forward_chain on the CPU: the plan's checks, each refusal naming its argument, and the knob.
The arguments are stand-ins for GPU arrays (no memory), so every check runs without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward_chain import Config, NSTAGES, VGROUPS, all_variants, plan_chain

from ..ds_scan.test_fla import DeviceArray

D, R = 128, 64
BF16 = np.uint16


def _args(chunks=5, HV=3, *, N=1, h0=False):
    a = {name: DeviceArray((chunks, HV, R, D), BF16) for name in ("w", "kg")}
    a["u"] = DeviceArray((chunks, HV, R, D), np.float16)
    a["decay"] = DeviceArray((chunks, HV, D), np.float32)
    a["u_scale"] = DeviceArray((chunks, HV, 4), np.float32)
    kw = {"initial_state": DeviceArray((N, HV, D, D), np.float32) if h0 else None}
    return a, kw


def _plan(a, kw, **over):
    args = {**a, **kw, **over}
    return plan_chain(args.pop("w"), args.pop("u"), args.pop("kg"), args.pop("decay"), args.pop("u_scale"), **args)


def test_one_sequence_of_every_chunk_by_default():
    a, kw = _args(chunks=7, HV=2)
    plan = _plan(a, kw)
    assert (plan.chunks, plan.HV, plan.N) == (7, 2, 1)
    np.testing.assert_array_equal(plan.cu_chunks, [0, 7])
    assert plan.ctas == 2 * VGROUPS and plan.output_final_state and not plan.has_initial_state
    assert plan.config == Config()


def test_sequences_by_their_chunks():
    a, kw = _args(chunks=9, HV=4, N=3, h0=True)
    plan = _plan(a, kw, cu_chunks=[0, 2, 3, 9], output_final_state=False)
    assert plan.N == 3 and plan.ctas == 3 * 4 * VGROUPS and plan.has_initial_state and not plan.output_final_state
    assert plan.cu_chunks.dtype == np.int32


@pytest.mark.parametrize("cu, words", [
    ([0, 3, 3, 9], "grow by at least one chunk"),
    ([1, 9], "start at 0"),
    ([0, 8], "end at the chunks of w (9)"),
    ([0], "N >= 1"),
    ([[0, 9]], "1-D"),
])
def test_bad_cu_chunks_are_named(cu, words):
    a, kw = _args(chunks=9)
    with pytest.raises(ValueError, match="cu_chunks") as e:
        _plan(a, kw, cu_chunks=cu)
    assert words in str(e.value)


def test_cu_chunks_on_the_device_are_refused_with_why():
    a, kw = _args(chunks=9)
    with pytest.raises(TypeError, match="host integers"):
        _plan(a, kw, cu_chunks=DeviceArray((2,), np.int64))


@pytest.mark.parametrize("name, bad, words", [
    ("w", DeviceArray((5, 3, 16, D), BF16), "w must be [chunks, HV, 64, 128]"),
    ("u", DeviceArray((5, 3, R, D), BF16), "u must be float16"),
    ("u_scale", DeviceArray((5, 3), np.float32), "u_scale must have shape (5, 3, 4)"),
    ("u_scale", DeviceArray((5, 3, 4), np.float16), "u_scale must be float32"),
    ("kg", DeviceArray((5, 2, R, D), BF16), "kg must have shape (5, 3, 64, 128)"),
    ("decay", DeviceArray((5, 3, R), np.float32), "decay must have shape (5, 3, 128)"),
    ("initial_state", DeviceArray((2, 3, D, D), np.float32), "initial_state must have shape (1, 3, 128, 128)"),
])
def test_bad_arrays_are_named(name, bad, words):
    a, kw = _args()
    with pytest.raises((ValueError, TypeError)) as e:
        _plan(a, kw, **{name: bad})
    assert words in str(e.value)


def test_host_arrays_are_refused_with_advice():
    a, kw = _args()
    with pytest.raises(TypeError, match="host memory") as e:
        _plan(a, kw, w=np.zeros((5, 3, R, D), np.uint16))
    assert "chain of tests/kernel/three_pass_model.py" in str(e.value)


def test_arrays_on_two_devices_are_refused():
    a, kw = _args()
    a["u"] = DeviceArray((5, 3, R, D), np.float16, device=1)
    with pytest.raises(ValueError, match="one device"):
        _plan(a, kw)


def test_32_bit_row_coordinates_are_checked():
    a, kw = _args(chunks=2**17, HV=128)   # 2^17 * 128 * 128 rows of states = 2^31
    with pytest.raises(ValueError, match="32-bit coordinates"):
        _plan(a, kw)


def test_the_knob():
    assert [c.nstage for c in all_variants()] == list(NSTAGES)
    with pytest.raises(ValueError, match="Config.nstage must be one of"):
        Config(nstage=5)
    with pytest.raises(ValueError, match="Config.nstage"):
        Config(nstage=True)
    a, kw = _args()
    with pytest.raises(TypeError, match="kernel.forward_chain.Config"):
        _plan(a, kw, config="st3")
