"""ptx-lab bench --layer on the CPU: its arguments, the child process's command line, the refusal, and
the rendering. The result dicts are synthetic: they test how a result is rendered, not a measurement
(test_bench_layer_gpu.py measures)."""
from __future__ import annotations

import json
import sys

import pytest

from kernel.tools.bench import backward_run, cli, layer, layer_report
from kernel.tools.bench.device import CANNOT_RUN_EXIT
from kernel.tools.bench.layer import LAYER_FLA, LAYER_OURS, OP_BARE, OP_FLA, OP_OURS


def test_layer_mode_arguments():
    a = cli.parse_args(["--layer"])
    assert a.layer and not a.backward and (a.heads, a.hidden) == (16, 2048)
    assert a.configs.split(",") == ["4x8192", "32x8192", "8x32768", "1x131072", "varlen64x262144"]
    assert cli.parse_args(["--layer", "--heads", "4", "--hidden", "512"]).heads == 4
    assert cli.parse_args([]).heads == 32 and cli.parse_args(["--backward"]).heads == 32


@pytest.mark.parametrize("argv, message", [
    (["--layer", "--backward"], "--backward and --layer are two modes: pick one"),
    (["--hidden", "512"], "--hidden takes an integer >= 1, with --layer"),
    (["--layer", "--hidden", "0"], "--hidden takes an integer >= 1, with --layer"),
    (["--layer", "--gates", "trained-layer"], "--gates trained-layer times the whole backward: add --backward"),
])
def test_bad_layer_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert message in capsys.readouterr().err


def test_each_configuration_gets_the_layer_runs_options():
    a = cli.parse_args(["--layer", "--heads", "8", "--hidden", "1024", "--reps", "7", "--warmup", "2", "--seed", "3"])
    argv = backward_run.child_argv(a, "varlen64x262144", "x.json")
    assert argv[:4] == [sys.executable, "-m", "kernel.tools.bench", "--layer"]
    child = cli.parse_args(argv[3:])
    assert child.layer and child.in_process and child.configs == "varlen64x262144" and child.json == "x.json"
    for name in ("heads", "hidden", "reps", "warmup", "seed"):
        assert getattr(child, name) == getattr(a, name), name
    assert backward_run.mode_of(child) is backward_run.MODES["layer"]


def test_refused_without_what_it_needs_naming_it(capsys):
    why = layer.missing_requirement()
    if why is None:
        pytest.skip("everything the layer bench needs is here")
    assert cli.main(["--layer", "--configs", "2x256"]) == CANNOT_RUN_EXIT
    err = capsys.readouterr()
    assert "--layer needs torch, fla-core" in err.out + err.err and why in err.out + err.err


def _synthetic(config="4x8192", **over) -> dict:
    r = {"bench": "layer", "config": config, "heads": 16, "hidden": 2048,
         "layer": {LAYER_FLA: {"median_ms": 20.0}, LAYER_OURS: {"median_ms": 12.0}}, "ratio": 0.6,
         "peak_memory": {LAYER_FLA: {"bytes": 4e9}, LAYER_OURS: {"bytes": 3e9}}, "wall_s": 30.0,
         "op_backward": {OP_FLA: {"median_ms": 10.0}, OP_OURS: {"median_ms": 4.2, "host_ms": 0.61},
                         OP_BARE: {"median_ms": 4.0}},
         "backward_ratio": 0.42, "wrapper": 0.05}
    r.update(over)
    return r


def test_rendering_a_row_the_verdict_and_the_problems():
    assert layer_report.layer_row(_synthetic()) == ["4x8192", "20.000", "12.000", "0.600", "4.00", "3.00", "0.75",
                                                    "10.000", "4.200", "0.420", "4.000", "+5.0%", "0.61"]
    slow = _synthetic("1x131072", ratio=0.7, peak_memory={LAYER_FLA: {"bytes": 4e9}, LAYER_OURS: {"bytes": 5e9}})
    failed = _synthetic("8x32768", layer={LAYER_FLA: {"median_ms": 20.0}, LAYER_OURS: {"error": "RuntimeError: x"}},
                        ratio=None, peak_memory={}, backward_ratio=None, wrapper=None,
                        op_backward={OP_FLA: {"median_ms": 10.0}, OP_OURS: {"error": "RuntimeError: y"}})
    earlier = _synthetic("2x256")
    del earlier["op_backward"], earlier["backward_ratio"], earlier["wrapper"]   # a run from before the op's part
    fast = _synthetic("4x8192", backward_ratio=0.40, wrapper=0.02)
    assert layer_report.verdict([fast, slow, failed, earlier, {"config": "32x8192", "error": "exited with -9"}]) == [
        "4x8192: time 0.600x FLA's: met; memory 0.75x FLA's: met",
        "4x8192: backward 0.400x FLA's: met; wrapper +2.0% of our bare backward: met",
        "1x131072: time 0.700x FLA's: NOT met (target 0.65x); memory 1.25x FLA's: NOT met",
        "1x131072: backward 0.420x FLA's: met; wrapper +5.0% of our bare backward: NOT met (target 3%)",
        "8x32768: time not measured; memory not measured",
        "8x32768: backward not measured; wrapper not measured",
        "2x256: time 0.600x FLA's: met; memory 0.75x FLA's: met"]
    assert layer_report.layer_row(earlier)[-6:] == ["-"] * 6
    assert layer_report.problems([failed, {"config": "32x8192", "error": "exited with -9"}]) == [
        "8x32768: layer layer_ours: RuntimeError: x", "8x32768: op_backward op_backward_ours: RuntimeError: y",
        "32x8192: exited with -9"]
    line = layer_report.progress_line("[1/1] 4x8192", _synthetic())
    assert "ours 12.000 ms (ratio 0.600)" in line and "ours 4.200 ms (ratio 0.420), bare 4.000 ms (wrapper +5.0%)" in line


def test_rendering_from_json_and_saying_no_plot(tmp_path, capsys):
    path = tmp_path / "l.json"
    path.write_text(json.dumps({"environment": {}, "args": {}, "runs": [], "results": [_synthetic()]}))
    assert layer_report.is_layer_json(str(path))
    assert cli.main(["--from-json", str(path), "--plot", str(tmp_path / "l.png"), "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert "| 4x8192 " in out and "4x8192: time 0.600x FLA's: met" in out and "--layer draws no plot" in out
    assert not (tmp_path / "l.png").exists()
    assert json.loads((tmp_path / "o.json").read_text())["results"][0]["config"] == "4x8192"


def test_the_op_backward_part_records_the_layers_call_and_our_bare_backward(monkeypatch):
    # CPU stand-ins: a "layer" that calls its module's chunk_kda with keywords, as FLA's does; FLA's
    # op a product; our route an autograd function whose backward calls kernel.kda_backward.run
    torch = pytest.importorskip("torch")
    import types

    import kernel.kda_backward
    from kernel.tools.bench import layer

    bare_calls = []

    def stub_run(*a, **k):
        bare_calls.append((a, k))
        return {"dq": a[0]}

    monkeypatch.setattr(kernel.kda_backward, "run", stub_run)

    class Ours(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q):
            return 3 * q

        @staticmethod
        def backward(ctx, do):
            return kernel.kda_backward.run(do, scale=2.0)["dq"] * 3

    fla_op = lambda **c: (2 * c["q"] * c["A_log"].sum() + 0 * c["v"], None)   # noqa: E731
    routed = lambda **c: (Ours.apply(c["q"]) + 0 * c["A_log"].sum() + 0 * c["v"], None)   # noqa: E731
    module = types.SimpleNamespace(chunk_kda=fla_op)
    q_proj, v_proj, a_log = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Parameter(torch.ones(2))

    def the_layer(x):
        return module.chunk_kda(q=q_proj(x), v=v_proj(x), A_log=a_log, cu_seqlens=torch.tensor([0, 3]),
                                use_gate_in_kernel=True)

    call = layer.layers_call(the_layer, torch.randn(3, 4), {}, module, fla_op)
    assert module.chunk_kda is fla_op
    assert call["q"].is_leaf and call["q"].requires_grad and call["A_log"].requires_grad
    assert not call["cu_seqlens"].requires_grad and call["use_gate_in_kernel"] is True
    out = {}
    calls = layer.op_backward_calls(call, fla_op, routed, seed=0, out=out)
    assert set(calls) == {layer.OP_FLA, layer.OP_OURS, layer.OP_BARE} and out == {}
    assert kernel.kda_backward.run is stub_run and len(bare_calls) == 1   # recorded once, then put back
    dq_fla, _, da_fla = calls[layer.OP_FLA]()
    dq_ours, _, _ = calls[layer.OP_OURS]()   # twice: the graphs are kept
    calls[layer.OP_OURS]()
    assert calls[layer.OP_BARE]() is not None and len(bare_calls) == 4
    assert bare_calls[-1][1] == {"scale": 2.0} and torch.equal(bare_calls[-1][0][0], bare_calls[0][0][0])
    assert torch.equal(dq_ours, 3 * bare_calls[0][0][0]) and dq_fla.shape == dq_ours.shape == (3, 4)
    # a side whose forward raises is recorded, not run; without our op's call there is no bare one
    def broken(**c):
        raise ValueError("refused")

    out = {}
    calls = layer.op_backward_calls(call, fla_op, broken, seed=0, out=out)
    assert set(calls) == {layer.OP_FLA} and "ValueError: refused" in out[layer.OP_OURS]["error"]
    with pytest.raises(RuntimeError, match="never called"):
        layer.layers_call(lambda x: None, torch.randn(3, 4), {}, module, fla_op)
