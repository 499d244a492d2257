"""The sequence split on the GPU (kernel.ds_scan.split through kernel.dstate_scan's ``segments``).

kernel.tools.check's split cases hold the split scan to the float64 reference and to
determinism (tests/kernel/ds_scan/test_launch_gpu.py runs them). Here: its error against
float64 is no worse than the unsplit kernel's on the same inputs; the summary build's
(M, d) against the float64 segment summary; torch tensors in and out; and the auto rule
leaves a batch that fills the GPU unsplit, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.tools import check

pytestmark = pytest.mark.gpu

# The split adds its own rounding (M and d in fp32 from bf16 operands, the incoming dS rounded
# to fp32) to the unsplit kernel's: its error against float64 may differ by a little either
# way, not by this factor; a wrong segment or fold is O(1)
NO_WORSE = 1.25


def _rel(out, ref) -> float:
    import cupy

    num, den = float(cupy.linalg.norm((out - ref).ravel())), float(cupy.linalg.norm(ref.ravel()))
    return num / den if den > 0 else num


def _errors(case: check.Case, segments) -> dict:
    import dataclasses

    return check.run_case(dataclasses.replace(case, segments=segments), repeat_for_determinism=False)


@pytest.mark.parametrize("case", [c for c in check.CASES if c.name.startswith("split")], ids=lambda c: c.name)
def test_the_split_is_no_less_precise_than_the_unsplit_scan(case):
    split, whole = _errors(case, case.segments), _errors(case, 1)
    print(case.name, {k: (split[k], whole[k]) for k in ("snapshots", "worst_snapshot", "dh0")})
    for key in ("snapshots", "dh0"):
        assert split[key] <= NO_WORSE * whole[key] + 1e-6, (key, split[key], whole[key])


@pytest.mark.parametrize("gate_strength", [1.0, 0.02])
def test_summaries_match_the_float64_segment_summary(gate_strength):
    """(FLA's tensors through the summary build: test_fla's split case.) With weak gates M
    stays O(1) over the whole sequence instead of decaying by ~0.45 a tile."""
    import cupy

    from kernel.ds_scan import launch
    from kernel.reference import segment_summary

    kern, ref = check.inputs(check.Case("summary", lengths=(64, 700, 1000), H=2, l2norm=False, seed=40,
                                        gate_strength=gate_strength))
    names = ("q", "k", "gc", "beta", "mqk", "inv", "do")
    M, d = launch.summaries(*(kern[n] for n in names), cu_seqlens=kern["cu_seqlens"], qk_l2norm=False)
    cu = kern["cu_seqlens"]
    for n in range(len(cu) - 1):
        rM, rd = segment_summary(*(ref[x] for x in names), start=int(cu[n]), cu_seqlens=cu, qk_l2norm=False)
        assert _rel(M[n].astype(np.float64), cupy.asarray(rM)) < check.BOUND, n
        assert _rel(d[n].astype(np.float64), cupy.asarray(rd)) < check.BOUND, n


def test_torch_tensors_through_the_split():
    torch = pytest.importorskip("torch")
    from kernel.ds_scan.launch import dstate_scan

    kern, _ = check.inputs(check.Case("split-torch", lengths=(1000, 300), H=2, seed=41))
    names = ("q", "k", "gc", "beta", "mqk", "inv", "do")
    as_t = {n: torch.from_dlpack(kern[n]) for n in names + ("dht",)}
    for n in ("q", "k", "do", "mqk", "inv"):
        as_t[n] = as_t[n].view(torch.int16).view(torch.bfloat16)
    s_t, d_t = dstate_scan(*(as_t[n] for n in names), dht=as_t["dht"], cu_seqlens=kern["cu_seqlens"], segments=4)
    s_c, d_c = dstate_scan(*(kern[n] for n in names), dht=kern["dht"], cu_seqlens=kern["cu_seqlens"], segments=4)
    assert isinstance(s_t, torch.Tensor) and isinstance(d_t, torch.Tensor)
    assert torch.equal(s_t.cpu(), torch.from_numpy(s_c.get())) and torch.equal(d_t.cpu(), torch.from_numpy(d_c.get()))


def test_auto_leaves_a_full_batch_unsplit_and_splits_a_long_sequence():
    from kernel.ds_scan import split
    from kernel.runtime import builds
    from kernel.ds_scan.launch import dstate_scan

    names = ("q", "k", "gc", "beta", "mqk", "inv", "do")
    kern, _ = check.inputs(check.Case("auto-full", B=132, T=64, H=1, seed=42))
    a = dstate_scan(*(kern[n] for n in names), dht=kern["dht"])
    b = dstate_scan(*(kern[n] for n in names), dht=kern["dht"], segments=1)
    assert all(bool((x == y).all()) for x, y in zip(a, b))
    T = split.SEGMENTS * split.MIN_SEGMENT
    assert split.auto_counts([T], 2, builds.sm_count()).tolist() == [split.SEGMENTS]
    kern, _ = check.inputs(check.Case("auto-long", B=1, T=T, H=2, seed=43))
    s_auto, d_auto = dstate_scan(*(kern[n] for n in names), dht=kern["dht"])
    s_forced, d_forced = dstate_scan(*(kern[n] for n in names), dht=kern["dht"], segments=split.SEGMENTS)
    s_whole, _ = dstate_scan(*(kern[n] for n in names), dht=kern["dht"], segments=1)
    assert bool((s_auto == s_forced).all()) and bool((d_auto == d_forced).all())
    assert not bool((s_auto == s_whole).all())      # the split ran: its rounding differs somewhere
