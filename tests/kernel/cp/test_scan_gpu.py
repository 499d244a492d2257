"""kernel.cp's GPU pair (Kernel A) on one GPU: every rank's part in turn = the unsplit kernel.

cp_dstate_scan_serial runs the parts of one sequence in rank order in this process, with
kernel_summary and kernel_scan: the (M, d) summaries by Kernel A, folded in float64, then each
part's scan from its true incoming dS. Its snapshots, concatenated, and rank 0's dS_out (dh0)
are compared with Kernel A on the whole sequence and with the float64 reference. The split
adds its own rounding (M and d are Kernel A's fp32 results, with dS a bf16 operand at every
tile), so it is held to the unsplit kernel's bound against float64 (kernel.tools.check.BOUND),
and to SPLIT_RTOL against the unsplit kernel.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel import cp
from kernel.tools import check

pytestmark = pytest.mark.gpu

SPLIT_RTOL = 5e-3       # split vs unsplit kernel, relative Frobenius per output (both ~1e-3 off float64)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# one sequence: parts cut inside 64-token snapshot groups and on their edges, the last tile partial
CASES = [dict(T=200, cuts=(48,), every=1), dict(T=200, cuts=(16, 64, 144), every=4),
         dict(T=333, cuts=(64, 128, 256), every=4), dict(T=100, cuts=(), every=1)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c['T']}-cuts{'-'.join(map(str, c['cuts']))}-e{c['every']}")
def test_the_ranks_parts_in_turn_equal_the_unsplit_kernel(case):
    import cupy

    from kernel.ds_scan.launch import dstate_scan
    from kernel.reference import dstate_scan_reference

    kern, ref = check.inputs(check.Case("cp", B=1, T=case["T"], H=2, dht=True))
    e = case["every"]
    whole = {n: kern[n] for n in cp.INPUT_NAMES}
    bounds = list(zip((0,) + case["cuts"], case["cuts"] + (case["T"],)))
    parts = [cp.shard({**whole, "dht": kern["dht"]}, r, len(bounds), tokens=b) for r, b in enumerate(bounds)]
    options = cp.ScanOptions(tile=16, snapshot_every=e)
    out = cp.cp_dstate_scan_serial(parts, options, summary_fn=cp.kernel_summary, scan_fn=cp.kernel_scan)
    snaps = cupy.concatenate([s for s, _ in out], axis=1).get().astype(np.float64)
    dh0 = out[0][1].get().astype(np.float64)

    un_snaps, un_dh0 = dstate_scan(*(kern[n] for n in cp.INPUT_NAMES), dht=kern["dht"], snapshot_every=e)
    r_snaps, r_dh0 = dstate_scan_reference(*(ref[n] for n in cp.INPUT_NAMES), dht=ref["dht"], snapshot_every=e)
    un_snaps, un_dh0 = un_snaps.get().astype(np.float64), un_dh0.get()[0].astype(np.float64)
    r_snaps, r_dh0 = cupy.asnumpy(r_snaps), cupy.asnumpy(r_dh0)[0]
    assert snaps.shape == un_snaps.shape, (snaps.shape, un_snaps.shape)
    errs = {"snapshots vs unsplit": _rel(snaps, un_snaps), "dh0 vs unsplit": _rel(dh0, un_dh0),
            "snapshots vs float64": _rel(snaps, r_snaps), "dh0 vs float64": _rel(dh0, r_dh0),
            "unsplit snapshots vs float64": _rel(un_snaps, r_snaps), "unsplit dh0 vs float64": _rel(un_dh0, r_dh0)}
    print(case, "  ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert errs["snapshots vs unsplit"] < SPLIT_RTOL and errs["dh0 vs unsplit"] < SPLIT_RTOL, errs
    assert errs["snapshots vs float64"] < check.BOUND and errs["dh0 vs float64"] < check.BOUND, errs
    # rank r's dS_out is the unsplit scan's dS at its part's first token: the snapshot of the tile before
    every_tile, _ = dstate_scan(*(kern[n] for n in cp.INPUT_NAMES), dht=kern["dht"], snapshot_every=1)
    for r, (start, _) in enumerate(bounds[1:], start=1):
        want = every_tile.get()[0, start // 16 - 1].astype(np.float64)
        assert _rel(out[r][1].get().astype(np.float64), want) < SPLIT_RTOL, f"rank {r}'s dS_out"


def test_a_summary_maps_the_incoming_ds_like_the_scan():
    """(M, d) by Kernel A against the part's own scan from a random incoming dS: M X + d = the scan's dS_out."""
    import cupy

    kern, _ = check.inputs(check.Case("cp", B=1, T=160, H=2, dht=True))
    whole = {n: kern[n] for n in cp.INPUT_NAMES}
    part = cp.shard(whole, 1, 2, tokens=(64, 160))
    part = cp.Part(part.inputs, 64, 160, 200)           # as a middle part: not the sequence's end
    options = cp.ScanOptions(tile=16)
    M, d = cp.kernel_summary(part, options)
    X = kern["dht"][0]
    _, out = cp.kernel_scan(part, X, options)
    mapped = cupy.einsum("hkj,hjv->hkv", M.astype(np.float64), X.astype(np.float64)) + d
    assert _rel(mapped.get(), out.get().astype(np.float64)) < SPLIT_RTOL
