"""kernel.studies.backward_overlap: the pipeline's model, the report and the arguments on the CPU; the green
contexts' split and a Kernel B run on one of its sides on the GPU."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kernel.studies.backward_overlap.__main__ import parse_args, pipelined_ms, report

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
               "b_same_bits": True, "pipelined_ms": 30.5},
              {"asked": 24, "a_sms": 24, "b_sms": 108, "a_ms": 22.0, "b_ms": 31.0, "both_ms": 32.0,
               "b_same_bits": False, "pipelined_ms": 31.4}]
    return {"config": "32x8192", "heads": 32, "reps": 5, "groups": 8, "device_sms": SMS, "smallest_partition": 8,
            "alignment": 8, "a_ms": 8.0, "b_ms": 26.0, "serial_ms": 34.0, "two_streams_ms": 33.5, "splits": splits}


def test_the_report_gives_each_split_against_a_then_b_and_the_best_model():
    text = report(_row())
    assert "| 132 SMs, then | 132 SMs | 8.000 | 26.000 | 34.000 | 1.000 |" in text
    assert "| 132 SMs, at once | 132 SMs | | | 33.500 | 0.985 |" in text
    assert "| 16 SMs | 116 SMs | 30.000 | 29.000 | 31.000 | 0.912 | 30.500 | 0.897 | same |" in text
    assert "| 24 SMs | 108 SMs |" in text and "| DIFFERENT |" in text
    assert "best modelled split: Kernel A on 16 SMs, 30.500 ms against 34.000 one after the other (+3.500 ms saved)" \
        in text


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
    from kernel.studies.backward_overlap.green_contexts import device_sms, split
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
