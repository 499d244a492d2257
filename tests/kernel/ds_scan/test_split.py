"""kernel.ds_scan.split, on the CPU: the plan of the sequence split and its three passes.

The GPU runs the passes with Kernel A's launches (tests/kernel/ds_scan/test_split_gpu.py).
Here the float64 reference stands in for each launch, segment by segment, through
the same :func:`kernel.ds_scan.split.run`: so the plan's tables (segment token ranges,
snapshot offsets, which launch runs which segment) and the fold are checked
against the unsplit reference scan, independently of the kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.ds_scan import split
from kernel.reference import dstate_scan_reference, segment_snapshots, segment_summary
from kernel.reference.dstate_scan import snapshot_offsets
from kernel.shapes import TILE_TOKENS

from ..scan_cases import scan_case, scan_inputs

# run()'s segment buffers are fp32, as Kernel A's dht and dh0 are: each segment's incoming dS
# is rounded once (2^-24 relative), which the later snapshots carry; a misplaced segment,
# snapshot or fold step is O(1)
RTOL = 1e-6


def _rel(out, ref) -> float:
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(out - ref))
    return num / den if den > 0 else num


@st.composite
def split_cases(draw):
    lengths = draw(st.lists(st.integers(1, 400), min_size=1, max_size=3))
    p = scan_case(draw, B=None, T=None, lengths=lengths, tile=TILE_TOKENS, V_max=4)
    p["snapshot_every"] = draw(st.sampled_from([1, 4]))
    p["counts"] = [draw(st.integers(1, 8)) for _ in lengths]
    return p


def _reference_launchers(inp: dict, p: dict, plan: split.Plan, snapshots: np.ndarray):
    """Kernel A's two launches, done by the float64 reference one segment at a time."""
    names = ("q", "k", "gc", "beta", "mqk", "inv", "do")
    opts = dict(tile=TILE_TOKENS, scale=p["scale"], qk_l2norm=p["qk_l2norm"])

    def seg_args(i):
        a, b = int(plan.cu[i]), int(plan.cu[i + 1])
        return [inp[n][:, a:b] for n in names]

    def scan(segs, seg_dht, out, *, last):
        assert last == bool(np.isin(segs, plan.ends).all()) and (last or not np.isin(segs, plan.ends).any())
        for i in segs:
            dht = None if seg_dht is None else seg_dht[i][None]
            snaps, dh0 = dstate_scan_reference(*seg_args(i), dht=dht, snapshot_every=p["snapshot_every"], **opts)
            o = int(plan.snap_offsets[i])
            snapshots[o:o + snaps.shape[1]] = snaps[0]
            out[i] = dh0[0]

    def summarise(segs, M, d):
        for i in segs:
            M[i], d[i] = segment_summary(*seg_args(i), **opts)

    return scan, summarise


try:
    import torch
except ImportError:
    torch = None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_cases(), st.booleans() if torch is not None else st.just(False))
def test_the_passes_with_reference_launches_equal_the_unsplit_scan(p, torch_fold):
    # torch_fold: the fold on torch views of the buffers, as a torch caller's runs (a CUDA graph can hold it)
    inp = scan_inputs(p)
    from kernel.reference import prepare_tiles

    gc, mqk, inv = prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], tile=TILE_TOKENS,
                                 qk_l2norm=p["qk_l2norm"], cu_seqlens=inp["cu_seqlens"])
    inp.update(gc=gc, mqk=mqk, inv=inv)
    cu = inp["cu_seqlens"]
    e = p["snapshot_every"]
    ref_snaps, ref_dh0 = dstate_scan_reference(inp["q"], inp["k"], gc, inp["beta"], mqk, inv, inp["do"],
                                               dht=inp["dht"], cu_seqlens=cu, tile=TILE_TOKENS, scale=p["scale"],
                                               qk_l2norm=p["qk_l2norm"], snapshot_every=e)
    counts = np.minimum(p["counts"], -(-np.diff(cu) // split.ALIGN))
    plan = split.plan(cu, counts, tile=TILE_TOKENS, snapshot_every=e)
    H, K, V = inp["q"].shape[2], inp["q"].shape[3], inp["do"].shape[3]
    snapshots = np.full(ref_snaps.shape[1:], np.nan)
    scan, summarise = _reference_launchers(inp, p, plan, snapshots)
    calls = []
    dh0 = split.run(plan, inp["dht"], scan, summarise, xp=np, H=H, K=K, V=V,
                    side_by_side=lambda a, b: (calls.append("side"), a(), b()),
                    fold_view=torch.from_numpy if torch_fold else None)
    assert not np.isnan(snapshots).any(), "a snapshot was not written"
    assert _rel(snapshots, ref_snaps[0]) < RTOL
    assert _rel(dh0, ref_dh0) < RTOL
    assert (len(calls) == 1) == bool(plan.middles.size)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=5), st.lists(st.integers(1, 60), min_size=5, max_size=5),
       st.sampled_from([1, 4]))
def test_the_plan_covers_every_token_once_at_64_token_cuts(lengths, counts, e):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    counts = np.minimum(counts[:len(lengths)], -(-np.asarray(lengths) // 64))
    p = split.plan(cu, counts, tile=TILE_TOKENS, snapshot_every=e)
    assert p.cu[0] == 0 and p.cu[-1] == cu[-1] and (np.diff(p.cu) > 0).all()
    offs = snapshot_offsets(np.asarray(lengths), TILE_TOKENS, e)
    assert p.count.tolist() == list(counts)
    for i in range(p.segments):
        n = int(p.seq[i])
        start, stop = int(p.cu[i] - cu[n]), int(p.cu[i + 1] - cu[n])
        assert start % split.ALIGN == 0 and 0 <= start < stop <= lengths[n]
        _, which = segment_snapshots(start, stop, lengths[n], TILE_TOKENS, e)
        assert which.size and p.snap_offsets[i] == offs[n] + which[0]    # its first snapshot
        if p.pos[i] == 0:
            assert p.first[n] == i and start == 0
    assert p.snap_offsets[-1] == offs[-1]
    # every segment is in exactly one real scan; summaries are the middles
    assert sorted(p.ends.tolist() + p.rest.tolist()) == list(range(p.segments))
    assert set(p.middles.tolist()) <= set(p.rest.tolist())
    assert len(p.middles) == sum(max(0, int(c) - 2) for c in counts)


def test_auto_counts_split_only_where_each_head_has_its_slots():
    sm = 132
    assert split.slots(32, sm) == 4 and split.slots(64, sm) == 2 and split.slots(1024, sm) == 1
    assert split.auto_counts([8192] * 32, 32, sm).tolist() == [1] * 32
    assert split.auto_counts([65536] * 2, 32, sm).tolist() == [1, 1]          # 2 SMs a head
    # 5 segments at 4 slots, 17 from 8 slots on (the measured best of each)
    assert split.auto_counts([131072], 32, sm).tolist() == [5]
    assert split.auto_counts([131072], 16, sm).tolist() == [17]
    assert split.auto_counts([524288], 32, sm).tolist() == [5]
    assert split.auto_counts([65536] * 2, 16, sm).tolist() == [5, 5]          # 4 slots a (sequence, head)
    assert split.auto_counts([32768], 16, sm).tolist() == [5]                 # too short for 17
    assert split.auto_counts([17 * split.MIN_SEGMENT], 16, sm).tolist() == [17]
    assert split.auto_counts([5 * split.MIN_SEGMENT - 1], 16, sm).tolist() == [1]
    # varlen: a long sequence splits, short ones beside it do not (5 slots)
    assert split.auto_counts([100_000, 500, 3000], 8, sm).tolist() == [5, 1, 1]


def test_each_pass_fits_the_slots():
    # three segments in 4 slots: the middle's M and d at vsplit 1 beside the last scan at vsplit 2,
    # then the first two at vsplit 2
    assert split.pass_vsplits([3], 4) == (1, 2, 2)
    assert split.pass_vsplits([2], 4) == (1, 4, 4)
    assert split.pass_vsplits([5, 1], 8) == (1, 2, 2)
    assert split.pass_vsplits([4], 4) == (1, 1, 1)       # too many: the launches take waves


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200_000), st.integers(1, 20), st.floats(0.5, 3.0))
def test_segment_starts_are_64_token_edges_with_the_last_weighted(length, count, weight):
    starts = split.segment_starts(length, count, weight)
    blocks = -(-length // split.ALIGN)
    assert starts[0] == 0 and len(starts) == min(count, blocks)
    assert all(a % split.ALIGN == 0 for a in starts) and all(b > a for a, b in zip(starts, starts[1:]))
    assert starts[-1] < length
    if len(starts) >= 3 and blocks >= 64 * len(starts):   # room to weigh: the last within a block of it
        sizes = np.diff(starts + [blocks * split.ALIGN]) / split.ALIGN
        assert abs(sizes[-1] - weight * np.mean(sizes[:-1])) <= 2 + 0.05 * sizes[-1]


def test_forced_counts_and_their_errors():
    assert split.forced_counts([1, 64, 65, 1000], 4).tolist() == [1, 1, 2, 4]
    assert split.counts_for(4, [1, 64, 65, 1000], 32, 132).tolist() == [1, 1, 2, 4]
    assert split.counts_for("auto", [131072], 32, 132).tolist() == [5]
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="segments must be 'auto' or an integer >= 1"):
            split.forced_counts([100], bad)
    with pytest.raises(ValueError, match="counts must hold one integer >= 1 per sequence"):
        split.plan(np.array([0, 100]), [0])


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "all"])
def test_the_api_names_a_bad_segments_before_anything_else(bad):
    from kernel.ds_scan.launch import dstate_scan
    from kernel.ds_scan.fla import dstate_scan_from_fla

    x = np.zeros((1, 64, 1, 128), dtype=np.uint16)
    with pytest.raises(ValueError, match="segments must be 'auto' or an integer >= 1"):
        dstate_scan(x, x, x, x[..., 0], x[..., :16], x[..., :16], x, segments=bad)
    with pytest.raises(ValueError, match="segments must be 'auto' or an integer >= 1"):
        dstate_scan_from_fla(x, x, x, x[..., 0], x[..., :64], x[..., :64], x, segments=bad)
