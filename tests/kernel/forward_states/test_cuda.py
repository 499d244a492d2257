"""kernel/forward_states/cuda on the CPU: the tile step's fragment layouts run through ptx_lab's exact
CPU model of the instructions, and every variant's compile (where nvcc is on PATH), Kernel S's and the
forward's (kernel/forward/cuda, built on Kernel S's headers)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kernel import forward as kf
from kernel import forward_states as fs

from ..chain_fragments import BLK_STRIDE, D, OP_STRIDE, SNAP_STRIDE, acc_of, bf16, chain_step, image
from ..forward_states_cases import two_parts


# ----------------------------------------------------------------------------
# one warp's tile step through ptx_lab.model: the .cu's addresses and registers, lane by lane
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("g6_split", fs.G6_SPLITS)
def test_the_tile_step_fragments_compute_the_tile_algebra(g6_split):
    rng = np.random.default_rng(7)
    S = rng.standard_normal((D, 16)).astype(np.float32)        # this warp's 16 v columns of S [K, V]
    Kd, Kr = bf16(rng.standard_normal((16, D))), bf16(rng.standard_normal((16, D)))
    v = bf16(rng.standard_normal((16, 16)))                     # [token][v]
    beta = rng.uniform(0.2, 1.0, 16).astype(np.float32)
    INV = bf16(np.tril(rng.standard_normal((16, 16))))
    gamma = rng.uniform(0.3, 1.0, D).astype(np.float32)
    acc = acc_of(S.T)

    # the chain's step, the snapshot staged by stmatrix .trans of G6's A fragments
    snap = np.zeros(D * SNAP_STRIDE * 2, dtype=np.uint8)
    _, snap = chain_step(acc, image(Kd, OP_STRIDE), image(Kr, OP_STRIDE), image(INV, BLK_STRIDE), v, beta, gamma,
                         g6_split, staging=snap)
    staged = (snap.view(np.uint16).reshape(D, SNAP_STRIDE)[:, :16].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(staged, bf16(S))             # the staging tile is S [k][v], rounded

    # the same tile in matrix algebra, with bf16 at the same points
    f64 = np.float64
    P = Kd.astype(f64) @ bf16(S).astype(f64)                    # [token][v]
    W = beta[:, None] * (v - P)
    U = INV.astype(f64) @ np.add(*two_parts(W)).astype(f64)   # W in two bf16 parts
    S1 = gamma[:, None] * S + Kr.T.astype(f64) @ bf16(U).astype(f64)
    got = acc_of(S1.T)
    # the model sums in float64 like the algebra: measured equal to the last fp32 bit (0.0 relative);
    # a wrong fragment order or .trans gives O(1) (a Kr read without .trans: 1.27)
    assert np.linalg.norm(acc - got) <= 1e-6 * np.linalg.norm(got)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("room, counts", [
    # Kernel S: the three products and the load, 16 + 4 + 16 HMMA (W's two parts: G7 twice), 8 + 1 + 8 LDSM;
    # the snapshot's 8 STSM
    (fs, (36, 17, 8, 0)),
    # the forward's consumers: G6 16, F1 16, G7 4, G8 16, F2 2 HMMA; Kd, Qd, Kr 8 each, INV, Mqk 1 LDSM; the
    # snapshot's 8 STSM and o's 1. Its producers: Qe Kr^T and Ke Kr^T, 16 HMMA and 16 LDSM each.
    (kf, (54 + 32, 26 + 32, 9, 0))], ids=["forward_states", "forward"])
def test_every_variant_compiles_without_spills_and_holds_its_instructions(tmp_path, room, counts):
    # what `ptx-lab resources --check` (CI's section 4) judges, for each scan's variants alone (HMMA, LDSM,
    # STSM, MOVM counted)
    from kernel.tools import resources

    for cfg in room.all_variants():
        row = resources.compile_variant(room.BUILD, cfg, tmp_path)
        assert "error" not in row, row.get("error")
        assert row["threads"] == cfg.threads and row["ctas_per_sm"] >= 1
        assert resources.problems(row) == [], (room.BUILD.label(cfg), resources.problems(row))
        assert row["spill"] == 0 and row["stack"] == 0, row["log"]
        assert row["smem"] == cfg.smem_bytes, (cfg.name(), row["smem"], cfg.smem_bytes)   # Config's sum is the source's
        if row["sass"] is not None:
            assert (row["sass"]["HMMA"], row["sass"]["LDSM"], row["sass"]["STSM"], row["sass"]["MOVM"]) == counts, \
                (cfg.name(), row["sass"])
