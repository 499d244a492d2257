"""kernel.forward_products on the CPU: the chunk table and the plan (its checks are kernel.forward's, tested
there). The arguments are stand-ins for GPU arrays (no memory), so every check runs without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward_products import chunk_table, plan_products

from ..ds_scan.test_fla import DeviceArray

D = 128
BF16 = np.uint16


def _args(B=1, T=441, H=2, HV=None):
    HV = H if HV is None else HV
    return (DeviceArray((B, T, H, D), BF16), DeviceArray((B, T, H, D), BF16), DeviceArray((B, T, HV, D), BF16),
            DeviceArray((B, T, HV, D), np.float32), DeviceArray((B, T, HV), np.float32))


def test_the_chunk_table_cuts_each_sequence_from_its_start():
    table = chunk_table(np.array([0, 1, 66, 200]))
    np.testing.assert_array_equal(table, [[0, 1], [1, 64], [65, 1], [66, 64], [130, 64], [194, 6]])


def test_the_plan_counts_chunks_per_sequence():
    lengths = [1, 15, 16, 17, 63, 64, 65, 200]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    plan = plan_products(*_args(T=int(cu[-1])), cu_seqlens=cu)
    np.testing.assert_array_equal(plan.cu_chunks, np.concatenate([[0], np.cumsum([-(-n // 64) for n in lengths])]))
    assert plan.chunks == len(chunk_table(cu)) == 12 and plan.training and plan.scale == D ** -0.5


def test_batches_are_sequences_of_T_and_value_heads_follow_v():
    plan = plan_products(*_args(B=3, T=130, H=2, HV=6), scale=0.5, training=False)
    assert (plan.B, plan.T, plan.H, plan.HV, plan.chunks, plan.scale) == (3, 130, 2, 6, 9, 0.5)
    assert not plan.training


def test_the_forwards_checks_name_the_argument():
    q, k, v, g, beta = _args()
    with pytest.raises(ValueError, match="g must have shape"):
        plan_products(q, k, v, DeviceArray((1, 441, 2, 64), np.float32), beta)
