"""kernel.kda_backward's host side, without a GPU: every argument check names the argument."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from kernel.kda_backward import ScanPlan, checked_batch, group_sum, kda_backward, plan_kda_backward, plan_scans
from kernel.reference import snapshot_offsets
from kernel.shapes import qk_head

from .ds_scan.test_fla import BF16, DeviceArray

D, C64 = 128, 64


def _args(B=2, T=100, H=3, *, HV=None, N=None, h0=True, dht=True, states=False):
    """Stand-ins: q, k with H heads, everything else with HV (None: H; more: FLA's grouped value heads)."""
    N = B if N is None else N
    HV = H if HV is None else HV
    qk, wide = (B, T, H, D), (B, T, HV, D)
    a = dict(q=DeviceArray(qk, BF16), k=DeviceArray(qk, BF16), v=DeviceArray(wide, BF16),
             g=DeviceArray(wide, np.float32), beta=DeviceArray((B, T, HV), np.float32),
             Aqk=DeviceArray((B, T, HV, C64), BF16), Akk=DeviceArray((B, T, HV, C64), BF16),
             do=DeviceArray(wide, BF16))
    nt = -(-T // C64)
    kw = dict(initial_state=DeviceArray((N, HV, D, D), np.float32) if h0 else None,
              dht=DeviceArray((N, HV, D, D), np.float32) if dht else None,
              states=DeviceArray((B, nt, HV, D, D), BF16) if states else None)
    return a, kw


def _plan(a, kw, **over):
    args = {**a, **kw, **over}
    pos = [args.pop(n) for n in ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")]
    return plan_kda_backward(*pos, **args)


def test_valid_arguments_give_kernel_a_s_plan():
    a, kw = _args(states=True)
    plan = _plan(a, kw)
    assert (plan.B, plan.T, plan.H, plan.N) == (2, 100, 3, 2)
    assert plan.dh_shape == (2, 2, 3, D, D)     # the states' shape too: one per 64-token chunk


@pytest.mark.parametrize("name, value, message", [
    ("v", DeviceArray((2, 100, 3, 64), BF16), r"v must have shape \(2, 100, 3, 128\)"),
    ("v", DeviceArray((2, 100, 3, D), np.float32), r"v .*bf16"),
    ("v", DeviceArray((2, 100, 6, D), BF16), r"v must have shape \(2, 100, 3, 128\) \(\[B, T, HV, V\], V = 128, "
                                             r"the value heads of g and do\)"),
    ("initial_state", DeviceArray((3, 3, D, D), np.float32), r"initial_state must have shape \(2, 3, 128, 128\)"),
    ("initial_state", DeviceArray((2, 3, D, D), BF16), r"initial_state .*float32"),
    ("states", DeviceArray((2, 1, 3, D, D), BF16), r"states must have shape \(2, 2, 3, 128, 128\)"),
    ("states", DeviceArray((2, 2, 3, D, D), np.float32), r"states .*bf16"),
    ("v", np.zeros((2, 100, 3, D), np.uint16), r"v is a numpy.ndarray \(host memory\): kda_backward .*kda_backward_reference"),
    ("q", np.zeros((2, 100, 3, D), np.uint16), r"q is a numpy.ndarray \(host memory\): kda_backward .*kda_backward_reference"),
])
def test_bad_arguments_are_named(name, value, message):
    a, kw = _args(states=True)
    (a if name in a else kw)[name] = value
    with pytest.raises((ValueError, TypeError), match=message):
        _plan(a, kw)


def test_grouped_value_heads_are_planned_per_value_head():
    # FLA's GVA: q and k with 2 heads, v, g, beta, Aqk, Akk, do, the states and their gradients with 6
    a, kw = _args(B=2, T=100, H=2, HV=6, states=True)
    plan = _plan(a, kw)
    assert (plan.B, plan.T, plan.H, plan.HV, plan.N) == (2, 100, 2, 6, 2)
    assert plan.dh_shape == (2, 2, 6, D, D) and plan.dh0_shape == (2, 6, D, D)
    batch = checked_batch(2, 100, 2, scale=0.5, torch_out=False, HV=6)
    assert (batch.H, batch.HV, batch.states_shape) == (2, 6, plan.dh_shape)
    assert checked_batch(2, 100, 3, scale=0.5, torch_out=False).HV == 3     # without GVA: HV = H


@pytest.mark.parametrize("name, shape, message", [
    ("g", (2, 100, 5, D), r"g64 has 5 heads and q has 2: the value heads must be q's heads or a multiple of them"),
    ("g", (2, 100, 1, D), r"g64 has 1 heads and q has 2: the value heads must be q's heads"),
    ("v", (2, 100, 2, D), r"v must have shape \(2, 100, 6, 128\)"),
    ("do", (2, 100, 2, D), r"do must have shape \(2, 100, 6, 128\)"),
    ("k", (2, 100, 6, D), r"k must have shape \(2, 100, 2, 128\) \(same as q"),
    ("initial_state", (2, 2, D, D), r"initial_state must have shape \(2, 6, 128, 128\)"),
    ("dht", (2, 2, D, D), r"dht must have shape \(2, 6, 128, 128\)"),
    ("states", (2, 2, 2, D, D), r"states must have shape \(2, 2, 6, 128, 128\) \(\[B, NT, HV, K, V\]"),
])
def test_grouped_value_heads_are_checked_by_name(name, shape, message):
    a, kw = _args(B=2, T=100, H=2, HV=6, states=True)
    dtype = np.dtype((a | kw)[name].__cuda_array_interface__["typestr"])
    (a if name in a else kw)[name] = DeviceArray(shape, dtype)
    with pytest.raises(ValueError, match=message):
        _plan(a, kw)


def test_the_group_sum_adds_the_value_heads_that_read_each_query_head():
    # Kernel B's dq, dk per value head [B, T, HV, K] -> [B, T, H, K]: each query / key head collects
    # exactly the value heads qk_head maps to it (the adjoint of FLA's repeat_interleave of q and k)
    rng = np.random.default_rng(0)
    B, T, H, HV = 2, 5, 3, 12
    x = rng.standard_normal((B, T, HV, D)).astype(np.float32)
    got = group_sum(x, H)
    assert got.shape == (B, T, H, D)
    want = np.zeros((B, T, H, D), np.float64)
    for hv in range(HV):
        want[:, :, qk_head(hv, HV, H)] += x[:, :, hv]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)   # fp32 sums of 4 terms
    assert np.array_equal(group_sum(x, H), got)                        # the same bits call after call
    assert np.array_equal(group_sum(x[:, :, :H], H), x[:, :, :H])     # HV = H: each head alone
    torch = pytest.importorskip("torch")
    assert np.array_equal(group_sum(torch.from_numpy(x), H).numpy(), got)   # torch's sum: the same order


def test_the_fla_entry_checks_run_too():
    a, kw = _args()
    a["Aqk"] = DeviceArray((2, 100, 3, 16), BF16)
    with pytest.raises(ValueError, match="Aqk"):
        _plan(a, kw)


@pytest.mark.parametrize("scale, exc", [(0.0, ValueError), (float("nan"), ValueError), (True, TypeError),
                                        ("0.1", TypeError)])
def test_scale(scale, exc):
    a, kw = _args()
    with pytest.raises(exc, match="scale"):
        _plan(a, kw, scale=scale)


def test_arrays_on_two_devices_are_refused():
    a, kw = _args()
    a["v"] = DeviceArray((2, 100, 3, D), BF16, device=1)
    with pytest.raises(ValueError, match="v is on device 1"):
        _plan(a, kw)


def test_varlen_states_are_packed_by_chunk_offsets():
    lengths = [1, 64, 65, 200]
    total = sum(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    a, kw = _args(B=1, T=total, N=len(lengths))
    n_chunks = int(snapshot_offsets(lengths, 16, 4)[-1])
    assert n_chunks == 1 + 1 + 2 + 4
    kw["states"] = DeviceArray((1, n_chunks, 3, D, D), BF16)
    plan = _plan(a, kw, cu_seqlens=cu)
    assert plan.dh_shape == (1, n_chunks, 3, D, D)
    kw["states"] = DeviceArray((1, n_chunks - 1, 3, D, D), BF16)
    with pytest.raises(ValueError, match="states must have shape"):
        _plan(a, kw, cu_seqlens=cu)


def test_without_cupy_the_call_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    a, kw = _args()
    args = {**a, **kw}
    pos = [args.pop(n) for n in ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")]
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[cuda\]'"):
        kda_backward(*pos, **args)


# The two scans' plan on the H200 (132 SMs): each side-by-side grid is what its own rule picks for 66.
@pytest.mark.parametrize("pairs, expect", [
    (32, ScanPlan(True, 2, 4)),          # 1 x T x H32: 64 + 64 CTAs instead of 128 and 128 in turn
    (64, ScanPlan(True, 1, 8)),          # 2 x T x H32: 64 + 64
    (65, ScanPlan(True, 1, 8)),          # 65 + 65 = 130 still fit
    (1, ScanPlan(True, 8, 1)),           # too few chains for either rule to fill even half
    (128, ScanPlan(False, "auto", None)),   # 4 x T x H32: 128 + 128 do not fit; each fills the GPU
    (1024, ScanPlan(False, "auto", None)),
])
def test_the_scans_go_side_by_side_when_both_halved_grids_fit(pairs, expect):
    assert plan_scans(pairs, 132) == expect


def test_side_by_side_can_be_forced_either_way():
    assert plan_scans(1024, 132, True) == ScanPlan(True, 1, 8)
    assert plan_scans(32, 132, False) == ScanPlan(False, "auto", None)
    assert plan_scans(32, 132, np.bool_(True)).side_by_side is True


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_side_by_side_takes_a_bool_or_none(bad):
    with pytest.raises(TypeError, match="side_by_side must be True, False or None"):
        plan_scans(32, 132, bad)
    a, kw = _args()
    with pytest.raises(TypeError, match="side_by_side must be True, False or None"):
        kda_backward(**a, **kw, side_by_side=bad)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "many"])
def test_segments_takes_auto_or_a_count(bad):
    a, kw = _args()
    with pytest.raises(ValueError, match="segments must be 'auto' or an integer >= 1"):
        kda_backward(**a, **kw, segments=bad)


def test_a_forced_split_is_refused_beside_the_forward_state_scan():
    """A split Kernel A needs the SMs the forward-state scan would take beside it: asking for both is
    refused by name (given states, no scan runs, so nothing is refused)."""
    a, kw = _args()
    with pytest.raises(ValueError, match=r"segments=3 splits Kernel A's scan.*side_by_side=True"):
        kda_backward(**a, **kw, segments=3, side_by_side=True)


def test_each_tokens_gate_needs_the_states_and_is_a_bool():
    # the forward-state scan reads FLA's cumsum: on each token's gate the states must come with the call
    a, kw = _args()
    with pytest.raises(ValueError, match=r"token_gate needs the states \(our forward's\)"):
        kda_backward(**a, **kw, token_gate=True)
    with pytest.raises(TypeError, match="token_gate must be True or False, got 1"):
        kda_backward(**a, **kw, token_gate=1)


def test_the_token_gate_with_the_gate_epilogue_is_refused_before_any_kernel():
    """Kernel B has no build of the pair: run() names it before the scans run (no GPU needed to see it)."""
    from kernel.kda_backward import Gate, run

    batch = checked_batch(1, 64, 1, None, scale=0.125, torch_out=False)
    gate = Gate(g_raw=None, A_log=None, dt_bias=None, lower_bound=-5.0)
    with pytest.raises(ValueError, match="token_gate with gate: Kernel B has no build"):
        run(batch, *[None] * 8, gate=gate, token_gate=True)


def test_raw_q_and_k_need_their_rstd_and_the_states_and_a_bool():
    """run(qk_raw=True): Kernel B normalises the raw rows with the call's rstd, and the forward-state scan has no
    build on raw k: each refused by name before any kernel runs (no GPU needed to see it)."""
    from kernel.kda_backward import run

    batch = checked_batch(1, 64, 1, None, scale=0.125, torch_out=False)
    with pytest.raises(ValueError, match=r"qk_raw: q and k are the raw rows, and Kernel B needs their l2norm's rstd"):
        run(batch, *[None] * 8, states="states", qk_raw=True)
    with pytest.raises(ValueError, match=r"qk_raw needs the forward's states: the forward-state scan \(Kernel S\)"):
        run(batch, *[None] * 8, rstd=("rq", "rk"), qk_raw=True)
    with pytest.raises(TypeError, match="qk_raw must be True or False, got 'yes'"):
        run(batch, *[None] * 8, rstd=("rq", "rk"), states="states", qk_raw="yes")


def test_qk_raw_reaches_the_launches_as_a_bool(monkeypatch):
    """run() hands qk_raw (numpy's bool too) to the launches, which pick Kernel A's l2norm build and Kernel B's
    qk_rstd build by it (the GPU tests hold their results to float64)."""
    import kernel.kda_backward as kb

    seen = {}
    monkeypatch.setattr(kb, "require_cupy", lambda what: None)
    monkeypatch.setattr(kb, "require_gpu", lambda what: None)
    monkeypatch.setattr(kb, "_run", lambda *a: seen.setdefault("qk_raw", []).append(a[-1]))
    batch = checked_batch(1, 64, 1, None, scale=0.125, torch_out=False)
    kb.run(batch, *[None] * 8, rstd=("rq", "rk"), states="states", qk_raw=np.bool_(True))
    kb.run(batch, *[None] * 8, rstd=("rq", "rk"), states="states")
    assert seen["qk_raw"] == [True, False] and all(type(x) is bool for x in seen["qk_raw"])


# ----------------------------------------------------------------------------
# the pipelined backward's groups (kernel.backward_pipeline): what each group's kernels are handed
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("lengths, B, groups", [(None, 6, 3), ([1, 200, 64, 65, 130, 17], 1, 2),
                                                 ([70, 70, 5, 300], 1, 2)], ids=["6x100", "varlen-6", "varlen-4"])
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gate"])
def test_each_groups_kernels_get_its_sequences_of_every_array_and_together_the_batch(lengths, B, groups, gate,
                                                                                     monkeypatch):
    # host arrays standing in for the CuPy views: each token's, tile's, chunk's and run's index is its value, so
    # the ranges the groups' kernels are handed show where they lie; together they must be the batch, once
    import dataclasses

    from kernel import kda_backward as kb
    from kernel.ds_scan import launch as ds_scan
    from kernel.token_gradients import launch as token_gradients

    T = 100 if lengths is None else sum(lengths)
    H, HV, run_chunks = 1, 2, 2
    batch = checked_batch(B, T, H, None if lengths is None else np.cumsum([0, *lengths]), scale=0.1,
                          torch_out=False, HV=HV)
    cu, varlen = batch.cu_seqlens, batch.varlen
    t = token_gradients.tables(cu, run_chunks)
    runs = token_gradients.RunPlan(run_chunks, t["runs"])

    def indexed(count, *rest):   # value = the row's index along the tokens (tiles, chunks) axis
        lead = (B, count // B) if not varlen else (1, count)
        return np.broadcast_to(np.arange(count).reshape(*lead, *([1] * len(rest))), (*lead, *rest)).copy()

    tok = lambda *rest: indexed(B * T, *rest)   # noqa: E731
    c = {n: tok(D) for n in ("q", "k", "v", "g", "do")} | {n: tok(C64) for n in ("Aqk", "Akk")}
    c["q"], c["k"] = tok(H, D), tok(H, D)
    beta_c = tok(HV)
    ds_c, states_c = indexed(int(t["tiles"]), HV), indexed(int(t["chunks"]), HV)
    dh0_c = np.arange(batch.N)[:, None]
    out = {n: tok(HV) for n in ("dq", "dk", "dv", "dg", "dbeta")}
    gate_out = None if not gate else token_gradients.GateOut(
        tok(HV), None, None, -5.0, tok(HV), np.arange(runs.runs)[:, None], np.arange(runs.runs)[:, None, None])
    checked = ds_scan.ScanInputs((c["q"], c["k"], c["g"], beta_c, c["Aqk"], c["Akk"], c["do"]), dh0_c, B, T, H, HV,
                                 cu, None)
    handed = {"A": [], "B": []}
    monkeypatch.setattr(kb.ds_scan, "run", lambda scan, **kw: handed["A"].append((scan, kw)))
    monkeypatch.setattr(kb.token_gradients, "launch", lambda *a, **kw: handed["B"].append((a, kw)))
    vsplit = ds_scan.scan_vsplit("auto", batch.N * HV, 132)
    jobs = kb._group_jobs(groups, checked, {"varlen": varlen}, vsplit, c, beta_c, ds_c, dh0_c, states_c, out, None,
                          gate_out, runs, batch, False, False)
    assert len(jobs) == groups
    for a, b in jobs:
        a()
        b()
    scans, launches = handed["A"], handed["B"]
    # every token, tile, chunk, sequence and run once, in order
    for name, arrays in (("Kernel A's q", [s.arrays[0] for s, _ in scans]), ("Kernel A's do", [s.arrays[6] for s, _ in
                                                                                               scans])):
        got = np.concatenate([np.asarray(x).reshape(-1, *x.shape[2:]) for x in arrays])
        np.testing.assert_array_equal(got[(slice(None),) + (0,) * (got.ndim - 1)], np.arange(B * T), err_msg=name)
    for name, at in (("q", 0), ("beta", 4)):
        got = np.concatenate([np.asarray(a[at]).reshape(-1, *a[at].shape[2:]) for a, _ in launches])
        np.testing.assert_array_equal(got[(slice(None),) + (0,) * (got.ndim - 1)], np.arange(B * T), err_msg=name)
    for name, at, total in (("dS", 8, t["tiles"]), ("states", 9, t["chunks"])):
        got = np.concatenate([np.asarray(a[at]).reshape(-1, HV) for a, _ in launches])[:, 0]
        np.testing.assert_array_equal(got, np.arange(total), err_msg=name)
    got = np.concatenate([kw["out"]["snapshots"].reshape(-1, HV) for _, kw in scans])[:, 0]
    np.testing.assert_array_equal(got, np.arange(t["tiles"]), err_msg="Kernel A's dS")
    np.testing.assert_array_equal(np.concatenate([kw["out"]["dh0"] for _, kw in scans])[:, 0], np.arange(batch.N))
    for _, kw in launches:   # each group's own offsets, and as many of the gate's rows as its runs
        group_cu = kw["cu"]
        assert group_cu[0] == 0 and kw["run_chunks"] == run_chunks
        if gate:
            assert kw["gate"].da_part.shape[0] == token_gradients.tables(group_cu, run_chunks)["runs"]
    if gate:
        rows = np.concatenate([kw["gate"].da_part[:, 0] for _, kw in launches])
        np.testing.assert_array_equal(rows, np.arange(runs.runs))
    for (scan, kw), (_, bkw) in zip(scans, launches):   # Kernel A of a group: its sequences, the batch's vsplit
        np.testing.assert_array_equal(scan.cu, bkw["cu"])
        assert kw["segments"] == 1 and kw["vsplit"] == ds_scan.choose_vsplit(batch.N * HV, 132)
        assert dataclasses.replace(scan).B == (1 if varlen else len(scan.cu) - 1)
