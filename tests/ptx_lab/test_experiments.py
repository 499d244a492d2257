"""Every experiment passes on the model (and, with a GPU, on the hardware),
and its checker has teeth: tampered observations fail, naming the lanes."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import EXPERIMENTS, NAMES, _common
from experiments._common import swap_lanes

REPO = Path(__file__).resolve().parents[2]


def lanes_named(result) -> set[int]:
    return {int(m) for m in re.findall(r"\blane (\d+)\b", "\n".join(result.failures))}


def test_registry_is_complete_and_ordered():
    assert list(EXPERIMENTS) == list(NAMES)
    assert set(NAMES) == {"mma_m16n8k16", "ldmatrix", "stmatrix", "movmatrix", "cp_async",
                          "bulk_copy", "accumulator_as_a", "banks"}
    for name, module in EXPERIMENTS.items():
        assert module.NAME == name
        assert module.SUMMARY and "\n" not in module.SUMMARY
        assert module.__doc__ and "Check" in module.__doc__


@pytest.mark.parametrize("name", NAMES)
def test_passes_on_the_model(name):
    result = EXPERIMENTS[name].run("model")
    assert result.passed, result.report()
    assert result.checked > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_passes_on_the_gpu(name):
    result = EXPERIMENTS[name].run("gpu")
    assert result.passed, result.report()


@pytest.mark.parametrize("name", ["ldmatrix", "movmatrix", "mma_m16n8k16", "accumulator_as_a",
                                  "bulk_copy"])
def test_swapped_lanes_are_both_named(name):
    module = EXPERIMENTS[name]
    result = module.check(swap_lanes(module.observe("model"), 3, 17)).result(name, "model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_stmatrix_swapped_registers_are_both_named(monkeypatch):
    module = EXPERIMENTS["stmatrix"]
    honest = module.registers

    def swapped(num, trans):
        regs = honest(num, trans).copy()
        regs[[3, 17]] = regs[[17, 3]]
        return regs

    monkeypatch.setattr(module, "registers", swapped)
    result = module.run("model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_cp_async_swapped_chunks_are_both_named():
    module = EXPERIMENTS["cp_async"]
    obs = module.observe("model")
    for cache, size, zfill in module.CASES:
        dst, _ = module.layout(size)
        image = obs[module.case_name(cache, size, zfill)]
        a, b = image[dst[3]:dst[3] + size].copy(), image[dst[17]:dst[17] + size].copy()
        image[dst[3]:dst[3] + size], image[dst[17]:dst[17] + size] = b, a
    result = module.check(obs).result("cp_async", "model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_bulk_copy_failures_name_the_row_byte_and_lane():
    module = EXPERIMENTS["bulk_copy"]
    obs = module.observe("model")
    row = module.STORED_ROW
    obs["out_a"][row, 2] = 1000 * row + 2      # the stale word a missing proxy fence could leave
    obs["out_b"][0, 31] = 31                   # src row 0's word where row 16's belongs
    obs["flags"][9, 0] = 1                     # a phase that completed before its arrival
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "bulk store out_a: row 5 word 2 (byte 8), in lane 5's bulk store of 96 bytes of rows_a[5], "
        "rewritten by fenced ordinary stores: got 5002, expected 905002",
        "bulk store out_b: row 0 word 31 (byte 124), in lane 0's bulk store of 128 bytes of "
        "rows_b[0]: got 31, expected 16031",
        "mbarrier: lane 9 try_wait(0) after the phase-0 copies, before the arrival: got 1, expected 0",
    ], result.report()


def test_bulk_copy_untouched_words_and_reuse_are_checked():
    module = EXPERIMENTS["bulk_copy"]
    obs = module.observe("model")
    obs["smem_b"][1, 30] = 1030                # a copy that ran past its 112 bytes
    obs["out_a"][4, 0] = module.REUSED         # rows_a reused before its bulk store read it
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "phase 1 rows_b: row 1 word 30 (byte 120), past lane 1's bulk copy of 112 bytes: "
        "written by nothing: got 1030, expected 0xffffffff",
        "bulk store out_a: row 4 word 0 (byte 0), in lane 4's bulk store of 80 bytes of rows_a[4]: "
        "got 0xa5a5a5a5, expected 4000",
    ], result.report()


@pytest.mark.gpu
def test_bulk_copy_gpu_equals_the_model_word_for_word():
    module = EXPERIMENTS["bulk_copy"]
    on_gpu, on_model = module.observe("gpu"), module.observe("model")
    assert on_gpu.keys() == on_model.keys()
    for key in on_model:
        assert on_gpu[key].shape == on_model[key].shape, key
        diff = np.argwhere(on_gpu[key] != on_model[key])
        assert diff.size == 0, f"{key}: GPU and model differ at (row/lane, word/flag) {diff[:8].tolist()}"


def test_mma_failure_line_reads_like_the_blog():
    module = EXPERIMENTS["mma_m16n8k16"]
    obs = module.observe("model")
    obs["bf16, C = 0: d"][14, 1] = 0.0  # D[3][5] = 16 * 3 * 5 lives in lane 14, c1
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == ["bf16, C = 0: lane 14 c1 D[3][5]: got 0, expected 240"]


def test_sentinel_rows_are_checked():
    module = EXPERIMENTS["stmatrix"]
    obs = module.observe("model")
    image = obs["x1"]
    spare = module.row_addresses(1)[31]  # the row the ignored lanes point at
    image[spare] ^= 0xFF
    result = module.check(obs).result(module.NAME, "model")
    assert len(result.failures) == 1 and "written by no lane" in result.failures[0]


def test_result_needs_something_checked():
    assert not _common.Result("x", "model", [], 0).passed
    assert _common.Result("x", "model", [], 1).passed


def test_main_exit_codes(monkeypatch, capsys):
    module = EXPERIMENTS["movmatrix"]
    assert _common.main(module, ["--emulate"]) == 0
    out = capsys.readouterr().out
    assert "--emulate: running on the CPU model" in out and "[PASS] movmatrix on model" in out
    monkeypatch.setattr(module, "run",
                        lambda backend: _common.Result("movmatrix", backend, ["lane 0 r0.lo: got 1, expected 2"], 1))
    assert _common.main(module, ["--emulate"]) == 1
    assert "[FAIL]" in capsys.readouterr().out


def test_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "experiments.ldmatrix", "--emulate"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[PASS] ldmatrix on model" in proc.stdout
    assert "RuntimeWarning" not in proc.stderr


def test_backend_is_validated():
    with pytest.raises(ValueError, match="backend"):
        EXPERIMENTS["ldmatrix"].observe("cpu")
