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
                          "accumulator_as_a", "banks"}
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


@pytest.mark.parametrize("name", ["ldmatrix", "movmatrix", "mma_m16n8k16", "accumulator_as_a"])
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
