"""kernel.forward_products on the CPU: the chunk table and the plan (its checks are kernel.forward's, tested
there). The arguments are stand-ins for GPU arrays (no memory), so every check runs without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward_products import Config, all_variants, chunk_table, plan_products

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


@pytest.mark.parametrize("token_gate", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_the_build_follows_the_inputs_forms(token_gate, l2norm):
    plan = plan_products(*_args(), token_gate=token_gate, l2norm=l2norm)
    assert plan.config == Config(token_gate=token_gate, l2norm=l2norm)
    # q and k normalised and their rstd go out for the backward in training only
    assert plan.writes_norms == l2norm
    assert not plan_products(*_args(), training=False, token_gate=token_gate, l2norm=l2norm).writes_norms


def test_without_norm_copies_the_l2norm_build_writes_the_rstd_alone(monkeypatch):
    from kernel.forward_products import launch

    monkeypatch.setattr(launch, "empty_output", lambda shape, dtype, device: (shape, shape))   # no GPU memory
    plan = plan_products(*_args(B=2, T=70, H=3), l2norm=True, norm_copies=False)
    assert plan.writes_norms and not plan.norm_copies
    shapes = launch.allocate(plan)[0]
    assert shapes["q_rstd"] == shapes["k_rstd"] == (2, 70, 3) and shapes["q"] is shapes["k"] is None
    assert launch.allocate(plan_products(*_args(B=2, T=70, H=3), l2norm=True))[0]["q"] == (2, 70, 3, D)
    with pytest.raises(TypeError, match="norm_copies must be True or False, got 0"):
        plan_products(*_args(), l2norm=True, norm_copies=0)


def test_a_build_for_other_inputs_is_refused_by_name():
    with pytest.raises(ValueError, match="config products-tg is the build for token_gate=True, but the call passes "
                                         "token_gate=False"):
        plan_products(*_args(), config=Config(token_gate=True))
    with pytest.raises(ValueError, match="config products is the build for l2norm=False, but the call passes "
                                         "l2norm=True"):
        plan_products(*_args(), l2norm=True, config=Config())
    with pytest.raises(TypeError, match="config must be a kernel.forward_products.Config"):
        plan_products(*_args(), config="products")
    # -lineinfo is not a form of the inputs: any call takes it
    assert plan_products(*_args(), token_gate=True, config=Config(token_gate=True, lineinfo=True)).config.lineinfo


def test_the_config_takes_booleans_only():
    with pytest.raises(ValueError, match="Config.token_gate must be True or False, got 1"):
        Config(token_gate=1)
    assert [c.name() for c in all_variants()] == ["products", "products-tg", "products-l2", "products-tg-l2"]
