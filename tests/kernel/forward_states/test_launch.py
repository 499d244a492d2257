"""kernel.forward_states.launch on the CPU: every refusal and the plan, the refusals and the plan's grid
for both scans that share them (Kernel S's, and the forward's, kernel.forward.launch: check_batch and
ScanPlan are Kernel S's).

The arguments are stand-ins for GPU arrays (tests/kernel/scan_stand_ins.py), so every check runs
without a GPU.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from kernel import forward as kf
from kernel.forward_states import Config, launch, plan_forward_states
from kernel.forward_states.config import KERNEL_NAME, SOURCE_PATH

from ..ds_scan.test_fla import DeviceArray
from ..kernel_signature import launched
from ..scan_stand_ins import BF16, C64, FORWARD, SCANS, STATES, D

_args, _call = STATES.args, STATES.call
by_scan = pytest.mark.parametrize("scan", SCANS, ids=lambda scan: scan.name)


# ----------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("beta_dtype", [np.float32, BF16])
@pytest.mark.parametrize("h0", [False, True])
def test_valid_arguments_pass_the_plan(beta_dtype, h0):
    a, kw = _args(B=2, T=130, H=3, h0=h0, beta_dtype=beta_dtype)
    plan = _call(plan_forward_states, a, kw)
    assert plan.states_shape == (2, 3, 3, D, D)          # ceil(130 / 64) = 3 entries a sequence
    assert plan.beta_bf16 == (beta_dtype is BF16) and plan.has_initial_state == h0
    assert plan.N == 2 and not plan.torch_out and plan.device == 0
    np.testing.assert_array_equal(plan.snapshot_offsets, [0, 3, 6])


def test_varlen_states_are_packed_by_flas_chunk_offsets():
    lengths = [1, 15, 16, 17, 63, 64, 65, 200]
    a, kw = _args(B=1, T=sum(lengths), H=2, N=len(lengths), h0=True)
    plan = _call(plan_forward_states, a, kw, cu_seqlens=np.cumsum([0] + lengths))
    chunk_offsets = np.concatenate([[0], np.cumsum([-(-n // C64) for n in lengths])])   # FLA's prepare_chunk_offsets
    np.testing.assert_array_equal(plan.snapshot_offsets, chunk_offsets)
    assert plan.states_shape == (1, int(chunk_offsets[-1]), 2, D, D)


@by_scan
def test_grouped_value_heads_pass_the_plan_and_size_the_grid_by_value_heads(scan):
    # FLA's GVA: k (and q) with 2 heads, v, g, beta, Akk, h0 and the states with 8; one chain per value head
    a, kw = scan.args(B=2, T=130, H=2, HV=8, h0=True)
    plan = scan.call(scan.plan, a, kw, **scan.states_kw)
    assert (plan.H, plan.HV) == (2, 8)
    assert plan.states_shape == (2, 3, 8, D, D)
    assert plan.config.warps == 1 and plan.ctas == 2 * 8 * 8   # 16 chains: the auto rule's for 16 pairs


@by_scan
@pytest.mark.parametrize("heads", [3, 1])
def test_value_heads_that_are_not_a_multiple_of_the_anchors_are_refused_naming_both(scan, heads):
    a, kw = scan.args(H=2)
    x = scan.anchor
    with pytest.raises(ValueError, match=rf"v has {heads} heads and {x} has 2: the value heads must be {x}'s heads or "
                                         r"a multiple of them \(FLA's grouped value heads"):
        scan.call(scan.plan, a, kw, v=DeviceArray((2, 100, heads, D), BF16))


def test_the_launch_passes_value_heads_and_k_s_heads_where_the_kernel_takes_them(monkeypatch):
    a, kw = _args(B=1, T=200, H=2, HV=6, h0=True)
    plan = _call(plan_forward_states, a, kw, config=Config(warps=2))
    calls = []
    monkeypatch.setattr(launch, "device_tables", lambda cu: ("cu", "offs", "order", int(plan.snapshot_offsets[-1])))
    monkeypatch.setattr(launch, "kernel", lambda cfg: (lambda *call, **kw: calls.append((call, kw)), 123, cfg.threads))
    launch.launch_planned(plan, "k", "v", "g", "beta", "Akk", "h0", "out")
    (grid, block, args), opts = calls[0]
    assert grid == (1 * 6 * 4,) and block == (Config(warps=2).threads,) and opts == {"shared_mem": 123}
    got = launched(SOURCE_PATH, KERNEL_NAME, args)
    assert (got["k"], got["v"], got["h0"], got["states"], got["order"]) == ("k", "v", "h0", "out", "order")
    assert (got["HV"], got["H"]) == (6, 2)


@pytest.mark.parametrize("scan, auto", [(STATES, Config(warps=1, producers=4, nstage=6, g6_split=4)),
                                         (FORWARD, kf.Config(warps=1, producers=4, nstage=5, g6_split=4, product_warps=2))],
                         ids=lambda x: getattr(x, "name", ""))
def test_the_plan_takes_the_auto_rule_or_the_given_config(scan, auto):
    a, kw = scan.args(B=2, T=100, H=4)                       # 8 pairs
    assert scan.call(scan.plan, a, kw).config == auto
    assert scan.call(scan.plan, a, kw, sm_count=16).config.warps == 4
    given = type(auto)(warps=2, nstage=2)
    assert scan.call(scan.plan, a, kw, config=given).config == given
    assert scan.call(scan.plan, a, kw).ctas == 8 * 8


# ----------------------------------------------------------------------------
# refusals, each naming the argument
# ----------------------------------------------------------------------------

@by_scan
def test_host_arrays_are_refused_with_what_to_do(scan):
    a, kw = scan.args()
    for name in scan.names:
        host = np.zeros(a[name].shape, dtype=np.dtype(a[name].__cuda_array_interface__["typestr"]))
        with pytest.raises(TypeError, match=rf"^{name} is a numpy.ndarray \(host memory\).*kda_forward_reference"):
            scan.call(scan.plan, a, kw, **{name: host})
    a, kw = scan.args(h0=True)
    with pytest.raises(TypeError, match=r"^initial_state is a numpy.ndarray"):
        scan.call(scan.plan, a, kw, initial_state=np.zeros((2, 3, D, D), np.float32))
    with pytest.raises(TypeError, match=f"{scan.anchor} must be a CuPy array or a torch CUDA tensor, got list"):
        scan.call(scan.plan, a, kw, **{scan.anchor: [1, 2]})


@by_scan
def test_cpu_torch_tensors_are_refused(scan):
    torch = pytest.importorskip("torch")
    a, kw = scan.args(B=1, T=16, H=1)
    with pytest.raises(TypeError, match="v must be a CUDA tensor, got a tensor on cpu"):
        scan.call(scan.plan, a, kw, v=torch.zeros((1, 16, 1, D), dtype=torch.bfloat16))


COMMON_DTYPES = [("k", np.float32, "k must be bf16"), ("v", np.float16, "v must be bf16"),
                 ("g", BF16, "g must be float32"), ("g", np.float64, "g must be float32"),
                 ("beta", np.float64, "beta must be float32 or bf16")]


@pytest.mark.parametrize("scan, name, dtype, expect", [
    *((scan, *case) for scan in SCANS for case in COMMON_DTYPES),
    (STATES, "Akk", np.float32, "Akk must be bf16"), (FORWARD, "q", np.float32, "q must be bf16")],
    ids=lambda x: getattr(x, "name", None))
def test_dtypes_are_named(scan, name, dtype, expect):
    a, kw = scan.args()
    with pytest.raises(TypeError, match=expect):
        scan.call(scan.plan, a, kw, **{name: DeviceArray(a[name].shape, dtype)})


COMMON_SHAPES = [("v", (2, 100, 3, 64), r"v must have shape \(2, 100, 3, 128\)"),
                 ("g", (2, 99, 3, D), r"g must have shape \(2, 100, 3, 128\)"),
                 ("beta", (2, 100, 3, 1), r"beta must have shape \(2, 100, 3\) \(\[B, T, HV\]\), got \(2, 100, 3, 1\)")]


@pytest.mark.parametrize("scan, name, shape, expect", [
    *((scan, *case) for scan in SCANS for case in COMMON_SHAPES),
    (STATES, "Akk", (2, 100, 3, 32), r"Akk must have shape \(2, 100, 3, 64\) \(\[B, T, HV, 64\], FLA's chunk_size 64\)"),
    (STATES, "Akk", (2, 100, 6, 64), r"Akk must have shape"),
    (FORWARD, "k", (2, 100, 2, D), r"k must have shape \(2, 100, 3, 128\) \(\[B, T, H, K\], as q\), got \(2, 100, 2, 128\)")],
    ids=lambda x: getattr(x, "name", None))
def test_shapes_are_named(scan, name, shape, expect):
    a, kw = scan.args()
    with pytest.raises(ValueError, match=expect):
        scan.call(scan.plan, a, kw, **{name: DeviceArray(shape, a[name].__cuda_array_interface__["typestr"])})


@by_scan
def test_the_anchors_shape_heads_and_sizes(scan):
    a, kw = scan.args()
    x = scan.anchor
    with pytest.raises(ValueError, match=f"{x}'s head dimension must be 128, got 64"):
        scan.call(scan.plan, a, kw, **{x: DeviceArray((2, 100, 3, 64), BF16)})
    with pytest.raises(ValueError, match=f"{x} must be 4-D"):
        scan.call(scan.plan, a, kw, **{x: DeviceArray((200, 3, D), BF16)})
    with pytest.raises(ValueError, match=f"{x} must have B, T, H >= 1"):
        scan.call(scan.plan, a, kw, **{x: DeviceArray((2, 0, 3, D), BF16)})


@by_scan
def test_non_contiguous_arrays_are_named(scan):
    a, kw = scan.args(B=1, T=4, H=2)
    swapped = DeviceArray((1, 4, 2, D), BF16, strides=(4 * 2 * D * 2, 2, 4 * 2, 4 * 2 * 2))
    with pytest.raises(ValueError, match=r"v must be C-contiguous"):
        scan.call(scan.plan, a, kw, v=swapped)


@by_scan
def test_initial_state_is_checked(scan):
    a, kw = scan.args(B=2, h0=True)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 3, 128, 128\)"):
        scan.call(scan.plan, a, kw, initial_state=DeviceArray((1, 3, D, D), np.float32))
    with pytest.raises(TypeError, match="initial_state must be float32"):
        scan.call(scan.plan, a, kw, initial_state=DeviceArray((2, 3, D, D), BF16))


@by_scan
@pytest.mark.parametrize("cu, B, err, expect", [
    ([0, 50, 100], 2, ValueError, "cu_seqlens needs a packed batch of size 1"),
    ([1, 100], 1, ValueError, "cu_seqlens must start at 0"),
    ([0, 50, 50, 100], 1, ValueError, "cu_seqlens must be strictly increasing"),
    ([0, 50, 99], 1, ValueError, "cu_seqlens must end at the total length 100"),
    ([0.0, 100.0], 1, ValueError, "cu_seqlens must have an integer dtype"),
    ([[0, 100]], 1, ValueError, "cu_seqlens must be 1-D"),
    ([0], 1, ValueError, "cu_seqlens must hold at least 2 offsets")])
def test_cu_seqlens_is_checked(scan, cu, B, err, expect):
    a, kw = scan.args(B=B, T=100)
    with pytest.raises(err, match=expect):
        scan.call(scan.plan, a, kw, cu_seqlens=np.asarray(cu))


@pytest.mark.parametrize("scan, name", [(STATES, "Akk"), (FORWARD, "k")], ids=lambda x: getattr(x, "name", x))
def test_misaligned_pointers_and_mixed_devices_are_named(scan, name):
    a, kw = scan.args(B=1, T=16, H=1)
    odd = DeviceArray(a[name].shape, BF16)
    odd.__cuda_array_interface__["data"] = (odd.ptr + 2, False)
    with pytest.raises(ValueError, match=f"{name} starts at address 0x[0-9a-f]+, not a multiple of 16 bytes"):
        scan.call(scan.plan, a, kw, **{name: odd})
    with pytest.raises(ValueError, match=f"g is on device 1, {scan.anchor} on device 0"):
        scan.call(scan.plan, a, kw, g=DeviceArray((1, 16, 1, D), np.float32, device=1))
    with pytest.raises(TypeError, match=f"config must be a {scan.config_type}"):
        scan.call(scan.plan, a, kw, config={"warps": 2})


@by_scan
def test_without_cupy_the_launch_says_what_to_install(monkeypatch, scan):
    monkeypatch.setitem(sys.modules, "cupy", None)   # as on a machine without CuPy
    a, kw = scan.args()
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[cuda\]'"):
        scan.call(scan.run, a, kw)
