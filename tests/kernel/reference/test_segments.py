"""kernel.reference.segments: the sequence split of Kernel A's scan, against the unsplit scan.

* dstate_scan_segmented (three passes) equals dstate_scan_reference, every
  snapshot and dh0, to RTOL relative (Frobenius, per snapshot), for any number
  of segments, boundaries on any tile edge (also inside a snapshot chunk when
  snapshot_every > 1), varlen or equal length, dht on and off.
* the fold of every segment's summary gives the direct scan's dS at every
  segment boundary;
* a summary's M is the product of the tile maps A_n and its d the composition of
  the b_n, both built here explicitly from the formulas (not through the scan).

Worst seen while writing these tests (800 examples per property, four hypothesis
seeds; gate strength up to 4, l2norm on and off): 4.6e-15 relative against the
unsplit scan and fold; summaries against the explicit tile maps 1.9e-16 of the
size of the maps' terms (see test_summary_is_the_product_of_tile_maps for why
not of M's own norm). Run with -s to print this run's worst.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.reference import (
    dstate_scan_reference,
    dstate_scan_segmented,
    fold_summaries,
    prepare_tiles,
    random_inputs,
    segment_bounds,
    segment_snapshots,
    segment_summary,

)

from ..scan_cases import scan_case, scan_inputs
from .segment_checks import FAST, WorstErrors, tile_edges as _tile_edges


_worst = WorstErrors()
_check_close, _check_scaled = _worst.check_close, _worst.check_scaled


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    print(f"\n[kernel.reference.segments] worst relative error vs the unsplit scan: {_worst['rel']:.2e}; "
          f"summaries vs explicit tile maps, of the factors' scale: {_worst['scaled']:.2e}")








# ----------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------



@st.composite
def problems(draw):
    """A small problem with many tiles (tile down to 2) and a way to cut every sequence."""
    tile = draw(st.sampled_from([2, 4, 8, 16]))
    length = st.one_of(st.sampled_from(sorted({1, max(tile - 1, 1), tile, tile + 1,
                                                4 * tile, 4 * tile + 1})),
                       st.integers(1, 10 * tile))
    if draw(st.booleans()):
        lengths = draw(st.lists(length, min_size=1, max_size=4))
        B = T = None
        seq_lengths = lengths
    else:
        lengths, B, T = None, draw(st.integers(1, 2)), draw(length)
        seq_lengths = [T] * B
    # an even split into S, or explicit cuts on arbitrary tile edges
    if draw(st.booleans()):
        segments = draw(st.integers(1, 8))
    else:
        segments = [sorted(draw(st.sets(st.sampled_from(edges)))) if edges else []
                    for edges in (_tile_edges(n, tile) for n in seq_lengths)]
    return scan_case(draw, B=B, T=T, lengths=lengths, tile=tile) | dict(
        snapshot_every=draw(st.sampled_from([1, 4]) | st.integers(1, 5)),
        segments=segments,
    )


def _inputs(p) -> dict:
    """Inputs with their tile quantities; q, k shrunk when not l2-normalised (as test_dstate_scan)."""
    inp = scan_inputs(p)
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], scale=p["scale"],
                                 qk_l2norm=p["qk_l2norm"], tile=p["tile"],
                                 cu_seqlens=inp["cu_seqlens"])
    inp.update(gc=gc, mqk=mqk, inv=inv)
    return inp


def _args(inp):
    return (inp["q"], inp["k"], inp["gc"], inp["beta"], inp["mqk"], inp["inv"], inp["do"])


def _opts(p):
    return dict(scale=p["scale"], tile=p["tile"], qk_l2norm=p["qk_l2norm"])


def _sequences(inp):
    """(bos, eos) of every sequence in the flattened token axis."""
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"]
    if cu is None:
        return [(b * T, (b + 1) * T) for b in range(B)]
    return [(int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]


def _segments_of(p, n: int, length: int) -> list[tuple[int, int]]:
    if isinstance(p["segments"], int):
        return segment_bounds(length, p["tile"], p["segments"])
    edges = [0] + p["segments"][n] + [length]
    return list(zip(edges[:-1], edges[1:]))


def _flat(x):
    return x.reshape((-1,) + x.shape[2:]).astype(np.float64)


# ----------------------------------------------------------------------------
# the three passes against the unsplit scan
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_segmented_matches_reference(p):
    inp = _inputs(p)
    kw = dict(**_opts(p), dht=inp["dht"], cu_seqlens=inp["cu_seqlens"],
              snapshot_every=p["snapshot_every"])
    ref_snaps, ref_dh0 = dstate_scan_reference(*_args(inp), **kw)
    snaps, dh0 = dstate_scan_segmented(*_args(inp), segments=p["segments"], **kw)
    assert snaps.shape == ref_snaps.shape and dh0.shape == ref_dh0.shape
    assert snaps.dtype == np.float64 and dh0.dtype == np.float64
    for b in range(snaps.shape[0]):
        for m in range(snaps.shape[1]):
            _check_close(snaps[b, m], ref_snaps[b, m], f"snapshot [{b}, {m}]")
    for n in range(dh0.shape[0]):
        _check_close(dh0[n], ref_dh0[n], f"dh0[{n}]")


@pytest.mark.parametrize("cuts", [[16], [16, 32, 48], [80, 96, 160], [64, 128]])
@pytest.mark.parametrize("with_dht", [True, False])
def test_boundaries_inside_snapshot_chunks(cuts, with_dht):
    """GPU sizes: 16-token tiles, a snapshot every 4th tile (bf16-every-64's grid), cuts on
    tile edges that are not 64-token edges (16, 80, ...) as well as ones that are (64, 128)."""
    inp = random_inputs(1, 200, 1, 4, 3, seed=5, with_dht=with_dht)
    p = dict(scale=None, tile=16, qk_l2norm=True)
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=16)
    inp.update(gc=gc, mqk=mqk, inv=inv)
    kw = dict(**_opts(p), dht=inp["dht"], snapshot_every=4)
    ref_snaps, ref_dh0 = dstate_scan_reference(*_args(inp), **kw)
    snaps, dh0 = dstate_scan_segmented(*_args(inp), segments=[cuts], **kw)
    assert snaps.shape == ref_snaps.shape == (1, 4, 1, 4, 3)
    for m in range(4):
        _check_close(snaps[0, m], ref_snaps[0, m], f"snapshot {m}")
    _check_close(dh0, ref_dh0, "dh0")


# ----------------------------------------------------------------------------
# the fold against the direct scan
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_fold_gives_the_scans_dS_at_every_boundary(p):
    """Summaries of *every* segment (the first too), folded from dht: incoming[j] is the
    direct scan's dS entering segment j's last tile, and M_0 @ incoming[0] + d_0 is dh0."""
    inp = _inputs(p)
    ref_snaps, ref_dh0 = dstate_scan_reference(*_args(inp), **_opts(p), dht=inp["dht"],
                                               cu_seqlens=inp["cu_seqlens"], snapshot_every=1)
    H, K, V = ref_snaps.shape[2:]
    every_tile = ref_snaps.reshape(-1, H, K, V)     # snapshot = dS entering each tile, in token order
    tile = p["tile"]
    first_snap = 0
    for n, (bos, eos) in enumerate(_sequences(inp)):
        bounds = _segments_of(p, n, eos - bos)
        summaries = [segment_summary(*_args(inp), start=bos + a, stop=bos + b,
                                     cu_seqlens=inp["cu_seqlens"], **_opts(p)) for a, b in bounds]
        dht = None if inp["dht"] is None else inp["dht"][n].astype(np.float64)
        incoming = fold_summaries(summaries, dht)
        assert len(incoming) == len(bounds)
        for j, (_, b) in enumerate(bounds):
            last_tile = -(-b // tile) - 1
            want = every_tile[first_snap + last_tile]
            got = np.zeros((H, K, V)) if incoming[j] is None else incoming[j]
            _check_close(got, want, f"sequence {n}, dS entering segment {j}")
        M0, d0 = summaries[0]
        x = np.zeros((H, K, V)) if incoming[0] is None else incoming[0]
        _check_close(M0 @ x + d0, ref_dh0[n], f"sequence {n}, dh0 from the first summary")
        first_snap += -(-(eos - bos) // tile)


def test_fold_reads_constant_summaries_and_skips_the_first():
    rng = np.random.default_rng(0)
    H, K, V = 2, 3, 4
    M1, d1, d2 = rng.standard_normal((H, K, K)), rng.standard_normal((H, K, V)), rng.standard_normal((H, K, V))
    dht = rng.standard_normal((H, K, V))
    # M None: the segment's dS_before is d, whatever enters it
    incoming = fold_summaries([None, (M1, d1), (None, d2)], dht)
    assert incoming[2] is dht and incoming[1] is d2
    np.testing.assert_array_equal(incoming[0], M1 @ d2 + d1)
    # dht None (zeros): the last segment's dS_before is its d
    incoming = fold_summaries([None, (M1, d1)], None)
    assert incoming[1] is None and incoming[0] is d1
    assert fold_summaries([None], None) == [None]


# ----------------------------------------------------------------------------
# the summary against explicitly built tile maps
# ----------------------------------------------------------------------------

def _tile_maps(inp, p, bos: int, a: int, b: int, h: int):
    """(A_n, b_n, scale_A, scale_b) of every tile of tokens bos+a .. bos+b-1, head h, from the
    formulas A_n = Diag(exp2(gT)) - kd^T diag(beta) INV^T kr and
    b_n = qd^T do - kd^T diag(beta) INV^T Mqk^T do; the scales are the norms of their terms."""
    C = p["tile"]
    K = inp["q"].shape[-1]
    s = K ** -0.5 if p["scale"] is None else p["scale"]
    q, k = _flat(inp["q"])[:, h], _flat(inp["k"])[:, h]
    if p["qk_l2norm"]:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    gc, beta, do = _flat(inp["gc"])[:, h], _flat(inp["beta"])[:, h], _flat(inp["do"])[:, h]
    mqk, inv = _flat(inp["mqk"])[:, h], _flat(inp["inv"])[:, h]
    maps = []
    for t0 in range(a, b, C):
        tok = np.arange(bos + t0, bos + min(t0 + C, b))
        L = tok.size
        g = gc[tok]                                   # [L, K]
        gT = g[-1]
        qd, kd, kr = s * q[tok] * np.exp2(g), k[tok] * np.exp2(g), k[tok] * np.exp2(gT - g)
        INV, Mqk = inv[tok][:, :L], mqk[tok][:, :L]   # row c at token c
        back = kd.T @ np.diag(beta[tok]) @ INV.T      # [K, L]
        decay = np.diag(np.exp2(gT))
        A_n, b_n = decay - back @ kr, qd.T @ do[tok] - back @ Mqk.T @ do[tok]
        # the size of the terms before they cancel: what rounding scales with
        nrm = np.linalg.norm
        scale_A = nrm(decay) + nrm(back) * nrm(kr)
        scale_b = (nrm(qd) + nrm(back) * nrm(Mqk)) * nrm(do[tok])
        maps.append((A_n, b_n, float(scale_A), float(scale_b)))
    return maps


@FAST
@given(problems(), st.data())
def test_summary_is_the_product_of_tile_maps(p, data):
    inp = _inputs(p)
    seqs = _sequences(inp)
    n = data.draw(st.integers(0, len(seqs) - 1), label="sequence")
    bos, eos = seqs[n]
    bounds = _segments_of(p, n, eos - bos)
    a, b = bounds[data.draw(st.integers(0, len(bounds) - 1), label="segment")]
    M, d = segment_summary(*_args(inp), start=bos + a, stop=bos + b, cu_seqlens=inp["cu_seqlens"],
                           **_opts(p))
    H, K, V = d.shape
    assert M.shape == (H, K, K) and M.dtype == np.float64 and d.dtype == np.float64
    for h in range(H):
        # A_n is a difference of terms that nearly cancel (16 unit keys in K = 2
        # dimensions: ||A_n|| far below its terms' norms; seen: ||M|| = 4e-9 over three
        # tiles), so the error is measured against what rounding scales with: the
        # product of the terms' sizes for M, composed the same way for d.
        want_M, want_d = np.eye(K), np.zeros((K, V))
        scale_M, scale_d = 1.0, 0.0
        for A_n, b_n, scale_A, scale_b in reversed(_tile_maps(inp, p, bos, a, b, h)):
            want_M, want_d = A_n @ want_M, A_n @ want_d + b_n        # from the segment's end
            scale_M, scale_d = scale_A * scale_M, scale_A * scale_d + scale_b
        _check_scaled(M[h], want_M, scale_M, f"M, head {h}")
        _check_scaled(d[h], want_d, scale_d, f"d, head {h}")


@settings(max_examples=20, deadline=None)
@given(problems())
def test_M_needs_neither_q_nor_do_nor_mqk(p):
    """Replacing q, do and Mqk by other numbers leaves M bit for bit (they only meet do = 0)."""
    inp = _inputs(p)
    bos, eos = _sequences(inp)[0]
    kw = dict(start=bos, stop=eos, cu_seqlens=inp["cu_seqlens"], **_opts(p))
    M, d = segment_summary(*_args(inp), **kw)
    rng = np.random.default_rng(1)
    other = dict(inp, q=rng.standard_normal(inp["q"].shape), do=rng.standard_normal(inp["do"].shape),
                 mqk=rng.standard_normal(inp["mqk"].shape))
    M2, d2 = segment_summary(*_args(other), **kw)
    np.testing.assert_array_equal(M2, M)
    assert not np.array_equal(d2, d)


# ----------------------------------------------------------------------------
# segment_bounds
# ----------------------------------------------------------------------------

def test_segment_bounds_examples():
    assert segment_bounds(200, 16, 4) == [(0, 48), (48, 96), (96, 144), (144, 200)]  # 13 tiles: 3,3,3,4
    assert segment_bounds(15, 16, 4) == [(0, 15)]                 # one tile: not cut
    assert segment_bounds(33, 16, 8) == [(0, 16), (16, 32), (32, 33)]
    assert segment_bounds(64, 16, 1) == [(0, 64)]


@given(st.integers(1, 2000), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 40))
def test_segment_bounds_cover_the_sequence_at_tile_edges(length, tile, segments):
    bounds = segment_bounds(length, tile, segments)
    n_tiles = -(-length // tile)
    assert len(bounds) == min(segments, n_tiles)
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    assert all(a % tile == 0 and a < b for a, b in bounds)
    tiles = [-(-b // tile) - a // tile for a, b in bounds]
    assert max(tiles) - min(tiles) <= 1


@given(st.integers(1, 600), st.sampled_from([1, 2, 4, 16]), st.integers(1, 6), st.data())
def test_segment_snapshots_of_consecutive_segments_are_the_sequences(length, tile, e, data):
    edges = _tile_edges(length, tile)
    cuts = sorted(data.draw(st.sets(st.sampled_from(edges)), label="cuts")) if edges else []
    bounds = list(zip([0] + cuts, cuts + [length]))
    n_s = -(-(-(-length // tile)) // e)
    which = []
    for a, b in bounds:
        tiles, snaps = segment_snapshots(a, b, length, tile, e)
        n_tiles = -(-(b - a) // tile)
        assert np.all((0 <= tiles) & (tiles < n_tiles))
        # snapshot m is the dS entering tile min(e m + e - 1, n_t - 1)
        np.testing.assert_array_equal(np.minimum(e * snaps + e - 1, -(-length // tile) - 1),
                                      a // tile + tiles)
        which.extend(snaps.tolist())
    assert which == list(range(n_s))


# ----------------------------------------------------------------------------
# validation at the boundary
# ----------------------------------------------------------------------------

def _small():
    """Two sequences, 10 and 13 tokens, tile 4 (tiles at 0, 4, 8 and 10, 14, 18, 22)."""
    inp = random_inputs(None, None, 2, 3, 4, lengths=[10, 13], seed=0)
    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=4,
                                 cu_seqlens=inp["cu_seqlens"])
    inp.update(gc=gc, mqk=mqk, inv=inv)
    return inp


@pytest.mark.parametrize("segments, match", [
    (0, r"segments must be an integer >= 1 or one list of cuts per sequence, got 0"),
    (True, r"segments must be an integer >= 1 or one list of cuts per sequence, got True"),
    ("2", r"segments must be an integer >= 1 or one list of cuts per sequence"),
    ([[4]], r"segments as cuts needs one list per sequence \(2\), got 1"),
    ([[4], [5]], r"segments\[1\]\[0\] = 5 must be a tile edge strictly inside the sequence "
                 r"\(a multiple of tile = 4 in 1 .. 12\)"),
    ([[10], []], r"segments\[0\]\[0\] = 10 must be a tile edge strictly inside"),
    ([[0], []], r"segments\[0\]\[0\] = 0 must be a tile edge"),
    ([[8, 4], []], r"segments\[0\] must be strictly increasing, got segments\[0\]\[0\] = 8 >= "
                   r"segments\[0\]\[1\] = 4"),
    ([[4.0], []], r"segments\[0\]\[0\] must be an integer token offset, got 4.0"),
    ([3, []], r"segments\[0\] must be a sequence of token offsets, got 3"),
])
def test_segmented_rejects_bad_segments(segments, match):
    inp = _small()
    with pytest.raises(ValueError, match=match):
        dstate_scan_segmented(*_args(inp), segments=segments, tile=4, cu_seqlens=inp["cu_seqlens"])


def test_segmented_checks_the_scans_arguments():
    inp = _small()
    with pytest.raises(ValueError, match=r"dht must have shape \(2, 2, 3, 4\).*got \(1, 2, 3, 4\)"):
        dstate_scan_segmented(*_args(inp), segments=2, tile=4, cu_seqlens=inp["cu_seqlens"],
                              dht=np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"mqk must have shape \(1, 23, 2, 4\)"):
        dstate_scan_segmented(*_args(dict(inp, mqk=inp["mqk"][..., :2])), segments=2, tile=4,
                              cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(ValueError, match=r"snapshot_every must be an integer >= 1, got 0"):
        dstate_scan_segmented(*_args(inp), segments=2, tile=4, cu_seqlens=inp["cu_seqlens"],
                              snapshot_every=0)


@pytest.mark.parametrize("start, stop, match", [
    (-1, None, r"start must be an integer token position in 0 .. 22, got -1"),
    (23, None, r"start must be an integer token position in 0 .. 22, got 23"),
    (2, None, r"start = 2 is not a tile edge of sequence 0 \(tokens 0 .. 9, tile 4\)"),
    (12, None, r"start = 12 is not a tile edge of sequence 1 \(tokens 10 .. 22, tile 4\)"),
    (0, 6, r"stop = 6 is not a tile edge of sequence 0"),
    (4, 14, r"stop must be an integer in 5 .. 10 \(the segment may not cross the end of "
            r"sequence 0, tokens 0 .. 9\), got 14"),
    (4, 4, r"stop must be an integer in 5 .. 10"),
    (4.0, None, r"start must be an integer token position"),
])
def test_summary_rejects_bad_ranges(start, stop, match):
    inp = _small()
    with pytest.raises(ValueError, match=match):
        segment_summary(*_args(inp), start=start, stop=stop, tile=4, cu_seqlens=inp["cu_seqlens"])


def test_summary_ranges_at_tile_edges_and_sequence_ends_are_accepted():
    inp = _small()
    for start, stop in [(0, 4), (8, 10), (10, 14), (18, 23), (14, None)]:
        M, d = segment_summary(*_args(inp), start=start, stop=stop, tile=4,
                               cu_seqlens=inp["cu_seqlens"])
        assert M.shape == (2, 3, 3) and d.shape == (2, 3, 4)


@pytest.mark.parametrize("summaries, dht, match", [
    ([], None, r"summaries must hold at least one entry"),
    (5, None, r"summaries must be a sequence of \(M, d\) pairs, got int"),
    ([None, None], None, r"summaries\[1\] must be an \(M, d\) pair, got NoneType"),
    ([None, (None, np.zeros((2, 3)))], None, r"summaries\[1\] d must be \[H, K, V\], got shape \(2, 3\)"),
    ([None, (None, np.zeros((2, 3, 4)))], np.zeros((2, 3, 5)),
     r"summaries\[1\] d must have shape \(2, 3, 5\) \(as dht and the other segments\), got \(2, 3, 4\)"),
    ([None, (np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))], None,
     r"summaries\[1\] M must have shape \(2, 3, 3\) \(\[H, K, K\]\) or be None, got \(2, 3, 4\)"),
    ([None], np.zeros((1, 2, 3, 4)), r"dht must be \[H, K, V\] \(one sequence\), got shape \(1, 2, 3, 4\)"),
])
def test_fold_rejects_bad_summaries(summaries, dht, match):
    with pytest.raises(ValueError, match=match):
        fold_summaries(summaries, dht)


# segment_snapshots checked nothing: a range that is not a segment gave a wrong answer
@pytest.mark.parametrize("args, error, match", [
    ((0, 16, 40.0, 16, 1), TypeError, r"length must be an int, got 40.0"),
    ((0.0, 16, 40, 16, 1), TypeError, r"start must be an int, got 0.0"),
    ((0, "16", 40, 16, 1), TypeError, r"stop must be an int, got '16'"),
    ((True, 16, 40, 16, 1), TypeError, r"start must be an int, got True"),
    ((0, 16, 0, 16, 1), ValueError, r"length must be an int >= 1, got 0"),
    ((-16, 16, 40, 16, 1), ValueError, r"start must be an int >= 0, got -16"),
    ((48, 50, 40, 16, 1), ValueError, r"start must be a token offset in 0 .. 39 \(length = 40\), got 48"),
    ((16, 16, 40, 16, 1), ValueError, r"stop must be in 17 .. 40 \(start = 16, length = 40\), got 16"),
    ((16, 48, 40, 16, 1), ValueError, r"stop must be in 17 .. 40 .*got 48"),
    ((8, 32, 40, 16, 1), ValueError, r"start = 8 is not a tile edge of a sequence of 40 tokens"),
    ((0, 24, 40, 16, 1), ValueError, r"stop = 24 is not a tile edge .*a multiple of tile = 16, or stop at 40"),
    ((0, 16, 40, 5, 1), ValueError, r"tile must be a positive divisor of 64"),
    ((0, 16, 40, 16, 0), ValueError, r"snapshot_every must be an integer >= 1, got 0"),
])
def test_segment_snapshots_rejects_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        segment_snapshots(*args)


def test_segment_snapshots_takes_numpy_ints():
    tiles, snaps = segment_snapshots(np.int64(16), np.int32(40), np.int64(40), 16, 1)
    assert tiles.tolist() == [0, 1] and snaps.tolist() == [1, 2]


@pytest.mark.parametrize("name", ["q", "gc", "mqk", "do"])
@pytest.mark.parametrize("dtype", [np.complex128, np.dtype("U8")])
def test_segment_functions_refuse_dtypes_that_are_not_real(name, dtype):
    inp = _small()
    inp[name] = inp[name].astype(dtype)
    match = rf"{name} must have a real floating dtype .*got {np.dtype(dtype)}"
    with pytest.raises(ValueError, match=match):
        segment_summary(*_args(inp), start=0, tile=4, cu_seqlens=inp["cu_seqlens"])
    with pytest.raises(ValueError, match=match):
        dstate_scan_segmented(*_args(inp), segments=2, tile=4, cu_seqlens=inp["cu_seqlens"])


def test_segmented_refuses_a_dht_that_is_not_real():
    inp = _small()
    with pytest.raises(ValueError, match=r"dht must have a real floating dtype .*got complex128"):
        dstate_scan_segmented(*_args(inp), segments=2, tile=4, cu_seqlens=inp["cu_seqlens"],
                              dht=inp["dht"].astype(np.complex128))


def test_segment_bounds_rejects_bad_input():
    with pytest.raises(ValueError, match=r"segments must be an integer >= 1, got 0"):
        segment_bounds(10, 4, 0)
    with pytest.raises(ValueError, match=r"length must be an integer >= 1, got 0"):
        segment_bounds(0, 4, 2)
    with pytest.raises(ValueError, match=r"tile must be a positive divisor of 64"):
        segment_bounds(10, 5, 2)
