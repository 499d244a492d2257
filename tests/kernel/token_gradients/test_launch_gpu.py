"""Kernel B alone on the GPU (kernel.token_gradients.launch) against the float64 tile algebra, on
test_cuda's cases: the inputs the lane model replays (bf16 q, k, v, do, Mqk, INV, S0, dS1; fp32 g and
beta), the same float64 gradients, the same bound (test_cuda.BOUND, 3x the model's largest error).
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.shapes import HEAD_DIM

from .. import token_gradients_model as kb
from .test_cuda import (BOUND, GRADS, HEAD, TOKEN_GATE_CASES, WIDE_SPAN, H, _rel, edge_tile, emulate, make_case,
                        token_gate_case)

pytestmark = pytest.mark.gpu



def _device(case: dict, token_gate: bool = False) -> dict:
    """Kernel B's gradients of the case's one chunk, both heads, on the host (dv as fp32 values); with
    ``token_gate``, its token-gate build on each token's natural-log gate (case["g_natural"])."""
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
    launch.launch(*arrays.values(), cu=inp.cu, H=H, HV=H, scale=inp.scale, out=out, token_gate=token_gate)
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
