"""ptx_lab.ncu: parsing ncu's CSV pages and retrying without metrics it does not know (CPU)."""
from __future__ import annotations

import subprocess
import time

from ptx_lab import ncu

from .test_processes import gone

DETAILS = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","h","bank_ld_u16","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed_op_shared_ld.sum","inst","1,152"
"0","123","python3","h","bank_ld_u16","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum","","n/a"
"1","123","python3","h","bank_ld_b32","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed_op_shared_ld.sum","inst","7"
'''

RAW = '''"ID","Process ID","Process Name","Host Name","Kernel Name","smsp__inst_executed_op_ldsm.sum","l1tex__x.sum"
"","","","","","inst",""
"0","9","python3","h","bank_ldsm_x4","2,048","n/a"
'''


def test_parse_details_page():
    launches = ncu.parse_csv("app output\n" + DETAILS)
    assert [(l.id, l.kernel) for l in launches] == [(0, "bank_ld_u16"), (1, "bank_ld_b32")]
    assert launches[0].metrics == {"smsp__inst_executed_op_shared_ld.sum": 1152.0,
                                   "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": None}


def test_parse_raw_page():
    (launch,) = ncu.parse_csv(RAW)
    assert launch.metrics == {"smsp__inst_executed_op_ldsm.sum": 2048.0, "l1tex__x.sum": None}


def test_parse_nothing():
    assert ncu.parse_csv("==ERROR== the user does not have permission\n") == []


def test_profile_drops_unknown_metrics_and_retries(monkeypatch):
    calls = []

    def fake_run(args, **kwargs):   # ncu.run_tree's contract: subprocess.run's result
        calls.append(args)
        metrics = args[args.index("--metrics") + 1].split(",")
        if "bogus.sum" in metrics:
            return subprocess.CompletedProcess(args, 1, "", "==ERROR== Failed to find metric bogus.sum\n")
        return subprocess.CompletedProcess(args, 0, DETAILS, "")

    monkeypatch.setattr(ncu, "ncu_path", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "run_tree", fake_run)
    prof = ncu.profile(["python3", "-m", "x"], ["bogus.sum", "smsp__inst_executed_op_shared_ld.sum"], "^bank_")
    assert prof.error is None and prof.dropped == ["bogus.sum"] and len(calls) == 2
    assert calls[-1][:6] == ["/usr/bin/ncu", "--clock-control", "none", "--target-processes", "all", "--csv"]
    assert "regex:^bank_" in calls[-1]


def test_profile_reports_an_ncu_failure(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_path", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "run_tree", lambda args, **k: subprocess.CompletedProcess(
        args, 1, "", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"))
    prof = ncu.profile(["true"], ["a.sum"])
    assert prof.launches == [] and "ERR_NVGPUCTRPERM" in prof.error


def test_a_profile_past_its_timeout_kills_what_ncu_started(tmp_path, monkeypatch):
    # a stand-in for ncu that starts a child of its own (as ncu starts the program it profiles) and hangs:
    # past the timeout both must be gone, or the child would hold the GPU for the tests after it
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "ncu"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nsleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "ncu_path", lambda: str(fake))
    start = time.monotonic()
    prof = ncu.profile(["true"], ["a.sum"], timeout=1.0)
    assert time.monotonic() - start < 30
    assert prof.launches == [] and prof.error.startswith("ncu ran past 1 s")
    child = int(pid_file.read_text())
    assert gone(child), f"the profiled program (pid {child}) outlived ncu's timeout"

