"""ptx-lab bench (kernel.tools.bench) on the CPU: arguments, configs, byte counts, index math, the table.

No GPU numbers here: the timings and errors themselves only exist on a device
run. What is checked is everything the bench computes on the host, against the
figures docs/kda_backward.md gives (section 5) and against kernel.reference.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel import reference as ref
from kernel.shapes import HEAD_DIM, TILE_TOKENS
from kernel.reference.dstate_scan import tile_table
from kernel.tools import floors

from .blocked_imports import run_blocked
from kernel.tools.bench import cli, configs, inputs, report
from kernel.tools.bench.configs import BF16_EVERY_64, FP32_EVERY_TILE

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------- import ----

def test_imports_without_torch_cupy_fla():
    # a fresh interpreter in which torch, cupy, triton and fla cannot be imported
    out = run_blocked("import kernel.tools.bench.cli, kernel.tools.bench.measure, kernel.tools.fla_adapter\n"
                      "ok, why = kernel.tools.fla_adapter.available()\n"
                      "assert not ok and 'torch' in why, why\n"
                      "print('ok')\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ------------------------------------------------------------- arguments ----

def test_defaults():
    a = cli.parse_args([])
    assert a.configs.split(",") == list(configs.DEFAULT_CONFIGS)
    assert a.modes == [BF16_EVERY_64, FP32_EVERY_TILE] and a.vsplit == "auto" and a.heads == 32
    assert a.segments == "auto"
    assert (a.warmup, a.reps) == (3, 20) and not a.precision


def test_quick_and_overrides():
    a = cli.parse_args(["--quick"])
    assert a.configs.split(",") == list(configs.QUICK_CONFIGS)
    assert (a.warmup, a.reps) == (1, 5)
    a = cli.parse_args(["--quick", "--reps", "7", "--configs", "2x64", "--snapshot", "fp32-every-tile",
                        "--vsplit", "4", "--precision", "--json", "x.json", "--plot", "x.png"])
    assert a.configs == "2x64" and a.reps == 7 and a.modes == [FP32_EVERY_TILE] and a.vsplit == 4
    assert a.precision and a.json == "x.json" and a.plot == "x.png"
    assert a.tuning == {}
    assert cli.parse_args(["--tune", "ksplit=2", "producers=8"]).tuning == {"ksplit": 2, "producers": 8}
    assert cli.parse_args(["--segments", "8"]).segments == 8


@pytest.mark.parametrize("bad", [["--vsplit", "3"], ["--snapshot", "fp16"], ["--reps", "0"],
                                 ["--tune", "ksplit"], ["--tune", "splits=2"], ["--segments", "0"],
                                 ["--segments", "many"]])
def test_bad_arguments_exit(bad):
    with pytest.raises(SystemExit):
        cli.parse_args(bad)


def test_parse_config():
    c = configs.parse_config("32x8192")
    assert (c.B, c.T, c.N, c.tokens, c.varlen) == (32, 8192, 32, 262144, False)
    v = configs.parse_config("varlen")
    assert v.name == "varlen64x262144" and (v.B, v.N, v.tokens, v.varlen) == (1, 64, 262144, True)
    v = configs.parse_config("varlen8x1000", seed=3)
    assert v.N == 8 and v.tokens == 1000 and v.lengths == ref.ragged_lengths(8, 1000, seed=3)
    for bad in ("32", "0x8", "varlen64", "abc"):
        with pytest.raises(ValueError):
            configs.parse_config(bad)


def test_ragged_config_sums_and_edges():
    v = configs.parse_config("varlen64x262144")
    assert sum(v.lengths) == 262144 and len(v.lengths) == 64 and min(v.lengths) >= 1
    assert {1, 15, 16, 17} <= set(v.lengths)


# ------------------------------------------------------------ byte count ----

def test_bytes_match_the_documented_floors():
    # docs/kda_backward.md, section 5: Kernel A moves 5,444 B a token and head with fp32
    # snapshots every tile and 1,860 B with bf16 every 64 tokens (long sequences: without
    # dht and dh0); at 32x8192 the snapshots are 34.4 GB and 4.3 GB, and Kernel A's byte
    # floor at the copy rate 10.78 ms and 3.70 ms
    lengths, H = [8192] * 32, 32
    fp32_every_tile = configs.kernel_a_bytes(lengths, H, snapshot_dtype="float32", snapshot_every=1)
    bf16_every_64 = configs.kernel_a_bytes(lengths, H, snapshot_dtype="bfloat16", snapshot_every=4)
    assert fp32_every_tile["inputs"] == bf16_every_64["inputs"]
    states = 2 * len(lengths) * H * HEAD_DIM * HEAD_DIM * 4          # dht read, dh0 written
    token_heads = sum(lengths) * H
    assert (fp32_every_tile["total"] - states) / token_heads == 5444
    assert (bf16_every_64["total"] - states) / token_heads == 1860
    assert abs(fp32_every_tile["snapshots"] / 1e9 - 34.4) < 0.05
    assert abs(bf16_every_64["snapshots"] / 1e9 - 4.3) < 0.05
    assert abs(fp32_every_tile["total"] / floors.COPY_BYTES_PER_S * 1e3 - 10.78) < 0.005
    assert abs(bf16_every_64["total"] / floors.COPY_BYTES_PER_S * 1e3 - 3.70) < 0.005


def test_bytes_term_by_term():
    lengths, H, d, C = [17, 1, 64], 3, HEAD_DIM, TILE_TOKENS
    tok, N = 82, 3
    b = configs.kernel_a_bytes(lengths, H, snapshot_dtype="bfloat16", snapshot_every=4)
    per_row = 3 * d * 2 + d * 4 + 4 + 2 * C * 2          # q, k, do + gc + beta + mqk, inv
    assert b["inputs"] == tok * H * per_row + N * H * d * d * 4
    # tiles 2, 1, 4 -> snapshots every 4 tiles: 1, 1, 1
    assert b["snapshots"] == 3 * H * d * d * 2
    assert b["dh0"] == N * H * d * d * 4
    assert b["total"] == b["inputs"] + b["snapshots"] + b["dh0"]
    nodht = configs.kernel_a_bytes(lengths, H, snapshot_dtype="float32", snapshot_every=1,
                                 with_dht=False)
    assert nodht["inputs"] == tok * H * per_row
    assert nodht["snapshots"] == (2 + 1 + 4) * H * d * d * 4


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.sampled_from([1, 2, 4]))
def test_n_snapshots_matches_reference_offsets(lengths, every):
    assert configs.n_snapshots(lengths, every) == int(ref.snapshot_offsets(lengths, 16, every)[-1])


# ------------------------------------------------------------ index math ----

@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=6))
def test_tile_table_covers_every_token_once(lengths):
    start, length = tile_table(lengths, TILE_TOKENS)
    cover = np.concatenate([np.arange(s, s + n) for s, n in zip(start, length)])
    assert np.array_equal(cover, np.arange(sum(lengths)))
    assert length.min() >= 1 and length.max() <= 16
    # tiles restart at every sequence start
    bos = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    assert set(bos) <= set(start)


def test_every_k_rows_against_reference_scan():
    # snapshots every 4 tiles must be the every-tile ones at rows every_k_rows(...)
    lengths = [1, 70, 16, 129, 33]
    x = ref.random_inputs(0, 0, 2, K=4, V=3, lengths=lengths, seed=1)
    gc, mqk, inv = ref.prepare_tiles(x["q"], x["k"], x["g"], x["beta"],
                                     cu_seqlens=x["cu_seqlens"])
    common = dict(dht=x["dht"], cu_seqlens=x["cu_seqlens"])
    s1, h1 = ref.dstate_scan_reference(x["q"], x["k"], gc, x["beta"], mqk, inv, x["do"],
                                       snapshot_every=1, **common)
    s4, h4 = ref.dstate_scan_reference(x["q"], x["k"], gc, x["beta"], mqk, inv, x["do"],
                                       snapshot_every=4, **common)
    rows = inputs.every_k_rows(lengths, 4)
    assert rows.shape[0] == s4.shape[1]
    np.testing.assert_array_equal(s1[0, rows], s4[0])
    np.testing.assert_array_equal(h1, h4)


def test_every_k_rows_equal_length():
    # 2 sequences of 100 tokens: 7 tiles each, 2 snapshots each (tiles 3 and 6)
    assert inputs.every_k_rows([100, 100], 4).tolist() == [3, 6, 10, 13]
    assert inputs.every_k_rows([5], 4).tolist() == [0]
    assert inputs.every_k_rows([40, 8], 1).tolist() == [0, 1, 2, 3]


# ----------------------------------------------------------------- table ----

def _result(**over):
    r = {"config": "4x8192",
         "kernel_a": {BF16_EVERY_64: {"median_ms": 0.5, "GBps": 3100.0, "vs_floor": 1.25},
                      FP32_EVERY_TILE: {"median_ms": 1.5, "GBps": 3500.0, "vs_floor": 1.1}},
         "fla": {"dAv+dhu": {"median_ms": 1.084}, "recompute_w_u": {"median_ms": 0.722}},
         "floor": {BF16_EVERY_64: {"ms": 0.4}, FP32_EVERY_TILE: {"ms": 1.36}},
         "ratio_a_fla": 0.5 / 1.084,
         "alternating": {report.ALTERNATING_A: {"median_ms": 0.49}, report.ALTERNATING_FLA: {"median_ms": 1.1}},
         "ratio_alternating": 0.49 / 1.1}
    r.update(over)
    return r


def test_table_row_values():
    row = report.table_row(_result())
    assert row == ["4x8192", "0.500", "1.500", "-", "1.084", "0.722", "0.46", "0.45", "-", "3100", "0.400", "1.25"]
    assert report.alternating_text(_result()) == "A 0.490 ms, FLA 1.100 ms, ratio 0.445"
    r = _result()
    r["kernel_a_from_fla"] = {"median_ms": 0.51}
    r["alternating"][report.ALTERNATING_FROM_FLA] = {"median_ms": 0.5}
    r["ratio_alternating_from_fla"] = 0.5 / 1.1
    row = report.table_row(r)
    assert row[3] == "0.510" and row[8] == "0.45"
    assert report.alternating_text(r).endswith("; A from FLA's tensors 0.500 ms, ratio 0.455")
    assert report.alternating_text({"alternating": {"error": "OutOfMemoryError: x"}}) == "failed (OutOfMemoryError: x)"
    assert report.alternating_text({}) == "-"


def test_table_row_missing_numbers_are_dashes():
    row = report.table_row({"config": "1x32768", "kernel_a": {}, "fla": {"dAv+dhu": {"median_ms": 1.674}},
                           "floor": {}})
    assert row[0] == "1x32768" and row[4] == "1.674"
    assert all(c == "-" for i, c in enumerate(row) if i not in (0, 4))
    # only fp32-every-tile ran: GB/s, floor, A/floor come from it
    r = _result()
    del r["kernel_a"][BF16_EVERY_64]
    row = report.table_row(r)
    assert row[1] == "-" and row[9:] == ["3500", "1.360", "1.10"]


def test_format_table_shape():
    rows = [report.table_row(_result()), report.table_row(_result(config="varlen64x262144"))]
    text = report.format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 4
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines[:1] + lines[2:])
    assert len({len(line) for line in lines}) == 1          # aligned columns
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(report.TABLE_COLUMNS)
    assert lines[1].count(":") == len(report.TABLE_COLUMNS) - 1   # numbers right-aligned
    with pytest.raises(ValueError):
        report.format_table([["too", "short"]])


def test_precision_row():
    r = _result(precision={"heads": 2, "sequences": 4,
                           "kernel_a": {BF16_EVERY_64: {"dh0": 1.7e-3, "snapshots": 2.3e-3}},
                           "kernel_a_unsplit": {BF16_EVERY_64: {"dh0": 1.6e-3, "snapshots": 2.2e-3}},
                           "fla": {"dh0": 1.75e-3, "dh": 2.34e-3},
                           "yardstick": {"bf16_of_exact_dh": 1.66e-3},
                           "builder_fp32_vs_f64": {"gc": 1e-8, "mqk": 2e-7, "inv": 3e-7}})
    row = report.precision_row(r)
    assert len(row) == len(report.PRECISION_COLUMNS)
    assert row[:4] == ["4x8192", "2 x 4", "1.70e-03", "2.30e-03"]
    assert row[4:6] == ["-", "-"] and row[6:8] == ["1.60e-03", "2.20e-03"]
    assert row[8:] == ["1.75e-03", "2.34e-03", "1.66e-03", "3.0e-07"]


def test_main_without_torch_says_so(capsys):
    # where torch is missing (this CPU machine) main reports it instead of crashing
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    assert cli.main(["--quick"]) == 2   # a run that cannot start here, as every GPU tool of ptx-lab
    assert "torch is not installed" in capsys.readouterr().out


def test_fla_autotune_is_reset_between_configurations():
    # FLA's autotune keys leave out B and T; the bench makes each configuration tune afresh.
    autotuner = pytest.importorskip("triton.runtime.autotuner")
    from kernel.tools import fla_adapter

    tuner = autotuner.Autotuner.__new__(autotuner.Autotuner)   # no kernel: only its choice cache
    tuner.cache = {(32, 128, 128, 64): "BV=64"}
    assert fla_adapter.reset_autotune() >= 1
    assert tuner.cache == {}
    assert fla_adapter.reset_autotune() == 0      # nothing left to forget


def test_fla_is_imported_to_tune_for_each_process(monkeypatch):
    # Triton's disk cache of autotune choices is keyed without B and T: with it on, the first
    # shape tuned on a machine would fix FLA's block sizes for every later configuration
    from kernel.tools import fla_adapter

    monkeypatch.delenv(fla_adapter.AUTOTUNE_DISK_CACHE_ENV, raising=False)
    monkeypatch.delenv(fla_adapter.DISPATCH_ENV, raising=False)
    fla_adapter.set_import_env()
    assert os.environ[fla_adapter.AUTOTUNE_DISK_CACHE_ENV] == "0"
    assert os.environ[fla_adapter.DISPATCH_ENV] == "1"
    monkeypatch.setenv(fla_adapter.AUTOTUNE_DISK_CACHE_ENV, "1")   # a user's explicit choice stays
    fla_adapter.set_import_env()
    assert os.environ[fla_adapter.AUTOTUNE_DISK_CACHE_ENV] == "1"


def test_a_dead_weak_proxy_among_the_live_objects_is_passed_over():
    # torch.compile leaves weakref.proxy objects whose referent is gone; isinstance() on one raises
    pytest.importorskip("triton.runtime.autotuner")
    import weakref

    from kernel.tools import fla_adapter

    class Thing:
        pass

    thing = Thing()
    holder = [weakref.proxy(thing)]   # kept alive in a list, so that gc.get_objects() reaches the proxy
    del thing
    with pytest.raises(ReferenceError):
        isinstance(holder[0], int)
    assert isinstance(fla_adapter.autotune_choices(), dict)
    assert isinstance(fla_adapter.reset_autotune(), int)


def test_fla_autotune_choices_are_recorded():
    autotuner = pytest.importorskip("triton.runtime.autotuner")
    from kernel.tools import fla_adapter

    def chunk_dhu_kernel():
        pass

    tuner = autotuner.Autotuner.__new__(autotuner.Autotuner)
    tuner.fn = chunk_dhu_kernel
    tuner.cache = {(32, 128, 128, 64): "BV: 32, num_warps: 4"}
    assert fla_adapter.autotune_choices()["chunk_dhu_kernel"] == {"(32, 128, 128, 64)": "BV: 32, num_warps: 4"}
    tuner.cache.clear()


def test_from_json_reports_earlier_runs_without_a_gpu(tmp_path, capsys):
    # configs timed in separate processes (one JSON each) become one table, plot and JSON
    for name, ms in (("4x8192", 0.5), ("32x8192", 4.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"environment": {"device": "H200"}, "args": {"configs": name},
             "results": [_result(config=name, kernel_a={BF16_EVERY_64: {"median_ms": ms, "GBps": 1.0, "vs_floor": 1.2}})]}))
    merged = tmp_path / "all.json"
    code = cli.main(["--from-json", str(tmp_path / "4x8192.json"), str(tmp_path / "32x8192.json"),
                     "--json", str(merged)])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 config(s) from 2 file(s)" in out
    assert "| 4x8192 " in out and "| 32x8192 " in out
    data = json.loads(merged.read_text())
    assert [r["config"] for r in data["results"]] == ["4x8192", "32x8192"]
    assert [r["file"] for r in data["runs"]] == ["4x8192.json", "32x8192.json"]   # names, not paths
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["--from-json", str(tmp_path / "bad.json")]) == 1
    assert "not a bench --json file" in capsys.readouterr().out


def test_from_json_without_matplotlib_says_how_to_plot(tmp_path, capsys, monkeypatch):
    import sys

    (tmp_path / "a.json").write_text(json.dumps(
        {"environment": {}, "args": {}, "results": [_result(config="4x8192", kernel_a={BF16_EVERY_64: {"median_ms": 0.5}})]}))
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib now fails
    assert cli.main(["--from-json", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert "| 4x8192 " in out and "plot failed" in out and "pip install -e '.[plot]'" in out
    assert not (tmp_path / "a.png").exists()


# ------------------------------------------------------- the snapshot modes' names ----

def test_snapshot_modes_are_named_by_what_they_store():
    assert configs.MODES == {"bf16-every-64": ("bfloat16", 4), "fp32-every-tile": ("float32", 1)}
    assert cli.parse_args(["--snapshot", "bf16-every-64"]).modes == [BF16_EVERY_64]
    assert report.TABLE_COLUMNS[1:3] == ("A bf16-every-64 ms", "A fp32-every-tile ms")
    assert report.PRECISION_COLUMNS[2:6] == ("A bf16-every-64 dh0", "A bf16-every-64 snaps",
                                             "A fp32-every-tile dh0", "A fp32-every-tile snaps")


@pytest.mark.parametrize("old, new", [("fla", "bf16-every-64"), ("seed", "fp32-every-tile")])
def test_an_old_snapshot_name_is_refused_naming_the_new_one(old, new, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--snapshot", old])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --snapshot: '{old}' is now '{new}'" in err
    assert "'both', 'bf16-every-64', 'fp32-every-tile'" in err


def test_the_help_names_the_command_typed(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"], prog="ptx-lab bench")
    assert capsys.readouterr().out.startswith("usage: ptx-lab bench ")


def test_an_old_result_reads_with_the_new_names():
    old = {"config": "4x8192", "kernel_a": {"fla": {"median_ms": 0.5}, "seed": {"median_ms": 1.5}},
           "floor": {"fla": {"ms": 0.4}}, "bytes": {"seed": {"total": 7}},
           "precision": {"heads": 2, "kernel_a": {"fla": {"dh0": 1e-3}}},
           "alternating": {"kernel_a_fla": {"median_ms": 0.49}, "fla_dAv+dhu": {"median_ms": 1.1}},
           "fla": {"dAv+dhu": {"median_ms": 1.0}}}
    new = report.upgrade_result(old)
    assert new["kernel_a"] == {BF16_EVERY_64: {"median_ms": 0.5}, FP32_EVERY_TILE: {"median_ms": 1.5}}
    assert new["floor"] == {BF16_EVERY_64: {"ms": 0.4}} and new["bytes"] == {FP32_EVERY_TILE: {"total": 7}}
    assert new["precision"] == {"heads": 2, "kernel_a": {BF16_EVERY_64: {"dh0": 1e-3}}}
    assert set(new["alternating"]) == {report.ALTERNATING_A, report.ALTERNATING_FLA}
    assert new["fla"] == old["fla"]                       # FLA's own results keep their keys
    assert old["kernel_a"] == {"fla": {"median_ms": 0.5}, "seed": {"median_ms": 1.5}}   # not changed in place
    assert report.upgrade_result(new) == new


def test_the_committed_runs_json_files_still_make_their_tables(capsys):
    # docs/bench holds Kernel A's runs' --json files (kernel_a_*), the earlier ones written with the
    # old mode names; the whole backward's (whole_backward_*) and the training study's are others
    runs = sorted((REPO / "docs" / "bench").glob("kernel_a_*.json"))
    assert runs, "docs/bench has no Kernel A JSON files"
    for path in runs:
        rows = [r for r in json.loads(path.read_text())["results"] if "error" not in r]
        assert cli.main(["--from-json", str(path)]) == 0, path
        out = capsys.readouterr().out
        assert "| config " in out and "A bf16-every-64 ms" in out
        for r in rows:
            a = (r["kernel_a"].get("fla") or r["kernel_a"].get("bf16-every-64") or {}).get("median_ms")
            cells = [c.strip() for c in next(line for line in out.splitlines()
                                             if line.startswith(f"| {r['config']} ")).strip("|").split("|")]
            assert cells[1] == ("-" if a is None else f"{a:.3f}"), (path.name, r["config"], cells)


def test_the_committed_backward_runs_still_make_their_table(capsys):
    runs = sorted((REPO / "docs" / "bench").glob("whole_backward_*.json"))
    assert runs, "docs/bench has no whole-backward JSON files"
    for path in runs:
        rows = [r for r in json.loads(path.read_text())["results"] if "error" not in r]
        assert cli.main(["--backward", "--from-json", str(path)]) == 0, path
        out = capsys.readouterr().out
        for r in rows:
            line = next(line for line in out.splitlines() if line.startswith(f"| {r['config']} "))
            assert f"{r['backward']['ours']['median_ms']:.3f}" in line, (path.name, r["config"], line)


def test_a_failing_configuration_is_recorded_and_the_run_goes_on(capsys):
    from types import SimpleNamespace

    from kernel.tools.bench.timing import run_configs

    configs = [SimpleNamespace(name="4x8192"), SimpleNamespace(name="1x131072"), SimpleNamespace(name="2x64")]

    def bench_one(cfg):
        if cfg.name == "1x131072":
            raise MemoryError("out of memory")
        return {"config": cfg.name, "ms": 1.0}

    seen = []
    results = run_configs(configs, bench_one, lambda i, tag, res: seen.append((i, tag)), failed={"bench": "backward"},
                          after=lambda cfg, res, tag: res.update(after=tag))
    assert [r["config"] for r in results] == ["4x8192", "1x131072", "2x64"]
    assert results[1]["error"] == "MemoryError: out of memory" and results[1]["bench"] == "backward"
    assert "after" not in results[1] and results[2]["after"] == "[3/3] 2x64"
    assert all(r["wall_s"] >= 0 for r in results)
    assert seen == [(0, "[1/3] 4x8192"), (2, "[3/3] 2x64")]
    assert "[2/3] 1x131072: FAILED MemoryError: out of memory" in capsys.readouterr().out


def test_a_modes_outputs_write_the_json_and_log_a_plot_that_fails(tmp_path, capsys):
    # report.write_outputs serves --forward and --backward: the plot of the results that ran, whose
    # failure is logged (the JSON and the table hold the numbers), and none when nothing ran
    drawn = []

    def draw(results, path):
        drawn.append([r["config"] for r in results])
        raise RuntimeError("no display")

    results = [{"config": "4x8192"}, {"config": "1x131072", "error": "its process exited with -9"}]
    path = tmp_path / "out.json"
    report.write_outputs(results, [{"file": "a.json"}], str(tmp_path / "out.png"), str(path), draw,
                         environment={"device": "x"}, args={"reps": 3})
    out = capsys.readouterr().out
    assert drawn == [["4x8192"]] and "plot failed: RuntimeError: no display" in out
    assert json.loads(path.read_text()) == {"environment": {"device": "x"}, "args": {"reps": 3},
                                            "runs": [{"file": "a.json"}], "results": results}
    report.write_outputs(results[1:], [], str(tmp_path / "none.png"), None, draw)
    assert drawn == [["4x8192"]] and not (tmp_path / "none.png").exists()


@pytest.mark.parametrize("host_ms, gpu_ms, warned", [
    (296.0, 54.2, True),    # the varlen step's host sync (log 52)
    (4.3, 52.8, False),     # a long call: the queue ahead grows, the GPU never waits
    (0.7, 0.55, False),     # a short call the 2 ms sleep ahead covers
    (4.0, 0.5, True),       # a host slower than the GPU
])
def test_a_host_gap_is_named_only_where_the_gpu_can_have_waited(host_ms, gpu_ms, warned):
    from kernel.tools.bench.timing import host_gap_warning

    warning = host_gap_warning("side", host_ms, gpu_ms)
    assert (warning is not None) == warned
    if warned:
        assert f"{host_ms:.2f} ms of host time a call, more than its {gpu_ms:.2f} ms on the GPU" in warning


def test_a_host_gap_is_judged_against_the_work_queued_ahead_now(monkeypatch):
    """A study that queues more GPU work ahead of each call (sequence_split.op's --ahead-ms) moves the line."""
    from kernel.tools.bench import timing

    assert timing.host_gap_warning("side", 10.0, 1.0) is not None
    monkeypatch.setattr(timing, "HOST_AHEAD_CYCLES", int(20 * timing.SLEEP_CYCLES_PER_MS))
    assert timing.host_gap_warning("side", 10.0, 1.0) is None
    assert "the 20 ms queued ahead of it" in timing.host_gap_warning("side", 30.0, 1.0)
