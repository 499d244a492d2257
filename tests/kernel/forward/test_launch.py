"""kernel.forward.launch on the CPU: the plan's outputs, scale and flags and the launch's arguments.
The refusals and the grid it shares with Kernel S (kernel.forward_states.launch's check_batch and
ScanPlan) are tested for both scans in tests/kernel/forward_states/test_launch.py.

The arguments are stand-ins for GPU arrays (tests/kernel/scan_stand_ins.py), so every check runs
without a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.forward import Config, launch, plan_forward
from kernel.forward.config import KERNEL_NAME, SOURCE_PATH
from kernel.runtime import builds

from ..ds_scan.test_fla import DeviceArray
from ..kernel_signature import launched
from ..scan_stand_ins import BF16, C64, FORWARD, D

_args, _call = FORWARD.args, FORWARD.call


# ----------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("beta_dtype", [np.float32, BF16])
@pytest.mark.parametrize("h0", [False, True])
def test_training_plans_every_output(beta_dtype, h0):
    a, kw = _args(B=2, T=130, H=3, h0=h0, beta_dtype=beta_dtype)
    plan = _call(plan_forward, a, kw, training=True, output_final_state=True)
    assert plan.o_shape == (2, 130, 3, D)
    assert plan.final_shape == (2, 3, D, D)
    assert plan.states_shape == (2, 3, 3, D, D)          # ceil(130 / 64) = 3 entries a sequence
    assert plan.blocks_shape == (2, 130, 3, C64)
    assert plan.beta_bf16 == (beta_dtype is BF16) and plan.has_initial_state == h0
    assert plan.N == 2 and not plan.torch_out and plan.device == 0
    np.testing.assert_array_equal(plan.snapshot_offsets, [0, 3, 6])


def test_inference_plans_o_alone_and_the_final_state_when_asked():
    a, kw = _args(B=2, T=130, H=3)
    plan = _call(plan_forward, a, kw)
    assert plan.o_shape == (2, 130, 3, D)
    assert (plan.final_shape, plan.states_shape, plan.blocks_shape) == (None, None, None)
    assert _call(plan_forward, a, kw, output_final_state=True).final_shape == (2, 3, D, D)


def test_the_scale_defaults_to_flas_and_is_checked():
    a, kw = _args()
    assert _call(plan_forward, a, kw).scale == D ** -0.5
    assert _call(plan_forward, a, kw, scale=0.25).scale == 0.25
    with pytest.raises(ValueError, match=r"scale must be finite and > 0 \(the forward's q scale\), got -1"):
        _call(plan_forward, a, kw, scale=-1)
    with pytest.raises(TypeError, match="scale must be a real number or None, got 'x'"):
        _call(plan_forward, a, kw, scale="x")


@pytest.mark.parametrize("name", ["training", "output_final_state", "token_gate", "l2norm"])
def test_the_flags_are_booleans(name):
    a, kw = _args()
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got 1"):
        _call(plan_forward, a, kw, **{name: 1})


def test_the_l2norm_build_writes_q_and_k_normalised_in_training_alone():
    a, kw = _args(B=2, T=130, H=3)
    plan = _call(plan_forward, a, kw, l2norm=True, training=True)
    assert plan.config.l2norm and plan.norm_shape == (2, 130, 3, D)
    assert _call(plan_forward, a, kw, l2norm=True).norm_shape is None   # inference: q and k used, not kept
    assert _call(plan_forward, a, kw, training=True).norm_shape is None
    with pytest.raises(ValueError, match=r"is the build for l2norm=False, but the call passes l2norm=True"):
        _call(plan_forward, a, kw, l2norm=True, config=Config(warps=2))


def _rstd(B=2, T=130, H=3, dtype=np.float32):
    """Stand-ins for q's and k's rstd."""
    return DeviceArray((B, T, H), dtype), DeviceArray((B, T, H), dtype)


def test_rstd_picks_the_qk_rstd_build_and_is_checked():
    a, kw = _args(B=2, T=130, H=3)
    plan = _call(plan_forward, a, kw, rstd=_rstd(), training=True)
    assert plan.config.qk_rstd and not plan.config.l2norm and plan.norm_shape is None   # no copies written
    assert not _call(plan_forward, a, kw).config.qk_rstd
    with pytest.raises(TypeError, match=r"rstd must be a pair \(q_rstd, k_rstd\) or None, got DeviceArray"):
        _call(plan_forward, a, kw, rstd=_rstd()[0])
    with pytest.raises(ValueError, match="rstd and l2norm=True are two ways of normalising q and k"):
        _call(plan_forward, a, kw, rstd=_rstd(), l2norm=True)
    with pytest.raises(ValueError, match=r"k_rstd must have shape \(2, 130, 3\) \(\[B, T, H\], fp32"):
        _call(plan_forward, a, kw, rstd=(_rstd()[0], _rstd(T=129)[1]))
    with pytest.raises(TypeError, match="q_rstd must be float32"):
        _call(plan_forward, a, kw, rstd=_rstd(dtype=BF16))
    with pytest.raises(ValueError, match=r"is the build for qk_rstd=False, but the call passes qk_rstd=True"):
        _call(plan_forward, a, kw, rstd=_rstd(), config=Config(warps=2))


def test_the_launch_passes_the_given_rstd_where_the_l2norm_build_writes_its_own(monkeypatch):
    a, kw = _args(B=1, T=200, H=2, HV=2)
    cfg = Config(warps=2, qk_rstd=True)
    plan = _call(plan_forward, a, kw, rstd=_rstd(B=1, T=200, H=2), config=cfg, training=True)
    calls = []
    monkeypatch.setattr(builds, "device_tables", lambda cu, every: ("cu", "offs", "order", int(plan.snapshot_offsets[-1])))
    monkeypatch.setattr(launch, "kernel", lambda cfg: (lambda *call, **kw: calls.append((call, kw)), 123, cfg.threads))
    outs = ("o", "final", "states", "aqk", "akk")
    launch.launch_planned(plan, "q", "k", "v", "g", "beta", "h0", *outs, rstd=("qr", "kr"))
    got = launched(SOURCE_PATH, KERNEL_NAME, calls[0][0][2])
    assert (got["q_rstd"], got["k_rstd"]) == ("qr", "kr")
    assert got["q_norm"] == got["k_norm"] == np.uint64(0)   # null: no copies
    with pytest.raises(ValueError, match="reads rstd, but rstd is missing"):
        launch.launch_planned(plan, "q", "k", "v", "g", "beta", "h0", *outs)


def test_the_token_gate_picks_its_build_and_a_config_must_agree():
    a, kw = _args()
    assert _call(plan_forward, a, kw, token_gate=True).config.token_gate
    assert not _call(plan_forward, a, kw).config.token_gate
    with pytest.raises(ValueError, match=r"config w2-p2-st4-g4 is the build for token_gate=False, but the call "
                                         r"passes token_gate=True: the inputs' form must be the build's"):
        _call(plan_forward, a, kw, token_gate=True, config=Config(warps=2))
    assert _call(plan_forward, a, kw, token_gate=True, config=Config(warps=2, token_gate=True)).config.token_gate


def test_varlen_states_are_packed_by_flas_chunk_offsets():
    lengths = [1, 15, 16, 17, 63, 64, 65, 200]
    a, kw = _args(B=1, T=sum(lengths), H=2, N=len(lengths), h0=True)
    plan = _call(plan_forward, a, kw, cu_seqlens=np.cumsum([0] + lengths), training=True, output_final_state=True)
    chunk_offsets = np.concatenate([[0], np.cumsum([-(-n // C64) for n in lengths])])   # FLA's prepare_chunk_offsets
    np.testing.assert_array_equal(plan.snapshot_offsets, chunk_offsets)
    assert plan.states_shape == (1, int(chunk_offsets[-1]), 2, D, D)
    assert plan.final_shape == (len(lengths), 2, D, D) and plan.blocks_shape == (1, sum(lengths), 2, C64)


def test_grouped_value_heads_size_o_by_value_heads():
    # FLA's GVA: q and k with 2 heads, v, g, beta, h0 and every output with 8 (the grid: for both scans
    # in tests/kernel/forward_states/test_launch.py)
    a, kw = _args(B=2, T=130, H=2, HV=8, h0=True)
    plan = _call(plan_forward, a, kw, training=True, output_final_state=True)
    assert plan.o_shape == (2, 130, 8, D) and plan.final_shape == (2, 8, D, D)
    assert plan.blocks_shape == (2, 130, 8, C64)


@pytest.mark.parametrize("training, final", [(True, True), (False, False)])
def test_the_launch_passes_every_argument_where_the_kernel_takes_it(monkeypatch, training, final):
    a, kw = _args(B=1, T=200, H=2, HV=6, h0=True)
    plan = _call(plan_forward, a, kw, config=Config(warps=2), scale=0.5, training=training, output_final_state=final)
    calls = []
    monkeypatch.setattr(builds, "device_tables", lambda cu, every: ("cu", "offs", "order", int(plan.snapshot_offsets[-1])))
    monkeypatch.setattr(launch, "kernel", lambda cfg: (lambda *call, **kw: calls.append((call, kw)), 123, cfg.threads))
    outs = ("o", "final", "states", "aqk", "akk") if training else ("o", None, None, None, None)
    launch.launch_planned(plan, "q", "k", "v", "g", "beta", "h0", *outs)
    (grid, block, args), opts = calls[0]
    assert grid == (1 * 6 * 4,) and block == (Config(warps=2).threads,) and opts == {"shared_mem": 123}
    got = launched(SOURCE_PATH, KERNEL_NAME, args)
    assert [got[n] for n in ("q", "k", "v", "g", "beta", "h0", "o")] == ["q", "k", "v", "g", "beta", "h0", "o"]
    assert got["scale"] == np.float32(0.5) and got["scale"].dtype == np.float32
    if training:
        assert [got[n] for n in ("final_state", "states", "aqk", "akk")] == ["final", "states", "aqk", "akk"]
    else:
        assert all(got[n] == np.uint64(0) for n in ("final_state", "states", "aqk", "akk"))   # null: not written
    assert (got["cu_seqlens"], got["snap_offsets"], got["order"]) == ("cu", "offs", "order")
    assert (got["HV"], got["H"]) == (6, 2)


def test_the_launch_takes_the_product_warps_threads(monkeypatch):
    # the block is the module's kf_threads (checked against Config.threads when the kernel is read): with
    # product warps 32 (warps + producers + product warps)
    cfg = Config(warps=1, producers=4, nstage=5, product_warps=2)
    a, kw = _args(B=1, T=200, H=2, HV=2)
    plan = _call(plan_forward, a, kw, config=cfg)
    calls = []
    monkeypatch.setattr(builds, "device_tables", lambda cu, every: ("cu", "offs", "order", int(plan.snapshot_offsets[-1])))
    monkeypatch.setattr(launch, "kernel", lambda c: (lambda *call, **kw: calls.append((call, kw)), 456, c.threads))
    launch.launch_planned(plan, "q", "k", "v", "g", "beta", None, "o", None, None, None, None)
    (grid, block, _), opts = calls[0]
    assert grid == (1 * 2 * 8,) and block == (32 * (1 + 4 + 2),) and opts == {"shared_mem": 456}
