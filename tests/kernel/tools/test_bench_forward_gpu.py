"""ptx-lab bench --forward on the GPU (torch, fla-core, CuPy): `bench --forward --quick` on one small
configuration, in this process, and what it records."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.fla]


@pytest.mark.parametrize("config", ["2x256", "varlen8x1000"])
def test_forward_quick_on_one_small_configuration(config, tmp_path, capsys):
    pytest.importorskip("torch")
    from kernel.tools.bench import cli, forward, forward_report
    from kernel.tools.bench.forward import FWD_CUDNN, FWD_FLA, FWD_OURS, FWD_RAW, FWD_THREE

    why = forward.missing_requirement()
    if why:
        pytest.skip(why)
    import kernel

    before = kernel.forward_setting()
    out = tmp_path / "f.json"
    assert cli.main(["--forward", "--quick", "--in-process", "--configs", config, "--heads", "2",
                     "--json", str(out)]) == 0
    assert kernel.forward_setting() == before          # the bench's using_forward("ours") was undone
    [res] = json.loads(out.read_text())["results"]
    assert res["bench"] == "forward" and res["config"] == config
    fwd, mem = res["forward"], res["peak_memory"]
    for side in (FWD_OURS, FWD_FLA, FWD_RAW, FWD_THREE):
        assert fwd[side]["median_ms"] > 0 and fwd[side]["host_ms"] > 0 and mem[side]["bytes"] > 0, (side, fwd)
    assert res["ratio"]["ours/fla"] == pytest.approx(fwd[FWD_OURS]["median_ms"] / fwd[FWD_FLA]["median_ms"])
    assert res["ratio"]["over_raw"] == pytest.approx(fwd[FWD_OURS]["median_ms"] / fwd[FWD_RAW]["median_ms"] - 1)
    assert res["ratio"]["three/raw"] == pytest.approx(fwd[FWD_THREE]["median_ms"] / fwd[FWD_RAW]["median_ms"])
    # cuDNN's where it is installed, else why not
    assert "median_ms" in fwd[FWD_CUDNN] or "missing" in fwd[FWD_CUDNN]["error"], fwd[FWD_CUDNN]
    assert res["fla_autotune"], "FLA's autotuners recorded no choice"
    assert len(forward_report.forward_row(res)) == len(forward_report.FORWARD_COLUMNS)
    assert forward_report.TITLE in capsys.readouterr().out
