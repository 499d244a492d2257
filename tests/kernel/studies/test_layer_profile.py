"""The layer-profile study's host side: its arguments, our kernels' names, a clean refusal without a GPU."""
from __future__ import annotations

import pytest

from kernel.studies.layer_profile.__main__ import SIDES, main, our_kernels, parse_args


def test_sides_and_steps_are_checked():
    assert parse_args([]).sides == list(SIDES)
    assert parse_args(["--sides", "ours"]).sides == ["ours"]
    assert parse_args([]).step == "layer" and parse_args(["--step", "op", "--heads", "4"]).heads == 4
    for bad in (["--sides", "cudnn"], ["--sides", ","], ["--steps", "0"], ["--step", "model"], ["--heads", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_qk_copies_is_a_flag_off_by_default():
    assert parse_args([]).qk_copies is False and parse_args(["--qk-copies"]).qk_copies is True


def test_ours_are_the_registrys_kernels_and_not_flas_kda_named_ones():
    mine = our_kernels()
    assert {"kda_forward", "kda_dstate_scan", "kda_token_gradients"} <= mine
    assert "kda_gate_chunk_cumsum_vector_kernel" not in mine   # FLA's, though named kda_*


def test_without_a_gpu_it_says_why(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--configs", "1x8192"]) == 2
    assert "layer_profile: needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.fla
def test_the_op_step_lists_our_three_backward_kernels_and_the_forwards(capsys):
    """--step op on a small call: our side's kernels include Kernel A, Kernel B and the forward's."""
    from kernel.studies.layer_profile.__main__ import profile_config

    res = profile_config("2x1024", ["ours"], steps=1, step="op", heads=2)
    names = set(res["ours"]["kernels"])
    assert {"kda_dstate_scan", "kda_token_gradients"} <= names
    assert res["ours"]["wall_ms"] > 0 and res["ours"]["kernel_sum_ms"] > 0


def test_backward_pipeline_is_parsed_and_refused_by_name():
    from kernel.backward_pipeline import Pipeline

    assert parse_args([]).backward_pipeline is None
    assert parse_args(["--backward-pipeline", "24,4"]).backward_pipeline == Pipeline(a_sms=24, groups=4)
    with pytest.raises(SystemExit):
        parse_args(["--backward-pipeline", "24"])
