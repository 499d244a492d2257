"""kernel.profile and kernel.racecheck: their pure parts on the CPU, the launches on the GPU."""
import shutil
import subprocess

import pytest

from kernel import profile, racecheck


# ----------------------------------------------------------------- racecheck

@pytest.mark.parametrize("line, want", [
    ("========= RACECHECK SUMMARY: 200 hazards displayed (900 errors, 0 warnings)", ("200", "900", "0")),
    ("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)", ("1", "1", "0")),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 2 warnings)", ("0", "0", "2")),
])
def test_racecheck_summary_line_is_parsed(line, want):
    m = racecheck.SUMMARY.search("noise\n" + line + "\nmore noise")
    assert m is not None and m.groups() == want


def test_every_run_has_an_expectation():
    assert set(racecheck.EXPECTED) == set(racecheck.RUNS)
    assert racecheck.EXPECTED["no-empty"] == "a real race"


def test_racecheck_without_the_sanitizer_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert racecheck.main(["--logs", str(tmp_path)]) == 2
    assert "compute-sanitizer is not on PATH" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_racecheck_probes_compile_for_sm_90a(tmp_path):
    from ptx_lab import CUDA_INCLUDE_DIR

    src = tmp_path / "probes.cu"
    src.write_text(racecheck.PROBE_SOURCE)
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", f"-I{CUDA_INCLUDE_DIR}", "-o",
                           str(tmp_path / "probes.cubin"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for kernel in ("ring_arrive", "ring_arrive_exit", "ring2_arrive", "ring2_producer_bar",
                   "ring_syncthreads", "no_empty"):
        # every run name except kernel-a is the name of a probe kernel
        assert f"void {kernel}(" in racecheck.PROBE_SOURCE
        assert kernel.replace("_", "-") in racecheck.RUNS


# ----------------------------------------------------------------- profile

def test_tune_arguments_are_key_value_ints():
    assert profile._tune_arg(["nstage=3", "producers=8"]) == {"nstage": 3, "producers": 8}
    with pytest.raises(SystemExit, match="key=value"):
        profile._tune_arg(["nstage"])


def test_profile_report_names_each_phase():
    r = dict(shape="1x64", H=2, vsplit=4, mode="bf16x4", tune={"nstage": 3}, producers=4,
             plain_ms=0.5, timed_ms=0.52, tiles=4,
             consumer=dict(zip(profile.CONSUMER_SLOTS, (1000.0, 100.0, 50.0, 800.0))),
             producer=dict(zip(profile.PRODUCER_SLOTS, (1000.0, 10.0, 600.0, 40.0, 300.0))))
    text = profile.format_result(r)
    assert "1x64 H2 vsplit 4 bf16x4 (nstage=3; 4 producer warps)" in text
    assert "wait FULL 50" in text and "R1 600" in text and "issue loads 300" in text


@pytest.mark.gpu
@pytest.mark.parametrize("vsplit, mode", [(4, "bf16x4"), (1, "f32x1")])
def test_profile_phases_add_up_to_at_most_the_total(vsplit, mode):
    r = profile.profile(1, 200, 2, vsplit, mode, {})
    assert r["tiles"] == 13
    for role, phases in (("consumer", profile.CONSUMER_SLOTS[1:]), ("producer", profile.PRODUCER_SLOTS[1:])):
        total = r[role]["total"]
        parts = sum(r[role][p] for p in phases)
        assert 0 < parts <= total * 1.01, (role, r[role])


@pytest.mark.gpu
def test_tuning_knobs_are_checked():
    from kernel.api import dstate_scan
    from tests.kernel.test_dstate_scan_gpu import _good_inputs

    k = _good_inputs()
    args = (k["q"], k["k"], k["gc"], k["beta"], k["mqk"], k["inv"], k["do"])
    with pytest.raises(ValueError, match="tuning must not set"):
        dstate_scan(*args, tuning={"vsplit": 2})
    with pytest.raises(ValueError, match="unknown knobs"):
        dstate_scan(*args, tuning={"stages": 3})
