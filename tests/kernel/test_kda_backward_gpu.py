"""The whole KDA backward on the GPU against the float64 reference.

Inputs are what FLA's forward keeps, made in float64 by kernel.reference.fla_forward_tensors
from seeded inputs rounded to bf16 the way FLA stores them (q, k l2-normalised first). The
reference, kda_backward_reference, runs on exactly those rounded values (raw gate, no
l2norm). The bound, 2e-2 relative Frobenius error, is about 5x what bf16 operands give
(FLA's own chunk_kda measures 2.3e-3 to 4e-3 on such inputs: docs/kda_backward.md).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from kernel.kda_backward import GRADIENTS as GRADS

pytestmark = pytest.mark.gpu

BOUND = 2e-2
CASES = [
    dict(B=2, T=100, lengths=None, h0=True, dht=True),
    dict(B=1, T=1, lengths=(1, 15, 16, 17, 65, 200), h0=False, dht=True),
    dict(B=1, T=1, lengths=(64, 63, 129, 5), h0=True, dht=False),
    dict(B=2, T=100, lengths=None, h0=True, dht=True, wide=True),
]
IDS = ["batch-2x100", "varlen-1-15-16-17-65-200", "varlen-64-63-129-5", "batch-2x100-tiles-past-fp32"]


def _widen(g):
    """Tiles whose gates decay a channel past fp32's normal range (natural-log gates, [B, T, H, K]):
    one channel by 2^-208 over a tile, one by 2^-144 at one token, and every channel of a tile by
    2^-208; Kernel B forms their G14-G17 pairwise."""
    g[0, 16:32, 1, 5] = -9.0
    g[1, 20, 0, 77] = -100.0
    g[1, 48:64, 1, :] = -9.0


def _rel(out, ref) -> float:
    num, den = float(np.linalg.norm(out - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _worst(out, ref, cu, axis_h=2):
    """(sequence, head, error) with the largest relative error, for the failure message."""
    worst = (None, None, -1.0)
    if out.ndim < 3 or cu is None:
        return worst
    for n in range(len(cu) - 1):
        for h in range(out.shape[axis_h]):
            o = out[0, cu[n]:cu[n + 1], h]
            r = ref[0, cu[n]:cu[n + 1], h]
            e = _rel(o, r)
            if e > worst[2]:
                worst = (n, h, e)
    return worst


# the norms the raw q and k rows take in turn by token in the qk_raw cases (k's one token later)
RAW_NORMS = (3.0, 0.2, 17.0, 1.0)


def make_case(case, H=2, seed=11, with_l2norm=False, group=1, token_gate=False, qk_raw=False):
    """Host float64 inputs, the device inputs in FLA's layout, and the reference gradients. With
    ``with_l2norm``, q and k go in normalised (bf16) with their fp32 rstd in the inputs' "rstd", and
    the reference's dq, dk are with respect to the raw rows (its own l2norm in float64). ``qk_raw``
    (implies ``with_l2norm``): the raw rows take the norms RAW_NORMS, q and k go in raw (bf16) with that
    rstd, and every gradient's reference is float64's l2norm on those raw rows.

    ``group``: FLA's grouped value heads. H is then the value heads, and q and k (and rstd) have
    H / group: value head hv reads q's and k's head hv // group. The float64 reference runs on q and k
    repeated so (FLA's own definition of GVA) and its dq, dk are summed over each group, the gradient
    of the one row every value head of the group read."""
    import cupy

    from kernel.ds_scan.launch import bf16_bits, bits_to_f32
    from kernel.reference import fla_forward_tensors, kda_backward_reference, kda_forward_reference, random_inputs
    from kernel.reference.checks import l2norm, l2norm_rstd
    from kernel.token_gradients import tables

    raw = random_inputs(case["B"], case["T"], H, lengths=list(case["lengths"]) if case["lengths"] else None,
                        seed=seed, with_dht=case["dht"])
    if case.get("wide"):
        _widen(raw["g"])
    rb = lambda x: bits_to_f32(bf16_bits(x)).astype(np.float64)  # noqa: E731  (bf16 rounding)
    q_raw, k_raw = (rb(raw[n][:, :, ::group]) for n in ("q", "k"))      # one q, k head a group of value heads
    with_l2norm = with_l2norm or qk_raw
    if qk_raw:
        T_all = q_raw.shape[1]
        q_raw, k_raw = (rb(l2norm(np, x) * np.asarray(RAW_NORMS)[(np.arange(T_all) + j) % len(RAW_NORMS)][
            None, :, None, None]) for j, x in enumerate((q_raw, k_raw)))
    q, k = rb(l2norm(np, q_raw)), rb(l2norm(np, k_raw))
    rep = lambda x: np.repeat(x, group, axis=2)  # noqa: E731  (value head hv reads head hv // group)
    gsum = lambda x: x.reshape(*x.shape[:2], -1, group, x.shape[3]).sum(3)  # noqa: E731  (its adjoint)
    v, do = rb(raw["v"]), rb(raw["do"])
    g, beta = raw["g"].astype(np.float64), raw["beta"].astype(np.float64)
    cu = raw["cu_seqlens"]
    B, T = q.shape[:2]
    cu_h = cu if cu is not None else np.arange(B + 1, dtype=np.int64) * T
    N = len(cu_h) - 1
    rng = np.random.default_rng(seed + 1)
    h0 = 0.1 * rng.standard_normal((N, H, 128, 128)) if case["h0"] else None
    F = fla_forward_tensors(rep(q), rep(k), g, beta, cu_seqlens=cu, qk_l2norm=False)
    ref = kda_backward_reference(rep(q), rep(k), v, g, beta, do, initial_state=h0, dht=raw["dht"], cu_seqlens=cu,
                                 qk_l2norm=False)
    if with_l2norm:   # dq, dk with respect to the raw rows: the reference's l2norm, on those
        raw_ref = kda_backward_reference(rep(q_raw), rep(k_raw), v, g, beta, do, initial_state=h0, dht=raw["dht"],
                                         cu_seqlens=cu, qk_l2norm=True)
        ref = raw_ref if qk_raw else {**ref, "dq": raw_ref["dq"], "dk": raw_ref["dk"]}
    ref = {**ref, "dq": gsum(ref["dq"]), "dk": gsum(ref["dk"])}
    _, _, tile_states = kda_forward_reference(rep(q), rep(k), v, g, beta, initial_state=h0, cu_seqlens=cu,
                                              qk_l2norm=False)
    t = tables(cu_h)
    flat = tile_states.reshape(-1, H, 128, 128)
    every64 = np.concatenate([flat[t["tile_offs"][n]:t["tile_offs"][n + 1]:4] for n in range(N)])
    states_shape = (B, t["chunks"] // B, H, 128, 128)
    dev = cupy.asarray
    g_in = g.astype(np.float32) if token_gate else F.g64.astype(np.float32)   # each token's gate, or FLA's cumsum
    q_in, k_in = (q_raw, k_raw) if qk_raw else (q, k)
    inputs = dict(q=dev(bf16_bits(q_in)), k=dev(bf16_bits(k_in)), v=dev(bf16_bits(v)), g=dev(g_in),
                  beta=dev(beta.astype(np.float32)), Aqk=dev(bf16_bits(F.Aqk)), Akk=dev(bf16_bits(F.Akk)),
                  do=dev(bf16_bits(do)))
    kw = dict(initial_state=None if h0 is None else dev(h0.astype(np.float32)),
              dht=None if raw["dht"] is None else dev(raw["dht"].astype(np.float32)), cu_seqlens=cu)
    states = dev(bf16_bits(every64.reshape(states_shape)))
    if with_l2norm:
        kw["rstd"] = tuple(dev(l2norm_rstd(np, x).astype(np.float32)) for x in (q_raw, k_raw))
    return inputs, kw, states, ref, cu


def _host(name, x):
    from kernel.ds_scan.launch import bits_to_f32

    x = x.get()
    return bits_to_f32(x).astype(np.float64) if x.dtype == np.uint16 else x.astype(np.float64)


def _check(out, ref, cu, label):
    errs = {}
    for name in GRADS:
        o = _host(name, out[name])
        assert o.shape == ref[name].shape, f"{label}: {name} shape {o.shape}, reference {ref[name].shape}"
        assert np.isfinite(o).all(), f"{label}: {name} has non-finite values at {np.argwhere(~np.isfinite(o))[:4]}"
        errs[name] = _rel(o, ref[name])
    print(f"{label}: " + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
    bad = {n: e for n, e in errs.items() if not e < BOUND}
    if bad:
        where = {n: _worst(_host(n, out[n]), ref[n], cu) for n in bad if n != "dh0"}
        raise AssertionError(f"{label}: relative errors over {BOUND}: {bad}; worst (sequence, head, error): {where}")
    return errs


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_b_with_reference_states_matches_float64(case):
    """Kernel A + Kernel B, given the float64 forward's states (rounded to bf16): Kernel B alone
    against the reference, independent of the forward-state scan."""
    from kernel.kda_backward import kda_backward

    inputs, kw, states, ref, cu = make_case(case)
    out = kda_backward(**inputs, **kw, states=states)
    _check(out, ref, cu, "given states")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_whole_backward_matches_float64(case):
    """The whole backward, its states recomputed by the forward-state scan."""
    pytest.importorskip("kernel.forward_states")
    from kernel.kda_backward import kda_backward

    inputs, kw, _, ref, cu = make_case(case)
    out = kda_backward(**inputs, **kw)
    _check(out, ref, cu, "recomputed states")


@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_kernel_b_applies_the_l2norms_backward(case):
    """q and k as the forward's l2norm left them, with its rstd: dq and dk with respect to the raw rows."""
    from kernel.kda_backward import checked_batch, run

    inputs, kw, states, ref, cu = make_case(case, with_l2norm=True)
    rstd, cu_seqlens = kw.pop("rstd"), kw.pop("cu_seqlens")
    B, T, H = inputs["q"].shape[:3]
    batch = checked_batch(B, T, H, cu_seqlens, scale=128 ** -0.5, torch_out=False)
    out = run(batch, inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["Aqk"],
              inputs["Akk"], inputs["do"], states=states, rstd=rstd, **kw)
    _check(out, ref, cu, "the l2norm's backward in Kernel B")


def _run_raw(case, **make):
    """run(qk_raw=True) on the case's raw q and k rows with their rstd and the forward's states: (out, ref, cu)."""
    from kernel.kda_backward import checked_batch, run

    inputs, kw, states, ref, cu = make_case(case, qk_raw=True, **make)
    rstd, cu_seqlens = kw.pop("rstd"), kw.pop("cu_seqlens")
    B, T, H = inputs["q"].shape[:3]
    batch = checked_batch(B, T, H, cu_seqlens, scale=128 ** -0.5, torch_out=False, HV=inputs["v"].shape[2])
    out = run(batch, *(inputs[n] for n in ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")), states=states,
              rstd=rstd, qk_raw=True, token_gate=make.get("token_gate", False), **kw)
    return out, ref, cu


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_raw_q_and_k_match_float64(case):
    """run(qk_raw=True): q and k the raw rows (norms 3, 0.2, 17 and 1 in turn) with their rstd, no normalised
    copies: Kernel A's l2norm build and Kernel B's qk_rstd build normalise them on chip; every gradient within
    the bound of float64's l2norm on the raw rows, on the batch, the varlen layouts and the tiles past fp32's
    range."""
    out, ref, cu = _run_raw(case)
    _check(out, ref, cu, "raw q and k")


def test_raw_q_and_k_on_each_tokens_gate_match_float64():
    out, ref, cu = _run_raw(CASES[1], token_gate=True)
    _check(out, ref, cu, "token gate, raw q and k")


def test_bf16_dq_dk_are_the_fp32_ones_rounded_once():
    from kernel.ds_scan.launch import bf16_bits
    from kernel.kda_backward import checked_batch, run

    inputs, kw, states, _, cu = make_case(CASES[1], with_l2norm=True)
    rstd, cu_seqlens = kw.pop("rstd"), kw.pop("cu_seqlens")
    B, T, H = inputs["q"].shape[:3]
    batch = checked_batch(B, T, H, cu_seqlens, scale=128 ** -0.5, torch_out=False)
    f32, b16 = (run(batch, *(inputs[n] for n in ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")), states=states,
                    rstd=rstd, dqk_bf16=flag, **kw) for flag in (False, True))
    for n in ("dq", "dk"):
        assert b16[n].dtype == np.uint16 and np.array_equal(b16[n].get(), bf16_bits(f32[n].get())), n
    for n in ("dv", "dg", "dbeta", "dh0"):
        assert np.array_equal(b16[n].get(), f32[n].get()), n


def test_two_calls_give_the_same_bits():
    from kernel.kda_backward import kda_backward

    inputs, kw, states, _, _ = make_case(CASES[1])
    a = kda_backward(**inputs, **kw, states=states)
    b = kda_backward(**inputs, **kw, states=states)
    for name in GRADS:
        assert (a[name] == b[name]).all(), f"{name} differs between two calls"


def test_torch_tensors_in_torch_tensors_out():
    torch = pytest.importorskip("torch")
    from kernel.kda_backward import kda_backward

    inputs, kw, states, ref, cu = make_case(CASES[0])
    as_t = lambda x: None if x is None else torch.as_tensor(x, device="cuda")  # noqa: E731
    bf = lambda x: as_t(x).view(torch.bfloat16)  # noqa: E731
    t_in = {n: (bf(x) if x.dtype == np.uint16 else as_t(x)) for n, x in inputs.items()}
    out = kda_backward(**t_in, initial_state=as_t(kw["initial_state"]), dht=as_t(kw["dht"]),
                       cu_seqlens=None, states=bf(states))
    assert all(isinstance(out[n], torch.Tensor) for n in GRADS)
    assert out["dv"].dtype == torch.bfloat16 and out["dq"].dtype == torch.float32
    for name in GRADS:
        o = out[name].float().cpu().numpy().astype(np.float64)
        assert _rel(o, ref[name]) < BOUND, name


def test_a_torch_call_allocates_through_torch_only():
    """With torch tensors in, every buffer of the call (the forward-state scan's states included) comes
    from torch's caching allocator: CuPy's pool gains nothing, and torch's peak covers the states."""
    torch = pytest.importorskip("torch")
    import cupy

    from kernel.kda_backward import kda_backward

    inputs, kw, _, _, _ = make_case(CASES[0])
    as_t = lambda x: None if x is None else torch.as_tensor(x, device="cuda")  # noqa: E731
    bf = lambda x: as_t(x).view(torch.bfloat16)  # noqa: E731
    t_in = {n: (bf(x) if x.dtype == np.uint16 else as_t(x)) for n, x in inputs.items()}
    t_in["beta"] = t_in["beta"].bfloat16()   # a bf16 beta is converted too
    h0, dht = as_t(kw["initial_state"]), as_t(kw["dht"])
    kda_backward(**t_in, initial_state=h0, dht=dht, cu_seqlens=None)   # the first call builds the modules
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = kda_backward(**t_in, initial_state=h0, dht=dht, cu_seqlens=None)
    torch.cuda.synchronize()
    B, T, H, K = t_in["q"].shape
    states_bytes = B * -(-T // 64) * H * K * K * 2
    assert pool.used_bytes() == before, "a buffer came from CuPy's pool"
    assert torch.cuda.max_memory_allocated() - base >= states_bytes + sum(x.nbytes for x in out.values()
                                                                          if isinstance(x, torch.Tensor))


def test_the_scans_side_by_side_give_the_in_turn_gradients():
    """The forward-state scan beside Kernel A (two streams, grids for half the SMs) against the two
    in turn at their full-GPU grids: within float32 rounding of each other (Kernel A's v-split and the
    scan's warps change which CTA computes a column, not its arithmetic), the same bits twice, and
    float64's bound."""
    from kernel.kda_backward import kda_backward

    inputs, kw, _, ref, cu = make_case(CASES[1])
    apart = kda_backward(**inputs, **kw, side_by_side=False)
    side = [kda_backward(**inputs, **kw, side_by_side=True) for _ in range(2)]
    _check(side[0], ref, cu, "side by side")
    for name in GRADS:
        assert (side[0][name] == side[1][name]).all(), f"{name}: two side-by-side calls differ"
        a, s = _host(name, apart[name]), _host(name, side[0][name])
        assert _rel(s, a) < 1e-5, f"{name}: side by side vs in turn, relative difference {_rel(s, a):.2e}"


def force_runs(monkeypatch, run_chunks: int) -> None:
    """Kernel B's CTAs walk runs of ``run_chunks`` chunks in every kda_backward call (the auto choice keeps one
    chunk a run at these tests' sizes: too few CTAs to fill a GPU's waves)."""
    from kernel.token_gradients import launch

    real = launch.run_plan
    monkeypatch.setattr(launch, "run_plan", lambda cu, HV, _="auto", sms=None: real(cu, HV, run_chunks))


@pytest.mark.parametrize("run_chunks", [2, 8])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_runs_of_chunks_match_float64(case, run_chunks, monkeypatch):
    """Kernel B's CTAs walking several chunks (the state carried across their boundaries), on the batch, the
    varlen layouts (runs ending in a sequence's partial chunk) and the tiles past fp32's range, with the states
    given and recomputed: within the bound of float64, as one chunk a run is."""
    from kernel.kda_backward import kda_backward

    force_runs(monkeypatch, run_chunks)
    inputs, kw, states, ref, cu = make_case(case)
    _check(kda_backward(**inputs, **kw, states=states), ref, cu, f"runs of {run_chunks}, given states")
    _check(kda_backward(**inputs, **kw), ref, cu, f"runs of {run_chunks}, recomputed states")


# ----------------------------------------------------------------------------
# FLA's grouped value heads: q and k (and their rstd) read in place, dq and dk summed over each group
# ----------------------------------------------------------------------------

GVA = [(CASES[0], 4, 2), (CASES[1], 6, 3), (CASES[3], 4, 4)]
GVA_IDS = [f"{IDS[0]}-HV4-G2", f"{IDS[1]}-HV6-G3", f"{IDS[3]}-HV4-G4"]


@pytest.mark.parametrize("case, HV, group", GVA, ids=GVA_IDS)
def test_grouped_value_heads_match_float64(case, HV, group):
    """The whole backward, states recomputed, q and k with HV / group heads: float64 on q and k
    repeated per value head, its dq and dk summed over each group."""
    from kernel.kda_backward import kda_backward

    inputs, kw, states, ref, cu = make_case(case, H=HV, group=group)
    assert inputs["q"].shape[2] == inputs["k"].shape[2] == HV // group and inputs["v"].shape[2] == HV
    _check(kda_backward(**inputs, **kw), ref, cu, f"GVA {group}, recomputed states")
    _check(kda_backward(**inputs, **kw, states=states), ref, cu, f"GVA {group}, given states")


@pytest.mark.parametrize("run_chunks", [1, 8])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_token_gate_backward_matches_float64(case, run_chunks, monkeypatch):
    """kda_backward on each token's natural-log gate, as kernel.chunk_kda calls it on our forward (Kernel A's and
    Kernel B's token-gate builds sum it within each tile; the states given), one chunk a run and runs of 8: within
    the bound of float64, as on FLA's cumsum."""
    from kernel.kda_backward import kda_backward

    force_runs(monkeypatch, run_chunks)
    inputs, kw, states, ref, cu = make_case(case, token_gate=True)
    _check(kda_backward(**inputs, **kw, states=states, token_gate=True), ref, cu, f"token gate, runs of {run_chunks}")


@pytest.mark.parametrize("case, HV, group", GVA[1:], ids=GVA_IDS[1:])
def test_the_token_gate_backward_with_grouped_value_heads_matches_float64(case, HV, group, monkeypatch):
    from kernel.kda_backward import kda_backward

    force_runs(monkeypatch, 4)
    inputs, kw, states, ref, cu = make_case(case, H=HV, group=group, token_gate=True)
    _check(kda_backward(**inputs, **kw, states=states, token_gate=True), ref, cu, f"GVA {group}, token gate, runs of 4")


@pytest.mark.parametrize("case, HV, group", GVA[1:], ids=GVA_IDS[1:])
def test_grouped_value_heads_in_runs_of_chunks_match_float64(case, HV, group, monkeypatch):
    from kernel.kda_backward import kda_backward

    force_runs(monkeypatch, 4)
    inputs, kw, states, ref, cu = make_case(case, H=HV, group=group)
    _check(kda_backward(**inputs, **kw), ref, cu, f"GVA {group} in runs of 4, recomputed states")


def test_grouped_value_heads_through_the_l2norm_s_backward_match_float64():
    from kernel.kda_backward import checked_batch, run

    inputs, kw, states, ref, cu = make_case(CASES[1], H=4, group=2, with_l2norm=True)
    rstd, cu_seqlens = kw.pop("rstd"), kw.pop("cu_seqlens")
    assert rstd[0].shape[2] == 2
    B, T = inputs["q"].shape[:2]
    batch = checked_batch(B, T, 2, cu_seqlens, scale=128 ** -0.5, torch_out=False, HV=4)
    out = run(batch, *(inputs[n] for n in ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")), rstd=rstd, **kw)
    _check(out, ref, cu, "GVA 2, the l2norm's backward")


def test_grouped_value_heads_give_the_bits_of_q_and_k_repeated():
    """In place or repeated per value head, every kernel reads the same rows: dv, dg, dbeta and dh0 are
    the same bits, dq and dk the repeated call's summed over each group; bf16 dq, dk are the fp32 sums
    rounded once."""
    import cupy

    from kernel.ds_scan.launch import bf16_bits
    from kernel.kda_backward import checked_batch, group_sum, run

    inputs, kw, _, _, _ = make_case(CASES[1], H=6, group=3, with_l2norm=True)
    rstd, cu_seqlens = kw.pop("rstd"), kw.pop("cu_seqlens")
    B, T = inputs["q"].shape[:2]
    rep = lambda x: cupy.ascontiguousarray(cupy.repeat(x, 3, axis=2))  # noqa: E731
    names = ("q", "k", "v", "g", "beta", "Aqk", "Akk", "do")

    def call(H, q, k, r, bf16=False):
        batch = checked_batch(B, T, H, cu_seqlens, scale=128 ** -0.5, torch_out=False, HV=6)
        return run(batch, q, k, *(inputs[n] for n in names[2:]), rstd=r, dqk_bf16=bf16, **kw)

    native = call(2, inputs["q"], inputs["k"], rstd)
    repeated = call(6, rep(inputs["q"]), rep(inputs["k"]), tuple(rep(x) for x in rstd))
    for n in ("dv", "dg", "dbeta", "dh0"):
        assert cupy.array_equal(native[n], repeated[n]), n
    for n in ("dq", "dk"):
        assert native[n].shape == (B, T, 2, 128) and cupy.array_equal(native[n], group_sum(repeated[n], 2)), n
    again, b16 = call(2, inputs["q"], inputs["k"], rstd), call(2, inputs["q"], inputs["k"], rstd, bf16=True)
    for n in ("dq", "dk"):
        assert cupy.array_equal(again[n], native[n]), f"{n}: two calls differ"
        assert b16[n].dtype == np.uint16 and cupy.array_equal(b16[n], bf16_bits(native[n])), n


@pytest.mark.parametrize("case, HV, group", GVA[:2], ids=GVA_IDS[:2])
def test_raw_q_and_k_with_grouped_value_heads_match_float64(case, HV, group):
    out, ref, cu = _run_raw(case, H=HV, group=group)
    assert out["dq"].shape[2] == HV // group
    _check(out, ref, cu, f"GVA {group}, raw q and k")


def test_grouped_value_heads_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    from kernel.kda_backward import kda_backward

    inputs, kw, _, ref, cu = make_case(CASES[0], H=4, group=2)
    as_t = lambda x: None if x is None else torch.as_tensor(x, device="cuda")  # noqa: E731
    t_in = {n: (as_t(x).view(torch.bfloat16) if x.dtype == np.uint16 else as_t(x)) for n, x in inputs.items()}
    out = kda_backward(**t_in, initial_state=as_t(kw["initial_state"]), dht=as_t(kw["dht"]), cu_seqlens=None)
    assert out["dq"].shape == out["dk"].shape == (2, 100, 2, 128) and out["dq"].dtype == torch.float32
    assert out["dv"].shape == (2, 100, 4, 128) and out["dh0"].shape == (2, 4, 128, 128)
    for name in GRADS:
        assert _rel(out[name].float().cpu().numpy().astype(np.float64), ref[name]) < BOUND, name


# ----------------------------------------------------------------------------
# Kernel A's sequence split inside the backward: only where Kernel A runs alone
# ----------------------------------------------------------------------------

def _segment_counts(monkeypatch):
    """Records the segment counts of every split Kernel A runs (kernel.ds_scan.launch._split_scan)."""
    from kernel.ds_scan import launch

    seen, real = [], launch._split_scan

    def recording(*args, **kwargs):
        seen.append(tuple(int(c) for c in args[4]))   # counts: segments per sequence
        return real(*args, **kwargs)

    monkeypatch.setattr(launch, "_split_scan", recording)
    return seen


@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_a_split_kernel_a_matches_float64_and_the_unsplit_scan(case, monkeypatch):
    """Given the states, Kernel A cut into up to 3 segments a sequence (as many as it has 64-token blocks):
    float64's bound, the same bits twice,
    and within rounding of the unsplit scan (the segments' incoming dS comes from the fold of their
    summaries, in fp32, not from the chain: not the unsplit bits)."""
    from kernel.kda_backward import kda_backward

    seen = _segment_counts(monkeypatch)
    inputs, kw, states, ref, cu = make_case(case)
    whole = kda_backward(**inputs, **kw, states=states, segments=1)
    assert seen == []
    split = [kda_backward(**inputs, **kw, states=states, segments=3) for _ in range(2)]
    lengths = np.diff(cu) if cu is not None else [case["T"]] * case["B"]
    assert len(seen) == 2 and list(seen[0]) == [min(3, -(-n // 64)) for n in lengths], seen
    _check(split[0], ref, cu, "split Kernel A")
    for name in GRADS:
        assert (split[0][name] == split[1][name]).all(), f"{name}: two split calls differ"
        a, s = _host(name, whole[name]), _host(name, split[0][name])
        assert _rel(s, a) < 1e-3, f"{name}: split vs unsplit, relative difference {_rel(s, a):.2e}"


def test_auto_splits_a_long_sequence_only_without_the_scan_beside_it(monkeypatch):
    """At one sequence of 5 x 2048 tokens x 2 heads, "auto" splits Kernel A given the states (and
    matches float64 there), and never when the forward-state scan runs beside it."""
    from kernel.kda_backward import kda_backward

    seen = _segment_counts(monkeypatch)
    inputs, kw, states, ref, cu = make_case(dict(B=1, T=10240, lengths=None, h0=True, dht=True))
    out = kda_backward(**inputs, **kw, states=states)
    assert seen == [(5,)], f"auto with the states given ran the splits {seen}"
    _check(out, ref, cu, "auto split, given states")
    kda_backward(**inputs, **kw, side_by_side=True)
    assert seen == [(5,)], "Kernel A was split beside the forward-state scan"
    kda_backward(**inputs, **kw, side_by_side=False)
    assert seen == [(5,), (5,)], "with the scans in turn, auto splits too"


def test_a_torch_call_s_split_allocates_through_torch_only():
    """The split's scratch (each segment's dS in and out, the summaries, the fold) comes from torch's
    caching allocator for a torch caller: CuPy's pool gains nothing."""
    torch = pytest.importorskip("torch")
    import cupy

    from kernel.kda_backward import kda_backward

    inputs, kw, states, ref, _ = make_case(CASES[0])
    as_t = lambda x: None if x is None else torch.as_tensor(x, device="cuda")  # noqa: E731
    bf = lambda x: as_t(x).view(torch.bfloat16)  # noqa: E731
    t_in = {n: (bf(x) if x.dtype == np.uint16 else as_t(x)) for n, x in inputs.items()}
    call = dict(initial_state=as_t(kw["initial_state"]), dht=as_t(kw["dht"]), cu_seqlens=None, states=bf(states),
                segments=3)
    kda_backward(**t_in, **call)   # the first call builds the modules and the split's cached tables
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    out = kda_backward(**t_in, **call)
    torch.cuda.synchronize()
    assert pool.used_bytes() == before, "a buffer of the split came from CuPy's pool"
    for name in GRADS:
        assert _rel(out[name].float().cpu().numpy().astype(np.float64), ref[name]) < BOUND, name
