"""ptx-lab cp-check on CPU processes: the float64 pair over gloo ranks, and its refusals."""
from __future__ import annotations

import json

import pytest

from kernel.tools import cp_check

SMALL = ["--pair", "reference", "--T", "75", "--heads", "2", "--K", "3", "--V", "4", "--tile", "4",
         "--reps", "1", "--timeout", "60"]


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason="cp-check needs torch (the [torch] extra; CI has the CPU build)")
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch build has no torch.distributed with gloo")
    return torch


@pytest.mark.parametrize("world, every", [(2, 1), (3, 4)])
def test_spawned_gloo_ranks_match_the_unsplit_scan(torch, tmp_path, capsys, world, every):
    out = tmp_path / "cp.json"
    assert cp_check.main(["--spawn", str(world), "--snapshot-every", str(every), *SMALL, "--json", str(out)]) == 0
    ranks = json.loads(out.read_text())["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    assert ranks[0]["start"] == 0 and ranks[-1]["stop"] == 75
    assert all(r["stop"] == n["start"] for r, n in zip(ranks, ranks[1:]))
    assert all(r["snapshots_rel"] < 1e-12 and r["dS_out_rel"] < 1e-12 for r in ranks), ranks
    assert all(r["exchange_bytes"] == world * 2 * 3 * (3 + 4) * 8 for r in ranks)   # H K (K + V) float64


def test_the_whole_backward_over_spawned_gloo_ranks_matches_the_unsplit_one(torch, tmp_path):
    out = tmp_path / "cp.json"
    assert cp_check.main(["--backward", "--spawn", "3", *SMALL[2:], "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["args"]["backward"] and data["args"]["pair"] == "reference"
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2] and ranks[-1]["stop"] == 75
    assert all(max(r["gradients_rel"].values()) < 1e-12 for r in ranks), ranks
    assert "dh0" in ranks[0]["gradients_rel"]
    assert all(r["exchange_bytes"] == 3 * 2 * 3 * (2 * 3 + 2 * 4) * 8 for r in ranks)   # H K (2K + 2V) float64


def test_the_whole_backward_has_no_gpu_pair_yet(capsys):
    with pytest.raises(SystemExit):
        cp_check.parse_args(["--backward", "--pair", "kernel"])
    assert "the whole backward's GPU pair is not built" in capsys.readouterr().err


def test_a_missed_bound_fails_the_run(torch):
    assert cp_check.main(["--spawn", "2", *SMALL, "--bound", "0"]) == 1


def test_without_torchrun_or_spawn_it_says_how(torch, monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert cp_check.main(SMALL) == 2
    assert "use --spawn N" in capsys.readouterr().err


def test_kernel_a_s_pair_refuses_other_sizes():
    with pytest.raises(SystemExit):
        cp_check.parse_args(["--K", "64"])


@pytest.mark.gpu
def test_kernel_a_s_pair_on_two_ranks_sharing_a_gpu(torch, tmp_path):
    """Two gloo ranks on this machine's GPU(s): Kernel A's summaries and scans within the split's bound."""
    out = tmp_path / "cp.json"
    assert cp_check.main(["--spawn", "2", "--T", "1000", "--heads", "2", "--reps", "1", "--json", str(out)]) == 0
    ranks = json.loads(out.read_text())["ranks"]
    assert all(r["snapshots_rel"] < 5e-3 and r["dS_out_rel"] < 5e-3 for r in ranks), ranks
