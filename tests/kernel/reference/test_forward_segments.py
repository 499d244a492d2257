"""kernel.reference.forward_segments: the forward's chain split along the sequence, against the unsplit forward.

* kda_forward_segmented (three passes) equals kda_forward_reference -- o, the
  final state and the state entering every tile -- to RTOL relative (Frobenius,
  per sequence for o and the final state, per tile for the states), for 1..6
  segments or cuts on any tile edge, varlen or equal length, 1-token sequences,
  initial_state on and off, l2norm on and off, gates from none to 2^-480 a tile
  (fp32 ends at 2^-126; float64's factorised tile at 2^-512);
* a summary applied to a state is the scan of its segment from that state, and
  its M and d are the product and composition of the tile maps
  A_n = diag(gamma) - Kr^T INV diag(beta) Kd, b_n = Kr^T INV diag(beta) v built
  here from prepare_tiles' INV (not through the scan);
* M reads neither q nor v, d not q, and d is linear in v;
* the fold of every segment's summary (the first one's too) gives the unsplit
  forward's state at every segment edge and its final state.

Worst seen while writing these tests (two runs of 800 examples per property, 300 for
the bit-for-bit and linearity ones): 3.9e-15 relative against the unsplit forward;
summaries against the explicit tile maps 6.4e-16 of the size of the maps' terms (see
test_summary_is_the_product_of_tile_maps for why not of M's own norm). Run with -s to
print this run's worst.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.reference import (fold_forward_summaries, forward_segment_summary, kda_forward_reference,
                              kda_forward_segmented, prepare_tiles, segment_bounds, snapshot_offsets)
from kernel.reference.kda import MAX_TILE_DECAY_LOG2

from .segment_checks import FAST, WorstErrors, tile_edges as _tile_edges
from .test_kda import make_inputs as kda_case_inputs

KEY_NORM2 = (0.2, 0.8)   # |q|^2, |k|^2 of a drawn row: a contracting delta rule, as the reference tests draw them

FP32_MIN_LOG2 = 126  # 2^-126: fp32's smallest normal, past which a tile's decay leaves fp32
HARD_DECAY_LOG2 = 240.0  # a tile's mean decay at most; a tile decays by up to twice its mean

_worst = WorstErrors()
_check_close, _check_scaled = _worst.check_close, _worst.check_scaled


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    print(f"\n[kernel.reference.forward_segments] worst relative error vs the unsplit forward: "
          f"{_worst['rel']:.2e}; summaries vs explicit tile maps, of the factors' scale: "
          f"{_worst['scaled']:.2e}")








# ----------------------------------------------------------------------------
# strategies and inputs
# ----------------------------------------------------------------------------



@st.composite
def problems(draw):
    """A small forward problem with many tiles (tile down to 2) and a way to cut every sequence."""
    tile = draw(st.sampled_from([2, 4, 8, 16]))
    edges = {1, max(tile - 1, 1), tile, tile + 1, 4 * tile - 1, 4 * tile, 4 * tile + 1}
    length = st.sampled_from(sorted(edges)) | st.integers(1, 10 * tile)
    if draw(st.booleans()):
        lengths, B = draw(st.lists(length, min_size=1, max_size=4)), None
        seq_lengths = lengths
    else:
        lengths, B = [draw(length)], draw(st.integers(1, 2))
        seq_lengths = lengths * B
    if draw(st.booleans()):
        segments = draw(st.integers(1, 6))
    else:
        segments = [sorted(draw(st.sets(st.sampled_from(e), max_size=5))) if e else []
                    for e in (_tile_edges(n, tile) for n in seq_lengths)]
    return dict(
        tile=tile, lengths=lengths, B=B, H=draw(st.integers(1, 2)), K=draw(st.integers(2, 5)),
        V=draw(st.integers(1, 4)), segments=segments, qk_l2norm=draw(st.booleans()),
        with_h0=draw(st.booleans()), scale=draw(st.none() | st.floats(0.1, 2.0)),
        # log2 of a tile's mean decay: none, strong, past fp32's range, anything in between
        tile_decay_log2=draw(st.sampled_from([0.0, 9.0, 200.0]) | st.floats(0.0, HARD_DECAY_LOG2)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def make_inputs(p: dict) -> dict:
    """float64 inputs as the reference's own tests draw them (test_kda.make_inputs), without the
    backward's do and dht: [B, T, ..] (equal length) or [1, total, ..] with cu_seqlens."""
    inp = kda_case_inputs({**p, "key_norm2": KEY_NORM2, "with_dht": False})
    del inp["do"], inp["dht"]
    return inp


def _args(inp):
    return inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"]


def _opts(p, inp):
    return dict(scale=p["scale"], qk_l2norm=p["qk_l2norm"], tile=p["tile"], cu_seqlens=inp["cu_seqlens"])


def _sequences(inp):
    """(n, batch row, bos, eos) of every sequence; bos, eos in its row's token axis."""
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"]
    if cu is None:
        return [(b, b, 0, T) for b in range(B)]
    return [(n, 0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]


def _flat_start(inp, b: int, bos: int) -> int:
    """A row's token in the flattened token axis (b*T + t)."""
    return b * inp["q"].shape[1] + bos


def _segments_of(p, n: int, length: int) -> list[tuple[int, int]]:
    if isinstance(p["segments"], int):
        return segment_bounds(length, p["tile"], p["segments"])
    edges = [0] + p["segments"][n] + [length]
    return list(zip(edges[:-1], edges[1:]))


def _one_sequence(inp, b: int, lo: int, hi: int, state=None) -> dict:
    """Tokens lo .. hi-1 of batch row b as a batch of one sequence (state: its [H, K, V] h0)."""
    one = {name: inp[name][b:b + 1, lo:hi] for name in ("q", "k", "v", "g", "beta")}
    one["initial_state"] = None if state is None else state[None]
    one["cu_seqlens"] = None
    return one


# ----------------------------------------------------------------------------
# the three passes against the unsplit forward
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_segmented_matches_reference(p):
    inp = make_inputs(p)
    kw = dict(_opts(p, inp), initial_state=inp["initial_state"])
    ref_o, ref_final, ref_states = kda_forward_reference(*_args(inp), **kw)
    o, final, states = kda_forward_segmented(*_args(inp), segments=p["segments"], **kw)
    for out, ref in ((o, ref_o), (final, ref_final), (states, ref_states)):
        assert out.shape == ref.shape and out.dtype == np.float64
    H, K, V = final.shape[1:]
    flat_states, flat_ref = states.reshape(-1, H, K, V), ref_states.reshape(-1, H, K, V)
    for n, b, bos, eos in _sequences(inp):
        _check_close(o[b, bos:eos], ref_o[b, bos:eos], f"o of sequence {n}")
        _check_close(final[n], ref_final[n], f"final state of sequence {n}")
    for i in range(flat_ref.shape[0]):
        _check_close(flat_states[i], flat_ref[i], f"state entering tile {i}")


def test_gates_past_fp32s_range():
    """16-token tiles decaying by 2^-200 .. 2^-461 a channel: nothing fp32 could hold, M of a
    segment down in float64's subnormals or zero, and the split still the unsplit forward."""
    p = dict(tile=16, lengths=[203], B=2, H=2, K=4, V=3, qk_l2norm=True, with_h0=True, scale=None,
             tile_decay_log2=HARD_DECAY_LOG2, seed=7, segments=5)
    inp = make_inputs(p)
    tile_decay = -inp["g"][:, :192].reshape(2, 12, 16, 2, 4).sum(2).max() / math.log(2.0)
    assert FP32_MIN_LOG2 < tile_decay < MAX_TILE_DECAY_LOG2
    kw = dict(_opts(p, inp), initial_state=inp["initial_state"])
    ref = kda_forward_reference(*_args(inp), **kw)
    out = kda_forward_segmented(*_args(inp), segments=5, **kw)
    for name, a, r in zip(("o", "final state", "states"), out, ref):
        for b in range(2):
            _check_close(a[b], r[b], f"{name}, row {b}")


@pytest.mark.parametrize("segments", [1, 2, 3, 13, 20, [[16, 32, 48, 160]], [[192]]])
def test_gpu_sized_tiles(segments):
    """16-token tiles, a sequence of 200 tokens (13 tiles, the last partial), cut evenly, on
    single tiles, on 64-token edges and not, up to one segment a tile."""
    p = dict(tile=16, lengths=[200], B=1, H=2, K=5, V=4, qk_l2norm=True, with_h0=True, scale=None,
             tile_decay_log2=1.0, seed=3)
    inp = make_inputs(p)
    kw = dict(_opts(p, inp), initial_state=inp["initial_state"])
    ref = kda_forward_reference(*_args(inp), **kw)
    out = kda_forward_segmented(*_args(inp), segments=segments, **kw)
    for name, a, r in zip(("o", "final state", "states"), out, ref):
        _check_close(a, r, name)


def test_one_segment_and_two_are_the_unsplit_forward_bit_for_bit():
    """One segment is the unsplit scan; with two, the second starts from the first's real
    S_after: no summary, no fold, the same sums in the same order."""
    p = dict(tile=4, lengths=[1, 9, 22], B=None, H=2, K=3, V=2, qk_l2norm=True, with_h0=True,
             scale=None, tile_decay_log2=2.0, seed=1)
    inp = make_inputs(p)
    kw = dict(_opts(p, inp), initial_state=inp["initial_state"])
    ref = kda_forward_reference(*_args(inp), **kw)
    for segments in (1, 2, [[], [4], [12]]):
        for a, r in zip(kda_forward_segmented(*_args(inp), segments=segments, **kw), ref):
            np.testing.assert_array_equal(a, r)


# ----------------------------------------------------------------------------
# the summaries
# ----------------------------------------------------------------------------

def _pick_segment(p, inp, data):
    seqs = _sequences(inp)
    n, b, bos, eos = seqs[data.draw(st.integers(0, len(seqs) - 1), label="sequence")]
    bounds = _segments_of(p, n, eos - bos)
    lo, hi = bounds[data.draw(st.integers(0, len(bounds) - 1), label="segment")]
    return n, b, bos + lo, bos + hi


def _summary(p, inp, b, lo, hi, **over):
    start = _flat_start(inp, b, lo)
    return forward_segment_summary(*_args(dict(inp, **over)), start=start,
                                   stop=start + hi - lo, **_opts(p, inp))


@FAST
@given(problems(), st.data())
def test_summary_applied_to_a_state_is_the_scan_from_it(p, data):
    inp = make_inputs(p)
    n, b, lo, hi = _pick_segment(p, inp, data)
    M, d = _summary(p, inp, b, lo, hi)
    H, K, V = d.shape
    assert M.shape == (H, K, K) and M.dtype == np.float64 and d.dtype == np.float64
    X = np.random.default_rng(data.draw(st.integers(0, 2**16), label="state")).standard_normal((H, K, V))
    one = _one_sequence(inp, b, lo, hi, X)
    _, final, _ = kda_forward_reference(*_args(one), initial_state=one["initial_state"],
                                        scale=p["scale"], qk_l2norm=p["qk_l2norm"], tile=p["tile"])
    _check_close(M @ X + d, final[0], f"M X + d of tokens {lo} .. {hi - 1} of row {b}")


def _tile_maps(p, inp, b: int, lo: int, hi: int, h: int):
    """(A_n, b_n, scale_A, scale_b) of every tile of row b's tokens lo .. hi-1, head h, from
    A_n = diag(gamma) - Kr^T INV diag(beta) Kd and b_n = Kr^T INV diag(beta) v, with
    prepare_tiles' gc and INV; the scales are the norms of the maps' terms."""
    C = p["tile"]
    one = _one_sequence(inp, b, lo, hi)
    gc, _, inv = prepare_tiles(one["q"], one["k"], one["g"], one["beta"], scale=p["scale"],
                               qk_l2norm=p["qk_l2norm"], tile=C)
    k = one["k"][0, :, h]
    if p["qk_l2norm"]:
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    gc, inv = gc[0, :, h], inv[0, :, h]
    beta, v = one["beta"][0, :, h], one["v"][0, :, h]
    nrm = np.linalg.norm
    maps = []
    for t0 in range(0, hi - lo, C):
        tok = np.arange(t0, min(t0 + C, hi - lo))
        L = tok.size
        gT = gc[tok[-1]]
        Kd, Kr = k[tok] * np.exp2(gc[tok]), k[tok] * np.exp2(gT - gc[tok])
        INV = inv[tok][:, :L]                                   # row c at token c
        into = Kr.T @ INV @ np.diag(beta[tok])                  # [K, L]
        decay = np.diag(np.exp2(gT))
        A_n, b_n = decay - into @ Kd, into @ v[tok]
        # the size of the terms before they cancel: what rounding scales with
        maps.append((A_n, b_n, float(nrm(decay) + nrm(into) * nrm(Kd)), float(nrm(into) * nrm(v[tok]))))
    return maps


@FAST
@given(problems(), st.data())
def test_summary_is_the_product_of_tile_maps(p, data):
    inp = make_inputs(p)
    n, b, lo, hi = _pick_segment(p, inp, data)
    M, d = _summary(p, inp, b, lo, hi)
    K, V = d.shape[1:]
    for h in range(d.shape[0]):
        # A_n is a difference of terms that can nearly cancel, so the error is measured
        # against the product of the terms' sizes for M, composed the same way for d
        want_M, want_d = np.eye(K), np.zeros((K, V))
        scale_M, scale_d = 1.0, 0.0
        for A_n, b_n, scale_A, scale_b in _tile_maps(p, inp, b, lo, hi, h):
            want_M, want_d = A_n @ want_M, A_n @ want_d + b_n        # last tile leftmost
            scale_M, scale_d = scale_A * scale_M, scale_A * scale_d + scale_b
        _check_scaled(M[h], want_M, scale_M, f"M, head {h}")
        _check_scaled(d[h], want_d, scale_d, f"d, head {h}")


@settings(max_examples=20, deadline=None)
@given(problems(), st.data())
def test_M_reads_neither_q_nor_v_and_d_not_q(p, data):
    """Other q and v leave M bit for bit, other q leaves d (the state never meets q)."""
    inp = make_inputs(p)
    _, b, lo, hi = _pick_segment(p, inp, data)
    M, d = _summary(p, inp, b, lo, hi)
    rng = np.random.default_rng(1)
    q2, v2 = rng.standard_normal(inp["q"].shape), rng.standard_normal(inp["v"].shape)
    M2, d2 = _summary(p, inp, b, lo, hi, q=q2, v=v2)
    np.testing.assert_array_equal(M2, M)
    assert not np.array_equal(d2, d)
    M3, d3 = _summary(p, inp, b, lo, hi, q=q2)
    np.testing.assert_array_equal(M3, M)
    np.testing.assert_array_equal(d3, d)


@settings(max_examples=20, deadline=None)
@given(problems(), st.data(), st.floats(-3.0, 3.0), st.floats(-3.0, 3.0))
def test_d_is_linear_in_v(p, data, x, y):
    inp = make_inputs(p)
    _, b, lo, hi = _pick_segment(p, inp, data)
    v1 = inp["v"]
    v2 = np.random.default_rng(2).standard_normal(v1.shape)
    _, d1 = _summary(p, inp, b, lo, hi)
    _, d2 = _summary(p, inp, b, lo, hi, v=v2)
    _, d12 = _summary(p, inp, b, lo, hi, v=x * v1 + y * v2)
    # the combination's own size is no measure where x d1 and y d2 cancel: theirs is
    scale = float(np.linalg.norm(x * d1) + np.linalg.norm(y * d2))
    _check_scaled(d12, x * d1 + y * d2, scale, "d(x v1 + y v2)")
    _, d0 = _summary(p, inp, b, lo, hi, v=np.zeros_like(v1))
    np.testing.assert_array_equal(d0, np.zeros_like(d0))


# ----------------------------------------------------------------------------
# the fold against the unsplit forward
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_fold_of_every_summary_gives_the_forwards_states(p):
    """Summaries of *every* segment (the first too), folded from h0: incoming[j] is the unsplit
    forward's state entering segment j's first tile, and M_last @ incoming[-1] + d_last (the
    fold of one more, empty, segment) is its final state."""
    inp = make_inputs(p)
    _, ref_final, ref_states = kda_forward_reference(*_args(inp), initial_state=inp["initial_state"],
                                                     **_opts(p, inp))
    H, K, V = ref_final.shape[1:]
    every_tile = ref_states.reshape(-1, H, K, V)
    seqs = _sequences(inp)
    first_tile = snapshot_offsets([eos - bos for _, _, bos, eos in seqs], p["tile"], 1)
    for n, b, bos, eos in seqs:
        bounds = _segments_of(p, n, eos - bos)
        summaries = [_summary(p, inp, b, bos + lo, bos + hi) for lo, hi in bounds]
        h0 = None if inp["initial_state"] is None else inp["initial_state"][n]
        incoming = fold_forward_summaries(summaries + [None], h0)
        assert len(incoming) == len(bounds) + 1
        for j, (lo, _) in enumerate(bounds):
            want = every_tile[first_tile[n] + lo // p["tile"]]
            got = np.zeros((H, K, V)) if incoming[j] is None else incoming[j]
            _check_close(got, want, f"sequence {n}, state entering segment {j}")
        _check_close(incoming[-1], ref_final[n], f"sequence {n}, final state from the fold")


def test_fold_reads_constant_summaries_and_skips_the_last():
    rng = np.random.default_rng(0)
    H, K, V = 2, 3, 4
    M1, d0, d1 = rng.standard_normal((H, K, K)), rng.standard_normal((H, K, V)), rng.standard_normal((H, K, V))
    h0 = rng.standard_normal((H, K, V))
    # M None: the segment's S_after is d, whatever enters it
    incoming = fold_forward_summaries([(None, d0), (M1, d1), None], h0)
    assert incoming[0] is h0 and incoming[1] is d0
    np.testing.assert_array_equal(incoming[2], M1 @ d0 + d1)
    # h0 None (zeros): the first segment's S_after is its d
    incoming = fold_forward_summaries([(M1, d1), None], None)
    assert incoming[0] is None and incoming[1] is d1
    assert fold_forward_summaries([None], None) == [None]
    assert fold_forward_summaries([None], h0)[0] is h0


# ----------------------------------------------------------------------------
# validation at the boundary
# ----------------------------------------------------------------------------

def _small():
    """Two sequences, 10 and 13 tokens, tile 4 (tiles at 0, 4, 8 and 10, 14, 18, 22)."""
    p = dict(tile=4, lengths=[10, 13], B=None, H=2, K=3, V=4, qk_l2norm=True, with_h0=True,
             scale=None, tile_decay_log2=1.0, seed=0)
    return make_inputs(p)


def test_segmented_rejects_bad_segments_by_the_shared_check():
    """``segments`` is read by kernel.reference.segments.segment_ranges, whose messages
    tests/kernel/reference/test_segments.py goes through case by case: here, that the forward uses it."""
    inp = _small()
    with pytest.raises(ValueError, match=r"segments must be an integer >= 1 or one list of cuts per sequence, got 0"):
        kda_forward_segmented(*_args(inp), segments=0, tile=4, cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(ValueError, match=r"segments\[1\]\[0\] = 5 must be a tile edge strictly inside the sequence"):
        kda_forward_segmented(*_args(inp), segments=[[4], [5]], tile=4, cu_seqlens=inp["cu_seqlens"])


def test_segmented_checks_the_forwards_arguments():
    inp = _small()
    kw = dict(segments=2, tile=4, cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 3, 4\).*got \(1, 2, 3, 4\)"):
        kda_forward_segmented(*_args(inp), initial_state=np.zeros((1, 2, 3, 4)), **kw)
    with pytest.raises(ValueError, match=r"beta must have shape \(1, 23, 2\)"):
        kda_forward_segmented(*_args(dict(inp, beta=inp["beta"][..., :1])), **kw)
    with pytest.raises(ValueError, match=r"g must be <= 0"):
        kda_forward_segmented(*_args(dict(inp, g=-inp["g"] + 0.1)), **kw)
    with pytest.raises(ValueError, match=r"v must have a real floating dtype .*got complex128"):
        kda_forward_segmented(*_args(dict(inp, v=inp["v"].astype(np.complex128))), **kw)
    with pytest.raises(ValueError, match=r"tile must be a positive divisor of 64"):
        kda_forward_segmented(*_args(inp), segments=2, tile=5, cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(TypeError, match=r"segments"):
        kda_forward_segmented(*_args(inp), tile=4, cu_seqlens=inp["cu_seqlens"])   # no default


def test_summary_rejects_bad_ranges_by_the_shared_check():
    """A segment's range is checked by kernel.reference.segments.segment_range, whose messages
    tests/kernel/reference/test_segments.py goes through case by case: here, that the forward uses it."""
    inp = _small()
    with pytest.raises(ValueError, match=r"start = 2 is not a tile edge of sequence 0 \(tokens 0 .. 9, tile 4\)"):
        forward_segment_summary(*_args(inp), start=2, tile=4, cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(ValueError, match=r"stop must be an integer in 5 .. 10"):
        forward_segment_summary(*_args(inp), start=4, stop=14, tile=4, cu_seqlens=inp["cu_seqlens"])


def test_summary_ranges_at_tile_edges_and_sequence_ends_are_accepted():
    inp = _small()
    for start, stop in [(0, 4), (8, 10), (10, 14), (18, 23), (14, None), (np.int64(4), np.int32(8))]:
        M, d = forward_segment_summary(*_args(inp), start=start, stop=stop, tile=4,
                                       cu_seqlens=inp["cu_seqlens"])
        assert M.shape == (2, 3, 3) and d.shape == (2, 3, 4)


@pytest.mark.parametrize("summaries, h0, match", [
    ([], None, r"summaries must hold at least one entry"),
    (5, None, r"summaries must be a sequence of \(M, d\) pairs, got int"),
    ([None, None], None, r"summaries\[0\] must be an \(M, d\) pair, got NoneType"),
    ([(None, np.zeros((2, 3))), None], None, r"summaries\[0\] d must be \[H, K, V\], got shape \(2, 3\)"),
    ([(None, np.zeros((2, 3, 4))), None], np.zeros((2, 3, 5)),
     r"summaries\[0\] d must have shape \(2, 3, 5\) \(as h0 and the other segments\), got \(2, 3, 4\)"),
    ([(np.zeros((2, 3, 4)), np.zeros((2, 3, 4))), None], None,
     r"summaries\[0\] M must have shape \(2, 3, 3\) \(\[H, K, K\]\) or be None, got \(2, 3, 4\)"),
    ([None], np.zeros((1, 2, 3, 4)), r"h0 must be \[H, K, V\] \(one sequence\), got shape \(1, 2, 3, 4\)"),
])
def test_fold_rejects_bad_summaries(summaries, h0, match):
    with pytest.raises(ValueError, match=match):
        fold_forward_summaries(summaries, h0)
