"""kernel.reference.dstate_scan against the perturbation oracle and against direct definitions.

The scan (fed by prepare_tiles) must match tests/kernel/oracle.py, a plain
token-by-token forward with no tile algebra, to 1e-10 relative (Frobenius, per
snapshot) in float64. Worst seen while writing these tests (several thousand
hypothesis examples, incl. l2norm off, gate strength up to 4, ragged varlen):
2.6e-14 relative (a snapshot ~10x smaller than the loss's other terms);
typical 2e-16..3e-15. Run with -s to print this run's worst.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.reference import (
    dstate_scan_reference,
    prepare_tiles,
    random_inputs,
    snapshot_offsets,

)
from kernel.reference.dstate_scan import tile_table

from ..scan_cases import scan_case, scan_inputs

from ..oracle import oracle_dstate

RTOL = 1e-10        # float64 against float64: orders of magnitude above the ~1e-15 seen
SNAPSHOT_EVERY = (1, 2, 3, 4)   # 1 and 4 are the GPU modes; 2, 3 check "any e >= 1"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_worst = {"rel": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    print(f"\n[kernel.reference] worst relative error vs oracle: {_worst['rel']:.2e}")


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref||; an all-zero ref must be matched exactly."""
    num = float(np.linalg.norm(out - ref))
    den = float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


# ----------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------

@st.composite
def problems(draw):
    """A small KDA backward problem: tiny K, V; equal-length or packed varlen."""
    tile = draw(st.sampled_from([2, 4, 8, 16]))
    # lengths around tile edges (1, C-1, C, C+1) as often as arbitrary ones
    length = st.one_of(st.sampled_from(sorted({1, max(tile - 1, 1), tile, tile + 1})),
                       st.integers(1, 40))
    varlen = draw(st.booleans())
    if varlen:
        lengths = draw(st.lists(length, min_size=1, max_size=4))
        B = T = None
    else:
        lengths, B, T = None, draw(st.integers(1, 2)), draw(length)
    return scan_case(draw, B=B, T=T, lengths=lengths, tile=tile)


_inputs = scan_inputs


def _tiles(inp, p):
    return prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], scale=p["scale"],
                         qk_l2norm=p["qk_l2norm"], tile=p["tile"], cu_seqlens=inp["cu_seqlens"])


def _scan(inp, p, tiles, e):
    gc, mqk, inv = tiles
    return dstate_scan_reference(inp["q"], inp["k"], gc, inp["beta"], mqk, inv, inp["do"],
                                 scale=p["scale"], dht=inp["dht"], cu_seqlens=inp["cu_seqlens"],
                                 tile=p["tile"], qk_l2norm=p["qk_l2norm"], snapshot_every=e)


def _sequences(inp):
    """(batch row, bos, eos) of every sequence."""
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"]
    if cu is None:
        return [(b, 0, T) for b in range(B)]
    return [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]


# ----------------------------------------------------------------------------
# the scan against the oracle
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_scan_matches_oracle(p):
    inp = _inputs(p)
    tiles = _tiles(inp, p)
    for e in SNAPSHOT_EVERY:
        snaps, dh0 = _scan(inp, p, tiles, e)
        ref_snaps, ref_dh0 = oracle_dstate(inp, tile=p["tile"], snapshot_every=e,
                                           scale=p["scale"], qk_l2norm=p["qk_l2norm"])
        assert snaps.dtype == np.float64 and dh0.dtype == np.float64
        assert snaps.shape == ref_snaps.shape, (e, snaps.shape, ref_snaps.shape)
        assert dh0.shape == ref_dh0.shape
        errs = [_rel(snaps[b, m], ref_snaps[b, m])
                for b in range(snaps.shape[0]) for m in range(snaps.shape[1])]
        errs += [_rel(dh0[n], ref_dh0[n]) for n in range(dh0.shape[0])]
        worst = max(errs)
        _worst["rel"] = max(_worst["rel"], worst)
        assert worst < RTOL, f"snapshot_every={e}: worst relative error {worst:.2e}"


@FAST
@given(problems())
def test_last_snapshot_is_dht(p):
    inp = _inputs(p)
    snaps, _ = _scan(inp, p, _tiles(inp, p), 1)
    H, K, V = snaps.shape[2:]
    lengths = [eos - bos for _, bos, eos in _sequences(inp)]
    off = snapshot_offsets(lengths, p["tile"], 1)
    dht = np.zeros((len(lengths), H, K, V)) if inp["dht"] is None else inp["dht"]
    flat = snaps.reshape(-1, H, K, V)
    # the snapshot after a sequence's last tile is the gradient handed in, untouched
    np.testing.assert_array_equal(flat[off[1:] - 1], dht.astype(np.float64))


def test_small_example_with_a_partial_tile():
    """K=4, V=3, C=4, T=11 (a partial last tile), against the oracle."""
    p = dict(tile=4, qk_l2norm=True, scale=None)
    inp = random_inputs(1, 11, 1, 4, 3, seed=7)
    snaps, dh0 = _scan(inp, p, _tiles(inp, p), 1)
    ref_snaps, ref_dh0 = oracle_dstate(inp, tile=4, snapshot_every=1)
    assert snaps.shape == (1, 3, 1, 4, 3)
    assert _rel(snaps, ref_snaps) < 1e-13 and _rel(dh0, ref_dh0) < 1e-13


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.sampled_from([2, 4, 16]), st.integers(0, 2**31 - 1))
def test_packed_equal_lengths_match_batch(B, T, tile, seed):
    """A batch [B, T] and the same sequences packed [1, B*T] give the same numbers."""
    p = dict(tile=tile, qk_l2norm=True, scale=None)
    batch = random_inputs(B, T, 2, 3, 4, seed=seed)
    packed = {name: batch[name].reshape((1, B * T) + batch[name].shape[2:])
              for name in ("q", "k", "v", "g", "beta", "do")}
    packed.update(dht=batch["dht"], cu_seqlens=np.arange(B + 1) * T)
    for e in (1, 4):
        s_b, d_b = _scan(batch, p, _tiles(batch, p), e)
        s_p, d_p = _scan(packed, p, _tiles(packed, p), e)
        assert s_p.shape == (1, s_b.shape[0] * s_b.shape[1]) + s_b.shape[2:]
        np.testing.assert_allclose(s_p.reshape(s_b.shape), s_b, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(d_p, d_b, rtol=1e-13, atol=1e-15)


def test_bf16_inputs_are_read_exactly():
    """bf16 (ml_dtypes) inputs, as the GPU kernel gets them, are widened exactly."""
    p = dict(tile=4, qk_l2norm=True, scale=None)
    inp = random_inputs(1, 13, 2, 4, 4, seed=3)
    bf = {k: (v.astype(ml_dtypes.bfloat16) if isinstance(v, np.ndarray) and v.dtype == np.float32
              else v) for k, v in inp.items()}
    wide = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == ml_dtypes.bfloat16
                else v) for k, v in bf.items()}
    s_bf, d_bf = _scan(bf, p, _tiles(bf, p), 1)
    s_w, d_w = _scan(wide, p, _tiles(wide, p), 1)
    np.testing.assert_array_equal(s_bf, s_w)
    np.testing.assert_array_equal(d_bf, d_w)


# ----------------------------------------------------------------------------
# prepare_tiles against the definitions (docs/kernel_a.md, section 2)
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_prepare_tiles_matches_definitions(p):
    inp = _inputs(p)
    gc, mqk, inv = _tiles(inp, p)
    C = p["tile"]
    K = inp["q"].shape[-1]
    s = K ** -0.5 if p["scale"] is None else p["scale"]
    H = inp["q"].shape[2]
    eye = np.eye(C)
    for b, bos, eos in _sequences(inp):
        q = inp["q"][b, bos:eos].astype(np.float64)
        k = inp["k"][b, bos:eos].astype(np.float64)
        if p["qk_l2norm"]:
            q = q / np.sqrt((q ** 2).sum(-1, keepdims=True) + 1e-6)
            k = k / np.sqrt((k ** 2).sum(-1, keepdims=True) + 1e-6)
        g = inp["g"][b, bos:eos].astype(np.float64)
        beta = inp["beta"][b, bos:eos].astype(np.float64)
        for t0 in range(0, eos - bos, C):
            L = min(C, eos - bos - t0)
            tok = slice(bos + t0, bos + t0 + L)
            # gc: running sum restarted at the tile, in log2 space
            acc = np.zeros((H, K))
            want_gc = []
            for c in range(L):
                acc = acc + g[t0 + c]
                want_gc.append(acc / math.log(2))
            want_gc = np.stack(want_gc)
            np.testing.assert_allclose(gc[b, tok], want_gc, rtol=1e-13, atol=1e-13)
            for h in range(H):
                M = mqk[b, tok, h]                       # [L, C]: row c at token c
                I_ = inv[b, tok, h]
                Lkk = np.zeros((C, C))
                want_M = np.zeros((L, C))
                for c in range(L):
                    for j in range(L):
                        decay = np.exp2(want_gc[c, h] - want_gc[j, h])
                        if j <= c:
                            want_M[c, j] = s * np.sum(q[t0 + c, h] * k[t0 + j, h] * decay)
                        if j < c:
                            Lkk[c, j] = beta[t0 + c, h] * np.sum(k[t0 + c, h] * k[t0 + j, h] * decay)
                np.testing.assert_allclose(M, want_M, rtol=1e-12, atol=1e-14)
                # INV: unit lower triangular, zero past the tile's end, INV (I + Lkk) = I
                assert np.all(np.triu(I_[:, :L], 1) == 0) and np.all(I_[:, L:] == 0)
                np.testing.assert_array_equal(np.diag(I_[:, :L]), np.ones(L))
                np.testing.assert_allclose(I_ @ (eye + Lkk)[:, :L], eye[:L, :L], atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.sampled_from([2, 4, 8, 16]),
       st.integers(0, 2**31 - 1))
def test_prepare_tiles_restart_at_each_sequence(lengths, tile, seed):
    """Packed prepare_tiles = each sequence prepared on its own, concatenated."""
    inp = random_inputs(None, None, 2, 3, 3, lengths=lengths, seed=seed)
    packed = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=tile,
                           cu_seqlens=inp["cu_seqlens"])
    cu = inp["cu_seqlens"]
    for n in range(len(lengths)):
        sl = slice(int(cu[n]), int(cu[n + 1]))
        alone = prepare_tiles(inp["q"][:, sl], inp["k"][:, sl], inp["g"][:, sl],
                              inp["beta"][:, sl], tile=tile)
        for got, want in zip(packed, alone):
            np.testing.assert_allclose(got[:, sl], want, rtol=1e-14, atol=1e-15)


# ----------------------------------------------------------------------------
# snapshot layout
# ----------------------------------------------------------------------------

def test_snapshot_offsets_examples():
    lengths = [1, 15, 16, 17, 64, 65, 200]
    # tile 16: tiles 1, 1, 1, 2, 4, 5, 13
    np.testing.assert_array_equal(snapshot_offsets(lengths, 16, 1),
                                  np.cumsum([0, 1, 1, 1, 2, 4, 5, 13]))
    # tile 16 x 4 = FLA's 64-token chunks: ceil(n / 64)
    np.testing.assert_array_equal(snapshot_offsets(lengths, 16, 4),
                                  np.cumsum([0] + [math.ceil(n / 64) for n in lengths]))
    assert snapshot_offsets(np.array(lengths, dtype=np.int32), 16, 4).dtype == np.int64


@given(st.lists(st.integers(1, 500), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       st.integers(1, 6))
def test_snapshot_offsets_count(lengths, tile, e):
    off = snapshot_offsets(lengths, tile, e)
    assert off.shape == (len(lengths) + 1,) and off[0] == 0
    assert list(np.diff(off)) == [math.ceil(math.ceil(n / tile) / e) for n in lengths]


# ----------------------------------------------------------------------------
# validation at the boundary
# ----------------------------------------------------------------------------

def _valid_args():
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4)
    return dict(q=inp["q"], k=inp["k"], gc=gc, beta=inp["beta"], mqk=mqk, inv=inv,
                do=inp["do"], dht=inp["dht"], tile=4)


def _call_scan(**over):
    a = {**_valid_args(), **over}
    return dstate_scan_reference(a.pop("q"), a.pop("k"), a.pop("gc"), a.pop("beta"),
                                 a.pop("mqk"), a.pop("inv"), a.pop("do"), **a)


Z = np.zeros


@pytest.mark.parametrize("over, match", [
    (dict(q=Z((20, 2, 3))), r"q must be 4-D"),
    (dict(k=Z((1, 20, 2, 4))), r"k must have shape \(1, 20, 2, 3\).*got \(1, 20, 2, 4\)"),
    (dict(gc=Z((1, 19, 2, 3))), r"gc must have shape \(1, 20, 2, 3\).*got \(1, 19, 2, 3\)"),
    (dict(beta=Z((1, 20, 2, 1))), r"beta must have shape \(1, 20, 2\).*got \(1, 20, 2, 1\)"),
    (dict(mqk=Z((1, 20, 2, 16))), r"mqk must have shape \(1, 20, 2, 4\).*got \(1, 20, 2, 16\)"),
    (dict(inv=Z((1, 20, 1, 4))), r"inv must have shape \(1, 20, 2, 4\).*got \(1, 20, 1, 4\)"),
    (dict(do=Z((1, 20, 4))), r"do must be 4-D"),
    (dict(do=Z((1, 20, 3, 4))), r"do must have shape \(1, 20, 2, 4\).*got \(1, 20, 3, 4\)"),
    (dict(dht=Z((2, 2, 3, 4))), r"dht must have shape \(1, 2, 3, 4\).*got \(2, 2, 3, 4\)"),
    (dict(cu_seqlens=np.array([[0, 20]])), r"cu_seqlens must be 1-D"),
    (dict(cu_seqlens=np.array([3, 20])), r"cu_seqlens must start at 0, got 3"),
    (dict(cu_seqlens=np.array([0, 5, 5, 20])), r"cu_seqlens must be strictly increasing"),
    (dict(cu_seqlens=np.array([0, 12, 7, 20])), r"cu_seqlens must be strictly increasing"),
    (dict(cu_seqlens=np.array([0, 5, 19])), r"cu_seqlens must end at the total length 20, got 19"),
    (dict(cu_seqlens=np.array([0.0, 20.0])), r"cu_seqlens must have an integer dtype"),
    (dict(cu_seqlens=np.array([0])), r"cu_seqlens must hold at least 2"),
    (dict(tile=3), r"tile must be a positive divisor of 64.*got 3"),
    (dict(tile=0), r"tile must be a positive divisor of 64.*got 0"),
    (dict(snapshot_every=0), r"snapshot_every must be an integer >= 1, got 0"),
])
def test_scan_rejects_bad_input(over, match):
    with pytest.raises(ValueError, match=match):
        _call_scan(**over)


def test_cu_seqlens_needs_batch_one():
    inp = random_inputs(2, 8, 1, 2, 2, seed=0)
    with pytest.raises(ValueError, match=r"cu_seqlens needs a packed batch of size 1.*got batch 2"):
        prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4,
                      cu_seqlens=np.array([0, 8, 16]))


@pytest.mark.parametrize("over, match", [
    (dict(q=Z((1, 20, 2))), r"q must be 4-D"),
    (dict(k=Z((1, 20, 1, 3))), r"k must have shape \(1, 20, 2, 3\)"),
    (dict(g=Z((1, 20, 2, 2))), r"g must have shape \(1, 20, 2, 3\)"),
    (dict(beta=Z((1, 20))), r"beta must have shape \(1, 20, 2\)"),
    (dict(tile=48), r"tile must be a positive divisor of 64.*got 48"),
    (dict(cu_seqlens=np.array([0, 25])), r"cu_seqlens must end at the total length 20, got 25"),
])
def test_prepare_tiles_rejects_bad_input(over, match):
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    a = dict(q=inp["q"], k=inp["k"], g=inp["g"], beta=inp["beta"], tile=4, **{})
    a.update(over)
    with pytest.raises(ValueError, match=match):
        prepare_tiles(a.pop("q"), a.pop("k"), a.pop("g"), a.pop("beta"), **a)


def test_snapshot_offsets_rejects_bad_input():
    with pytest.raises(ValueError, match=r"lengths must all be >= 1, got lengths\[1\] = 0"):
        snapshot_offsets([3, 0], 16, 1)
    with pytest.raises(ValueError, match=r"snapshot_every must be an integer >= 1"):
        snapshot_offsets([3], 16, 0)


def test_tile_table_examples():
    start, length = tile_table([5, 16, 17], 16)
    assert start.tolist() == [0, 5, 21, 37] and length.tolist() == [5, 16, 16, 1]
    start, length = tile_table(np.array([3, 4], dtype=np.int32), 2)
    assert start.tolist() == [0, 2, 3, 5] and length.tolist() == [2, 1, 2, 2]


@pytest.mark.parametrize("lengths, error, match", [
    # [2.7, 16] was truncated to [2, 16]; an array [0.5, 16.0] was reported as [0, 16]
    ([2.7, 16], TypeError, r"lengths must hold ints .*got lengths\[0\] = 2.7 \(float\)"),
    (np.array([0.5, 16.0]), TypeError, r"got an array of float64: \[0.5, 16.0\]"),
    (np.array([16.0, 32.0]), TypeError, r"got an array of float64: \[16.0, 32.0\]"),
    ([16, True], TypeError, r"lengths\[1\] = True \(bool\)"),
    (["16"], TypeError, r"lengths\[0\] = '16'"),
    ([], ValueError, r"lengths must be a non-empty list of ints >= 1"),
    ([16, 0], ValueError, r"lengths must all be >= 1, got lengths\[1\] = 0"),
    ([[16, 3]], ValueError, r"lengths must be a flat list"),
])
def test_tile_table_refuses_lengths_it_would_truncate(lengths, error, match):
    with pytest.raises(error, match=match):
        tile_table(lengths, 16)


def test_tile_table_checks_chunk():
    with pytest.raises(ValueError, match=r"tile must be a positive divisor of 64.*got 5"):
        tile_table([16], 5)
    with pytest.raises(TypeError, match=r"tile must be an int"):
        tile_table([16], 16.0)


def test_snapshot_offsets_refuses_lengths_it_would_truncate():
    with pytest.raises(TypeError, match=r"lengths\[1\] = 2.5"):
        snapshot_offsets([16, 2.5], 16, 1)
    with pytest.raises(TypeError, match=r"got an array of float32"):
        snapshot_offsets(np.array([16, 2.5], dtype=np.float32), 16, 1)
    with pytest.raises(TypeError, match=r"tile must be an int"):
        snapshot_offsets([16], 16.0, 1)
    with pytest.raises(TypeError, match=r"snapshot_every must be an integer"):
        snapshot_offsets([16], 16, True)
    assert snapshot_offsets([], 16, 1).tolist() == [0]


# ----------------------------------------------------------------------------
# non-finite inputs and positive gates are refused, by name
# ----------------------------------------------------------------------------

def _poisoned(x: np.ndarray, index: tuple, value: float) -> np.ndarray:
    out = np.array(x, dtype=np.float64 if x.dtype.kind == "f" else x.dtype, copy=True)
    out[index] = value
    return out


@pytest.mark.parametrize("name", ["q", "k", "g", "beta"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_prepare_tiles_refuses_non_finite_inputs(name, value):
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    index = (0, 13, 1) + ((2,) if name != "beta" else ())
    inp[name] = _poisoned(inp[name], index, value)
    want = f"{name} holds 1 non-finite value(s) (NaN or inf), the first {name}{list(index)} = {value}"
    with pytest.raises(ValueError, match=re.escape(want)):
        prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4)


def test_prepare_tiles_refuses_a_positive_gate():
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    g = _poisoned(inp["g"], (0, 7, 0, 1), 0.25)
    g[0, 9, 1, 0] = 1e-30                            # the smallest growth is still growth
    with pytest.raises(ValueError, match=r"g must be <= 0 \(a natural-log decay gate: exp\(g\) in \(0, 1\]\), "
                                         r"got 2 positive value\(s\), the first g\[0, 7, 0, 1\] = 0.25"):
        prepare_tiles(inp["q"], inp["k"], g, inp["beta"], tile=4)
    g0 = np.zeros_like(inp["g"])                    # g = 0 (no decay) is a gate
    gc, _, _ = prepare_tiles(inp["q"], inp["k"], g0, inp["beta"], tile=4)
    assert np.all(gc == 0)


@pytest.mark.parametrize("name", ["q", "k", "gc", "beta", "mqk", "inv", "do", "dht"])
def test_scan_refuses_non_finite_inputs(name):
    args = _valid_args()
    index = {"beta": (0, 5, 1), "dht": (0, 1, 2, 3)}.get(name, (0, 5, 1, 2))
    args[name] = _poisoned(args[name], index, np.nan)
    with pytest.raises(ValueError, match=rf"{name} holds 1 non-finite value\(s\)"):
        _call_scan(**args)


@pytest.mark.parametrize("call", ["prepare_tiles", "scan"])
@pytest.mark.parametrize("scale, error, match", [
    (float("nan"), ValueError, "scale must be finite"), (float("inf"), ValueError, "scale must be finite"),
    ("0.5", TypeError, "scale must be a real number"), (True, TypeError, "scale must be a real number"),
    (0.0, ValueError, r"scale must be > 0 \(None for K\*\*-0.5\), got 0.0"),
    (-0.5, ValueError, r"scale must be > 0 .*got -0.5")])
def test_scale_must_be_a_finite_number(call, scale, error, match):
    with pytest.raises(error, match=match):
        _call(call, scale=scale)


@pytest.mark.parametrize("call", ["prepare_tiles", "scan"])
@pytest.mark.parametrize("flag", ["no", 0, 1.0, None])
def test_qk_l2norm_must_be_a_bool(call, flag):
    # "no" used to mean True
    with pytest.raises(TypeError, match=r"qk_l2norm must be a bool \(True or False\)"):
        _call(call, qk_l2norm=flag)


def _call(which: str, **over):
    if which == "scan":
        return _call_scan(**over)
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    return prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4, **over)


# complex values lost their imaginary part and strings were parsed as numbers, silently
NOT_REAL = [np.complex128, np.dtype("U8"), np.int32, bool]


@pytest.mark.parametrize("name", ["q", "k", "g", "beta"])
@pytest.mark.parametrize("dtype", NOT_REAL)
def test_prepare_tiles_refuses_dtypes_that_are_not_real_floating(name, dtype):
    inp = random_inputs(1, 20, 2, 3, 4, seed=0)
    inp[name] = inp[name].astype(dtype)
    want = f"{name} must have a real floating dtype (float16/32/64 or bfloat16), got {np.dtype(dtype)}"
    with pytest.raises(ValueError, match=re.escape(want)):
        prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4)


@pytest.mark.parametrize("name", ["q", "k", "gc", "beta", "mqk", "inv", "do", "dht"])
@pytest.mark.parametrize("dtype", [np.complex64, np.dtype("U8")])
def test_scan_refuses_dtypes_that_are_not_real_floating(name, dtype):
    args = _valid_args()
    args[name] = args[name].astype(dtype)
    with pytest.raises(ValueError, match=rf"{name} must have a real floating dtype .*got {np.dtype(dtype)}"):
        _call_scan(**args)


def test_gc_is_only_checked_to_be_finite():
    # gc an ulp above 0 or rising by an ulp, as float32 reassociation can leave it, is
    # accepted and moves the result by as little as it should
    inp = random_inputs(1, 20, 2, 3, 4, seed=0, gate_strength=0.0)
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4)
    assert np.all(gc == 0)
    nudged = gc.copy()
    nudged[0, 5, 1, 2] = np.spacing(np.float32(1))            # 1.2e-7, tile 1's second token
    ref, got = (dstate_scan_reference(inp["q"], inp["k"], x, inp["beta"], mqk, inv, inp["do"],
                                      dht=inp["dht"], tile=4) for x in (gc, nudged))
    assert 0 < _rel(got[1], ref[1]) < 1e-6


# ----------------------------------------------------------------------------
# CuPy in, CuPy out (needs a GPU)
# ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_cupy_matches_numpy():
    from ptx_lab.gpu import gpu_reason
    if gpu_reason() is not None:
        pytest.skip(gpu_reason())
    import cupy

    p = dict(tile=16, qk_l2norm=True, scale=None)
    lengths = [1, 15, 16, 17, 70]
    host = random_inputs(None, None, 2, 8, 8, lengths=lengths, seed=5)
    dev = random_inputs(None, None, 2, 8, 8, lengths=lengths, seed=5, xp=cupy)
    for e in (1, 4):
        s_h, d_h = _scan(host, p, _tiles(host, p), e)
        s_d, d_d = _scan(dev, p, _tiles(dev, p), e)
        assert isinstance(s_d, cupy.ndarray) and isinstance(d_d, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(s_d), s_h, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cupy.asnumpy(d_d), d_h, rtol=1e-12, atol=1e-14)


@pytest.mark.gpu
def test_cupy_inputs_are_checked_alike():
    import cupy

    inp = random_inputs(1, 20, 2, 3, 4, seed=0, xp=cupy)
    g = inp["g"].copy()
    g[0, 7, 0, 1] = 0.25
    with pytest.raises(ValueError, match=re.escape("the first g[0, 7, 0, 1] = 0.25")):
        prepare_tiles(inp["q"], inp["k"], g, inp["beta"], tile=4)
    q = inp["q"].copy()
    q[0, 3, 1, 2] = cupy.nan
    with pytest.raises(ValueError, match=re.escape("q holds 1 non-finite value(s) (NaN or inf), the first "
                                                   "q[0, 3, 1, 2] = nan")):
        prepare_tiles(q, inp["k"], inp["g"], inp["beta"], tile=4)
