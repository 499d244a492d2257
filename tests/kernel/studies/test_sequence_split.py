"""kernel.studies.sequence_split.sweep's arguments, and its refusal without a GPU (the sweep itself
ran on the H200: docs/log/32-sequence-split.md)."""
from __future__ import annotations

import argparse

import pytest

from kernel.studies.sequence_split import sweep


def test_segment_counts_and_weights_parse():
    assert sweep.parse_segments("1, 5,auto") == [1, 5, "auto"]
    assert sweep.parse_weights("1.5,2") == [1.5, 2.0]


@pytest.mark.parametrize("text", ["0", "-1", "2.5", "all", ""])
def test_bad_segment_counts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="'auto' or integers >= 1"):
        sweep.parse_segments(text)


@pytest.mark.parametrize("text", ["0", "-1", "x", "1,,2"])
def test_bad_weights_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="end weights"):
        sweep.parse_weights(text)


def test_without_a_gpu_it_says_why(capsys):
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is usable here: the sweep would run")
    assert sweep.run(["--configs", "1x1024"]) == 2
    assert "the sweep needs a GPU" in capsys.readouterr().out


def test_the_op_study_without_a_gpu_says_why(capsys):
    from kernel.studies.sequence_split import op
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is usable here: the study would run")
    assert op.run(["--segments", "1,17"]) == 2
    assert "the study needs a GPU" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--ahead-ms", "0"], ["--segments", "0"]])
def test_the_op_studys_bad_arguments_are_refused(argv):
    from kernel.studies.sequence_split import op

    with pytest.raises(SystemExit):
        op.run(argv)


def test_the_op_study_refuses_an_unknown_call():
    from kernel.studies.sequence_split import op

    with pytest.raises(SystemExit):
        op.run(["--call", "model"])


@pytest.mark.gpu
@pytest.mark.fla
def test_the_op_study_times_the_backward_bench_steps_call(tmp_path, capsys):
    """One short sequence, two counts: the table and the JSON name both, each with a time."""
    import json

    from kernel.studies.sequence_split import op

    pytest.importorskip("fla")
    out = tmp_path / "split.json"
    assert op.run(["--call", "bench", "--config", "1x4096", "--heads", "2", "--segments", "1,2", "--reps", "1",
                   "--ahead-ms", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 1x4096 | 2 | 1 |" in table and "| 1x4096 | 2 | 2 |" in table
    got = json.loads(out.read_text())
    assert got["call"] == "bench" and sorted(got["times"]) == ["1", "2"]
    assert all(t["median_ms"] > 0 for t in got["times"].values())
