"""kernel.studies.gradient_rounding: each rounding hook is the reference when nothing is rounded, and
the study's findings hold on a short sequence (the GPU measurement is in docs/log/29)."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.reference import dstate_scan_reference
from kernel.reference import kda as ref_kda
from kernel.studies.gradient_rounding import rounding, scan_rounding


@pytest.mark.parametrize("recipe", ["unit", "random_inputs"])
def test_nothing_rounded_is_the_reference(recipe):
    blk, r, S0, dS1 = rounding.tiles_of(recipe, 64, 1)
    want = ref_kda._tile_backward(np, blk, r, S0, dS1)
    got = rounding.tile_backward(blk, r, S0, dS1, frozenset({"gate-fp32"}))
    for g in rounding.GRADS:
        assert rounding.rel_fro(got[g], want[g]) < 1e-13, g


def test_gate_products_of_the_bf16_operands_and_two_part_da_cut_the_errors():
    rows = rounding.rows_for("unit", 256, 1, {"before": rounding.KERNEL_BEFORE,
                                              "gate-bf16": frozenset(rounding.GROUPS) | {"gate-bf16"},
                                              "after": rounding.KERNEL_AFTER})
    assert rows["gate-bf16"]["dg"] < 0.75 * rows["before"]["dg"]      # 1024 tokens: 3.59e-3 vs 5.87e-3
    assert rows["after"]["dq"] < 0.95 * rows["gate-bf16"]["dq"]       # 2.05e-3 vs 2.24e-3
    assert rows["after"]["dg"] < rows["gate-bf16"]["dg"]


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        rounding.main(["--T", "100"])
    assert exc.value.code == 2 and "multiple of 16" in capsys.readouterr().err


# ---------------------------------------------------------------- the scan (dh0)


@pytest.mark.parametrize("recipe", ["unit", "random_inputs"])
def test_the_scan_unrounded_is_the_reference(recipe):
    q, k, gc, beta, mqk, inv, do, dht = scan_rounding.scan_inputs(recipe, 64, 2)
    got = scan_rounding.scan(q, k, gc, beta, mqk, inv, do, dht, frozenset())
    _, want = dstate_scan_reference(q[None], k[None], gc[None], beta[None], mqk[None], inv[None], do[None],
                                    dht=dht[None], qk_l2norm=False)
    assert rounding.rel_fro(got, want[0]) < 1e-13


def test_qds_rounding_makes_dh0s_error():
    rows = scan_rounding.rows_for("unit", 256, 1, scan_rounding.variants())
    assert rows["qd alone"] > 0.8 * rows["every group"]            # 4096 tokens: 1.67e-3 of 1.67e-3
    assert rows["every group but qd"] < 0.3 * rows["every group"]  # 1.66e-4
    # qd in two bf16 parts (Kernel A's G4 since log 31) is as good as qd unrounded
    assert rows["every group, qd in two parts"] < 1.05 * rows["every group but qd"]
