"""kernel.dstate_scan where it cannot run: what a CPU-only user is told.

Without CuPy (as on a CPU machine) the call must say what is missing and how to
install it; numpy arrays must be refused as host arrays whether CuPy is there or
not; the host-side scalars are checked before anything needs a GPU. These run
everywhere: the missing-CuPy case is also forced with sys.modules["cupy"] = None
(Python's own way to make an import fail), so it runs where CuPy is installed too.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from kernel import dstate_scan
from kernel.reference import prepare_tiles, random_inputs

HAS_CUPY = importlib.util.find_spec("cupy") is not None
INSTALL = r"pip install -e '\.\[cuda\]' \(cupy-cuda13x"


def _host_inputs(T: int = 20, H: int = 1) -> dict:
    """Kernel A's inputs as a CPU user would first build them: numpy arrays."""
    raw = random_inputs(1, T, H, seed=0)
    gc, mqk, inv = prepare_tiles(raw["q"], raw["k"], raw["g"], raw["beta"])
    return dict(q=raw["q"], k=raw["k"], gc=gc.astype(np.float32), beta=raw["beta"],
                mqk=mqk.astype(np.float32), inv=inv.astype(np.float32), do=raw["do"])


def _call(args: dict, **kwargs):
    return dstate_scan(args["q"], args["k"], args["gc"], args["beta"], args["mqk"], args["inv"],
                       args["do"], **kwargs)


class NotAnArray:
    """Stands where a device array would be (a CuPy or torch one cannot be built here)."""


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)   # `import cupy` now raises ModuleNotFoundError


def _placeholders() -> dict:
    return {name: NotAnArray() for name in ("q", "k", "gc", "beta", "mqk", "inv", "do")}


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the forced case below covers it")
def test_without_cupy_the_error_says_what_is_missing_and_how_to_install_it():
    with pytest.raises(ModuleNotFoundError, match=rf"needs CuPy, which is not installed.*{INSTALL}.*CUDA GPU"):
        _call(_placeholders())


def test_without_cupy_forced_the_error_is_the_same(no_cupy):
    with pytest.raises(ModuleNotFoundError, match=rf"needs CuPy, which is not installed.*{INSTALL}.*CUDA GPU") \
            as info:
        _call(_placeholders())
    assert info.value.name == "cupy" and isinstance(info.value, ImportError)   # `except ImportError` works


@pytest.mark.parametrize("forced", [False, True])
def test_numpy_inputs_are_refused_as_host_arrays(forced, monkeypatch):
    if forced:
        monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(TypeError, match=r"q must be a cupy.ndarray or a torch CUDA tensor, got a numpy.ndarray: "
                                        r"Kernel A runs on the GPU and takes device arrays, CuPy arrays .*"
                                        r"cupy.asarray\(kernel.ds_scan.bf16_bits\(q\)\).*torch.from_numpy\(q\).cuda\(\)"):
        _call(_host_inputs())


@pytest.mark.parametrize("name", ["k", "gc", "beta", "mqk", "inv", "do", "dht"])
def test_the_host_array_is_named(name):
    args = _placeholders()
    array = np.zeros(4, np.float32)
    if name == "dht":
        with pytest.raises(TypeError, match=r"^dht must be a cupy.ndarray"):
            _call(args, dht=array)
    else:
        args[name] = array
        with pytest.raises(TypeError, match=rf"^{name} must be a cupy.ndarray"):
            _call(args)


def test_cpu_tensors_are_refused_as_host_arrays():
    torch = pytest.importorskip("torch")
    args = {name: torch.zeros(4) for name in ("q", "k", "gc", "beta", "mqk", "inv", "do")}
    with pytest.raises(TypeError, match=r"q must be a CUDA tensor, got a tensor on cpu"):
        _call(args)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(snapshot_every=True), ValueError, r"snapshot_every must be 1 or 4, got True"),   # was 1
    (dict(snapshot_every=4.0), ValueError, r"snapshot_every must be 1 or 4, got 4.0"),
    (dict(snapshot_dtype="bf16"), ValueError, r"snapshot_dtype must be one of"),
    (dict(qk_l2norm="no"), TypeError, r"qk_l2norm must be a bool"),                       # was True
    (dict(qk_l2norm=0), TypeError, r"qk_l2norm must be a bool"),
    (dict(scale=float("nan")), ValueError, r"scale must be finite and > 0 \(the forward.s q scale\), got nan"),
    (dict(scale="0.1"), TypeError, r"scale must be a real number"),
    (dict(vsplit=2.5), ValueError, r"vsplit must be 'auto' or one of \(1, 2, 4, 8\), got 2.5"),   # was 2
    (dict(vsplit=True), ValueError, r"vsplit must be 'auto' or one of"),
    (dict(vsplit=3), ValueError, r"vsplit must be 'auto' or one of"),
])
def test_host_scalars_are_checked_before_anything_needs_a_gpu(kwargs, error, match, no_cupy):
    with pytest.raises(error, match=match):
        _call(_placeholders(), **kwargs)


# ----------------------------------------------------------------------------
# FLA's grouped value heads: q and k in place, at their own heads
# ----------------------------------------------------------------------------

def test_the_tensor_maps_give_q_and_k_their_own_heads(monkeypatch):
    # tensor-copy loads: q and k have H heads (rows of H * 128), every other input HV (rows of HV * 128,
    # or HV * 16 for Mqk / INV); the kernel reads q and k at column (hv // G) * 128 of their maps
    from ptx_lab import tensormap

    from kernel.ds_scan import launch

    maps = {}

    def encode(tmap):
        maps[len(maps)] = tmap
        return np.zeros(1, dtype=tensormap.TENSOR_MAP_DTYPE)

    monkeypatch.setattr(tensormap, "encode", encode)
    dims = (64, 128, 64, 128, 32, 64)
    tokens, H, HV, base = 4096, 2, 8, 0x7F00_0000_0000
    launch.encode_tensor_maps.__wrapped__(True, dims, tokens, H, HV, tuple(base + 4096 * i for i in range(6)), None)
    got = dict(zip(("q", "k", "gc", "do", "mqk", "inv"), maps.values()))
    for name, cols, esize in (("q", H * 128, 2), ("k", H * 128, 2), ("gc", HV * 128, 4), ("do", HV * 128, 2),
                              ("mqk", HV * 16, 2), ("inv", HV * 16, 2)):
        assert got[name].shape == (tokens, cols) and got[name].row_stride == cols * esize, name


def test_the_summary_launch_passes_value_heads_and_q_s_heads_where_the_kernel_takes_them(monkeypatch):
    from kernel.ds_scan import config, launch

    from ..kernel_signature import launched

    calls = []
    monkeypatch.setattr(launch, "kernel", lambda cfg: (lambda *call, **kw: calls.append((call, kw)), 99, cfg.threads, ()))
    inputs = ("q", "k", "gc", "beta", "mqk", "inv", "do")
    launch._launch_summaries(inputs, "M", "d", "cu", "offs", np.arange(3, dtype=np.int32), H=2, HV=6, scale=0.5,
                             vsplit=2, base=dict(l2norm=False, fla_inputs=True, token_gate=False))
    (grid, block, args), opts = calls[0]
    assert grid == (3 * 6 * 2, 2) and opts == {"shared_mem": 99}   # (sequence, value head, v part) x 2 roles
    got = launched(config.SOURCE_PATH, config.KERNEL_NAME, args)
    assert (got["HV"], got["H"], got["scale"]) == (6, 2, 0.5)
    assert (got["q"], got["k"], got["dO"], got["snapshots"], got["dh0"]) == ("q", "k", "do", "M", "d")
