"""kernel.tools.stalls: the binding stall, the table and the argument checks on the CPU; one ncu run on the GPU."""
import json
import re
import shutil
import sys

import numpy as np
import pytest

from kernel.tools import stalls
from ptx_lab import ncu


def _launch(kernel, **stall_values):
    metrics = {name: None for name in stalls.METRICS}
    metrics.update({stalls.stall_metric(r): v for r, v in stall_values.items()})
    metrics.update({"gpu__time_duration.sum": 1.5e6, "launch__registers_per_thread": 168.0,
                    "launch__shared_mem_per_block_dynamic": 206 * 1024.0, "launch__grid_size": 128.0,
                    "sm__warps_active.avg.per_cycle_active": 8.0, "smsp__issue_active.avg.per_cycle_active": 0.35})
    return ncu.Launch(0, kernel, metrics)


def test_every_stall_reason_is_one_metric():
    names = [stalls.stall_metric(r) for r in stalls.STALL_REASONS]
    assert len(set(names)) == len(names) and all(n in stalls.METRICS for n in names)
    assert stalls.ISSUING in stalls.STALL_REASONS and stalls.ISSUE_BOUND in stalls.STALL_REASONS


def test_the_binding_stall_is_the_largest_that_is_not_issuing():
    row = stalls.summarize(_launch("kda_token_gradients", selected=3.0, short_scoreboard=1.65, wait=1.05,
                                   mio_throttle=0.7))
    assert row["kernel"] == "Kernel B" and row["binding"] == "short_scoreboard"
    assert list(row["stalls"]) == ["selected", "short_scoreboard", "wait", "mio_throttle"]
    assert row["warps_per_scheduler"] == 2.0 and "binding_note" not in row


def test_not_selected_reads_as_issue_bound():
    row = stalls.summarize(_launch("kda_dstate_scan", not_selected=2.0, barrier=0.5))
    assert row["kernel"] == "Kernel A" and row["binding"] == "not_selected"
    assert "issue-bound" in row["binding_note"]


def test_no_stall_measured_has_no_binding_and_the_table_says_so():
    row = stalls.summarize(_launch("kda_forward_states"))
    assert row["binding"] is None and row["stalls"] == {}
    text = stalls.table([row])
    lines = text.splitlines()
    assert len(lines) == 3 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["forward-state scan", "1.500", "168", "206.0", "128", "2.00", "0.350", "-", "-", "-", "-"]


def test_drawn_inputs_have_fla_s_shapes_and_gate_layout():
    """--inputs drawn: g as FLA's per-64-chunk cumsum in log2 units, Aqk and Akk 64 wide (torch on the CPU)."""
    torch = pytest.importorskip("torch")
    B, T, H, D = 1, 100, 2, 128
    gen = torch.Generator().manual_seed(0)
    raw = {name: torch.randn((B, T, H, D), generator=gen).to(torch.bfloat16) for name in ("q", "k", "v")}
    raw["g"] = -torch.rand((B, T, H, D), generator=gen)
    raw["beta"] = torch.rand((B, T, H), generator=gen)
    q, k, v, g, beta, aqk, akk = stalls._drawn_forward_tensors(raw, seed=0)
    assert q is raw["q"] and beta is raw["beta"]
    assert aqk.shape == akk.shape == (B, T, H, 64) and aqk.dtype == torch.bfloat16
    gn = raw["g"].double().numpy()
    want = np.concatenate([np.cumsum(gn[:, c:c + 64], axis=1) for c in range(0, T, 64)], axis=1) / np.log(2)
    assert g.shape == (B, T, H, D) and g.is_contiguous()
    np.testing.assert_allclose(g.double().numpy(), want, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        stalls.parse_args(["--config", "4by8192"])
    assert "expected 'BxT'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stalls.parse_args(["--heads", "0"])


def test_the_child_runs_this_module_with_the_same_problem():
    cmd = stalls.child_command(stalls.parse_args(["--config", "varlen8x4096", "--heads", "2", "--seed", "3"]))
    assert cmd[0] == sys.executable and cmd[1:4] == ["-m", "kernel.tools.stalls", "--child"]
    assert cmd[4:] == ["--config", "varlen8x4096", "--heads", "2", "--seed", "3", "--inputs", "auto"]


def test_without_ncu_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    assert stalls.main([]) == 2
    assert "ncu is not on PATH" in capsys.readouterr().err


def test_rows_come_from_ncu_and_go_to_json(monkeypatch, tmp_path, capsys):
    import ptx_lab.gpu

    seen = {}

    def fake_profile(command, metrics, kernel_regex, **kw):
        seen.update(command=command, metrics=metrics, regex=kernel_regex, env=kw.get("env"))
        return ncu.Profile([_launch("kda_dstate_scan", barrier=0.4, long_scoreboard=0.9)], ["x.y"], None, ("ncu",))

    monkeypatch.setattr(ncu, "ncu_path", lambda: "/bin/true")
    monkeypatch.setattr(ncu, "profile", fake_profile)
    monkeypatch.setattr(ptx_lab.gpu, "gpu_reason", lambda: None)
    out = tmp_path / "stalls.json"
    assert stalls.main(["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| Kernel A |" in text and "long_scoreboard 0.90" in text and "does not know x.y" in text
    assert seen["regex"] == stalls.KERNEL_REGEX and tuple(seen["metrics"]) == stalls.METRICS
    assert "--child" in seen["command"] and "--forward" not in seen["command"] and seen["env"]["PYTHONPATH"]
    data = json.loads(out.read_text())
    assert data["rows"][0]["binding"] == "long_scoreboard" and data["dropped"] == ["x.y"] and not data["forward"]
    # --forward: the child runs the forward, and ncu profiles kda_forward alone (not kda_forward_states)
    assert stalls.main(["--forward", "--config", "32x8192", "--heads", "16"]) == 0
    assert "one forward (kernel.forward.forward)" in capsys.readouterr().out
    assert seen["regex"] == stalls.FORWARD_REGEX and "--forward" in seen["command"]
    assert re.fullmatch(seen["regex"], "kda_forward") and not re.fullmatch(seen["regex"], "kda_forward_states")
    assert re.search(seen["regex"], "kda_forward") and not re.search(seen["regex"], "kda_forward_states")
    # --three-pass: the child runs the three passes, and ncu profiles their three kernels alone
    assert stalls.main(["--three-pass", "--config", "1x131072", "--heads", "16"]) == 0
    assert "one three-pass forward" in capsys.readouterr().out
    assert seen["regex"] == stalls.THREE_PASS_REGEX and "--three-pass" in seen["command"]
    for name in ("kda_forward_products", "kda_forward_chain", "kda_forward_output"):
        assert re.search(seen["regex"], name)
    assert not any(re.search(seen["regex"], n) for n in ("kda_forward", "kda_forward_states", "kda_dstate_scan"))


def test_one_forward_a_run():
    with pytest.raises(SystemExit):
        stalls.parse_args(["--forward", "--three-pass"])


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on PATH")
def test_stalls_on_the_gpu_name_each_kernel(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "stalls.json"
    # drawn inputs: no fla-core, so no Triton compile
    assert stalls.main(["--config", "varlen5x1000", "--heads", "2", "--inputs", "drawn", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kernel"] for r in rows} == set(stalls.BACKWARD_KERNELS.values())
    for r in rows:
        assert r["time_ns"] and r["binding"] in stalls.STALL_REASONS, r


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on PATH")
@pytest.mark.parametrize("flag, config, kernels", [
    ("--forward", "varlen5x1000", ["the forward"]),                      # kda_forward alone, not kda_forward_states
    ("--three-pass", "1x4096", ["products pass", "chain", "o pass"]),
], ids=["forward", "three-pass"])
def test_stalls_of_a_forward_name_its_kernels_alone(tmp_path, flag, config, kernels):
    pytest.importorskip("torch")
    out = tmp_path / "stalls.json"
    assert stalls.main([flag, "--config", config, "--heads", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data[flag[2:].replace("-", "_")] and [r["kernel"] for r in data["rows"]] == kernels
    for r in data["rows"]:
        assert r["time_ns"] and r["binding"] in stalls.STALL_REASONS, r
