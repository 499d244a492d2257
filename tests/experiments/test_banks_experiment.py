"""experiments.banks: the model path, the table, the clock64 and ncu judgements on
synthetic measurements (CPU), and the real GPU run (gpu marker). ncu's CSV parsing is
tests/ptx_lab/test_ncu.py."""
from __future__ import annotations

import re

import numpy as np
import pytest

from experiments import banks as exp
from ptx_lab import CUDA_INCLUDE_DIR, ncu

N = len(exp.CASES)
INDEX = {name: i for i, name in enumerate(exp.CASE_NAMES)}


def model_obs() -> dict:
    return exp.observe("model")


# ------------------------------------------------------------------ the model path

def test_model_run_passes_and_says_what_was_not_measured():
    result = exp.run("model")
    assert result.passed and result.checked == N
    assert any(n.startswith("clock64: not measured:") for n in result.notes)
    assert any(n.startswith("ncu: not measured:") for n in result.notes)
    report = result.report()
    # the table comes last, one line per case, in order
    tail = report.rstrip().splitlines()[-N:]
    assert [line.split()[0] for line in tail] == list(exp.CASE_NAMES)


def test_the_design_notes_figures_are_in_the_cases():
    expected = {c.name: c.expected for c in exp.CASES}
    assert (expected["qk_stride128_read"], expected["qk_stride136_read"],
            expected["qk_stride130_read"]) == (32, 4, 1)
    assert expected["qd_scalar_sts16"] == 16 and expected["qd_stsm_trans"] == 4


def test_a_wrong_model_value_is_named():
    obs = model_obs()
    obs["model"] = obs["model"].copy()
    obs["model"][INDEX["qk_stride136_read"]] = 2
    result = exp.check(obs).result(exp.NAME, "model")
    assert not result.passed
    assert len(result.failures) == 1 and "qk_stride136_read" in result.failures[0]


def test_transpose_dual_views_hand_in_the_same_rows():
    b, c = exp.CASES[INDEX["ds_b_ldsm"]], exp.CASES[INDEX["ds_c_ldsm_trans"]]
    assert np.array_equal(b.addresses, c.addresses)


def test_every_case_fits_in_shared_memory_and_is_aligned():
    for case in exp.CASES:
        assert exp._smem_bytes(case) <= exp.MAX_SMEM
        assert (case.addresses % exp.OPS[case.op].bytes == 0).all(), case.name


def test_probe_source_agrees_with_the_python_constants():
    src = (CUDA_INCLUDE_DIR / "bank_probes.cu").read_text()
    assert f"constexpr int UNROLL = {exp.UNROLL};" in src
    assert f"constexpr u32 SHIFT_BYTES = {exp.SHIFT_BYTES};" in src
    assert exp.SHIFT_BYTES % 128 == 0   # a whole bank row: shifting keeps every bank
    kernels = set(re.findall(r"PTX_LAB_BANK_PROBE\((\w+),", src))
    assert {op.kernel for op in exp.OPS.values()} <= kernels
    assert not re.search(r"\basm\s*(volatile\s*)?\(", src)   # asm strings live in the headers only


# ------------------------------------------------------------------ clock64, synthetic

LATENCY = 3.0   # a made-up constant cost per instruction on top of the wavefronts


def test_clock_times_that_follow_the_model_pass():
    obs = model_obs()
    obs["cycles"] = obs["model"] + LATENCY
    result = exp.check(obs).result(exp.NAME, "gpu")
    assert result.passed, result.report()
    assert result.checked > N


def test_a_32_way_case_as_fast_as_its_baseline_is_named():
    obs = model_obs()
    obs["cycles"] = obs["model"] + LATENCY
    obs["cycles"][INDEX["qk_stride128_read"]] = obs["cycles"][INDEX["qk_stride130_read"]]
    result = exp.check(obs).result(exp.NAME, "gpu")
    assert not result.passed
    assert len(result.failures) == 1 and result.failures[0].startswith("qk_stride128_read: clock64")


def test_in_between_ratios_are_reported_not_judged():
    assert exp.clock_verdict(4, 1.05) is None
    assert exp.clock_verdict(1, 1.2) is True and exp.clock_verdict(1, 1.3) is False
    assert exp.clock_verdict(32, 2.5) is True and exp.clock_verdict(8, 1.5) is False


# ------------------------------------------------------------------ ncu, synthetic

SETUP = 100.0   # counts outside the timed loop, which the two-rep difference must cancel


def fake_launches(wavefronts_of=None) -> list[ncu.Launch]:
    """Two launches per case, with counts the model predicts (plus setup noise)."""
    out = []
    for case in exp.CASES:
        acc = case.access()
        inst_name, wf_name, cf_name = (cands[0] for cands in exp.NCU_METRICS[exp.OPS[case.op].family])
        wf = acc.wavefronts if wavefronts_of is None else wavefronts_of(case)
        for reps in (exp.REPS_LO, exp.REPS_HI):
            inst = reps * exp.UNROLL
            out.append(ncu.Launch(len(out), exp.OPS[case.op].kernel, {
                inst_name: inst + SETUP, wf_name: wf * inst + 3 * SETUP,
                cf_name: (wf - acc.ideal_wavefronts) * inst + SETUP}))
    return out


@pytest.fixture
def fake_ncu(monkeypatch):
    state = {"launches": fake_launches(), "dropped": []}
    monkeypatch.setattr(ncu, "ncu_path", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "profile", lambda *a, **k: ncu.Profile(state["launches"], state["dropped"]))
    return state


def test_ncu_counts_divide_out_to_the_model(fake_ncu):
    counts, notes = exp.measure_ncu()
    obs = model_obs()
    assert np.array_equal(counts["wavefronts"], obs["model"])
    assert np.array_equal(counts["conflicts"], obs["model_conflicts"])
    assert np.allclose(counts["instructions"], 1)
    assert notes == []


def test_ncu_disagreement_is_named(fake_ncu):
    fake_ncu["launches"] = fake_launches(
        lambda c: 2 if c.name in ("lds64_same_8_bytes", "ds_b_ldsm") else c.access().wavefronts)
    counts, _ = exp.measure_ncu()
    obs = model_obs()
    obs.update({f"ncu_{k}": v for k, v in counts.items()})
    result = exp.check(obs).result(exp.NAME, "gpu")
    named = {f.split(":")[0] for f in result.failures}
    assert named == {"lds64_same_8_bytes", "ds_b_ldsm"}
    assert "NCU !=" in exp.table(obs)


def test_missing_metrics_are_reported_not_failed(fake_ncu):
    for launch in fake_ncu["launches"]:
        for name in list(launch.metrics):
            if "ldgsts" in name:
                launch.metrics[name] = None
    fake_ncu["dropped"] = ["l1tex__made_up.sum"]
    counts, notes = exp.measure_ncu()
    cp = INDEX["qk_stride130_fill_cp4"]
    assert np.isnan(counts["wavefronts"][cp])
    assert any("dropped unknown metric l1tex__made_up.sum" in n for n in notes)
    assert any(n.startswith("ncu: no value for ldgsts") for n in notes)


def test_without_instruction_counts_one_instruction_per_access_is_assumed(fake_ncu):
    for launch in fake_ncu["launches"]:   # setup counts still cancel in the two-rep difference
        for name in list(launch.metrics):
            if "inst_executed" in name:
                del launch.metrics[name]
    counts, notes = exp.measure_ncu()
    assert np.isnan(counts["instructions"]).all()
    assert np.array_equal(counts["wavefronts"], model_obs()["model"])
    assert any("assume one instruction per access" in n for n in notes)


def test_wrong_launch_order_is_refused(fake_ncu):
    fake_ncu["launches"][0].kernel = "bank_ldsm_x4"
    counts, notes = exp.measure_ncu()
    assert counts is None and "expected bank_ld_b32" in notes[-1]


def test_no_ncu_on_path_is_said(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    counts, notes = exp.measure_ncu()
    assert counts is None and notes == ["ncu: not measured: ncu is not on PATH"]


# ------------------------------------------------------------------ on the GPU

@pytest.mark.gpu
def test_clock64_orders_32_way_after_conflict_free():
    pick = [exp.CASES[INDEX[n]] for n in ("qk_stride130_read", "qk_stride128_read",
                                            "lds32_consecutive", "lds32_stride_128B")]
    cycles = exp.measure_clock(pick)
    assert cycles[1] > exp.CLOCK_MIN_SLOWDOWN * cycles[0], cycles
    assert cycles[3] > exp.CLOCK_MIN_SLOWDOWN * cycles[2], cycles


@pytest.mark.gpu
def test_gpu_run_matches_the_model():
    if ncu.ncu_path() is None:
        pytest.skip("ncu is not on PATH: the exact wavefront counts were not measured "
                    "(clock64 ordering is tested above)")
    obs = exp.observe("gpu")
    assert not np.isnan(obs["ncu_wavefronts"]).all(), obs["notes"]
    result = exp.check(obs).result(exp.NAME, "gpu")
    assert result.passed, "\n".join([result.report(), *obs["notes"], exp.table(obs)])
