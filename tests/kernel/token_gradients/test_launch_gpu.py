"""Kernel B alone on the GPU (kernel.token_gradients.launch) against the float64 tile algebra, on
test_cuda's cases: the inputs the lane model replays (bf16 q, k, v, do, Mqk, INV, S0, dS1; fp32 g and
beta), the same float64 gradients, the same bound (test_cuda.BOUND, 3x the model's largest error).
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.shapes import HEAD_DIM

from .. import token_gradients_model as kb
from .test_cuda import (BOUND, GRADS, HEAD, QK_RAW_NORMS, TOKEN_GATE_CASES, WIDE_SPAN, H, _poisoned_states, _rel,
                        _wide_tile, edge_tile, emulate, make_case, token_gate_case)

pytestmark = pytest.mark.gpu



def _device(case: dict, token_gate: bool = False, run_chunks: int | str = "auto", timing: bool = False,
            qk_rstd: bool = False) -> dict:
    """Kernel B's gradients of the case, both heads, on the host (dv as fp32 values); with ``token_gate``, its
    token-gate build on each token's natural-log gate (case["g_natural"]); ``run_chunks``, ``timing``: launch's;
    the case's rstd where it has one (the l2norm's backward); ``qk_rstd``: the qk_rstd build on the raw rows,
    case["raw"]."""
    import cupy

    from kernel.token_gradients import launch

    inp = case["inputs"]
    tokens = inp.v.shape[0]
    wide = (tokens, H, HEAD_DIM)
    out = {"dq": cupy.empty(wide, np.float32), "dk": cupy.empty(wide, np.float32),
           "dv": cupy.empty(wide, np.uint16), "dg": cupy.empty(wide, np.float32),
           "dbeta": cupy.empty((tokens, H), np.float32)}
    dev = cupy.asarray
    arrays = {n: dev(getattr(inp, n)) for n in ("q", "k", "v", "g", "beta", "aqk", "akk", "do", "ds", "states")}
    if token_gate:
        arrays["g"] = dev(case["g_natural"])
    if qk_rstd:
        arrays["q"], arrays["k"] = dev(case["raw"]["q"]), dev(case["raw"]["k"])
    rstd = None if inp.q_rstd is None else (dev(inp.q_rstd), dev(inp.k_rstd))
    launch.launch(*arrays.values(), cu=inp.cu, H=H, HV=H, scale=inp.scale, out=out, token_gate=token_gate,
                  run_chunks=run_chunks, timing=timing, rstd=rstd, qk_rstd=qk_rstd)
    cupy.cuda.get_current_stream().synchronize()
    got = {n: x.get() for n, x in out.items()}
    got["dv"] = kb.dv_values(got["dv"])
    return got


def _tile_errors(case: dict, got: dict, t: int) -> dict:
    ref = case["ref"][t]
    return {n: _rel(got[n][ref["rows"], HEAD], ref[n]) for n in GRADS}


def test_a_tile_within_fp32s_range_but_past_the_span_limit_matches_float64(monkeypatch):
    case = make_case(48, seed=0, wide=edge_tile(WIDE_SPAN, slice(None)))
    out, _ = emulate(case)
    assert out.pairwise == [False, True, False]           # the lane model takes the pairwise path there
    monkeypatch.setattr(kb, "SPAN_LIMIT", np.float32(126.0))
    _, flushed = emulate(case)
    assert max(_tile_errors(case, flushed, 1).values()) > BOUND   # what the test would see at 126
    got = _device(case)
    for t in range(len(case["ref"])):
        errs = _tile_errors(case, got, t)
        print(f"tile {t}: " + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
        assert all(np.isfinite(got[n][case["ref"][t]["rows"], HEAD]).all() for n in GRADS), t
        assert all(e < BOUND for e in errs.values()), (t, errs)


@pytest.mark.parametrize("T, recipe, wide", TOKEN_GATE_CASES)
def test_the_token_gate_build_gives_the_cumsum_builds_gradients(T, recipe, wide):
    """The cumsum folded into Kernel B (docs/kda_forward.md, section 8): summed in R1 from each token's gate,
    the gradients keep the cumsum build's errors against float64 (the two differ by the gate's fp32 rounding:
    within 1.0006x on the forward's model, tests/kernel/test_gate_fold_model.py), on whole and partial tiles
    and on a tile past the span limit (the pairwise path)."""
    case = token_gate_case(T, recipe, wide)
    cumsum, token = _device(case), _device(case, token_gate=True)
    for t in range(len(case["ref"])):
        before, after = _tile_errors(case, cumsum, t), _tile_errors(case, token, t)
        print(f"tile {t}: " + "  ".join(f"{n} {before[n]:.3e} -> {after[n]:.3e}" for n in GRADS))
        assert all(np.isfinite(token[n][case["ref"][t]["rows"], HEAD]).all() for n in GRADS), t
        assert all(after[n] < BOUND and 0.9 * before[n] < after[n] < 1.1 * before[n] for n in GRADS), (t, before, after)


@pytest.mark.parametrize("T", [100, 256])
def test_runs_of_chunks_carry_the_state_and_match_float64(T):
    """Two chunks (the second partial) and four: at every run length the gradients are within the bound of
    float64 on every tile; a run never reads the stored state of a chunk it entered by carrying (NaN there
    changes nothing); the walk at one chunk a run reads it (NaN shows); two calls give the same bits."""
    case = make_case(T, seed=3)
    chunks = len(case["inputs"].states)
    for run_chunks in (1, 2, 4):
        got = _device(case, run_chunks=run_chunks)
        for t in range(len(case["ref"])):
            errs = _tile_errors(case, got, t)
            assert all(e < BOUND for e in errs.values()), (run_chunks, t, errs)
        print(f"run_chunks {run_chunks}: last tile " + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
        assert _bits(got) == _bits(_device(case, run_chunks=run_chunks))
        carried = [c for c in range(1, chunks) if c % run_chunks]   # chunks a run enters by carrying
        for c in carried:
            poisoned = _device(_poisoned_states(case, c), run_chunks=run_chunks)
            assert _bits(poisoned) == _bits(got), (run_chunks, c)
    poisoned = _device(_poisoned_states(case, 1), run_chunks=1)
    assert np.isnan(poisoned["dq"][64:80, HEAD]).all()


def _bits(got: dict) -> list[bytes]:
    return [got[n].tobytes() for n in GRADS]


def test_the_timing_build_without_a_buffer_runs_clean_and_gives_the_plain_bits():
    """Its clock reads change no arithmetic, and with no buffer pointed (kdb_timing null, as after a profile) its
    flush stores nothing (without the guard, lane 0 would store to address 0 and fault the context)."""
    import cupy

    case = make_case(100, seed=3)
    timed = _device(case, timing=True, run_chunks=2)
    cupy.cuda.Device().synchronize()
    assert _bits(timed) == _bits(_device(case, run_chunks=2))



@pytest.mark.parametrize("token_gate", [False, True])
@pytest.mark.parametrize("shape", ["tiles", "wide"])
def test_the_qk_rstd_build_on_raw_rows_gives_the_plain_builds_bits(shape, token_gate):
    """Raw q and k rows of norms 3 and 0.2 with their rstd: the qk_rstd build gives the bits the plain build gives
    on the rows bf16(x rstd) with the same rstd (R1 rebuilds exactly those rows, and everything after reads them),
    on whole and partial tiles and through the pairwise path; and within the bound of float64 on every tile."""
    case = (make_case(48, seed=0, wide=_wide_tile, raw_norms=QK_RAW_NORMS) if shape == "wide"
            else make_case(45, seed=2, raw_norms=QK_RAW_NORMS))
    raw = _device(case, token_gate=token_gate, qk_rstd=True)
    assert _bits(raw) == _bits(_device(case, token_gate=token_gate))
    for t in range(len(case["ref"])):
        errs = _tile_errors(case, raw, t)
        print(f"tile {t}: " + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
        assert all(e < BOUND for e in errs.values()), (t, errs)
