"""kernel.reference.kda against the complex-step oracle (tests/kernel/kda_oracle.py).

The oracle shares nothing with the reference: a plain token-by-token forward
and Im(L(x + i h e_j)) / h, h = 1e-30, for every input element. Bound: 1e-10
relative (Frobenius, per output array) for dq, dk, dv, dg, dbeta, dh0, and
per sequence for the forward's o, final state and tile-entry states, and for
one of Kernel A's dS snapshots per example.

Strategies (``cases``): tile 2, 4, 8 or 16; lengths 1, C-1, C, C+1, 2C+1 as
often as any of 1..40; equal length (B = 1..2) or a packed varlen batch of
1..3 ragged sequences; H 1..2, K 2..4, V 1..4; l2norm on/off (off: random
directions with |q|^2, |k|^2 uniform in [0.2, 0.8], so the delta rule
contracts); initial_state and dht each present or absent; scale None or
0.1..2; the gate per tile from no decay to 2^-9 (and up to 2^-12 in
between), random per channel and token. K = 1 has its own test (short
sequences, l2norm off: with it on, q/|q| is +-1 up to eps and its gradient is
all rounding). The oracle runs in long double (x86-64: 64-bit mantissa), so
the errors seen are the float64 reference's.

Worst relative error seen over 5000 examples of each hypothesis test, run
once by hand (the same strategies under settings(max_examples=5000)):
dq 6.1e-14, dk 5.7e-15, dv 5.0e-15, dg 7.4e-15, dbeta 1.9e-14, dh0 6.4e-15;
K = 1: dg 7.6e-14, dh0 6.3e-14, others <= 7.8e-15; forward o 1.4e-14,
final state 3.4e-15, tile states 1.2e-14; Kernel A's snapshots 4.2e-15.
The bound leaves > 1000x of room. Run with -s to print this run's worst.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.reference import (array_module, dstate_scan_reference, kda_backward_reference,
                              kda_forward_reference, prepare_tiles, snapshot_offsets)
from kernel.reference.kda import MAX_TILE_DECAY_LOG2

from .. import kda_oracle as oracle

RTOL = 1e-10
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRADS = (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"), ("dh0", "h0"))

_worst: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    if _worst:
        print("\n[kernel.reference.kda] worst relative error vs the complex-step oracle: "
              + ", ".join(f"{k} {v:.2e}" for k, v in sorted(_worst.items())))


def _rel(out, ref) -> float:
    """||out - ref|| / ||ref||; an all-zero ref must be matched exactly."""
    num = float(np.linalg.norm(np.asarray(out) - ref))
    den = float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _record(name: str, err: float) -> None:
    _worst[name] = max(_worst.get(name, 0.0), err)
    assert err < RTOL, f"{name}: relative error {err:.2e} vs the oracle"


# ----------------------------------------------------------------------------
# strategies and inputs
# ----------------------------------------------------------------------------

@st.composite
def cases(draw, K=st.integers(2, 4), max_length=40, qk_l2norm=st.booleans(),
          key_norm2=(0.2, 0.8)):
    """A small KDA problem: tiny K, V; equal length or packed varlen; lengths around tile edges."""
    tile = draw(st.sampled_from([2, 4, 8, 16]))
    edges = sorted(x for x in {1, max(tile - 1, 1), tile, tile + 1, 2 * tile + 1}
                   if x <= max_length)
    length = st.sampled_from(edges) | st.integers(1, max_length)
    if draw(st.booleans()):
        lengths, B = draw(st.lists(length, min_size=1, max_size=3)), None
    else:
        lengths, B = [draw(length)], draw(st.integers(1, 2))
    return dict(
        tile=tile, lengths=lengths, B=B, H=draw(st.integers(1, 2)),
        K=draw(K), V=draw(st.integers(1, 4)), key_norm2=key_norm2,
        qk_l2norm=draw(qk_l2norm), with_h0=draw(st.booleans()), with_dht=draw(st.booleans()),
        scale=draw(st.none() | st.floats(0.1, 2.0)),
        # log2 of a tile's mean decay: 0 (none), 9 (strong), anything in between
        tile_decay_log2=draw(st.sampled_from([0.0, 9.0]) | st.floats(0.0, 12.0)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def make_inputs(p: dict) -> dict:
    """float64 inputs of a case: [B, T, ..] (equal length) or [1, total, ..] with cu_seqlens."""
    rng = np.random.default_rng(p["seed"])
    H, K, V, C = p["H"], p["K"], p["V"], p["tile"]
    if p["B"] is None:
        B, T, N = 1, sum(p["lengths"]), len(p["lengths"])
        cu = np.concatenate([[0], np.cumsum(p["lengths"])]).astype(np.int64)
    else:
        B, T, N, cu = p["B"], p["lengths"][0], p["B"], None
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    if not p["qk_l2norm"]:
        # Raw N(0, 1) keys make beta |k|^2 > 2 likely, an expansive delta rule in
        # which every float64 evaluation loses digits to growth: random directions
        # with |q|^2, |k|^2 uniform in key_norm2 instead (not unit: on/off differ).
        lo, hi = p["key_norm2"]
        for x in (q, k):
            x *= np.sqrt(rng.uniform(lo, hi, (B, T, H, 1)) / (x * x).sum(-1, keepdims=True))
    # per-token gates whose tile of C tokens decays by 2^-tile_decay_log2 on average
    per_token = p["tile_decay_log2"] * math.log(2.0) / C
    g = -per_token * rng.uniform(0.0, 2.0, (B, T, H, K))
    return dict(
        q=q, k=k, v=rng.standard_normal((B, T, H, V)), g=g,
        beta=1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H)))),
        do=rng.standard_normal((B, T, H, V)),
        initial_state=0.5 * rng.standard_normal((N, H, K, V)) if p["with_h0"] else None,
        dht=0.5 * rng.standard_normal((N, H, K, V)) if p["with_dht"] else None,
        cu_seqlens=cu)


def sequences(inp: dict):
    """(n, one sequence's inputs for the oracle) for every sequence."""
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"]
    spans = [(b, 0, T) for b in range(B)] if cu is None else \
        [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    for n, (b, bos, eos) in enumerate(spans):
        seq = {name: inp[name][b, bos:eos] for name in ("q", "k", "v", "g", "beta", "do")}
        seq["h0"] = None if inp["initial_state"] is None else inp["initial_state"][n]
        seq["dht"] = None if inp["dht"] is None else inp["dht"][n]
        yield n, (b, bos, eos), seq


def _kwargs(p: dict, inp: dict) -> dict:
    return dict(scale=p["scale"], initial_state=inp["initial_state"],
                cu_seqlens=inp["cu_seqlens"], qk_l2norm=p["qk_l2norm"], tile=p["tile"])


def _backward(p: dict, inp: dict) -> dict:
    return kda_backward_reference(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["do"],
                                  dht=inp["dht"], **_kwargs(p, inp))


# ----------------------------------------------------------------------------
# the backward against the oracle
# ----------------------------------------------------------------------------

def check_backward(p: dict) -> dict[str, float]:
    """Every gradient of one case against the oracle; returns the worst error per output."""
    inp = make_inputs(p)
    got = _backward(p, inp)
    B, T, H, K = inp["q"].shape
    V = inp["v"].shape[-1]
    N = B if inp["cu_seqlens"] is None else len(inp["cu_seqlens"]) - 1
    shapes = dict(dq=(B, T, H, K), dk=(B, T, H, K), dv=(B, T, H, V), dg=(B, T, H, K),
                  dbeta=(B, T, H), dh0=(N, H, K, V))
    assert set(got) == set(shapes)
    for name, shape in shapes.items():
        assert got[name].shape == shape and got[name].dtype == np.float64, name
    want = {name: np.zeros(shape) for name, shape in shapes.items()}
    for n, (b, bos, eos), seq in sequences(inp):
        ref = oracle.gradients(seq, scale=p["scale"], qk_l2norm=p["qk_l2norm"])
        for out, x in GRADS[:-1]:
            want[out][b, bos:eos] = ref[x]
        want["dh0"][n] = ref["h0"]
    return {out: _rel(got[out], want[out]) for out, _ in GRADS}


@FAST
@given(cases())
def test_backward_matches_complex_step(p):
    for name, err in check_backward(p).items():
        _record(name, err)


@settings(max_examples=20, deadline=None)
@given(cases(K=st.just(1), max_length=16, qk_l2norm=st.just(False), key_norm2=(0.05, 0.3)))
def test_backward_matches_complex_step_k1(p):
    """K = 1 apart: the delta rule scales the one-row state by 1 - beta k^2 a token, so a
    long sequence erases it and dh0 falls to ~1e-5 of the terms the tile algebra sums
    it from (seen: 1.1e-10 relative at 33 tokens); short sequences, small keys."""
    for name, err in check_backward(p).items():
        _record(name, err)


def test_backward_example_with_partial_tiles():
    """A fixed varlen case with every edge at once: lengths 1, C-1, C, C+1, strong gates."""
    p = dict(tile=4, lengths=[1, 3, 4, 5, 13], B=None, H=2, K=3, V=2, qk_l2norm=True,
             key_norm2=None, with_h0=True, with_dht=True, scale=None, tile_decay_log2=9.0, seed=5)
    for name, err in check_backward(p).items():
        _record(name, err)


def test_the_backward_with_forward_adds_the_forwards_o_and_final_state_and_changes_nothing_else():
    """with_forward: o and ht are kda_forward_reference's (the same scan, the same bits), the gradients
    the same bits as without it; a varlen batch with an initial state."""
    rng = np.random.default_rng(7)
    lengths, H, K, V = [1, 5, 12], 2, 6, 4
    T = sum(lengths)
    q, k = rng.standard_normal((2, 1, T, H, K))
    v, do = rng.standard_normal((2, 1, T, H, V))
    g = -np.abs(rng.standard_normal((1, T, H, K)))
    beta = rng.uniform(0, 1, (1, T, H))
    h0, dht = rng.standard_normal((2, len(lengths), H, K, V))
    cu = np.concatenate([[0], np.cumsum(lengths)])
    kw = dict(initial_state=h0, cu_seqlens=cu, tile=4)
    plain = kda_backward_reference(q, k, v, g, beta, do, dht=dht, **kw)
    both = kda_backward_reference(q, k, v, g, beta, do, dht=dht, with_forward=True, **kw)
    o, ht, _ = kda_forward_reference(q, k, v, g, beta, **kw)
    assert set(both) == set(plain) | {"o", "ht"}
    assert all(np.array_equal(both[n], plain[n]) for n in plain)
    assert np.array_equal(both["o"], o) and np.array_equal(both["ht"], ht)


# ----------------------------------------------------------------------------
# the forward against the plain forward
# ----------------------------------------------------------------------------

@FAST
@given(cases())
def test_forward_matches_plain_forward(p):
    inp = make_inputs(p)
    o, final, states = kda_forward_reference(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"],
                                             **_kwargs(p, inp))
    C = p["tile"]
    lengths = [eos - bos for _, (_, bos, eos), _ in sequences(inp)]
    off = snapshot_offsets(lengths, C, 1)
    H, K = inp["q"].shape[2:]
    V = inp["v"].shape[-1]
    assert o.shape == inp["v"].shape and final.shape == (len(lengths), H, K, V)
    if inp["cu_seqlens"] is None:
        assert states.shape == (inp["q"].shape[0], off[1], H, K, V)
    else:
        assert states.shape == (1, off[-1], H, K, V)
    flat_states = states.reshape(-1, H, K, V)
    for n, (b, bos, eos), seq in sequences(inp):
        want_o, want_states = oracle.plain_forward(seq, scale=p["scale"], qk_l2norm=p["qk_l2norm"])
        _record("o", _rel(o[b, bos:eos], want_o))
        _record("final state", _rel(final[n], want_states[-1]))
        for tile in range(off[n + 1] - off[n]):
            # the state entering tile i = the state after token i*C - 1
            _record("tile states", _rel(flat_states[off[n] + tile], want_states[tile * C]))


# ----------------------------------------------------------------------------
# Kernel A's snapshots are the oracle's state gradients
# ----------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(cases(), st.integers(0, 2**16))
def test_dstate_snapshot_is_the_state_gradient(p, pick):
    """One snapshot of dstate_scan_reference against Im(L(S + i h E_ab)) / h inside the loop."""
    inp = make_inputs(p)
    C = p["tile"]
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], scale=p["scale"],
                                 qk_l2norm=p["qk_l2norm"], tile=C, cu_seqlens=inp["cu_seqlens"])
    snaps, _ = dstate_scan_reference(inp["q"], inp["k"], gc, inp["beta"], mqk, inv, inp["do"],
                                     scale=p["scale"], dht=inp["dht"], cu_seqlens=inp["cu_seqlens"],
                                     tile=C, qk_l2norm=p["qk_l2norm"], snapshot_every=1)
    seqs = list(sequences(inp))
    n, (_, bos, eos), seq = seqs[pick % len(seqs)]
    n_tiles = -(-(eos - bos) // C)
    tile = (pick // len(seqs)) % n_tiles
    lengths = [e - b for _, (_, b, e), _ in seqs]
    got = snaps.reshape((-1,) + snaps.shape[2:])[snapshot_offsets(lengths, C, 1)[n] + tile]
    last_token = min((tile + 1) * C, eos - bos) - 1
    want = oracle.state_gradient(seq, last_token, scale=p["scale"], qk_l2norm=p["qk_l2norm"])
    _record("Kernel A snapshot", _rel(got, want))


# ----------------------------------------------------------------------------
# dtypes and array modules
# ----------------------------------------------------------------------------

def _small(seed=0, **over):
    p = dict(tile=4, lengths=[9], B=1, H=2, K=3, V=2, qk_l2norm=True, key_norm2=None,
             with_h0=True, with_dht=True, scale=None, tile_decay_log2=3.0, seed=seed)
    p.update(over)
    return p, make_inputs(p)


def test_narrow_dtypes_are_widened_exactly():
    """float32 and bfloat16 inputs give the float64 answer of the same values."""
    import ml_dtypes
    p, inp = _small()
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        narrow = {k: (v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v)
                  for k, v in inp.items()}
        wide = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == dtype else v)
                for k, v in narrow.items()}
        a, b = _backward(p, narrow), _backward(p, wide)
        for name in a:
            assert a[name].dtype == np.float64
            np.testing.assert_array_equal(a[name], b[name])


def test_dh0_without_initial_state_is_the_gradient_at_zero():
    p, inp = _small(with_h0=False)
    got = _backward(p, inp)["dh0"]
    p0, inp0 = _small(with_h0=False)
    inp0["initial_state"] = np.zeros_like(got)
    np.testing.assert_array_equal(got, _backward(p0, inp0)["dh0"])
    assert np.linalg.norm(got) > 0


@pytest.mark.gpu
def test_cupy_in_cupy_out():
    import cupy
    p, inp = _small(lengths=[1, 4, 7], B=None)
    dev = {k: (cupy.asarray(v) if isinstance(v, np.ndarray) and k != "cu_seqlens" else v)
           for k, v in inp.items()}
    host = _backward(p, inp)
    got = _backward(p, dev)
    for name, x in got.items():
        assert array_module(x) is cupy and x.dtype == np.float64, name
        # the same algebra, other summation orders: equal to float64 rounding
        assert _rel(cupy.asnumpy(x), host[name]) < 1e-13, name
    o, final, states = kda_forward_reference(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"],
                                             **_kwargs(p, dev))
    assert all(array_module(x) is cupy for x in (o, final, states))


# ----------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------

def _args():
    rng = np.random.default_rng(0)
    B, T, H, K, V = 1, 20, 2, 3, 4
    return dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                v=rng.standard_normal((B, T, H, V)), g=-rng.random((B, T, H, K)),
                beta=rng.random((B, T, H)), do=rng.standard_normal((B, T, H, V)),
                initial_state=rng.standard_normal((1, H, K, V)),
                dht=rng.standard_normal((1, H, K, V)), tile=4)


def _call_backward(**over):
    a = {**_args(), **over}
    return kda_backward_reference(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"),
                                  a.pop("do"), **a)


def _with(name, index, value):
    x = _args()[name].copy()
    x[index] = value
    return {name: x}


Z = np.zeros


@pytest.mark.parametrize("over, match", [
    (dict(q=Z((20, 2, 3))), r"q must be 4-D \[B, T, H, K\], got shape \(20, 2, 3\)"),
    (dict(q=Z((1, 20, 2, 0)), k=Z((1, 20, 2, 0)), g=Z((1, 20, 2, 0))), r"q must have B, H, K >= 1"),
    (dict(k=Z((1, 20, 2, 4))), r"k must have shape \(1, 20, 2, 3\).*got \(1, 20, 2, 4\)"),
    (dict(g=Z((1, 19, 2, 3))), r"g must have shape \(1, 20, 2, 3\).*got \(1, 19, 2, 3\)"),
    (dict(v=Z((1, 20, 4))), r"v must be 4-D"),
    (dict(v=Z((1, 20, 3, 4))), r"v must have shape \(1, 20, 2, 4\).*got \(1, 20, 3, 4\)"),
    (dict(beta=Z((1, 20, 2, 1))), r"beta must have shape \(1, 20, 2\).*got \(1, 20, 2, 1\)"),
    (dict(do=Z((1, 20, 2, 5))), r"do must have shape \(1, 20, 2, 4\).*got \(1, 20, 2, 5\)"),
    (dict(do=Z((20, 2, 4))), r"do must be 4-D"),
    (dict(initial_state=Z((2, 2, 3, 4))),
     r"initial_state must have shape \(1, 2, 3, 4\).*got \(2, 2, 3, 4\)"),
    (dict(initial_state=Z((2, 3, 4))), r"initial_state must be 4-D"),
    (dict(dht=Z((1, 2, 4, 3))), r"dht must have shape \(1, 2, 3, 4\).*got \(1, 2, 4, 3\)"),
    (dict(q=Z((1, 20, 2, 3), dtype=np.int32)), r"q must have a real floating dtype.*got int32"),
    (dict(beta=Z((1, 20, 2), dtype=np.complex128)), r"beta must have a real floating dtype.*complex128"),
    (dict(dht=Z((1, 2, 3, 4), dtype=bool)), r"dht must have a real floating dtype.*got bool"),
    (_with("v", (0, 3, 1, 2), np.nan), r"v must be finite, got nan at index \(0, 3, 1, 2\)"),
    (_with("do", (0, 0, 0, 0), np.inf), r"do must be finite, got inf at index \(0, 0, 0, 0\)"),
    (_with("g", (0, 5, 0, 1), -np.inf), r"g must be finite, got -inf"),
    (_with("initial_state", (0, 1, 2, 3), np.nan), r"initial_state must be finite"),
    (_with("g", (0, 7, 1, 0), 0.25), r"g must be <= 0 .*got 0.25 at index \(0, 7, 1, 0\)"),
    (dict(g=np.full((1, 20, 2, 3), -150.0)), r"g: a tile of 4 tokens decays by 2\^-865.6"),
    (dict(tile=5), r"tile must be a positive divisor of 64.*got 5"),
    (dict(cu_seqlens=np.array([0, 5, 5, 20])), r"cu_seqlens must be strictly increasing"),
    (dict(cu_seqlens=np.array([0, 5, 19])), r"cu_seqlens must end at the total length 20, got 19"),
    (dict(cu_seqlens=np.array([0.0, 20.0])), r"cu_seqlens must have an integer dtype"),
    (dict(cu_seqlens=np.array([0, 20])), None),   # one sequence: valid
    (dict(cu_seqlens=np.array([0, 7, 20]), initial_state=None, dht=Z((1, 2, 3, 4))),
     r"dht must have shape \(2, 2, 3, 4\)"),
])
def test_backward_rejects_bad_input(over, match):
    if match is None:
        _call_backward(**over)
        return
    with pytest.raises(ValueError, match=match):
        _call_backward(**over)


def test_forward_rejects_bad_input():
    a = _args()
    with pytest.raises(ValueError, match=r"g must be <= 0"):
        kda_forward_reference(a["q"], a["k"], a["v"], np.abs(a["g"]) + 1e-3, a["beta"], tile=4)
    with pytest.raises(ValueError, match=r"cu_seqlens needs a packed batch of size 1"):
        kda_forward_reference(*(np.repeat(a[n], 2, axis=0) for n in ("q", "k", "v", "g", "beta")),
                              cu_seqlens=np.array([0, 20, 40]), tile=4)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 2, 3, 4\)"):
        kda_forward_reference(a["q"], a["k"], a["v"], a["g"], a["beta"],
                              initial_state=Z((1, 2, 3, 3)), tile=4)


def test_tile_decay_bound_is_the_documented_one():
    """A tile decaying by exactly 2^-MAX_TILE_DECAY_LOG2 is accepted; a little more is refused."""
    a = _args()
    per_token = -MAX_TILE_DECAY_LOG2 * math.log(2.0) / 4
    g = np.full_like(a["g"], per_token)
    _call_backward(g=g * 0.999, initial_state=None, dht=None)
    with pytest.raises(ValueError, match=r"g: a tile of 4 tokens decays"):
        _call_backward(g=g * 1.01)


# ----------------------------------------------------------------------------
# the GEMM table of kernel.tools.floors is the reference's
# ----------------------------------------------------------------------------

def test_floor_gemms_are_the_reference_gemms():
    """Every GEMM named in kda.py's comments has the M/N/K kernel.tools.floors counts."""
    import re
    from pathlib import Path

    from kernel.tools import floors as kda_floors
    from kernel.reference import kda

    source = Path(kda.__file__).read_text()
    named = re.findall(r"#\s+(G\d+)\s.*?M=(\w) N=(\w) K=(\w)", source)
    seen = {name for name, *_ in named}
    # G4, G5 (the dS re-scan) are Kernel A's and run outside this reference
    assert seen == set(kda_floors.GEMMS) - {"G4", "G5"}, sorted(seen)
    for name, m, n, k in named:
        g = kda_floors.GEMMS[name]
        assert (g.m, g.n, g.k) == (m, n, k), (name, (g.m, g.n, g.k), (m, n, k))
    per_tile = sum(kda_floors.GEMMS[g].flops({"C": 16, "K": 128, "V": 128})
                   for g in kda_floors.PER_TOKEN)
    assert per_tile == 5 * 2 * 16 * 128 * 128 + 9 * 2 * 16 * 16 * 128
