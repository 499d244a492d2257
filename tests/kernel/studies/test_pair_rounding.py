"""kernel.studies.gradient_rounding.pair_rounding on the CPU: the pair walk's first-tile dS1 against the float64
dS scan, and its gradients' errors against today's."""
from __future__ import annotations

import numpy as np

from kernel.studies.gradient_rounding.pair_rounding import entering, pair_dS1, rows_for
from kernel.studies.gradient_rounding.rounding import tiles_of


def test_the_gradient_entering_a_tile_is_the_dS_scan_s_after_the_tile_before():
    """Unrounded, the formula from tile t's quantities gives the float64 scan's dS after tile t - 1 (an independent
    statement: kernel.reference.dstate_scan_reference walks the tiles backwards by Kernel A's G1-G5)."""
    blk, r, _, dS1 = tiles_of("random_inputs", 96, 2)
    for t in range(1, dS1.shape[0]):
        got = entering(blk, r, t, dS1[t], qd_two_parts=False, rounded=False)
        np.testing.assert_allclose(got, dS1[t - 1], rtol=0, atol=1e-12 * np.abs(dS1[t - 1]).max())
    paired = pair_dS1(blk, r, dS1, qd_two_parts=True)
    assert all(np.array_equal(paired[t], dS1[t]) for t in (1, 3, 5))            # stored: the second of each pair
    assert not np.array_equal(paired[0], dS1[0])                                # formed, in bf16 roundings
    assert np.linalg.norm(paired[0] - dS1[0]) < 1e-2 * np.linalg.norm(dS1[0])


def test_with_qd_in_two_parts_the_pairs_keep_today_s_errors():
    """Measured at T = 256 and 1024 (the study's README): within 1.04x of dS after every tile on both recipes; with
    Qd in one bf16, dv and dbeta up to 1.24x."""
    for recipe in ("unit", "random_inputs"):
        rows = rows_for(recipe, 256, 2)
        today, two = rows["dS1 after every tile (today)"], rows["after every second tile, Qd in two parts"]
        assert all(two[g] <= 1.05 * today[g] for g in today), (recipe, today, two)
