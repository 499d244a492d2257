"""kernel.ds_scan.launch's ``out`` on the CPU: the arrays a caller gives for the outputs are checked by name and
reach the launch as given (stand-ins for GPU arrays: test_fla's DeviceArray; the checks read no memory)."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.ds_scan import launch

from .test_fla import BF16, DeviceArray

D = 128


def _inputs(B=2, T=40, HV=3, cu=None, device=0) -> launch.ScanInputs:
    """Checked inputs as launch's boundary makes them, of stand-ins: B sequences of T tokens (or a packed row)."""
    cu = np.arange(B + 1, dtype=np.int64) * T if cu is None else np.asarray(cu, dtype=np.int64)
    arrays = tuple(DeviceArray((B, T, HV, D), BF16, device=device) for _ in range(7))
    return launch.ScanInputs(arrays, None, B, T, HV, HV, cu, None)


def _out(snapshots, dh0, snap_dtype=BF16, **over):
    return {"snapshots": DeviceArray(snapshots, snap_dtype), "dh0": DeviceArray(dh0, np.float32), **over}


def _check(out, c, snapshot_dtype="bfloat16", snapshot_every=1, varlen=False):
    return launch.check_out(out, c, snapshot_dtype=snapshot_dtype, snapshot_every=snapshot_every, varlen=varlen)


def test_output_shapes_are_what_a_call_allocates():
    # 40 tokens: 3 tiles of 16 (the last partial); packed 17 + 23 tokens: 2 + 2 tiles, one snapshot each at 4
    cu = np.array([0, 40, 80])
    assert launch.output_shapes(2, 3, cu, 1, varlen=False) == {"snapshots": (2, 3, 3, D, D), "dh0": (2, 3, D, D)}
    assert launch.output_shapes(1, 3, cu, 1, varlen=True) == {"snapshots": (1, 6, 3, D, D), "dh0": (2, 3, D, D)}
    packed = np.array([0, 17, 40])
    assert launch.output_shapes(1, 5, packed, 4, varlen=True)["snapshots"] == (1, 2, 5, D, D)


def test_good_out_passes_and_none_stays_none():
    c = _inputs()
    out = _out((2, 3, 3, D, D), (2, 3, D, D))
    assert _check(out, c) == out and _check(None, c) is None
    f32 = _out((2, 3, 3, D, D), (2, 3, D, D), snap_dtype=np.float32)
    assert _check(f32, c, snapshot_dtype="float32") == f32
    packed = _inputs(B=1, T=40, cu=[0, 17, 40])
    assert _check(_out((1, 2, 3, D, D), (2, 3, D, D)), packed, snapshot_every=4, varlen=True) is not None


@pytest.mark.parametrize("name, bad, error, message", [
    ("snapshots", DeviceArray((2, 2, 3, D, D), BF16), ValueError, r"out\['snapshots'\] must have shape \(2, 3, 3"),
    ("snapshots", DeviceArray((2, 3, 3, D, D), np.float32), TypeError, r"out\['snapshots'\] must be bf16"),
    ("dh0", DeviceArray((3, 3, D, D), np.float32), ValueError, r"out\['dh0'\] must have shape \(2, 3, 128, 128\)"),
    ("dh0", DeviceArray((2, 3, D, D), BF16), TypeError, r"out\['dh0'\] must be float32"),
    ("dh0", DeviceArray((2, 3, D, D), np.float32, strides=(3 * D * D * 4, D * D * 4, 4, D * 4)), ValueError,
     r"out\['dh0'\] must be C-contiguous"),
    ("dh0", DeviceArray((2, 3, D, D), np.float32, device=1), ValueError, r"out\['dh0'\] is on device 1"),
    ("dh0", np.zeros((2, 3, D, D), np.float32), TypeError, r"out\['dh0'\] must be a cupy.ndarray .* numpy"),
])
def test_a_wrong_output_array_is_refused_by_name(name, bad, error, message):
    out = _out((2, 3, 3, D, D), (2, 3, D, D))
    out[name] = bad
    with pytest.raises(error, match=message):
        _check(out, _inputs())


def test_out_must_be_a_dict_of_exactly_the_outputs():
    c = _inputs()
    good = _out((2, 3, 3, D, D), (2, 3, D, D))
    with pytest.raises(TypeError, match="out must be None or a dict"):
        _check(tuple(good.values()), c)
    with pytest.raises(ValueError, match=r"missing \['dh0'\]"):
        _check({"snapshots": good["snapshots"]}, c)
    with pytest.raises(ValueError, match=r"unknown \['ds'\]"):
        _check({**good, "ds": good["dh0"]}, c)


@pytest.fixture
def launched(monkeypatch):
    """launch with its GPU steps stood in for: the checked inputs are _inputs(), and run records its keywords."""
    calls = []
    monkeypatch.setattr(launch, "_checked_inputs", lambda *args: _inputs())
    monkeypatch.setattr(launch, "run", lambda c, **kw: calls.append(kw) or ("snapshots", "dh0"))

    def call(**kw):
        return launch.launch(*(object() for _ in range(7)), snapshot_dtype="bfloat16", **kw)
    return call, calls


def test_launch_checks_out_and_hands_the_same_arrays_to_the_run(launched):
    call, calls = launched
    out = _out((2, 3, 3, D, D), (2, 3, D, D))
    call(out=out)
    assert calls[-1]["out"] == out and all(calls[-1]["out"][n] is out[n] for n in out)
    call()
    assert calls[-1]["out"] is None   # no out: the call allocates, as before
    with pytest.raises(ValueError, match=r"out\['snapshots'\] must have shape"):
        call(out=_out((2, 2, 3, D, D), (2, 3, D, D)))
    assert len(calls) == 2   # refused before anything ran
