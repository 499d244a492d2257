"""kernel.ds_scan.fla: dstate_scan_from_fla's host side on the CPU, its GPU runs on the GPU.

On the CPU the arguments are stand-ins for GPU arrays (DeviceArray below: the
CUDA array interface CuPy arrays expose, and a device id, with no memory behind
them), so every check runs without a GPU; valid arguments pass
plan_fla_launch, and without CuPy the call then stops at kernel.ds_scan.launch's "needs
CuPy" error.

The `gpu` tests compare dstate_scan_from_fla with kernel.dstate_scan fed from
prepare_tiles on the same inputs and with float64, and with FLA's own dhu on
its own forward's tensors; one checks the three identities on the tensors FLA's
own forward stored (torch and fla-core required).
"""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from kernel.ds_scan import fla
from kernel.ds_scan.fla import dstate_scan_from_fla, plan_fla_launch

D, C64 = 128, 64
_addresses = itertools.count(0x7F00_0000_0000, 1 << 32)


class DeviceArray:
    """A stand-in for a GPU array: shape, typestr, strides and a data pointer through the
    CUDA array interface, and ``.device.id``, as a CuPy array has them; no memory."""

    def __init__(self, shape, dtype, *, strides=None, device: int = 0):
        dt = np.dtype(dtype)
        self.shape = tuple(shape)
        self.device = SimpleNamespace(id=device)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": dt.str, "strides": strides,
                                         "data": (next(_addresses), False), "version": 3}

    @property
    def ptr(self) -> int:
        return self.__cuda_array_interface__["data"][0]


BF16 = np.uint16   # bf16 bits, CuPy's convention


def _args(B=2, T=100, H=3, *, HV=None, dht=True, beta_dtype=np.float32, N=None):
    """Stand-ins of FLA's tensors: q, k with H heads, the others with HV (None: H; more: FLA's GVA)."""
    N = B if N is None else N
    HV = H if HV is None else HV
    qk, wide = (B, T, H, D), (B, T, HV, D)
    a = dict(q=DeviceArray(qk, BF16), k=DeviceArray(qk, BF16), g64=DeviceArray(wide, np.float32),
             beta=DeviceArray((B, T, HV), beta_dtype), Aqk=DeviceArray((B, T, HV, C64), BF16),
             Akk=DeviceArray((B, T, HV, C64), BF16), do=DeviceArray(wide, BF16))
    kw = dict(dht=DeviceArray((N, HV, D, D), np.float32) if dht else None)
    return a, kw


def _call(fn, a, kw, **over):
    args = {**a, **kw, **over}
    pos = [args.pop(n) for n in ("q", "k", "g64", "beta", "Aqk", "Akk", "do")]
    return fn(*pos, **args)


# ----------------------------------------------------------------------------
# valid arguments reach the launch, and the plan says what the kernel gets
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("beta_dtype", [np.float32, BF16])
def test_valid_arguments_pass_the_plan(beta_dtype):
    a, kw = _args(beta_dtype=beta_dtype)
    _call(plan_fla_launch, a, kw)
    lengths = [1, 15, 16, 17, 63, 64, 65, 200]
    a, kw = _args(B=1, T=sum(lengths), dht=False)
    plan = _call(plan_fla_launch, a, kw, cu_seqlens=np.cumsum([0] + lengths))
    assert plan.dh_shape[1] == sum(-(-n // 64) for n in lengths)


def test_without_cupy_the_launch_says_what_to_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)   # as on a machine without CuPy
    a, kw = _args()
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[cuda\]'"):
        _call(dstate_scan_from_fla, a, kw)


def test_the_plan_names_pointers_strides_and_outputs():
    a, kw = _args(B=2, T=130, H=3)
    plan = _call(plan_fla_launch, a, kw)
    H = 3
    ops = plan.operands
    assert set(ops) == {"q", "k", "g64", "beta", "Aqk", "Akk", "do", "dht"}
    for name in ("q", "k", "g64", "do"):
        assert (ops[name].row_stride, ops[name].head_stride) == (H * D, D)
    for name in ("Aqk", "Akk"):                 # 64-wide rows: tile n's block at column 16 (n mod 4)
        assert (ops[name].row_stride, ops[name].head_stride) == (H * C64, C64)
        assert ops[name].dtype == "bfloat16"
    assert (ops["beta"].row_stride, ops["beta"].head_stride) == (H, 1)
    assert (ops["dht"].row_stride, ops["dht"].head_stride) == (H * D * D, D * D)
    assert all(ops[n].ptr == a[n].ptr for n in a) and ops["dht"].ptr == kw["dht"].ptr
    assert plan.dh_shape == (2, 3, H, D, D) and plan.dh0_shape == (2, H, D, D)   # ceil(130 / 64) = 3
    assert plan.snapshot_every == 4 and plan.snapshot_dtype == "bfloat16"
    assert plan.scale == D ** -0.5 and not plan.torch_out and plan.device == 0
    assert _call(plan_fla_launch, a, kw, scale=0.25).scale == 0.25


def test_varlen_dh_is_packed_by_flas_chunk_offsets():
    lengths = [1, 15, 16, 17, 63, 64, 65, 129, 200]
    a, kw = _args(B=1, T=sum(lengths), H=2, N=len(lengths))
    plan = _call(plan_fla_launch, a, kw, cu_seqlens=np.cumsum([0] + lengths))
    # FLA's prepare_chunk_offsets: cumsum of ceil(length / 64), from 0
    chunk_offsets = np.concatenate([[0], np.cumsum([math.ceil(n / C64) for n in lengths])])
    np.testing.assert_array_equal(plan.snapshot_offsets, chunk_offsets)
    assert plan.dh_shape == (1, int(chunk_offsets[-1]), 2, D, D)
    assert plan.N == len(lengths) and plan.dh0_shape == (len(lengths), 2, D, D)


# ----------------------------------------------------------------------------
# errors that name the argument
# ----------------------------------------------------------------------------

NAMES = ("q", "k", "g64", "beta", "Aqk", "Akk", "do")


@pytest.mark.parametrize("name", NAMES + ("dht",))
def test_host_arrays_are_refused_with_the_way_to_a_host_evaluation(name):
    a, kw = _args()
    host = np.zeros((a | kw)[name].shape, dtype=np.float32)
    with pytest.raises(TypeError, match=rf"^{name} is a numpy.ndarray \(host memory\).*kernel_a_inputs_from_fla"):
        _call(dstate_scan_from_fla, a, kw, **{name: host})


def test_other_objects_are_refused():
    a, kw = _args()
    with pytest.raises(TypeError, match="k must be a CuPy array or a torch CUDA tensor, got list"):
        _call(dstate_scan_from_fla, a, kw, k=[[0.0]])


@pytest.mark.parametrize("name, shape, message", [
    ("k", (2, 99, 3, D), r"k must have shape \(2, 100, 3, 128\)"),
    ("g64", (2, 100, 3, 64), r"g64 must have shape \(2, 100, 3, 128\)"),
    ("beta", (2, 100), r"beta must have shape \(2, 100, 3\)"),
    ("Aqk", (2, 100, 3, 16), r"Aqk must have shape \(2, 100, 3, 64\)"),
    ("Akk", (2, 100, 2, 64), r"Akk must have shape \(2, 100, 3, 64\)"),
    ("do", (2, 100, 3, 64), r"do must have shape \(2, 100, 3, 128\)"),
    ("dht", (2, 3, D, 64), r"dht must have shape \(2, 3, 128, 128\)"),
])
def test_wrong_shapes(name, shape, message):
    a, kw = _args()
    dtype = np.dtype((a | kw)[name].__cuda_array_interface__["typestr"])
    with pytest.raises(ValueError, match=message):
        _call(dstate_scan_from_fla, a, kw, **{name: DeviceArray(shape, dtype)})


@pytest.mark.parametrize("name, dtype, message", [
    ("q", np.float32, r"q must be bf16 \(torch.bfloat16, or uint16 bf16 bits in CuPy\), got float32"),
    ("k", np.float16, "k must be bf16"),
    ("do", np.float32, "do must be bf16"),
    ("Aqk", np.float32, "Aqk must be bf16"),
    ("Akk", np.float32, "Akk must be bf16"),
    ("g64", BF16, "g64 must be float32, got bfloat16"),
    ("g64", np.float64, "g64 must be float32, got float64"),
    ("beta", np.float64, "beta must be float32 or bf16"),
    ("dht", np.float64, "dht must be float32"),
])
def test_wrong_dtypes(name, dtype, message):
    a, kw = _args()
    with pytest.raises(TypeError, match=message):
        _call(dstate_scan_from_fla, a, kw, **{name: DeviceArray((a | kw)[name].shape, dtype)})


@pytest.mark.parametrize("name", NAMES + ("dht",))
def test_non_contiguous_arrays(name):
    a, kw = _args()
    x = (a | kw)[name]
    dt = np.dtype(x.__cuda_array_interface__["typestr"])
    strides = np.empty(x.shape[::-1], dtype=dt).T.strides     # same shape, column-major
    with pytest.raises(ValueError, match=rf"{name} must be C-contiguous"):
        _call(dstate_scan_from_fla, a, kw, **{name: DeviceArray(x.shape, dt, strides=strides)})


def test_explicit_c_strides_are_contiguous():
    a, kw = _args()
    q = a["q"]
    explicit = DeviceArray(q.shape, BF16, strides=np.empty(q.shape, dtype=BF16).strides)
    _call(plan_fla_launch, a, kw, q=explicit)


def test_q_itself():
    a, kw = _args()
    with pytest.raises(ValueError, match=r"q must be 4-D \[B, T, H, 128\]"):
        _call(dstate_scan_from_fla, a, kw, q=DeviceArray((100, 3, D), BF16))
    with pytest.raises(ValueError, match="q's head dimension must be 128, got 64"):
        _call(dstate_scan_from_fla, a, kw, q=DeviceArray((2, 100, 3, 64), BF16))
    with pytest.raises(ValueError, match="q must have B, T, H >= 1"):
        _call(dstate_scan_from_fla, a, kw, q=DeviceArray((2, 0, 3, D), BF16))


def test_arrays_on_another_device():
    a, kw = _args()
    with pytest.raises(ValueError, match="Akk is on device 1, q on device 0"):
        _call(dstate_scan_from_fla, a, kw, Akk=DeviceArray(a["Akk"].shape, BF16, device=1))


def test_cu_seqlens():
    a, kw = _args(B=1, T=100, N=2)
    call = lambda cu, **over: _call(dstate_scan_from_fla, a, kw, cu_seqlens=cu, **over)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        call(np.array([1, 50, 100]))
    with pytest.raises(ValueError, match="cu_seqlens must be strictly increasing"):
        call(np.array([0, 50, 50, 100]))
    with pytest.raises(ValueError, match="cu_seqlens must end at the total length 100"):
        call(np.array([0, 50, 99]))
    with pytest.raises(ValueError, match="cu_seqlens must have an integer dtype"):
        call(np.array([0.0, 50.0, 100.0]))
    with pytest.raises(ValueError, match="dht must have shape \\(3, 3, 128, 128\\)"):
        call(np.array([0, 20, 50, 100]))
    a2, kw2 = _args(B=2, T=50)
    with pytest.raises(ValueError, match="cu_seqlens needs a packed batch of size 1"):
        _call(dstate_scan_from_fla, a2, kw2, cu_seqlens=np.array([0, 50, 100]))


# ----------------------------------------------------------------------------
# FLA layouts not covered: refused, with what to do instead
# ----------------------------------------------------------------------------

def test_state_v_first_is_refused():
    a, kw = _args()
    with pytest.raises(ValueError, match=r"state_v_first=True .*not covered.*dht.transpose\(-1, -2\)"):
        _call(dstate_scan_from_fla, a, kw, state_v_first=True)


def test_grouped_value_heads_pass_the_plan_with_q_and_k_in_place():
    # FLA's GVA: q, k with 2 heads, everything else with 6; the kernel reads q and k at value head
    # hv's hv // 3 with their own row stride, and every output is per value head
    a, kw = _args(B=2, T=130, H=2, HV=6)
    plan = _call(plan_fla_launch, a, kw)
    assert (plan.H, plan.HV) == (2, 6)
    ops = plan.operands
    for name in ("q", "k"):
        assert (ops[name].row_stride, ops[name].head_stride) == (2 * D, D)
    for name in ("g64", "do"):
        assert (ops[name].row_stride, ops[name].head_stride) == (6 * D, D)
    assert ops["Aqk"].row_stride == ops["Akk"].row_stride == 6 * C64 and ops["beta"].row_stride == 6
    assert plan.dh_shape == (2, 3, 6, D, D) and plan.dh0_shape == (2, 6, D, D)


@pytest.mark.parametrize("heads", [5, 1])
def test_value_heads_that_are_not_a_multiple_of_q_s_are_refused_naming_both(heads):
    a, kw = _args(H=2)
    with pytest.raises(ValueError, match=rf"g64 has {heads} heads and q has 2: the value heads must be q's heads "
                                         r"or a multiple of them \(FLA's grouped value heads"):
        _call(dstate_scan_from_fla, a, kw, g64=DeviceArray((2, 100, heads, D), np.float32))


@pytest.mark.parametrize("name", ["beta", "Aqk", "Akk", "do", "dht"])
def test_every_value_side_array_has_the_gate_s_heads(name):
    a, kw = _args(H=2, HV=6)
    shape = list((a | kw)[name].shape)
    shape[1 if name == "dht" else 2] = 4              # a multiple of q's 2, but not g64's 6
    dtype = np.dtype((a | kw)[name].__cuda_array_interface__["typestr"])
    want = [6 if i == (1 if name == "dht" else 2) else n for i, n in enumerate(shape)]
    with pytest.raises(ValueError, match=rf"{name} must have shape \({', '.join(map(str, want))}\)"):
        _call(dstate_scan_from_fla, a, kw, **{name: DeviceArray(shape, dtype)})


@pytest.mark.parametrize("name", ["Aqk", "Akk"])
def test_chunk_32_is_refused(name):
    a, kw = _args()
    narrow = DeviceArray(a[name].shape[:3] + (32,), BF16)
    with pytest.raises(ValueError, match=rf"{name} has 32 columns a row: FLA ran with chunk_size=32.*"
                                         r"chunk_size=64.*snapshot_every=1"):
        _call(dstate_scan_from_fla, a, kw, **{name: narrow})


def test_options():
    a, kw = _args()
    with pytest.raises(ValueError, match="snapshot_dtype must be one of"):
        _call(dstate_scan_from_fla, a, kw, snapshot_dtype="float16")
    with pytest.raises(ValueError, match="vsplit must be 'auto' or one of"):
        _call(dstate_scan_from_fla, a, kw, vsplit=3)
    with pytest.raises(ValueError, match=r"tuning must not set \['snap_every'\]"):
        _call(dstate_scan_from_fla, a, kw, tuning={"snap_every": 1})
    with pytest.raises(ValueError, match=r"tuning has unknown knobs \['warps'\]"):
        _call(dstate_scan_from_fla, a, kw, tuning={"warps": 4})
    assert _call(plan_fla_launch, a, kw, snapshot_dtype="float32", vsplit=2).vsplit == 2


def test_torch_cpu_tensors_are_refused():
    torch = pytest.importorskip("torch")
    a, kw = _args()
    with pytest.raises(TypeError, match="q must be a CUDA tensor, got a tensor on cpu"):
        _call(dstate_scan_from_fla, a, kw, q=torch.zeros(a["q"].shape, dtype=torch.bfloat16))


# ----------------------------------------------------------------------------
# on the GPU
# ----------------------------------------------------------------------------

BF16_ULP = 2.0 ** -8      # one bf16 rounding at the top of a binade: what two bf16 outputs may differ by
GPU_CASES = [dict(B=2, T=200, lengths=None, dht=True),
             dict(B=1, T=None, lengths=(1, 15, 16, 17, 63, 64, 65, 129, 200), dht=False),
             # the sequence split: cuts on FLA's chunk edges (its Aqk / Akk blocks and gate restart there)
             dict(B=1, T=None, lengths=(1, 65, 700, 1500), dht=True, segments=4)]


def _rel(out, ref) -> float:
    num, den = float(np.linalg.norm(out - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=["batch", "varlen", "split"])
def test_matches_the_tile_path_and_float64(case):
    import cupy

    from kernel import dstate_scan
    from kernel.tools import check
    from kernel.ds_scan.launch import bf16_bits, bits_to_f32
    from kernel.reference import (dstate_scan_reference, fla_forward_tensors, prepare_tiles,
                                  random_inputs)
    from kernel.reference.checks import l2norm

    raw = random_inputs(case["B"], case["T"], 2, lengths=list(case["lengths"]) if case["lengths"] else None,
                        seed=5, with_dht=case["dht"])
    cu = raw["cu_seqlens"]
    # FLA stores q, k normalised, in bf16, and builds Aqk, Akk from those stored values
    q_r = bits_to_f32(bf16_bits(l2norm(np, raw["q"].astype(np.float64)))).astype(np.float64)
    k_r = bits_to_f32(bf16_bits(l2norm(np, raw["k"].astype(np.float64)))).astype(np.float64)
    F = fla_forward_tensors(q_r, k_r, raw["g"], raw["beta"], cu_seqlens=cu, qk_l2norm=False)  # garbage above
    gc, mqk, inv = prepare_tiles(q_r, k_r, raw["g"], raw["beta"], cu_seqlens=cu, qk_l2norm=False)
    dev = cupy.asarray
    q_b, k_b, do_b = dev(bf16_bits(q_r)), dev(bf16_bits(k_r)), dev(bf16_bits(raw["do"]))
    dht = None if raw["dht"] is None else dev(raw["dht"])
    beta = dev(raw["beta"])

    dh, dh0 = dstate_scan_from_fla(q_b, k_b, dev(F.g64.astype(np.float32)), beta, dev(bf16_bits(F.Aqk)),
                                   dev(bf16_bits(F.Akk)), do_b, dht=dht, cu_seqlens=cu,
                                   segments=case.get("segments", "auto"))
    snaps, d0 = dstate_scan(q_b, k_b, dev(gc.astype(np.float32)), beta, dev(bf16_bits(mqk)), dev(bf16_bits(inv)),
                            do_b, dht=dht, cu_seqlens=cu, qk_l2norm=False, snapshot_dtype="bfloat16",
                            snapshot_every=4, segments=case.get("segments", "auto"))
    dh_h, snaps_h = bits_to_f32(dh.get()).astype(np.float64), bits_to_f32(snaps.get()).astype(np.float64)
    assert dh_h.shape == snaps_h.shape and np.isfinite(dh_h).all() and np.isfinite(dh0.get()).all()
    assert _rel(dh_h, snaps_h) < BF16_ULP and _rel(dh0.get(), d0.get()) < BF16_ULP

    ref_s, ref_d0 = dstate_scan_reference(q_r, k_r, gc.astype(np.float32), raw["beta"],
                                          bits_to_f32(bf16_bits(mqk)), bits_to_f32(bf16_bits(inv)),
                                          bits_to_f32(bf16_bits(raw["do"])), dht=raw["dht"], cu_seqlens=cu,
                                          qk_l2norm=False, snapshot_every=4)
    assert _rel(dh_h, ref_s) < check.BOUND and _rel(dh0.get(), ref_d0) < check.BOUND


def _fla_state(torch, lengths, seed=3, H=2):
    """FLA's own forward on seeded inputs (kernel.tools.fla_adapter.prepare), and the host inputs."""
    from kernel.tools import fla_adapter
    from kernel.reference import random_inputs

    ok, why = fla_adapter.available()
    if not ok:
        pytest.skip(f"FLA's kernels cannot run here: {why}")
    raw = random_inputs(1, 1, H, lengths=list(lengths), seed=seed)
    cuda = lambda x, dtype: torch.from_numpy(x).cuda().to(dtype)
    s = fla_adapter.prepare(cuda(raw["q"], torch.bfloat16), cuda(raw["k"], torch.bfloat16),
                            cuda(raw["v"], torch.bfloat16), cuda(raw["g"], torch.float32),
                            cuda(raw["beta"], torch.float32), cu_seqlens=torch.from_numpy(raw["cu_seqlens"]).cuda(),
                            qk_l2norm=True)
    torch.cuda.synchronize()
    return s, raw


@pytest.mark.gpu
@pytest.mark.fla
def test_the_identities_hold_on_flas_own_tensors():
    """The three identities on what fla-core's chunk_kda_fwd really stored (bf16, safe_gate off),
    read by the blueprint on CuPy views, against prepare_tiles in float64 on the same q, k, g, beta.
    The bounds are one bf16 rounding (Mqk, INV) and a few fp32 roundings (gc)."""
    torch = pytest.importorskip("torch")
    from kernel.runtime.arrays import bits_to_f32, cupy_view as _cupy_view
    from kernel.reference import kernel_a_inputs_from_fla, prepare_tiles

    s, raw = _fla_state(torch, (1, 15, 16, 17, 63, 64, 65, 129, 300))
    cu = raw["cu_seqlens"]
    gc, mqk, inv = kernel_a_inputs_from_fla(_cupy_view(s.Aqk), _cupy_view(s.Akk), _cupy_view(s.gk), cu_seqlens=cu)
    host64 = lambda t: t.float().cpu().numpy().astype(np.float64)
    gc_r, mqk_r, inv_r = prepare_tiles(host64(s.q), host64(s.k), raw["g"], raw["beta"], scale=s.scale,
                                       qk_l2norm=False, cu_seqlens=cu)
    mqk_h, inv_h = bits_to_f32(mqk.get()).astype(np.float64), bits_to_f32(inv.get()).astype(np.float64)
    assert np.isfinite(mqk_h).all() and np.isfinite(inv_h).all()
    errs = dict(mqk=_rel(mqk_h, mqk_r), inv=_rel(inv_h, inv_r), gc=_rel(gc.get().astype(np.float64), gc_r))
    print(f"\n[fla identities on fla-core's tensors] relative differences {errs}")
    assert errs["mqk"] < BF16_ULP and errs["inv"] < BF16_ULP and errs["gc"] < 1e-5, errs


@pytest.mark.gpu
@pytest.mark.fla
def test_dh_matches_flas_own_backward():
    """dstate_scan_from_fla on FLA's stored tensors against FLA's dAv + dhu (fla_adapter.dh_dh0)
    and against float64: both within the bound kernel.check uses."""
    torch = pytest.importorskip("torch")
    from kernel.tools import check, fla_adapter
    from kernel.reference import dstate_scan_reference, prepare_tiles

    s, raw = _fla_state(torch, (1, 15, 16, 17, 63, 64, 65, 129, 300))
    cu = raw["cu_seqlens"]
    do = torch.from_numpy(raw["do"]).cuda().to(torch.bfloat16)
    dht = torch.from_numpy(raw["dht"]).cuda()
    dh, dh0 = dstate_scan_from_fla(s.q, s.k, s.gk, s.beta, s.Aqk, s.Akk, do, dht=dht, cu_seqlens=s.cu_seqlens,
                                   scale=s.scale)
    fla_dh, fla_dh0 = fla_adapter.dh_dh0(s, do, dht)
    host64 = lambda t: t.float().cpu().numpy().astype(np.float64)
    q64, k64 = host64(s.q), host64(s.k)
    gc, mqk, inv = prepare_tiles(q64, k64, raw["g"], raw["beta"], scale=s.scale, qk_l2norm=False, cu_seqlens=cu)
    ref_dh, ref_dh0 = dstate_scan_reference(q64, k64, gc, raw["beta"], mqk, inv, host64(do), scale=s.scale,
                                            dht=raw["dht"], cu_seqlens=cu, qk_l2norm=False, snapshot_every=4)
    assert tuple(dh.shape) == tuple(fla_dh.shape) == ref_dh.shape
    assert _rel(host64(dh), ref_dh) < check.BOUND and _rel(host64(dh0), ref_dh0) < check.BOUND
    assert _rel(host64(dh), host64(fla_dh)) < check.BOUND and _rel(host64(dh0), host64(fla_dh0)) < check.BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=["batch", "varlen", "split"])
def test_the_token_gate_build_gives_the_cumsum_builds_dh_and_float64s(case):
    # each token's natural-log gate in place of FLA's chunk cumsum, summed in R1 across the producers'
    # mbarrier (kernel.shapes.tile_gate_sums): the two builds differ by the gate's fp32 rounding alone, far
    # below the bf16 snapshots' (the split's summary builds take it too)
    import cupy

    from kernel.ds_scan.launch import bf16_bits, bits_to_f32, launch
    from kernel.reference import dstate_scan_reference, fla_forward_tensors, prepare_tiles, random_inputs
    from kernel.reference.checks import l2norm
    from kernel.tools import check

    raw = random_inputs(case["B"], case["T"], 2, lengths=list(case["lengths"]) if case["lengths"] else None,
                        seed=7, with_dht=case["dht"])
    cu = raw["cu_seqlens"]
    q_r = bits_to_f32(bf16_bits(l2norm(np, raw["q"].astype(np.float64)))).astype(np.float64)
    k_r = bits_to_f32(bf16_bits(l2norm(np, raw["k"].astype(np.float64)))).astype(np.float64)
    F = fla_forward_tensors(q_r, k_r, raw["g"], raw["beta"], cu_seqlens=cu, qk_l2norm=False)
    dev = cupy.asarray
    common = (dev(bf16_bits(q_r)), dev(bf16_bits(k_r)))
    rest = (dev(raw["beta"]), dev(bf16_bits(F.Aqk)), dev(bf16_bits(F.Akk)), dev(bf16_bits(raw["do"])))
    kw = dict(dht=None if raw["dht"] is None else dev(raw["dht"]), cu_seqlens=cu, qk_l2norm=False,
              snapshot_dtype="bfloat16", snapshot_every=4, segments=case.get("segments", "auto"), fla_inputs=True)
    dh_t, d0_t = launch(*common, dev(raw["g"].astype(np.float32)), *rest, token_gate=True, **kw)
    dh_c, d0_c = launch(*common, dev(F.g64.astype(np.float32)), *rest, **kw)
    dh_t, dh_c = (bits_to_f32(x.get()).astype(np.float64) for x in (dh_t, dh_c))
    assert np.isfinite(dh_t).all() and np.isfinite(d0_t.get()).all()
    assert _rel(dh_t, dh_c) < BF16_ULP and _rel(d0_t.get(), d0_c.get()) < BF16_ULP, \
        (_rel(dh_t, dh_c), _rel(d0_t.get(), d0_c.get()))
    gc, mqk, inv = prepare_tiles(q_r, k_r, raw["g"], raw["beta"], cu_seqlens=cu, qk_l2norm=False)
    ref_s, ref_d0 = dstate_scan_reference(q_r, k_r, gc.astype(np.float32), raw["beta"], bits_to_f32(bf16_bits(mqk)),
                                          bits_to_f32(bf16_bits(inv)), bits_to_f32(bf16_bits(raw["do"])),
                                          dht=raw["dht"], cu_seqlens=cu, qk_l2norm=False, snapshot_every=4)
    assert _rel(dh_t, ref_s) < check.BOUND and _rel(d0_t.get(), ref_d0) < check.BOUND
