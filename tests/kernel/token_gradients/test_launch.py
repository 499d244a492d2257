"""kernel.token_gradients.launch on the CPU: Kernel B's batch tables (first tile, first chunk and
sequence of every chunk, first chunk of every run), the choice of the chunks a run, and the launch's grid and
arguments against the kernel's parameters."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.token_gradients import KERNEL_NAME, SOURCE_PATH, launch, tables

from ..kernel_signature import launched


def test_tables_name_every_chunk_s_sequence_and_first_tile():
    cu = np.array([0, 1, 65, 130, 330], dtype=np.int64)
    t = tables(cu)
    assert t["tile_offs"].tolist() == [0, 1, 5, 10, 23]      # ceil(n / 16) tiles a sequence
    assert t["chunk_offs"].tolist() == [0, 1, 2, 4, 8]       # ceil(n / 64) chunks a sequence
    assert t["chunk_seq"].tolist() == [0, 1, 2, 2, 3, 3, 3, 3]
    assert (t["tiles"], t["chunks"]) == (23, 8)
    # a chunk's first tile is its sequence's first tile + 4 (chunk - first chunk)
    for c, n in enumerate(t["chunk_seq"]):
        assert t["tile_offs"][n] + 4 * (c - t["chunk_offs"][n]) < t["tile_offs"][n + 1]


def test_runs_start_every_run_chunks_chunks_within_each_sequence():
    cu = np.array([0, 1, 65, 130, 330, 700], dtype=np.int64)   # 1, 1, 2, 4 and 6 chunks
    assert tables(cu)["run_chunk0"].tolist() == list(range(14))   # one chunk a run: every chunk
    t = tables(cu, 4)
    assert t["run_chunk0"].tolist() == [0, 1, 2, 4, 8, 12]      # a sequence's last run has what is left
    assert t["runs"] == 6 and t["chunks"] == 14
    assert (tables(cu, 2)["run_chunk0"].tolist(), tables(cu, 8)["runs"]) == ([0, 1, 2, 4, 6, 8, 10, 12], 5)


def test_the_auto_run_length_minimises_waves_times_the_chunks_a_cta_walks():
    """waves = ceil(runs x HV / SMs), each of (chunks a run + RUN_START_CHUNKS) chunks' time, by hand."""
    start = launch.RUN_START_CHUNKS
    cu = np.arange(5, dtype=np.int64) * 8192      # 4 sequences of 128 chunks
    # 32 heads, 132 SMs: 16384 / 8192 / 4096 / 2048 CTAs -> 125 / 63 / 32 / 16 waves
    costs = {1: 125 * (1 + start), 2: 63 * (2 + start), 4: 32 * (4 + start), 8: 16 * (8 + start)}
    best = min(costs, key=lambda c: (costs[c], c))
    assert launch.run_plan(cu, 32, sms=132) == launch.RunPlan(best, 512 // best)
    # a small problem keeps one chunk a run: 32 CTAs fill one wave already
    small = np.array([0, 1024], dtype=np.int64)
    assert launch.run_plan(small, 2, sms=132) == launch.RunPlan(1, 16)
    assert launch.run_plan(cu, 32, 2) == launch.RunPlan(2, 256)    # given: no device asked
    for bad in (3, 0, True, "4"):
        with pytest.raises(ValueError, match="run_chunks must be 'auto' or one of"):
            launch.run_plan(cu, 32, bad)


def _device_tables(b: bytes, run_chunks: int):
    t = tables(np.frombuffer(b, np.int64), run_chunks)
    return "cu", "tile", "chunk", "seq", "run", t["runs"]


def _stand_in_kernel(monkeypatch, smem: int = 1) -> tuple[list, list]:
    """The kernel and the device tables stood in for: (the builds asked for, each launch's arguments)."""
    builds, calls = [], []

    def kernel(build):
        builds.append(build)
        return (lambda *call, **kw: calls.append(call)), smem, 256

    monkeypatch.setattr(launch, "kernel", kernel)
    monkeypatch.setattr(launch, "_device_tables", _device_tables)
    return builds, calls


def _outputs() -> dict:
    """Stand-ins for Kernel B's outputs (fp32 dq and dk, so that the launch reads their dtype)."""
    return {"dq": np.zeros(1, np.float32), "dk": np.zeros(1, np.float32), "dv": "dv", "dg": "dg", "dbeta": "dbeta"}


def _launch(monkeypatch, *, H: int, HV: int, rstd=None, dqk=np.float32, run_chunks=1):
    """One launch of 1 + 2 chunks with the kernel and the device tables stood in for: (grid, block,
    {parameter: argument}, shared memory)."""
    calls = []
    monkeypatch.setattr(launch, "kernel", lambda build: (lambda *call, **kw: calls.append((call, kw)), 4321, 256))
    monkeypatch.setattr(launch, "_device_tables", _device_tables)
    out = {"dq": np.zeros(1, dqk), "dk": np.zeros(1, dqk), "dv": "dv", "dg": "dg", "dbeta": "dbeta"}
    names = ("q", "k", "v", "g", "beta", "aqk", "akk", "do", "ds", "states")
    plan = launch.launch(*names, cu=np.array([0, 60, 130]), H=H, HV=HV, scale=0.25, out=out, rstd=rstd,
                         run_chunks=run_chunks)
    (grid, block, args), opts = calls[0]
    assert grid[0] == plan.runs
    return grid, block, launched(SOURCE_PATH, KERNEL_NAME, args), opts["shared_mem"]


@pytest.mark.parametrize("H, HV", [(3, 3), (2, 8)])
def test_one_cta_per_run_and_value_head_and_both_head_counts_where_the_kernel_takes_them(monkeypatch, H, HV):
    grid, block, got, smem = _launch(monkeypatch, H=H, HV=HV)
    assert grid == (3, HV) and block == (256,) and smem == 4321
    assert (got["run_chunk0"], got["run_chunks"]) == ("run", 1)
    grid, _, got, _ = _launch(monkeypatch, H=H, HV=HV, run_chunks=2)   # chunks 0 | 1, 2
    assert grid == (2, HV) and got["run_chunks"] == 2
    assert (got["HV_"], got["H_"], got["scale"], got["dqk_bf16"]) == (HV, H, 0.25, 0)
    assert (got["q"], got["k"], got["v"], got["dout"], got["gate"], got["ds"]) == ("q", "k", "v", "do", "g", "ds")
    assert (got["q_rstd"], got["k_rstd"]) == (0, 0)            # null: no l2norm backward


def test_rstd_and_bf16_gradients_reach_their_parameters(monkeypatch):
    _, _, got, _ = _launch(monkeypatch, H=2, HV=4, rstd=("rq", "rk"), dqk=np.uint16)
    assert (got["q_rstd"], got["k_rstd"], got["dqk_bf16"]) == ("rq", "rk", 1)
    with pytest.raises(ValueError, match="dq and dk must both be float32 or both bf16"):
        launch.launch(*"q k v g beta aqk akk do ds states".split(), cu=np.array([0, 9]), H=1, HV=1, scale=1.0,
                      out={"dq": np.zeros(1, np.float32), "dk": np.zeros(1, np.uint16)})


def test_the_plain_build_gets_null_gate_arguments_and_writes_dg(monkeypatch):
    builds = []
    monkeypatch.setattr(launch, "kernel", lambda build: (builds.append(build), (lambda *a, **kw: None, 1, 256))[1])
    _, _, got, _ = _launch(monkeypatch, H=1, HV=1)
    assert got["dg"] == "dg"
    assert [got[n] for n in ("g_raw", "a_log", "dt_bias", "dg_raw", "da_part", "ddt_part", "gate_form")] == [0] * 7


@pytest.mark.parametrize("lower_bound, form", [(None, 1), (-5.0, 2)])
def test_the_gate_build_gets_its_inputs_outputs_and_form_and_writes_no_dg(monkeypatch, lower_bound, form):
    builds, calls = _stand_in_kernel(monkeypatch, smem=4321)
    out = _outputs()
    da, ddt = np.zeros((3, 2), np.float32), np.zeros((3, 2, 128), np.float32)   # a row a run: 3 at one chunk a run
    gate = launch.GateOut("g_raw", "A_log" if form == 1 else None, "dt_bias", lower_bound, "dg_raw", da, ddt)
    args = "q k v g beta aqk akk do ds states".split()
    launch.launch(*args, cu=np.array([0, 60, 130]), H=1, HV=2, scale=0.5, out=out, gate=gate, run_chunks=1)
    with pytest.raises(ValueError, match=r"gate.da_part has 3 rows; Kernel B writes one a run: 2 at 2 chunks a run"):
        launch.launch(*args, cu=np.array([0, 60, 130]), H=1, HV=2, scale=0.5, out=out, gate=gate, run_chunks=2)
    got = launched(SOURCE_PATH, KERNEL_NAME, calls[0][2])
    assert builds == [launch.Build(gate=True)] and builds[0].name() == "token-gradients-gate"
    assert got["dg"] == 0                                          # never written in this build
    assert (got["g_raw"], got["dt_bias"], got["dg_raw"]) == ("g_raw", "dt_bias", "dg_raw")
    assert got["da_part"] is da and got["ddt_part"] is ddt
    assert got["a_log"] == ("A_log" if form == 1 else 0)
    assert got["gate_form"] == form == launch.GATE_FORMS["softplus" if lower_bound is None else "sigmoid"]
    assert got["lower_bound"] == (0.0 if lower_bound is None else lower_bound)


def test_every_build_passes_its_gate_macros_and_each_is_a_variant():
    B = launch.Build
    assert launch.all_variants() == [B(), B(gate=True), B(token_gate=True), B(qk_rstd=True),
                                     B(gate=True, qk_rstd=True), B(token_gate=True, qk_rstd=True), B(timing=True)]
    assert {"-DKDB_GATE=0", "-DKDB_TOKEN_GATE=0", "-DKDB_TIMING=0", "-DKDB_QK_RSTD=0"} <= set(launch.options())
    assert {"-DKDB_GATE=1", "-DKDB_TOKEN_GATE=0"} <= set(launch.options(B(gate=True)))
    assert {"-DKDB_GATE=0", "-DKDB_TOKEN_GATE=1"} <= set(launch.options(B(token_gate=True)))
    assert {"-DKDB_GATE=0", "-DKDB_TIMING=1"} <= set(launch.options(B(timing=True)))
    assert {"-DKDB_GATE=1", "-DKDB_QK_RSTD=1"} <= set(launch.options(B(gate=True, qk_rstd=True)))
    assert [b.name() for b in launch.all_variants()] == [
        "token-gradients", "token-gradients-gate", "token-gradients-token-gate", "token-gradients-qk-rstd",
        "token-gradients-gate-qk-rstd", "token-gradients-token-gate-qk-rstd", "token-gradients-timing"]


def test_the_entry_file_stops_without_the_qk_rstd_macro():
    text = SOURCE_PATH.read_text()
    assert '#ifndef KDB_QK_RSTD\n#error "KDB_QK_RSTD must be defined' in text


@pytest.mark.parametrize("gate", [False, True])
def test_the_qk_rstd_build_is_launched_on_raw_rows_and_needs_their_rstd(monkeypatch, gate):
    builds, calls = _stand_in_kernel(monkeypatch)
    out = _outputs()
    args = "q k v g beta aqk akk do ds states".split()
    epilogue = launch.GateOut("g_raw", "A_log", "dt_bias", None, "dg_raw", None, None) if gate else None
    launch.launch(*args, cu=np.array([0, 60]), H=1, HV=1, scale=0.5, out=out, rstd=("rq", "rk"), gate=epilogue,
                  qk_rstd=True, run_chunks=1)
    assert builds == [launch.Build(gate=gate, qk_rstd=True)]
    got = launched(SOURCE_PATH, KERNEL_NAME, calls[0][2])
    assert (got["q"], got["k"], got["q_rstd"], got["k_rstd"]) == ("q", "k", "rq", "rk")
    with pytest.raises(ValueError, match=r"qk_rstd: q and k are the raw rows, and their l2norm's rstd"):
        launch.launch(*args, cu=np.array([0, 60]), H=1, HV=1, scale=0.5, out=out, gate=epilogue, qk_rstd=True)
    with pytest.raises(TypeError, match="qk_rstd must be True or False, got 1"):
        launch.launch(*args, cu=np.array([0, 60]), H=1, HV=1, scale=0.5, out=out, rstd=("rq", "rk"), qk_rstd=1)
    assert len(builds) == 1                                        # refused before any build


def test_the_token_gate_build_is_launched_on_request_and_never_with_the_gate_epilogue(monkeypatch):
    builds, _ = _stand_in_kernel(monkeypatch)
    out = _outputs()
    args = "q k v g beta aqk akk do ds states".split()
    launch.launch(*args, cu=np.array([0, 60]), H=1, HV=1, scale=0.5, out=out, token_gate=True, run_chunks=1)
    assert builds == [launch.Build(token_gate=True)]
    gate = launch.GateOut("g_raw", "A_log", "dt_bias", None, "dg_raw", "da", "ddt")
    with pytest.raises(ValueError, match="no build of the gate epilogue on each token's gate"):
        launch.launch(*args, cu=np.array([0, 60]), H=1, HV=1, scale=0.5, out=out, gate=gate, token_gate=True)


def test_the_gate_forms_are_the_kernel_s():
    text = (SOURCE_PATH.parent / "token_gradients_gate.cuh").read_text()
    for name, value in launch.GATE_FORMS.items():
        assert f"constexpr int GATE_{name.upper()} = {value};" in text
