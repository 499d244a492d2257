"""kernel.forward.launch on the CPU: every refusal (naming the argument, expected vs received), the plan
and the launch's arguments.

The arguments are stand-ins for GPU arrays (tests/kernel/ds_scan/test_fla.py's DeviceArray: the CUDA
array interface and a device id, no memory), so every check runs without a GPU.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from kernel.forward import Config, forward, launch, plan_forward
from kernel.forward.config import KERNEL_NAME, SOURCE_PATH
from kernel.runtime import builds

from ..ds_scan.test_fla import DeviceArray
from ..kernel_signature import launched

D, C64 = 128, 64
BF16 = np.uint16
NAMES = ("q", "k", "v", "g", "beta")


def _args(B=2, T=100, H=3, *, HV=None, h0=False, beta_dtype=np.float32, N=None):
    """Stand-ins: q, k with H heads, the others with HV (None: H; more: FLA's grouped value heads)."""
    N = B if N is None else N
    HV = H if HV is None else HV
    qk, wide = (B, T, H, D), (B, T, HV, D)
    a = dict(q=DeviceArray(qk, BF16), k=DeviceArray(qk, BF16), v=DeviceArray(wide, BF16),
             g=DeviceArray(wide, np.float32), beta=DeviceArray((B, T, HV), beta_dtype))
    kw = dict(initial_state=DeviceArray((N, HV, D, D), np.float32) if h0 else None)
    return a, kw


def _call(fn, a, kw, **over):
    args = {**a, **kw, **over}
    pos = [args.pop(n) for n in NAMES]
    return fn(*pos, **args)


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


@pytest.mark.parametrize("name", ["training", "output_final_state"])
def test_the_flags_are_booleans(name):
    a, kw = _args()
    with pytest.raises(TypeError, match=rf"{name} must be True or False, got 1"):
        _call(plan_forward, a, kw, **{name: 1})


def test_varlen_states_are_packed_by_flas_chunk_offsets():
    lengths = [1, 15, 16, 17, 63, 64, 65, 200]
    a, kw = _args(B=1, T=sum(lengths), H=2, N=len(lengths), h0=True)
    plan = _call(plan_forward, a, kw, cu_seqlens=np.cumsum([0] + lengths), training=True, output_final_state=True)
    chunk_offsets = np.concatenate([[0], np.cumsum([-(-n // C64) for n in lengths])])   # FLA's prepare_chunk_offsets
    np.testing.assert_array_equal(plan.snapshot_offsets, chunk_offsets)
    assert plan.states_shape == (1, int(chunk_offsets[-1]), 2, D, D)
    assert plan.final_shape == (len(lengths), 2, D, D) and plan.blocks_shape == (1, sum(lengths), 2, C64)


def test_grouped_value_heads_pass_the_plan_and_size_the_grid_by_value_heads():
    # FLA's GVA: q and k with 2 heads, v, g, beta, h0 and every output with 8; one chain per value head
    a, kw = _args(B=2, T=130, H=2, HV=8, h0=True)
    plan = _call(plan_forward, a, kw, training=True)
    assert (plan.H, plan.HV) == (2, 8)
    assert plan.o_shape == (2, 130, 8, D) and plan.states_shape == (2, 3, 8, D, D)
    assert plan.config.warps == 1 and plan.ctas == 2 * 8 * 8   # 16 chains: the auto rule's for 16 pairs


@pytest.mark.parametrize("heads", [3, 1])
def test_value_heads_that_are_not_a_multiple_of_q_s_are_refused_naming_both(heads):
    a, kw = _args(H=2)
    with pytest.raises(ValueError, match=rf"v has {heads} heads and q has 2: the value heads must be q's heads or "
                                         r"a multiple of them \(FLA's grouped value heads"):
        _call(plan_forward, a, kw, v=DeviceArray((2, 100, heads, D), BF16))


def test_the_plan_takes_the_auto_rule_or_the_given_config():
    a, kw = _args(B=2, T=100, H=4)                           # 8 pairs
    assert _call(plan_forward, a, kw).config == Config(warps=1, producers=4, nstage=5, g6_split=4)
    assert _call(plan_forward, a, kw, sm_count=16).config.warps == 4
    assert _call(plan_forward, a, kw, config=Config(warps=2, nstage=2)).config == Config(2, nstage=2)
    assert _call(plan_forward, a, kw).ctas == 8 * 8


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


# ----------------------------------------------------------------------------
# refusals, each naming the argument
# ----------------------------------------------------------------------------

def test_host_arrays_are_refused_with_what_to_do():
    a, kw = _args()
    for name in NAMES:
        host = np.zeros(a[name].shape, dtype=np.dtype(a[name].__cuda_array_interface__["typestr"]))
        with pytest.raises(TypeError, match=rf"^{name} is a numpy.ndarray \(host memory\).*kda_forward_reference"):
            _call(plan_forward, a, kw, **{name: host})
    a, kw = _args(h0=True)
    with pytest.raises(TypeError, match=r"^initial_state is a numpy.ndarray"):
        _call(plan_forward, a, kw, initial_state=np.zeros((2, 3, D, D), np.float32))
    with pytest.raises(TypeError, match="q must be a CuPy array or a torch CUDA tensor, got list"):
        _call(plan_forward, a, kw, q=[1, 2])


def test_cpu_torch_tensors_are_refused():
    torch = pytest.importorskip("torch")
    a, kw = _args(B=1, T=16, H=1)
    with pytest.raises(TypeError, match="v must be a CUDA tensor, got a tensor on cpu"):
        _call(plan_forward, a, kw, v=torch.zeros((1, 16, 1, D), dtype=torch.bfloat16))


@pytest.mark.parametrize("name, dtype, expect", [
    ("q", np.float32, "q must be bf16"), ("k", np.float32, "k must be bf16"), ("v", np.float16, "v must be bf16"),
    ("g", BF16, "g must be float32"), ("g", np.float64, "g must be float32"),
    ("beta", np.float64, "beta must be float32 or bf16")])
def test_dtypes_are_named(name, dtype, expect):
    a, kw = _args()
    with pytest.raises(TypeError, match=expect):
        _call(plan_forward, a, kw, **{name: DeviceArray(a[name].shape, dtype)})


@pytest.mark.parametrize("name, shape, expect", [
    ("k", (2, 100, 2, D), r"k must have shape \(2, 100, 3, 128\) \(\[B, T, H, K\], as q\), got \(2, 100, 2, 128\)"),
    ("v", (2, 100, 3, 64), r"v must have shape \(2, 100, 3, 128\)"),
    ("g", (2, 99, 3, D), r"g must have shape \(2, 100, 3, 128\)"),
    ("beta", (2, 100, 3, 1), r"beta must have shape \(2, 100, 3\) \(\[B, T, HV\]\), got \(2, 100, 3, 1\)")])
def test_shapes_are_named(name, shape, expect):
    a, kw = _args()
    with pytest.raises(ValueError, match=expect):
        _call(plan_forward, a, kw, **{name: DeviceArray(shape, a[name].__cuda_array_interface__["typestr"])})


def test_q_s_shape_heads_and_sizes():
    a, kw = _args()
    with pytest.raises(ValueError, match="q's head dimension must be 128, got 64"):
        _call(plan_forward, a, kw, q=DeviceArray((2, 100, 3, 64), BF16))
    with pytest.raises(ValueError, match="q must be 4-D"):
        _call(plan_forward, a, kw, q=DeviceArray((200, 3, D), BF16))
    with pytest.raises(ValueError, match="q must have B, T, H >= 1"):
        _call(plan_forward, a, kw, q=DeviceArray((2, 0, 3, D), BF16))


def test_non_contiguous_arrays_are_named():
    a, kw = _args(B=1, T=4, H=2)
    swapped = DeviceArray((1, 4, 2, D), BF16, strides=(4 * 2 * D * 2, 2, 4 * 2, 4 * 2 * 2))
    with pytest.raises(ValueError, match=r"v must be C-contiguous"):
        _call(plan_forward, a, kw, v=swapped)


def test_initial_state_is_checked():
    a, kw = _args(B=2, h0=True)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 3, 128, 128\)"):
        _call(plan_forward, a, kw, initial_state=DeviceArray((1, 3, D, D), np.float32))
    with pytest.raises(TypeError, match="initial_state must be float32"):
        _call(plan_forward, a, kw, initial_state=DeviceArray((2, 3, D, D), BF16))


@pytest.mark.parametrize("cu, B, err, expect", [
    ([0, 50, 100], 2, ValueError, "cu_seqlens needs a packed batch of size 1"),
    ([1, 100], 1, ValueError, "cu_seqlens must start at 0"),
    ([0, 50, 50, 100], 1, ValueError, "cu_seqlens must be strictly increasing"),
    ([0, 50, 99], 1, ValueError, "cu_seqlens must end at the total length 100"),
    ([0.0, 100.0], 1, ValueError, "cu_seqlens must have an integer dtype"),
    ([[0, 100]], 1, ValueError, "cu_seqlens must be 1-D"),
    ([0], 1, ValueError, "cu_seqlens must hold at least 2 offsets")])
def test_cu_seqlens_is_checked(cu, B, err, expect):
    a, kw = _args(B=B, T=100)
    with pytest.raises(err, match=expect):
        _call(plan_forward, a, kw, cu_seqlens=np.asarray(cu))


def test_misaligned_pointers_and_mixed_devices_are_named():
    a, kw = _args(B=1, T=16, H=1)
    odd = DeviceArray((1, 16, 1, D), BF16)
    odd.__cuda_array_interface__["data"] = (odd.ptr + 2, False)
    with pytest.raises(ValueError, match="k starts at address 0x[0-9a-f]+, not a multiple of 16 bytes"):
        _call(plan_forward, a, kw, k=odd)
    with pytest.raises(ValueError, match="g is on device 1, q on device 0"):
        _call(plan_forward, a, kw, g=DeviceArray((1, 16, 1, D), np.float32, device=1))
    with pytest.raises(TypeError, match="config must be a kernel.forward.Config"):
        _call(plan_forward, a, kw, config={"warps": 2})


def test_without_cupy_the_launch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)   # as on a machine without CuPy
    a, kw = _args()
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[cuda\]'"):
        _call(forward, a, kw)
