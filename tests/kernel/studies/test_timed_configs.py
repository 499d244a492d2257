"""kernel.studies.timed_configs on the CPU: the configurations' check and the loop's order, output and JSON."""
from __future__ import annotations

import argparse
import json

import pytest

from kernel.runtime import arrays
from kernel.studies.timed_configs import parse_configs, run_configs


def test_configurations_are_bxt():
    p = argparse.ArgumentParser()
    assert parse_configs(p, " 1x64,2x128 ,") == ["1x64", "2x128"]
    for bad in ("64", "0x64", "1x", "axb"):
        with pytest.raises(SystemExit):
            parse_configs(p, bad)


def test_each_configuration_is_reported_and_the_json_holds_the_rows_so_far(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(arrays, "torch_gpu_reason", lambda: None)
    out = tmp_path / "rows.json"
    seen = []

    def measure(config):
        if config == "3x64":
            assert json.loads(out.read_text()) == [{"config": "1x64"}, {"config": "2x64"}]   # written after each
        seen.append(config)
        return {"config": config}

    assert run_configs("study", ["1x64", "2x64", "3x64"], 4, measure, lambda r: f"row {r['config']}", out) == 0
    assert seen == ["1x64", "2x64", "3x64"] and len(json.loads(out.read_text())) == 3
    got = capsys.readouterr()
    assert got.out.splitlines() == ["row 1x64", "row 2x64", "row 3x64"] and "study: 2x64, 4 heads ..." in got.err


def test_without_a_gpu_it_says_so_and_measures_nothing(monkeypatch, capsys):
    monkeypatch.setattr(arrays, "torch_gpu_reason", lambda: "torch sees no CUDA device")
    assert run_configs("study", ["1x64"], 4, lambda c: pytest.fail("measured"), str, None) == 2
    assert "study: needs torch with a CUDA GPU and CuPy (torch sees no CUDA device)" in capsys.readouterr().err
