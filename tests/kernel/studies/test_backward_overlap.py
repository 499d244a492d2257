"""kernel.studies.backward_overlap: the pipeline's model, the report and the arguments on the CPU; the green
contexts' split and a Kernel B run on one of its sides on the GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kernel.backward_pipeline import group_bounds
from kernel.studies.backward_overlap.__main__ import group_outputs, group_views, parse_args, pipelined_ms, report
from kernel.tools import source_ab

SMS = 132


def test_the_pipeline_pays_the_ends_on_every_sm_and_the_middle_at_its_slower_side():
    assert pipelined_ms(8.0, 24.0, 20.0, 30.0, groups=8) == pytest.approx(32.0 / 8 + 7 / 8 * 30.0)
    assert pipelined_ms(8.0, 24.0, 40.0, 30.0, groups=2) == pytest.approx(16.0 + 20.0)


@given(a=st.floats(0.1, 100.0), b=st.floats(0.1, 100.0), k=st.integers(1, SMS - 1), groups=st.integers(2, 64))
def test_no_split_gains_when_both_kernels_slow_in_proportion_to_their_sms(a, b, k, groups):
    # the SM-time of the two is then fixed: whatever the split, the slower side takes at least A then B
    a_part, b_rest = a * SMS / k, b * SMS / (SMS - k)
    assert pipelined_ms(a, b, a_part, b_rest, groups) >= (a + b) * (1 - 1e-12)


def test_a_kernel_a_that_keeps_its_time_on_fewer_sms_is_hidden_behind_b():
    a, b = 8.0, 26.0
    assert pipelined_ms(a, b, a, b * SMS / (SMS - 16), groups=8) < a + b - 3.0


def _row():
    splits = [{"asked": 16, "a_sms": 16, "b_sms": 116, "a_ms": 30.0, "b_ms": 29.0, "both_ms": 31.0,
               "b_same_bits": True, "pipeline_ms": 31.0, "modelled_ms": 30.5},
              {"asked": 24, "a_sms": 24, "b_sms": 108, "a_ms": 22.0, "b_ms": 31.0, "both_ms": 32.0,
               "b_same_bits": False, "pipeline_ms": 32.5, "modelled_ms": 31.4}]
    return {"config": "32x8192", "heads": 32, "reps": 5, "groups": 8, "device_sms": SMS, "smallest_partition": 8,
            "alignment": 8, "a_ms": 8.0, "b_ms": 26.0, "serial_ms": 34.0, "two_streams_ms": 33.5,
            "groups_in_turn_ms": 34.5, "groups_two_streams_ms": 33.0, "splits": splits}


def test_the_report_gives_every_variant_and_split_against_a_then_b():
    text = report(_row())
    assert "| A then B | 34.000 | 1.000 |" in text
    assert "| A and B at once on two streams, A's first | 33.500 | 0.985 |" in text
    assert "| 8 groups of sequences in turn | 34.500 | 1.015 |" in text
    assert "| 8 groups pipelined on two streams, A's first | 33.000 | 0.971 |" in text
    assert "| 16 SMs | 116 SMs | 30.000 | 29.000 | 31.000 | 0.912 | 31.000 | 0.912 | 30.500 | same |" in text
    assert "| 24 SMs | 108 SMs |" in text and "| DIFFERENT |" in text
    assert ("fastest pipeline: Kernel A on 16 SMs, 31.000 ms against 34.000 one after the other (+3.000 ms saved; "
            "the model said 30.500)") in text


def test_arguments_are_checked():
    args = parse_args(["--configs", "32x8192,8x32768", "--sm-counts", "16, 32"])
    assert (args.configs, args.sm_counts, args.groups) == (["32x8192", "8x32768"], [16, 32], 8)
    for bad in (["--sm-counts", "a,b"], ["--sm-counts", "0"], ["--groups", "1"], ["--configs", "8192"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.gpu
def test_a_split_gives_disjoint_sides_and_kernel_b_the_same_bits_on_either():
    pytest.importorskip("cuda.bindings")
    import cupy
    import torch

    from kernel.studies.backward_overlap.__main__ import _checksum
    from kernel.runtime.green_contexts import device_sms, split
    from kernel.tools import source_ab

    total, smallest, _ = device_sms()
    sp = split(smallest)
    try:
        assert sp.first.sms >= smallest and sp.first.sms + sp.rest.sms <= total
        spec = source_ab.parse_spec("2x1024", "b")
        x = source_ab.drawn_inputs(spec, 2)
        run, outputs = source_ab.kernel_b_call(spec, 2, x)
        run()
        cupy.cuda.Device().synchronize()
        want = _checksum(outputs().values())
        for side in (sp.first, sp.rest):
            for a in outputs().values():
                a.fill(0)
            cupy.cuda.Device().synchronize()
            with side.stream:
                run()
            side.stream.synchronize()
            assert _checksum(outputs().values()) == want
    finally:
        torch.cuda.synchronize()
        sp.close()


def test_group_views_are_the_groups_rows_of_every_array_with_no_copy():
    B, T, H = 4, 100, 2   # 7 tiles and 2 chunks a sequence (partial ones included)
    x = {"q": np.arange(B * T * H).reshape(B, T, H), "dht": np.arange(B * 3).reshape(B, 3)}
    arrays = {"ds": np.arange(B * 7 * 2).reshape(B * 7, 2), "states": np.arange(B * 2).reshape(B * 2, 1),
              "rstd": (np.arange(B * T).reshape(B, T),) * 2, "out": {"dq": np.zeros((B, T, H))}}
    xs, parts = zip(*(group_views(T, x, arrays, b0, b1) for b0, b1 in group_bounds(np.arange(B + 1), 2)))
    for name in x:
        np.testing.assert_array_equal(np.concatenate([g[name] for g in xs]), x[name])
    for name in ("ds", "states"):
        np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), arrays[name])
    np.testing.assert_array_equal(np.concatenate([p["rstd"][1] for p in parts]), arrays["rstd"][1])
    assert all(np.shares_memory(p["out"]["dq"], arrays["out"]["dq"]) for p in parts)
    assert parts[1]["ds"][0, 0] == arrays["ds"][2 * 7, 0]


def test_each_groups_kernel_a_outputs_are_its_rows_of_one_allocation_in_the_shapes_launch_checks():
    spec, H = source_ab.Spec(B=5, T=100), 2   # 7 tiles a sequence, the last partial
    shapes = source_ab.kernel_a_output_shapes(spec, H)
    assert shapes == {"snapshots": (1, 5 * 7, H, 128, 128), "dh0": (5, H, 128, 128)}
    whole = {name: np.arange(np.prod(shape), dtype=np.int64).reshape(shape) for name, shape in shapes.items()}
    views = []
    for b0, b1 in group_bounds(np.arange(spec.B + 1), 2):
        v = group_outputs(spec.T, whole, b0, b1)
        assert {n: a.shape for n, a in v.items()} == source_ab.kernel_a_output_shapes(
            source_ab.Spec(B=b1 - b0, T=spec.T), H)
        assert all(a.flags.c_contiguous and np.shares_memory(a, whole[n]) for n, a in v.items())
        views.append(v)
    for name in shapes:
        np.testing.assert_array_equal(np.concatenate([v[name] for v in views], axis=1 if name == "snapshots" else 0),
                                      whole[name])


def test_kernel_a_call_hands_its_out_to_the_launch_and_allocates_by_default(monkeypatch):
    from kernel.ds_scan import launch

    seen = []
    monkeypatch.setattr(launch, "launch", lambda *args, **kw: seen.append(kw) or "ran")
    spec, H = source_ab.Spec(B=2, T=32), 1
    x = {n: np.zeros((2, 32, H, 128)) for n in ("q", "k", "g", "beta", "Aqk", "Akk", "do")}
    x["dht"] = np.zeros((2, H, 128, 128))
    out = {"snapshots": object(), "dh0": object()}
    assert source_ab.kernel_a_call(spec, x, out=out)() == "ran" and seen[-1]["out"] is out
    source_ab.kernel_a_call(spec, x)()
    assert seen[-1]["out"] is None
    assert seen[-1]["snapshot_dtype"] == "bfloat16" and seen[-1]["snapshot_every"] == 1


@pytest.mark.gpu
def test_the_study_runs_every_variant_on_a_small_batch():
    pytest.importorskip("cuda.bindings")
    from kernel.studies.backward_overlap.__main__ import measure
    from kernel.runtime.green_contexts import device_sms

    _, smallest, _ = device_sms()
    row = measure("4x1024", heads=2, sm_counts=[smallest], reps=1, groups=2)
    (split,) = row["splits"]
    assert split["b_same_bits"] and split["a_sms"] >= smallest
    for ms in (row["serial_ms"], row["groups_in_turn_ms"], row["groups_two_streams_ms"], split["pipeline_ms"],
               split["both_ms"]):
        assert 0 < ms < 1e3
    assert "fastest pipeline" in report(row)


@pytest.mark.gpu
def test_kernel_a_with_its_outputs_given_allocates_nothing_on_a_side_stream():
    # the study's timed calls: a call that allocated would get a fresh block on a stream new to CuPy's pool
    import cupy

    spec, H = source_ab.parse_spec("2x1024", "a"), 2
    x = source_ab.drawn_inputs(spec, H)
    out = source_ab.kernel_a_outputs(spec, H)
    run = source_ab.kernel_a_call(spec, x, out=out)
    run()   # the first call builds the kernel and caches the layout's device tables
    pool = cupy.get_default_memory_pool()
    held = pool.total_bytes()
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        got = run()
    side.synchronize()
    assert pool.total_bytes() == held and got[0] is out["snapshots"] and got[1] is out["dh0"]
