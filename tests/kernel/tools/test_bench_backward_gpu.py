"""ptx-lab bench --backward on the GPU (torch, fla-core, CuPy): FLA's calls as its autograd function makes
them, one small configuration measured, and the per-process run loop."""
from __future__ import annotations

import json
import math

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.fla]


def _need_stack():
    pytest.importorskip("torch")
    from kernel.tools.bench.backward import missing_requirement
    why = missing_requirement()
    if why:
        pytest.skip(why)


def _rel(x, ref) -> float:
    d = (x.double() - ref.double()).norm()
    return float(d / ref.double().norm())


@pytest.mark.parametrize("config", ["2x256", "varlen8x1000"])
def test_fla_kda_reproduces_chunk_kdas_own_gradients(config):
    """fla_kda.forward + backward (+ FLA's l2norm backward) give what chunk_kda's autograd gives: the
    bench times FLA's backward as FLA runs it."""
    _need_stack()
    import torch

    from kernel.tools import fla_kda
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.inputs import cu_for_fla, make_inputs

    cfg = parse_config(config)
    raw = make_inputs(cfg, 2, seed=0, gate_strength=1.0)
    cu = cu_for_fla(raw["cu_seqlens"])
    h0 = torch.zeros_like(raw["dht"])
    f = fla_kda.forward(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"], h0=h0, cu_seqlens=cu, safe_gate=True)
    ours = fla_kda.backward(f, raw["do"], raw["dht"])
    ours["dq"], ours["dk"] = fla_kda.l2norm_backward(f, ours["dq"], ours["dk"])

    inp = fla_kda.chunk_kda_step_inputs(raw, h0=h0, cu_seqlens=cu)
    leaves = inp["leaves"]
    o, ht = fla_kda.import_fla()["chunk_kda"](leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                              initial_state=leaves["initial_state"], **inp["kwargs"])
    grads = dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"),
                     torch.autograd.grad((o, ht), list(leaves.values()), (raw["do"], raw["dht"]))))
    for name, ref in grads.items():
        assert _rel(ours[name], ref) < 1e-2, (name, _rel(ours[name], ref))


@pytest.mark.parametrize("config", ["2x256", "varlen8x1000"])
def test_one_small_configuration_is_measured(config):
    _need_stack()
    import torch

    from kernel.tools.bench import backward, backward_report, cli
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.timing import L2_FLUSH_BYTES

    args = cli.parse_args(["--backward", "--in-process", "--configs", config, "--heads", "2", "--reps", "2",
                           "--warmup", "1"])
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    res = backward.bench_backward_config(parse_config(config), args, flush)
    for name in (backward.FLA_SAFE, backward.FLA_UNSAFE):
        assert res["backward"][name]["median_ms"] > 0 and res["peak_memory"][name]["bytes"] > 0
    assert res["step"][backward.STEP_FLA]["median_ms"] > 0 and res["our_forward"] == "ours"
    assert res["step_peak_memory"][backward.STEP_FLA]["bytes"] > 0   # its saved tensors and gradients at least
    ours = res["backward"][backward.OURS]
    assert "median_ms" in ours or "is missing" in ours["error"], ours
    if "median_ms" in ours:
        assert math.isclose(res["ratio"][f"{backward.OURS}/{backward.FLA_SAFE}"],
                            ours["median_ms"] / res["backward"][backward.FLA_SAFE]["median_ms"])
        assert 0 < res["pieces"]["kernel_a_share"] < 1
    assert res["fla_autotune"], "FLA's autotuners recorded no choice"
    assert len(backward_report.backward_row(res)) == len(backward_report.BACKWARD_COLUMNS)
    # each side's backward alone through autograd; cuDNN's where it is installed, else its reason
    ab = res["autograd_backward"]
    assert ab[backward.STEP_FLA]["median_ms"] > 0
    if "median_ms" in ours:
        assert ab[backward.STEP_OURS]["median_ms"] > 0 and math.isclose(
            ab["ratio"], ab[backward.STEP_OURS]["median_ms"] / ab[backward.STEP_FLA]["median_ms"])
        assert "over_bare" in ab
    cudnn = res["step"][backward.STEP_CUDNN]
    assert "median_ms" in cudnn or "missing" in cudnn["error"], cudnn


def test_step_only_times_the_step_and_no_bare_backward():
    _need_stack()
    import torch

    from kernel.tools.bench import backward, cli
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.timing import L2_FLUSH_BYTES

    args = cli.parse_args(["--backward", "--step-only", "--in-process", "--configs", "2x256", "--heads", "2",
                           "--reps", "2", "--warmup", "1", "--no-cudnn"])
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    res = backward.bench_backward_config(parse_config("2x256"), args, flush)
    assert res["step_only"] and res["backward"] == {} and res["pieces"] == {} and "fla_forward_s" not in res
    assert res["step"][backward.STEP_FLA]["median_ms"] > 0 and res["step"][backward.STEP_OURS]["median_ms"] > 0
    assert res["step"]["ratio"] > 0 and res["step_peak_memory"][backward.STEP_OURS]["bytes"] > 0
    assert res["autograd_backward"][backward.STEP_OURS]["median_ms"] > 0 and res["fla_autotune"]


def test_trained_layer_gates_leave_flas_safe_gate_out():
    _need_stack()
    import torch

    from kernel.tools.bench import backward, cli
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.timing import L2_FLUSH_BYTES

    args = cli.parse_args(["--backward", "--in-process", "--configs", "2x256", "--heads", "2", "--reps", "2",
                           "--warmup", "1", "--gates", "trained-layer", "--projection-scale", "8"])
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    res = backward.bench_backward_config(parse_config("2x256"), args, flush)
    assert res["gates"] == "trained-layer" and res["gate_statistics"]["tile_channels_past"] > 0
    assert backward.FLA_SAFE not in res["backward"] and res["backward"][backward.FLA_UNSAFE]["median_ms"] > 0
    assert res["step"][backward.STEP_FLA]["median_ms"] > 0


def test_each_configuration_runs_in_its_own_process(tmp_path):
    _need_stack()
    from kernel.tools.bench import cli

    out = tmp_path / "b.json"
    assert cli.main(["--backward", "--configs", "2x256,varlen8x1000", "--heads", "2", "--reps", "1",
                     "--warmup", "0", "--no-step", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["results"]] == ["2x256", "varlen8x1000"]
    assert [r["config"] for r in data["runs"]] == ["2x256", "varlen8x1000"]
    assert all(r["fla_autotune_reset"] == 0 for r in data["results"])   # a fresh process: nothing tuned before
