"""ptx-lab bench --backward on the CPU: its arguments, the floor column, the refusal, and the rendering.

The result dicts below are synthetic: they test how a result is rendered (table, JSON, PNG), not a
measurement. The measured numbers exist only from a GPU run (test_bench_backward_gpu.py, .ci/gpu-checks).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.tools import floors
from kernel.tools.bench import backward, backward_report, backward_run, cli, configs
from kernel.tools.bench.backward import FLA_SAFE, FLA_UNSAFE, OURS, STEP_CUDNN, STEP_FLA, STEP_OURS, STEP_PIPELINED

from .blocked_imports import run_blocked

# ------------------------------------------------------------- arguments ----


def test_backward_mode_arguments():
    a = cli.parse_args(["--backward"])
    assert a.backward and not a.in_process and not a.no_step
    assert a.configs.split(",") == list(configs.BACKWARD_CONFIGS) == \
        ["4x8192", "32x8192", "8x32768", "1x131072", "varlen64x262144"]
    a = cli.parse_args(["--backward", "--quick", "--in-process", "--no-step", "--configs", "2x256", "--heads", "4"])
    assert (a.configs, a.heads, a.reps, a.warmup, a.in_process, a.no_step) == ("2x256", 4, 5, 1, True, True)
    assert not cli.parse_args([]).backward          # the default mode is unchanged


def test_each_configuration_gets_this_runs_options():
    a = cli.parse_args(["--backward", "--heads", "8", "--reps", "7", "--warmup", "2", "--seed", "3",
                        "--gate-strength", "0.5", "--no-step", "--no-fla", "--no-cudnn"])
    argv = backward_run.child_argv(a, "varlen64x262144", "x.json")
    assert argv[:3] == [sys.executable, "-m", "kernel.tools.bench"]
    child = cli.parse_args(argv[3:])
    assert child.backward and child.in_process and child.configs == "varlen64x262144" and child.json == "x.json"
    for name in ("heads", "reps", "warmup", "seed", "gate_strength", "no_step", "no_fla", "no_cudnn", "gates",
                 "projection_scale"):
        assert getattr(child, name) == getattr(a, name), name
    a = cli.parse_args(["--backward", "--gates", "trained-layer", "--projection-scale", "8"])
    child = cli.parse_args(backward_run.child_argv(a, "4x8192", "x.json")[3:])
    assert (child.gates, child.projection_scale) == ("trained-layer", 8.0) and not child.qk_copies
    child = cli.parse_args(backward_run.child_argv(cli.parse_args(["--backward", "--qk-copies"]), "4x8192", "x")[3:])
    assert child.qk_copies   # each configuration's process takes the op's copies path too


def test_step_only_is_checked_and_passed_to_each_configurations_process():
    a = cli.parse_args(["--backward", "--step-only"])
    assert a.step_only and not a.no_step and not cli.parse_args(["--backward"]).step_only
    assert cli.parse_args(backward_run.child_argv(a, "32x8192", "x.json")[3:]).step_only


@pytest.mark.parametrize("argv, message", [
    (["--step-only"], "--step-only times --backward's step alone: add --backward, without --no-step"),
    (["--backward", "--step-only", "--no-step"], "--step-only times --backward's step alone"),
    (["--gates", "trained-layer"], "--gates trained-layer times the whole backward: add --backward"),
    (["--backward", "--projection-scale", "8"], "--projection-scale takes a number > 0, with --gates trained-layer"),
    (["--backward", "--gates", "trained-layer", "--projection-scale", "0"], "--projection-scale takes a number > 0"),
])
def test_the_gate_recipe_options_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_trained_layer_gates_are_the_recipes_unbounded_gate():
    torch = pytest.importorskip("torch")
    from kernel.tools.bench.inputs import make_inputs
    from kernel.tools.trained_layer_gate import trained_layer_gate

    for config in ("2x64", "varlen5x200"):
        cfg = configs.parse_config(config)
        raw = make_inputs(cfg, 2, seed=1, gate_strength=1.0, gates="trained-layer", projection_scale=8.0,
                          device="cpu")
        want = trained_layer_gate(cfg.B, cfg.T, 2, 2, lengths=list(cfg.lengths) if cfg.varlen else None, seed=1,
                                  projection_scale=8.0)["g"]
        assert raw["g"].shape == raw["q"].shape and raw["g"].dtype == torch.float32
        assert torch.equal(raw["g"], want.reshape(raw["g"].shape))
        assert raw["g"].min() < -5       # below what FLA's safe_gate takes
    clamped = make_inputs(configs.parse_config("2x64"), 2, seed=1, gate_strength=1.0, device="cpu")
    assert clamped["g"].min() >= -5
    with pytest.raises(ValueError, match="gates must be one of"):
        make_inputs(configs.parse_config("2x64"), 2, seed=1, gate_strength=1.0, gates="bounded", device="cpu")


# ------------------------------------------------------------ the floor ----

@pytest.mark.parametrize("bench_name, floors_name", [("4x8192", "4x8192"), ("32x8192", "32x8192"),
                                                     ("8x32768", "8x32768"), ("1x131072", "1x131072"),
                                                     ("varlen64x262144", "varlen 64 / 262144")])
def test_floor_column_is_the_recommended_designs_from_floors(bench_name, floors_name):
    cfg = configs.parse_config(bench_name)
    assert cfg.lengths == floors.SHAPES[floors_name]
    entry = backward.floor_entry(cfg.lengths, 32)
    row = next(r for r in floors.floors() if r.design == floors.RECOMMENDED.name and r.shape == floors_name)
    assert entry["design"] == floors.RECOMMENDED.name == "bf16-every-64 dS, bf16 states every 64 recomputed"
    assert entry["ms"] == pytest.approx(row.byte_ms, rel=1e-12)
    assert entry["gbytes"] == pytest.approx(row.gbytes, rel=1e-12)


def test_floor_at_32x8192_is_the_documented_one():
    # docs/kda_backward.md section 8: 14.55 ms at 32x8192 for the recommended design
    assert backward.floor_entry([8192] * 32, 32)["ms"] == pytest.approx(14.55, abs=0.005)


# ----------------------------------------------------------- the refusal ----

def _run_blocked(blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from kernel.tools.bench import cli\n"
        "sys.exit(cli.main(['--backward', '--configs', '2x256'], prog='ptx-lab bench'))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[3])


def test_refused_without_torch_naming_it():
    out = _run_blocked(("torch", "cupy", "triton", "fla", "matplotlib"))
    assert out.returncode == 2, out.stderr
    assert out.stdout.strip() == ("ptx-lab bench --backward needs torch, fla-core 0.6.0 (with triton) and CuPy on a "
                                  "CUDA GPU: torch is not installed (blocked: torch)")


def test_refused_without_fla_naming_it():
    pytest.importorskip("torch", reason="the fla-core refusal comes after torch's check: needs torch")
    out = _run_blocked(("fla", "triton"))
    assert out.returncode == 2, out.stderr
    assert "needs torch, fla-core 0.6.0 (with triton) and CuPy on a CUDA GPU: fla-core cannot be imported" \
        in out.stdout
    assert "blocked: " in out.stdout


def test_refused_without_cupy_naming_it(monkeypatch, capsys):
    # fla cannot be installed on this machine: its import is replaced by one that succeeds, so that the
    # next requirement in line, CuPy, is the one missing
    pytest.importorskip("torch")
    monkeypatch.setattr(backward.fla_kda, "import_fla", lambda: {})
    monkeypatch.setitem(sys.modules, "cupy", None)      # import cupy raises ImportError
    assert cli.main(["--backward", "--configs", "2x256"], prog="ptx-lab bench") == 2
    assert "CuPy on a CUDA GPU: CuPy is not installed" in capsys.readouterr().out


def test_a_module_not_written_yet_is_called_missing():
    fn, why = backward.import_ours("no_such_module", "f")
    assert fn is None and why.startswith("kernel.no_such_module.f is missing (ModuleNotFoundError")
    fn, why = backward.import_ours("ds_scan.launch", "no_such_name")
    assert fn is None and why.startswith("kernel.ds_scan.launch.no_such_name is missing (AttributeError")
    fn, why = backward.import_ours("ds_scan.launch", "launch")
    assert why is None and fn.__name__ == "launch"


# ------------------------------------------------- rendering (synthetic) ----

def _synthetic(config="4x8192", **over) -> dict:
    """A made-up result in the shape bench_backward_config returns (numbers chosen to render exactly)."""
    r = {"bench": "backward", "config": config, "H": 32,
         "floor": backward.floor_entry(configs.parse_config(config).lengths, 32),
         "backward": {OURS: {"median_ms": 6.0}, FLA_SAFE: {"median_ms": 12.0}, FLA_UNSAFE: {"median_ms": 15.0}},
         "ratio": {f"{OURS}/{FLA_SAFE}": 0.5, f"{OURS}/{FLA_UNSAFE}": 0.4},
         "peak_memory": {OURS: {"bytes": 1.5e9}, FLA_SAFE: {"bytes": 4.25e9}, FLA_UNSAFE: {"bytes": 4.25e9}},
         "pieces": {"kernel_a_share": 0.25, "forward_states": {"median_ms": 1.0}, "kernel_a": {"median_ms": 1.5},
                    "rest_ms": 3.5},
         "step": {STEP_FLA: {"median_ms": 20.0}, STEP_OURS: {"median_ms": 15.0}, "ratio": 0.75}, "wall_s": 12.0,
         "autograd_backward": {}}
    r.update(over)
    return r


def test_rendering_a_row():
    row = backward_report.backward_row(_synthetic())
    floor = floors.byte_floor_ms([8192] * 4)
    assert len(row) == len(backward_report.BACKWARD_COLUMNS)
    assert row == ["4x8192", "6.000", "12.000", "15.000", "0.500", "0.400", f"{floor:.3f}", f"{6.0 / floor:.2f}",
                   "0.25", "1.50", "4.25", "4.25", "20.000", "15.000", "0.750"] + ["-"] * 12   # no step memory,
    # pipeline, cuDNN, autograd
    with_memory = _synthetic(step_peak_memory={STEP_FLA: {"bytes": 6.5e9}, STEP_OURS: {"bytes": 4.5e9}})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(with_memory)))
    assert (cells["step FLA GB"], cells["step ours GB"]) == ("6.50", "4.50")
    piped = _synthetic(step={STEP_FLA: {"median_ms": 20.0}, STEP_OURS: {"median_ms": 15.0}, "ratio": 0.75,
                             STEP_PIPELINED: {"median_ms": 14.0}, "ratio_pipelined": 0.7})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(piped)))
    assert (cells["step pipelined ms"], cells["step pipelined/FLA"]) == ("14.000", "0.700")


def test_rendering_the_cudnn_step_and_the_backwards_through_autograd():
    r = _synthetic(step={STEP_FLA: {"median_ms": 20.0}, STEP_OURS: {"median_ms": 15.0}, STEP_CUDNN: {"median_ms": 25.0},
                         "ratio": 0.75, "ratio_cudnn": 0.6},
                   autograd_backward={STEP_FLA: {"median_ms": 14.0}, STEP_OURS: {"median_ms": 6.3},
                                      STEP_CUDNN: {"median_ms": 12.6}, "ratio": 0.45, "ratio_cudnn": 0.5,
                                      "over_bare": 0.05})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(r)))
    assert (cells["step cuDNN ms"], cells["step ours/cuDNN"]) == ("25.000", "0.600")
    assert [cells[c] for c in backward_report.BACKWARD_COLUMNS[-6:]] == [
        "14.000", "6.300", "12.600", "0.450", "0.500", "+5.0%"]
    slow = _synthetic("1x131072", autograd_backward={"ratio_cudnn": 0.62})
    assert [x for x in backward_report.verdict([r, slow]) if "autograd" in x] == [
        "4x8192: through autograd ours 0.500x cuDNN's backward: met",
        "1x131072: through autograd ours 0.620x cuDNN's backward: NOT met (target 0.5x)"]
    missing = _synthetic(step={STEP_CUDNN: {"error": "cuDNN frontend's kimi_delta_attention is missing (x)"}})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(missing)))
    assert cells["step cuDNN ms"] == "missing"


def test_rendering_what_is_missing_or_failed():
    r = _synthetic(backward={OURS: {"error": "kernel.kda_backward.kda_backward is missing (ModuleNotFoundError: x)"},
                             FLA_SAFE: {"median_ms": 12.0}, FLA_UNSAFE: {"error": "OutOfMemoryError: y"}},
                   ratio={}, peak_memory={}, pieces={},
                   step={STEP_FLA: {"median_ms": 20.0}, STEP_OURS: {"error": "kernel.chunk_kda.chunk_kda is missing"}})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(r)))
    assert (cells["ours ms"], cells["FLA sg=T ms"], cells["FLA sg=F ms"]) == ("missing", "12.000", "failed")
    assert (cells["ours/FLA sg=T"], cells["ours/floor"], cells["A share"], cells["ours GB"]) == ("-",) * 4
    assert (cells["step FLA ms"], cells["step ours ms"], cells["step ours/FLA"]) == ("20.000", "missing", "-")
    lines = backward_report.problems([r, {"config": "1x131072", "error": "its process exited with -9"}])
    assert lines == ["4x8192: backward ours: kernel.kda_backward.kda_backward is missing (ModuleNotFoundError: x)",
                     "4x8192: backward fla_safe_gate_false: OutOfMemoryError: y",
                     "4x8192: step kernel_chunk_kda: kernel.chunk_kda.chunk_kda is missing",
                     "1x131072: its process exited with -9"]
    assert "ours" in backward_report.progress_line("[1/1] 4x8192", r)


def test_trained_layer_gates_are_named_and_judged_against_flas_safe_gate_false():
    r = _synthetic(gates="trained-layer", backward={OURS: {"median_ms": 6.0}, FLA_UNSAFE: {"median_ms": 15.0}},
                   ratio={f"{OURS}/{FLA_UNSAFE}": 0.4}, peak_memory={OURS: {"bytes": 1.5e9}, FLA_UNSAFE: {"bytes": 3e9}})
    cells = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(r)))
    assert cells["config"] == "4x8192 (trained-layer gates)"
    assert (cells["FLA sg=T ms"], cells["ours/FLA sg=T"], cells["ours/FLA sg=F"]) == ("-", "-", "0.400")
    assert backward_report.verdict([r])[0] == ("4x8192: time 0.400x FLA's safe_gate=False: met; memory 0.50x FLA's "
                                               "safe_gate=False: met; FLA's dhu BV ?")


def test_the_verdict_judges_time_and_memory_and_names_flas_dhu_choice():
    dhu = {backward_report.DHU_KERNEL: {"(32, 32, 128)": "BV: 32, num_warps: 4, num_ctas: 1"}}
    slow = _synthetic("1x131072", ratio={f"{OURS}/{FLA_SAFE}": 0.51},
                      peak_memory={OURS: {"bytes": 5e9}, FLA_SAFE: {"bytes": 4e9}}, fla_autotune=dhu)
    lines = backward_report.verdict([_synthetic(), slow, _synthetic(ratio={}, peak_memory={}),
                                     {"config": "8x32768", "error": "its process exited with -9"}])
    assert [x for x in lines if not x.startswith("step ")] == [
        "4x8192: time 0.500x FLA's: met; memory 0.35x FLA's: met; FLA's dhu BV ?",
        "1x131072: time 0.510x FLA's: NOT met (target 0.5x); memory 1.25x FLA's: NOT met; FLA's dhu BV 32",
        "4x8192: time not measured; memory not measured; FLA's dhu BV ?"]


def test_rendering_from_json_table_json_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    paths = []
    for name in ("4x8192", "varlen64x262144"):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"environment": {"device": "synthetic"}, "args": {"configs": name},
                                 "runs": [], "results": [_synthetic(name)]}))
        paths.append(str(p))
    assert backward_report.is_backward_json(paths[0])
    merged, png = tmp_path / "all.json", tmp_path / "all.png"
    # --from-json tells a --backward file by its results, without --backward
    assert cli.main(["--from-json", *paths, "--json", str(merged), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2 config(s) from 2 file(s)" in out
    header = next(line for line in out.splitlines() if line.startswith("| config "))
    assert [c.strip() for c in header.strip("|").split("|")] == list(backward_report.BACKWARD_COLUMNS)
    assert "| 4x8192 " in out and "| varlen64x262144 " in out
    data = json.loads(merged.read_text())
    assert [r["config"] for r in data["results"]] == ["4x8192", "varlen64x262144"]
    # by name: the paths are the scratch folders of the machine that ran them
    assert [r["file"] for r in data["runs"]] == [os.path.basename(p) for p in paths]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # a plot with FLA alone (ours missing everywhere) still draws
    only_fla = _synthetic(backward={FLA_SAFE: {"median_ms": 12.0}}, step={})
    backward_report.plot_backward([only_fla], str(tmp_path / "fla.png"))
    assert (tmp_path / "fla.png").stat().st_size > 0


def test_a_file_that_is_not_a_backward_run_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": 3}')
    assert not backward_report.is_backward_json(str(bad))
    assert cli.main(["--backward", "--from-json", str(bad)]) == 1
    assert "not a bench --backward --json file" in capsys.readouterr().out


def test_imports_without_torch_cupy_fla():
    out = run_blocked("import kernel.tools.bench.backward_run, kernel.tools.fla_kda\n"
                      "from kernel.tools.bench.backward import missing_requirement\n"
                      "print(missing_requirement())\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch is not installed (blocked: torch)"


def test_the_progress_line_says_when_the_scans_ran_side_by_side():
    plain = backward_report.progress_line("[1/1] 4x8192", _synthetic(scans={"side_by_side": False}))
    assert "side by side" not in plain
    pieces = {**_synthetic()["pieces"], backward.OURS_IN_TURN: {"median_ms": 7.25},
              backward.KERNEL_A_HALF: {"median_ms": 2.0}, backward.FORWARD_STATES_HALF: {"median_ms": 1.25}}
    line = backward_report.progress_line("[1/1] 1x131072", _synthetic(
        "1x131072", pieces=pieces, scans={"side_by_side": True, "vsplit": 2, "states_warps": 4}))
    assert ("the scans side by side (Kernel A vsplit 2, the forward-state scan 4 warps: 2.000 and 1.250 ms "
            "alone), in turn 7.250 ms") in line


def test_backward_pipeline_is_parsed_checked_and_passed_to_each_configurations_process():
    from kernel.backward_pipeline import Pipeline
    from kernel.tools.bench.cli import parse_args

    args = parse_args(["--backward", "--backward-pipeline", "24,4"])
    assert args.backward_pipeline == Pipeline(a_sms=24, groups=4)
    assert parse_args(["--backward"]).backward_pipeline is None
    for bad in ("24", "24,1", "a,4"):
        with pytest.raises(SystemExit):
            parse_args(["--backward", "--backward-pipeline", bad])
    child = parse_args(backward_run.child_argv(args, "32x8192", "x.json")[3:])
    assert child.backward_pipeline == Pipeline(a_sms=24, groups=4)


def test_the_pipelined_side_sets_the_pipeline_for_its_step_alone():
    from kernel import backward_pipeline
    from kernel.backward_pipeline import Pipeline

    plan = Pipeline(a_sms=24, groups=4)
    assert backward._pipelined(plan, lambda: backward_pipeline.PIPELINE) == plan
    assert backward_pipeline.PIPELINE is None

    def fails():
        raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError, match="the step failed"):
        backward._pipelined(plan, fails)
    assert backward_pipeline.PIPELINE is None


def test_the_pipelined_steps_bits_are_compared_gradient_by_gradient():
    torch = pytest.importorskip("torch")
    xs = (torch.tensor([1.0, -0.0]), torch.tensor([2.0]))
    assert backward._same_bits(xs, (xs[0].clone(), xs[1].clone()))
    assert not backward._same_bits(xs, (xs[0], torch.tensor([2.0 + 2 ** -20])))
    assert not backward._same_bits(xs, xs[:1])


def test_a_step_only_result_is_judged_on_its_step_alone_and_renders(tmp_path):
    # no bare backward ran: no backward verdict ("not measured" would read as a miss), the step's with FLA's dhu BV
    r = _synthetic("32x8192", backward={}, ratio={}, peak_memory={}, pieces={}, step_only=True,
                   step={STEP_FLA: {"median_ms": 120.0}, STEP_OURS: {"median_ms": 46.8}, "ratio": 0.39},
                   fla_autotune={backward_report.DHU_KERNEL: {"k": "BV: 64, num_warps: 4"}})
    assert backward_report.verdict([r]) == ["step 32x8192: time 0.390x FLA's step: met; memory not measured; "
                                            "FLA's dhu BV 64"]
    row = dict(zip(backward_report.BACKWARD_COLUMNS, backward_report.backward_row(r)))
    assert (row["ours ms"], row["step ours ms"], row["step ours/FLA"]) == ("-", "46.800", "0.390")
    pytest.importorskip("matplotlib")
    backward_report.plot_backward([r], str(tmp_path / "step.png"))
    assert (tmp_path / "step.png").stat().st_size > 0


def test_the_step_verdict_takes_each_configurations_target():
    at_target = _synthetic("1x131072", step={STEP_OURS: {"median_ms": 32.0}, "ratio": 0.5},
                           step_peak_memory={STEP_FLA: {"bytes": 4e9}, STEP_OURS: {"bytes": 3e9}})
    above = _synthetic("32x8192", step={"ratio": 0.407})
    assert backward_report.step_verdict(at_target) == "step 1x131072: time 0.500x FLA's step: met; memory 0.75x " \
                                                      "FLA's step: met"
    assert backward_report.step_verdict(above) == "step 32x8192: time 0.407x FLA's step: NOT met (target 0.4x); " \
                                                  "memory not measured"
    assert backward_report.step_verdict(_synthetic(step={})) is None
    assert backward_report.step_verdict(above) in backward_report.verdict([above])
