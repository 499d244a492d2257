"""ptx-lab bench --forward on the CPU: its arguments, the child process's command line, the refusal, and the
rendering; and --our-forward of --backward and --layer.

The result dicts below are synthetic: they test how a result is rendered (table, JSON, PNG), not a
measurement (test_bench_forward_gpu.py measures)."""
from __future__ import annotations

import json
import sys

import pytest

from kernel.tools.bench import backward_report, backward_run, cli, configs, forward, forward_report, layer_report
from kernel.tools.bench.forward import FWD_CUDNN, FWD_FLA, FWD_OURS, FWD_RAW, FWD_THREE

from .blocked_imports import run_blocked

# ------------------------------------------------------------- arguments ----


def test_forward_mode_arguments():
    a = cli.parse_args(["--forward"])
    assert a.forward and not (a.backward or a.layer or a.in_process or a.no_cudnn) and a.heads == 32
    assert a.configs.split(",") == list(configs.BACKWARD_CONFIGS)
    a = cli.parse_args(["--forward", "--quick", "--in-process", "--no-cudnn", "--configs", "2x256", "--heads", "4"])
    assert (a.configs, a.heads, a.reps, a.warmup, a.in_process, a.no_cudnn) == ("2x256", 4, 5, 1, True, True)
    assert backward_run.mode_of(a) is backward_run.MODES["forward"]
    assert not cli.parse_args([]).forward


@pytest.mark.parametrize("argv, message", [
    (["--forward", "--backward"], "--backward and --forward are two modes: pick one"),
    (["--forward", "--layer", "--backward"], "--backward and --layer and --forward are three modes: pick one"),
    (["--forward", "--gates", "trained-layer"], "--gates trained-layer times the whole backward: add --backward"),
    (["--forward", "--our-forward", "fla"], "--our-forward picks kernel.chunk_kda's forward in --backward's step"),
    (["--our-forward", "fla"], "--our-forward picks kernel.chunk_kda's forward in --backward's step"),
    (["--backward", "--our-forward", "triton"], "invalid choice: 'triton'"),
])
def test_bad_forward_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert message in capsys.readouterr().err


def test_each_configuration_gets_the_forward_runs_options():
    a = cli.parse_args(["--forward", "--heads", "8", "--reps", "7", "--warmup", "2", "--seed", "3",
                        "--gate-strength", "0.5", "--no-fla", "--no-cudnn"])
    argv = backward_run.child_argv(a, "varlen64x262144", "x.json")
    assert argv[:4] == [sys.executable, "-m", "kernel.tools.bench", "--forward"]
    assert "--our-forward" not in argv and "--gates" not in argv
    child = cli.parse_args(argv[3:])
    assert child.forward and child.in_process and child.configs == "varlen64x262144" and child.json == "x.json"
    for name in ("heads", "reps", "warmup", "seed", "gate_strength", "no_fla", "no_cudnn"):
        assert getattr(child, name) == getattr(a, name), name


@pytest.mark.parametrize("mode", ["--backward", "--layer"])
@pytest.mark.parametrize("our_forward", ["ours", "fla"])
def test_our_forward_reaches_each_configurations_process(mode, our_forward):
    a = cli.parse_args([mode] + ([] if our_forward == "ours" else ["--our-forward", our_forward]))
    assert a.our_forward == our_forward
    child = cli.parse_args(backward_run.child_argv(a, "4x8192", "x.json")[3:])
    assert child.our_forward == our_forward and getattr(child, mode[2:])


def test_refused_without_what_it_needs_naming_it():
    code = ("import sys\nfrom kernel.tools.bench import cli\n"
            "sys.exit(cli.main(['--forward', '--configs', '2x256'], prog='ptx-lab bench'))\n")
    out = run_blocked(code)
    assert out.returncode == 2, out.stderr
    assert out.stdout.strip() == ("ptx-lab bench --forward needs torch, fla-core 0.6.0 (with triton) and CuPy on a "
                                  "CUDA GPU: torch is not installed (blocked: torch)")


def test_imports_without_torch_cupy_fla():
    out = run_blocked("import kernel.tools.bench.forward, kernel.tools.bench.forward_report\nprint('ok')\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ------------------------------------------------- rendering (synthetic) ----

def _synthetic(config="4x8192", **over) -> dict:
    """A made-up result in the shape bench_forward_config returns (numbers chosen to render exactly)."""
    r = {"bench": "forward", "config": config, "H": 32,
         "forward": {FWD_OURS: {"median_ms": 3.0, "host_ms": 0.75}, FWD_FLA: {"median_ms": 4.0, "host_ms": 0.5},
                     FWD_CUDNN: {"median_ms": 6.0, "host_ms": 0.25}, FWD_RAW: {"median_ms": 2.5, "host_ms": 0.125},
                     FWD_THREE: {"median_ms": 2.0, "host_ms": 0.375}},
         "ratio": {"ours/fla": 0.75, "ours/cudnn": 0.5, "over_raw": 0.2, "three/raw": 0.8},
         "peak_memory": {FWD_OURS: {"bytes": 2.5e9}, FWD_FLA: {"bytes": 3.0e9}, FWD_CUDNN: {"bytes": 2.75e9},
                         FWD_RAW: {"bytes": 1.25e9}, FWD_THREE: {"bytes": 1.5e9}},
         "wall_s": 20.0, "fla_autotune": {}}
    r.update(over)
    return r


def test_rendering_a_row():
    row = forward_report.forward_row(_synthetic())
    assert len(row) == len(forward_report.FORWARD_COLUMNS)
    assert row == ["4x8192", "3.000", "4.000", "6.000", "2.500", "2.000", "0.750", "0.500", "+20.0%", "0.800",
                   "2.50", "3.00", "2.75", "1.25", "1.50", "0.75", "0.50", "0.25", "0.12", "0.38"]
    line = forward_report.progress_line("[1/1] 4x8192", _synthetic())
    assert "forward ours 3.000 ms, FLA 4.000 ms (ratio 0.750), cuDNN 6.000 ms (ratio 0.500)" in line
    assert "raw 2.500 ms (ours over raw +20.0%), three passes 2.000 ms (0.800 of raw)" in line and "[20 s]" in line


def test_the_ratios_are_ours_over_each_side_from_the_same_run():
    fwd = {FWD_OURS: {"median_ms": 3.0}, FWD_FLA: {"median_ms": 4.0}, FWD_RAW: {"median_ms": 2.0},
           FWD_CUDNN: {"error": "ImportError: x"}, FWD_THREE: {"median_ms": 1.5}}
    assert forward._ratios(fwd) == {"ours/fla": 0.75, "over_raw": 0.5, "three/raw": 0.75}
    assert forward._ratios({FWD_FLA: {"median_ms": 4.0}}) == {}


def test_rendering_what_is_missing_failed_or_skipped():
    r = _synthetic(forward={FWD_OURS: {"error": "kernel.fla_dropin.chunk_kda is missing (x)"},
                            FWD_FLA: {"median_ms": 4.0}, FWD_CUDNN: {"skipped": "--no-cudnn"},
                            FWD_RAW: {"error": "RuntimeError: y"}},
                   ratio={}, peak_memory={FWD_FLA: {"bytes": 3e9}})
    cells = dict(zip(forward_report.FORWARD_COLUMNS, forward_report.forward_row(r)))
    assert (cells["ours ms"], cells["FLA ms"], cells["cuDNN ms"], cells["raw ms"]) == \
        ("missing", "4.000", "-", "failed")
    assert (cells["ours/FLA"], cells["over raw"], cells["ours GB"], cells["FLA GB"]) == ("-", "-", "-", "3.00")
    assert forward_report.problems([r, {"config": "1x131072", "error": "its process exited with -9"}]) == [
        "4x8192: forward kernel_chunk_kda: kernel.fla_dropin.chunk_kda is missing (x)",
        "4x8192: forward kernel_forward_raw: RuntimeError: y", "1x131072: its process exited with -9"]
    assert forward_report.notes([r]) == ["4x8192: cudnn_kda skipped (--no-cudnn)"]


def test_the_verdict_holds_ours_to_half_flas_forward_and_below_cudnns():
    fast = _synthetic("32x8192", ratio={"ours/fla": 0.5, "ours/cudnn": 0.9})
    slow = _synthetic("1x131072", ratio={"ours/fla": 0.729, "ours/cudnn": 1.0})
    no_cudnn = _synthetic("4x8192", ratio={"ours/fla": 0.554})
    assert forward_report.verdict([fast, slow, no_cudnn, {"config": "8x32768", "error": "x"}]) == [
        "32x8192: 0.500x FLA's forward: met; 0.900x cuDNN's: met",
        "1x131072: 0.729x FLA's forward: NOT met (target 0.5x); 1.000x cuDNN's: NOT met (target below 1x)",
        "4x8192: 0.554x FLA's forward: NOT met (target 0.5x); cuDNN's not timed"]


def _write_runs(tmp_path, results_per_file: dict[str, list[dict]]) -> list[str]:
    paths = []
    for name, results in results_per_file.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"environment": {"device": "synthetic"}, "args": {"configs": name}, "runs": [],
                                 "results": results}))
        paths.append(str(p))
    return paths


def test_rendering_from_json_merges_the_runs_table_json_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    paths = _write_runs(tmp_path, {"4x8192": [_synthetic()], "varlen64x262144": [_synthetic("varlen64x262144")]})
    assert forward_report.is_forward_json(paths[0]) and not backward_report.is_backward_json(paths[0])
    merged, png = tmp_path / "all.json", tmp_path / "all.png"
    # --from-json tells a --forward file by its results, without --forward
    assert cli.main(["--from-json", *paths, "--json", str(merged), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2 config(s) from 2 file(s)" in out and forward_report.TITLE in out
    header = next(line for line in out.splitlines() if line.startswith("| config "))
    assert [c.strip() for c in header.strip("|").split("|")] == list(forward_report.FORWARD_COLUMNS)
    assert "| 4x8192 " in out and "| varlen64x262144 " in out
    data = json.loads(merged.read_text())
    assert [r["config"] for r in data["results"]] == ["4x8192", "varlen64x262144"]
    assert [r["file"] for r in data["runs"]] == ["4x8192.json", "varlen64x262144.json"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # a plot with FLA alone still draws
    forward_report.plot_forward([_synthetic(forward={FWD_FLA: {"median_ms": 4.0}}, peak_memory={})],
                                str(tmp_path / "fla.png"))
    assert (tmp_path / "fla.png").stat().st_size > 0


def test_a_file_that_is_not_a_forward_run_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": 3}')
    assert not forward_report.is_forward_json(str(bad))
    assert cli.main(["--forward", "--from-json", str(bad)]) == 1
    assert "not a bench --forward --json file" in capsys.readouterr().out


# ---------------------------------------- --our-forward in the other modes ----

def _step_result(config: str, **over) -> dict:
    return {"bench": "backward", "config": config, "H": 32, "backward": {}, "step": {}, **over}


def test_the_backward_table_title_says_which_forward_ours_ran(capsys):
    ours, fla = _step_result("4x8192", our_forward="ours"), _step_result("1x131072", our_forward="fla")
    earlier = _step_result("8x32768")    # recorded before --our-forward, when kernel.chunk_kda ran FLA's forward
    assert backward_report.title([ours]).endswith("ours is kernel.chunk_kda with our forward and our backward:")
    assert "with FLA's forward and our backward" in backward_report.title([fla, earlier])
    assert "with FLA's forward (1x131072, 8x32768) / our forward (4x8192) and our backward" in \
        backward_report.title([ours, fla, earlier])
    backward_report.log_backward_table([ours])
    assert backward_report.title([ours]) in capsys.readouterr().out
    assert "ours (our forward)" in backward_report.progress_line("[1/1] 4x8192", ours)


def test_the_layer_table_title_says_which_forward_ours_ran(capsys):
    r = {"bench": "layer", "config": "4x8192", "layer": {}, "peak_memory": {}, "our_forward": "fla"}
    layer_report.log_layer_table([r])
    assert "kernel.chunk_kda with FLA's forward and our backward" in capsys.readouterr().out
    assert "with our forward" in layer_report.title([{**r, "our_forward": "ours"}])


def test_the_step_and_the_layer_run_under_the_forward_asked_for(monkeypatch):
    pytest.importorskip("torch")
    import kernel
    from kernel.tools.bench import backward, layer

    before = kernel.forward_setting()
    for name in ("fla", "ours"):
        with backward.our_forward_setting(name):
            assert kernel.forward_setting() == name
        assert kernel.forward_setting() == before
    seen = []
    monkeypatch.setattr(layer, "_bench_layer_config",
                        lambda cfg, args, flush: seen.append(kernel.forward_setting()) or {})
    monkeypatch.setattr(layer, "record_fla_autotune", lambda res, tag: res.update(fla_autotune={}))
    layer.bench_layer_config(configs.parse_config("2x256"), cli.parse_args(["--layer", "--our-forward", "fla"]), None)
    assert seen == ["fla"] and kernel.forward_setting() == before
