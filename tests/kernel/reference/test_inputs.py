"""kernel.reference.inputs: the input generators (random_inputs, ragged_lengths), seeded, in range,
and refusing bad arguments by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.reference import ragged_lengths, random_inputs


def test_random_inputs_seeded_and_in_range():
    a = random_inputs(2, 33, 3, 8, 5, seed=11, gate_strength=2.0)
    b = random_inputs(2, 33, 3, 8, 5, seed=11, gate_strength=2.0)
    c = random_inputs(2, 33, 3, 8, 5, seed=12, gate_strength=2.0)
    shapes = dict(q=(2, 33, 3, 8), k=(2, 33, 3, 8), g=(2, 33, 3, 8), v=(2, 33, 3, 5),
                  do=(2, 33, 3, 5), beta=(2, 33, 3), dht=(2, 3, 8, 5))
    assert set(a) == set(shapes) | {"cu_seqlens"} and a["cu_seqlens"] is None
    for name, shape in shapes.items():
        assert a[name].shape == shape and a[name].dtype == np.float32, name
        np.testing.assert_array_equal(a[name], b[name])
        assert not np.array_equal(a[name], c[name]), name
    assert np.all(a["g"] <= 0) and np.all(a["g"] >= -5)
    assert np.all(a["beta"] > 0) and np.all(a["beta"] < 1)
    # a 16-token tile decays by a realistic amount at gate_strength 1
    g1 = random_inputs(1, 4096, 1, 16, 1, seed=0)["g"].astype(np.float64)
    tile_decay = np.exp(g1.reshape(-1, 16, 16).sum(1))
    assert 0.2 < np.median(tile_decay) < 0.8
    assert np.all(random_inputs(1, 5, 1, 2, 2, gate_strength=0.0)["g"] == 0)
    assert random_inputs(1, 5, 1, 2, 2, with_dht=False)["dht"] is None


def test_random_inputs_varlen():
    lengths = [1, 15, 16, 17, 5]
    a = random_inputs(None, None, 2, 4, 3, lengths=lengths, seed=1)
    assert a["q"].shape == (1, sum(lengths), 2, 4) and a["dht"].shape == (5, 2, 4, 3)
    assert a["cu_seqlens"].dtype == np.int64
    np.testing.assert_array_equal(a["cu_seqlens"], np.cumsum([0] + lengths))
    with pytest.raises(ValueError, match="lengths"):
        random_inputs(None, None, 1, lengths=[4, 0])


@given(st.integers(4, 70), st.integers(0, 10_000), st.integers(0, 2**31 - 1))
def test_ragged_lengths(n, extra, seed):
    total = 49 + (n - 4) + (extra if n > 4 else 0)
    out = ragged_lengths(n, total, seed)
    assert len(out) == n and sum(out) == total and min(out) >= 1
    assert {1, 15, 16, 17} <= set(out)
    assert out == ragged_lengths(n, total, seed)


def test_ragged_lengths_benchmark_shape():
    out = ragged_lengths(64, 262144, seed=0)
    assert sum(out) == 262144 and len(out) == 64
    assert sum(n % 16 != 0 for n in out) > 32
    with pytest.raises(ValueError, match="ragged_lengths needs n >= 4"):
        ragged_lengths(3, 100, 0)


@pytest.mark.parametrize("kwargs, error, match", [
    # a length is a token count: 2.7 used to be truncated to 2
    (dict(lengths=[2.7, 3]), TypeError, r"lengths must hold ints .*got lengths\[0\] = 2.7 \(float\)"),
    (dict(lengths=[4, 3.0]), TypeError, r"lengths\[1\] = 3.0"),
    (dict(lengths=[3, True]), TypeError, r"lengths\[1\] = True \(bool\)"),
    (dict(lengths=["4"]), TypeError, r"lengths\[0\] = '4'"),
    (dict(lengths=np.array([4.0, 3.0])), TypeError, r"lengths must hold ints .*got an array of float64"),
    (dict(lengths=[[4, 3]]), ValueError, r"lengths must be a flat list"),
    (dict(lengths=[]), ValueError, r"lengths must be a non-empty list"),
    (dict(lengths=[4, -1]), ValueError, r"lengths must all be >= 1, got lengths\[1\] = -1"),
    (dict(lengths=[4], B=1.5), TypeError, r"B must be an int or None"),
    (dict(B=2.0), TypeError, r"B must be an int, got 2.0"),
    (dict(T=0), ValueError, r"T must be an int >= 1, got 0"),
    (dict(T=np.float64(8)), TypeError, r"T must be an int"),
    (dict(H=0), ValueError, r"H must be an int >= 1"),
    (dict(K=True), TypeError, r"K must be an int, got True"),
    (dict(V=3.5), TypeError, r"V must be an int"),
    (dict(seed=-1), ValueError, r"seed must be an int >= 0, got -1"),
    (dict(seed=1.5), TypeError, r"seed must be an int"),
    # NaN made every g NaN; a negative strength turned decay into growth (g > 0)
    (dict(gate_strength=float("nan")), ValueError, r"gate_strength must be finite, got nan"),
    (dict(gate_strength=float("inf")), ValueError, r"gate_strength must be finite"),
    (dict(gate_strength=-0.5), ValueError, r"gate_strength must be >= 0.0, got -0.5"),
    (dict(gate_strength="1"), TypeError, r"gate_strength must be a real number"),
    (dict(gate_strength=True), TypeError, r"gate_strength must be a real number"),
    (dict(with_dht="no"), TypeError, r"with_dht must be a bool"),
    (dict(with_dht=0), TypeError, r"with_dht must be a bool"),
    (dict(xp="numpy"), TypeError, r"xp must be an array module"),
])
def test_random_inputs_rejects_bad_arguments_by_name(kwargs, error, match):
    args = dict(B=1, T=8, H=1, K=2, V=2)
    args.update(kwargs)
    if "lengths" in kwargs:
        args.setdefault("B", None)
    with pytest.raises(error, match=match):
        random_inputs(args.pop("B"), args.pop("T"), args.pop("H"), **args)


def test_random_inputs_takes_numpy_ints_and_floats():
    a = random_inputs(np.int64(1), np.int32(8), 1, 2, 2, seed=np.uint32(3), gate_strength=np.float32(0.5),
                      with_dht=np.bool_(False), lengths=None)
    b = random_inputs(1, 8, 1, 2, 2, seed=3, gate_strength=0.5, with_dht=False)
    for key in ("q", "g", "beta"):
        np.testing.assert_array_equal(a[key], b[key])
    c = random_inputs(None, None, 1, 2, 2, lengths=np.array([3, 5], dtype=np.int32))
    np.testing.assert_array_equal(c["cu_seqlens"], [0, 3, 8])
    assert np.all(random_inputs(1, 5, 1, 2, 2, gate_strength=0)["g"] == 0)    # an int strength


@pytest.mark.parametrize("args, error, match", [
    ((64.0, 1000), TypeError, r"n must be an int, got 64.0"),
    ((8, 1000.0), TypeError, r"total must be an int"),
    ((8, 1000, -1), ValueError, r"seed must be an int >= 0"),
    ((8, 1000, 0.5), TypeError, r"seed must be an int"),
    ((True, 49), TypeError, r"n must be an int, got True"),
])
def test_ragged_lengths_rejects_bad_arguments_by_name(args, error, match):
    with pytest.raises(error, match=match):
        ragged_lengths(*args)
