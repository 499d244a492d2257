"""kernel.tools.racecheck: its report parsing, its runs (the probes of racecheck_probes.cu and a workload
for every kernel of kernel.registry), its command lines and its probes' compile on the CPU; the probes'
answers on the GPU."""
import dataclasses
import re
import shutil
import subprocess
import sys
import types

import pytest

from kernel import registry
from kernel.shapes import CHUNK_TOKENS, TILE_TOKENS
from kernel.tools import racecheck
from .blocked_imports import run_blocked

CUDA_SOURCE = racecheck.PROBES_CU.read_text()


# ----------------------------------------------------------------- the report

@pytest.mark.parametrize("line, want", [
    ("========= RACECHECK SUMMARY: 200 hazards displayed (900 errors, 0 warnings)", ("200", "900", "0")),
    ("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)", ("1", "1", "0")),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 2 warnings)", ("0", "0", "2")),
])
def test_racecheck_summary_line_is_parsed(line, want):
    m = racecheck.SUMMARY.search("noise\n" + line + "\nmore noise")
    assert m is not None and m.groups() == want


# compute-sanitizer's racecheck report, as it prints hazards: one from a -lineinfo build of an NVRTC entry
# file (a WAR between consumer warp 0's read and producer warp 1's cp.async), one from a build without
# line information (function+offset only), and a RAW of the first shape's pair reversed
HAZARD_LOG = """========= COMPUTE-SANITIZER
========= Error: Potential WAR hazard detected at __shared__ 0x6800 in block (4,0,0) :
=========     Read Thread (0,0,0) at fs::bf16_to_f32(unsigned short)+0x1b30 in 0123456789abcdef0123456789abcdef01234567.cubin.cu:120
=========     Write Thread (32,0,0) at ptx_lab::cp_async_cg16_zfill(unsigned int, const void *, unsigned int)+0x4c10 in cp_async.cuh:37
=========     Current Value : 245, Incoming Value : 27
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: forward_states in forward_states.py:333
========= 
========= Error: Potential WAR hazard detected at __shared__ 0x6801 in block (18,0,0) :
=========     Read Thread (5,0,0) at fs::bf16_to_f32(unsigned short)+0x1b30 in 0123456789abcdef0123456789abcdef01234567.cubin.cu:120
=========     Write Thread (64,0,0) at ptx_lab::cp_async_cg16_zfill(unsigned int, const void *, unsigned int)+0x4c10 in cp_async.cuh:37
=========     Current Value : 191, Incoming Value : 63
========= 
========= Error: Potential WAR hazard detected at __shared__ 0x500 in block (0,0,0) :
=========     Read Thread (112,0,0) at kernel_a_ring_1c+0x240
=========     Write Thread (160,0,0) at kernel_a_ring_1c+0xd80
=========     Current Value : 0, Incoming Value : 0
========= 
========= Error: Potential RAW hazard detected at __shared__ 0x10 in block (0,0,0) :
=========     Write Thread (32,0,0) at ptx_lab::cp_async_cg16_zfill(unsigned int, const void *, unsigned int)+0x4c10 in cp_async.cuh:37
=========     Read Thread (0,0,0) at fs::bf16_to_f32(unsigned short)+0x1b30 in 0123456789abcdef0123456789abcdef01234567.cubin.cu:120
=========     Current Value : 1, Incoming Value : 2
========= 
========= RACECHECK SUMMARY: 4 hazards displayed (4 errors, 0 warnings)
"""


def test_racecheck_groups_the_displayed_hazards_by_shape():
    shapes = racecheck.hazard_shapes(HAZARD_LOG)
    war = "WAR: Read fs::bf16_to_f32 entry .cu:119 -> Write ptx_lab::cp_async_cg16_zfill cp_async.cuh:37"
    assert shapes[0] == (war, 2, "warps 0 -> 1,2")
    assert ("WAR: Read kernel_a_ring_1c -> Write kernel_a_ring_1c", 1, "warps 3 -> 5") in shapes
    assert ("RAW: Write ptx_lab::cp_async_cg16_zfill cp_async.cuh:37 -> Read fs::bf16_to_f32 entry .cu:119", 1,
            "warps 1 -> 0") in shapes
    assert len(shapes) == 3
    assert racecheck.hazard_shapes("========= ERROR SUMMARY: 0 errors\n") == []


def _fake_sanitizer(monkeypatch, calls=None):
    """compute-sanitizer 'on PATH', each run's child answering HAZARD_LOG for forward-states, no hazard else."""
    def run(cmd, **kw):
        if calls is not None:
            calls.append(cmd)
        return types.SimpleNamespace(stdout=HAZARD_LOG if "forward-states" in cmd else
                                     "========= ERROR SUMMARY: 0 errors\n", stderr="", returncode=0)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    monkeypatch.setattr(racecheck, "run_tree", run)


def test_racecheck_prints_each_runs_table_row_and_hazard_shapes(monkeypatch, tmp_path, capsys):
    calls = []
    _fake_sanitizer(monkeypatch, calls)
    assert racecheck.main(["--runs", "kernel-b", "forward-states", "no-empty", "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:4] for line in out.splitlines() if line.startswith(("kernel-b ", "forward-states ",
                                                                              "no-empty "))] == \
        [["kernel-b", "?", "0", "0"], ["forward-states", "?", "4", "4"], ["no-empty", "a", "real", "race"]]
    assert "forward-states: the displayed hazards by shape" in out and "kernel-b: the displayed" not in out
    assert "     2  WAR: Read fs::bf16_to_f32 entry .cu:119 -> Write ptx_lab::cp_async_cg16_zfill" in out
    assert (tmp_path / "racecheck-forward-states.log").read_text() == HAZARD_LOG
    assert [cmd[-1] for cmd in calls] == ["kernel-b", "forward-states", "no-empty"]


def test_racecheck_without_the_sanitizer_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert racecheck.main(["--logs", str(tmp_path)]) == 2
    assert "compute-sanitizer is not on PATH" in capsys.readouterr().err


# ----------------------------------------------------------------- the runs and their commands

def test_every_registry_kernel_has_a_workload_and_every_workload_names_one():
    functions = [k.function for k in registry.KERNELS]
    missing = [k.function for k in racecheck.without_workload()]
    assert missing == [], f"give {missing} a workload in kernel.tools.racecheck.WORKLOADS"
    assert set(racecheck.WORKLOADS) <= set(functions), "a workload names no kernel of kernel.registry.KERNELS"
    assert [k.function for k, _ in racecheck.kernel_runs()] == functions   # the registry's order


# the registry's kernels' runs, in its order
KERNEL_RUNS = ("kernel-a", "forward-states", "kernel-b", "forward", "forward-products", "forward-chain",
               "forward-output", "row-rstd")


def test_a_registry_kernel_without_a_workload_is_reported_and_fails_the_run(monkeypatch, tmp_path, capsys):
    new = dataclasses.replace(registry.KERNELS[0], title="Kernel N (a new one)", function="kda_new")
    monkeypatch.setattr(racecheck, "KERNELS", (*registry.KERNELS, new))
    assert racecheck.without_workload() == [new]
    assert racecheck.runs()[-len(KERNEL_RUNS):] == KERNEL_RUNS   # nothing to run for it
    _fake_sanitizer(monkeypatch)
    assert racecheck.main(["--runs", "kernel-b", "--logs", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("no workload for Kernel N (a new one) (kda_new)") == 2   # before the runs and after the table


def test_the_runs_are_the_probes_then_the_kernels_each_named_once():
    names = racecheck.runs()
    assert len(set(names)) == len(names)
    assert names == tuple(p.name for p in racecheck.PROBES) + KERNEL_RUNS
    assert {racecheck.expected(n) for n in names} == {"race-free", "a real race", "?"}
    assert [n for n in names if racecheck.expected(n) == "a real race"] == ["mbarrier-ring-early-release", "no-empty"]
    assert tuple(n for n in names if racecheck.expected(n) == "?") == KERNEL_RUNS


@pytest.mark.parametrize("run, kernel", [("kernel-a", None), ("forward-states", "kda_forward_states"),
                                         ("kernel-b", "kda_token_gradients"), ("ring-arrive", None)])
def test_the_sanitizer_command_checks_the_named_kernel_only_where_its_run_launches_others(run, kernel):
    cmd = racecheck.sanitizer_command("/opt/cs", run)
    assert cmd[:7] == ["/opt/cs", "--tool", "racecheck", "--racecheck-report", "all", "--print-limit", "200"]
    assert cmd[-5:] == [sys.executable, "-m", "kernel.tools.racecheck", "--child", run]
    assert cmd[7:-5] == ([] if kernel is None else ["--kernel-name", f"kns={kernel}"])


# ----------------------------------------------------------------- memcheck over the same workloads

# one run a distinct workload: the three passes' runs launch the same three kernels, so memcheck runs them once
MEMCHECK_RUNS = ("kernel-a", "forward-states", "kernel-b", "forward", "forward-products", "row-rstd")


def test_memcheck_runs_each_workload_once_and_so_every_registry_kernel():
    assert racecheck.memcheck_runs() == MEMCHECK_RUNS
    checked = [f for run in MEMCHECK_RUNS for f in racecheck.checked_by(run)]
    assert sorted(checked) == sorted(k.function for k in registry.KERNELS)
    assert racecheck.checked_by("forward-products") == ["kda_forward_products", "kda_forward_chain",
                                                        "kda_forward_output"]


def test_the_memcheck_command_checks_every_kernel_its_child_launches():
    assert racecheck.sanitizer_command("/opt/cs", "kernel-b", "memcheck") == [
        "/opt/cs", "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "1",
        sys.executable, "-m", "kernel.tools.racecheck", "--child", "kernel-b"]


def _fake_memcheck(monkeypatch, calls, answer):
    def run(cmd, **kw):
        calls.append(cmd)
        return answer(cmd[-1])

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    monkeypatch.setattr(racecheck, "run_tree", run)


def test_memcheck_prints_a_row_a_run_and_fails_on_an_error(monkeypatch, tmp_path, capsys):
    calls = []
    error = "========= Invalid __global__ read of size 4 bytes\n========= ERROR SUMMARY: 1 error\n"
    _fake_memcheck(monkeypatch, calls, lambda run: types.SimpleNamespace(
        stdout=error if run == "forward" else "========= ERROR SUMMARY: 0 errors\n", stderr="",
        returncode=1 if run == "forward" else 0))
    assert racecheck.main(["--tool", "memcheck", "--logs", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert [cmd[-1] for cmd in calls] == list(MEMCHECK_RUNS)
    assert all(cmd[1:3] == ["--tool", "memcheck"] for cmd in calls)
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.split()[:1] == ["forward"]
            or line.startswith("forward-products ")}
    assert rows == {"forward": ["1", "1"], "forward-products": ["0", "0"]}
    assert "kda_forward_products, kda_forward_chain, kda_forward_output" in out
    assert (tmp_path / "memcheck-forward.log").read_text() == error


def test_memcheck_clean_on_the_runs_asked_for(monkeypatch, tmp_path, capsys):
    calls = []
    _fake_memcheck(monkeypatch, calls, lambda run: types.SimpleNamespace(
        stdout="========= ERROR SUMMARY: 0 errors\n", stderr="", returncode=0))
    assert racecheck.main(["--tool", "memcheck", "--runs", "row-rstd", "kernel-b", "--logs", str(tmp_path)]) == 0
    assert [cmd[-1] for cmd in calls] == ["row-rstd", "kernel-b"]


def test_memcheck_a_timeout_is_a_failure(monkeypatch, tmp_path, capsys):
    def timeout(run):
        raise subprocess.TimeoutExpired(cmd=run, timeout=240, output="partial\n")

    _fake_memcheck(monkeypatch, [], timeout)
    assert racecheck.main(["--tool", "memcheck", "--runs", "row-rstd", "--logs", str(tmp_path)]) == 1
    assert "timed out after 240 s" in (tmp_path / "memcheck-row-rstd.log").read_text()


def test_memcheck_refuses_the_probes(capsys):
    with pytest.raises(SystemExit) as exc:
        racecheck.main(["--tool", "memcheck", "--runs", "ring-arrive", "kernel-b"])
    assert exc.value.code == 2
    assert "not the probes: ring-arrive" in capsys.readouterr().err


def test_the_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        racecheck.main(["--runs", "ring-arive"])
    assert exc.value.code == 2
    assert "invalid choice: 'ring-arive'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        racecheck.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "compute-sanitizer racecheck on every kernel of kernel.registry" in out
    assert all(name in out for name in racecheck.runs())


def test_the_help_needs_no_gpu_library():
    proc = run_blocked("import sys, runpy\nsys.argv = ['racecheck', '--help']\n"
                       "runpy.run_module('kernel.tools.racecheck', run_name='__main__')")
    assert proc.returncode == 0, proc.stderr
    assert "--runs RUN [RUN ...]" in proc.stdout


def test_the_kernel_workloads_cases_turn_the_rings_over():
    """Kernel A's longest sequence walks at least twice as many tiles as any build's ring has stages, so
    every stage is refilled after an EMPTY hand-off at least once (a case of at most nstage tiles has
    none); the other kernels' longest spans several 64-token chunks."""
    from kernel.ds_scan import config

    deepest = max(cfg.nstage for cfg in config.all_variants())
    tiles = max(-(-n // TILE_TOKENS) for n in racecheck.KERNEL_A_LENGTHS)
    assert tiles >= 2 * deepest, (tiles, deepest)
    assert max(racecheck.BACKWARD_LENGTHS) >= 4 * CHUNK_TOKENS


# ----------------------------------------------------------------- the probes

GLOBAL_FUNCTIONS = re.compile(r'extern "C" __global__ void (\w+)\(float\* out\) \{')


def test_every_probe_is_a_kernel_of_the_cu_file_and_every_kernel_there_a_probe():
    functions = [p.function for p in racecheck.PROBES]
    assert len(set(functions)) == len(functions)
    kernels = [line for line in CUDA_SOURCE.splitlines() if "__global__" in line and not line.startswith("//")]
    assert sorted(GLOBAL_FUNCTIONS.match(line).group(1) for line in kernels) == sorted(functions)


def test_the_probes_hand_off_through_ptx_labs_ring():
    # the ring's barrier ids come from ring.cuh: no probe numbers FULL or EMPTY itself
    assert '#include "ring.cuh"' in CUDA_SOURCE
    assert "asm" not in CUDA_SOURCE
    for ring in ("Ring", "Ring2", "KaRing"):
        assert f"{ring}::publish(" in CUDA_SOURCE and f"{ring}::wait_full(" in CUDA_SOURCE
        assert f"{ring}::release(" in CUDA_SOURCE and f"{ring}::wait_to_refill(" in CUDA_SOURCE


def test_the_lane_0_answers():
    # what lane 0 adds up over the small rings' 8 tiles (word w of tile i holds i * 32 + w % 32)
    assert racecheck.ONE_WORD == sum(i * 32 + 31 for i in range(8)) == 1144
    assert racecheck.TWO_WORDS == sum(i * 32 + i * 32 for i in range(8)) == 1792
    copied = [p.name for p in racecheck.PROBES if p.source is not None]
    assert copied == ["ring-cp-async", "ring2-cp-async-ldmatrix", "ring2-consumer-bar"] + \
        [p.name for p in racecheck.PROBES if p.name.startswith(("kernel-a-ring", "mbarrier-ring"))]
    assert {p.threads for p in racecheck.PROBES if p.name.startswith("ring2")} == {96}


def _nvcc(tmp_path, *args: str) -> subprocess.CompletedProcess:
    from ptx_lab import CUDA_INCLUDE_DIR

    return subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}",
                           *args, str(racecheck.PROBES_CU)], capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_probes_compile_for_sm_90a_without_spills(tmp_path):
    proc = _nvcc(tmp_path, "-cubin", "-Xptxas", "-v", "-o", "probes.cubin")
    assert proc.returncode == 0, proc.stderr
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", proc.stderr)
    assert sorted(entries) == sorted(p.function for p in racecheck.PROBES)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert len(spills) == len(entries) and set(spills) == {("0", "0")}, proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_each_source_array_has_the_shape_the_tool_fills(tmp_path):
    proc = _nvcc(tmp_path, "-ptx", "-o", "probes.ptx")
    assert proc.returncode == 0, proc.stderr
    ptx = (tmp_path / "probes.ptx").read_text()
    for src in {p.source for p in racecheck.PROBES if p.source is not None}:
        assert f".global .align 4 .b8 {src.array}[{4 * src.tiles * src.words}];" in ptx, src


@pytest.mark.gpu
@pytest.mark.parametrize("probe", [p for p in racecheck.PROBES if p.expected == "race-free"], ids=lambda p: p.name)
def test_each_race_free_probe_gives_its_answer(probe, capsys):
    assert racecheck.main(["--child", probe.name]) == 0
    out = capsys.readouterr().out
    if probe.lane0 is None:   # the .trans read (and the MMA's) of words as bf16 halves: no exact value
        assert re.fullmatch(rf"{probe.name}: lane 0 sum \S+ \(finite: (True|False)\)\n", out), out
    else:
        assert out == f"{probe.name}: lane 0 sum {probe.lane0} (race-free value {probe.lane0})\n"


def test_a_run_past_its_limit_is_a_timeout_row_with_its_partial_log(monkeypatch, tmp_path, capsys):
    def run(cmd, **kw):   # racecheck.run_tree past its limit: the group killed, what it wrote kept
        if "kernel-b" in cmd:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], output="========= partial\n", stderr="")
        return types.SimpleNamespace(stdout="========= ERROR SUMMARY: 0 errors\n", stderr="", returncode=0)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    monkeypatch.setattr(racecheck, "run_tree", run)
    racecheck.main(["--runs", "kernel-b", "no-empty", "--logs", str(tmp_path)])
    out = capsys.readouterr().out
    assert "timed out after 240 s" in out and re.search(r"^kernel-b\s+\S+\s+timeout", out, re.M)
    assert (tmp_path / "racecheck-kernel-b.log").read_text() == "========= partial\n\ntimed out after 240 s\n"
