"""ptx_lab.device checks its arguments as ptx_lab.model does, on the CPU, before CuPy.

The GPU twins take the model's spellings (dtype names of ptx_lab.dtypes and their
PTX aliases, flags only as real bools, counts only as ints) and refuse the rest
with the argument's name, before a GPU is looked for. Nothing here needs a GPU:
every call below is refused before the launch, and the refusals are also made in
a fresh interpreter, which must not have imported CuPy afterwards.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptx_lab import device, model

REPO = Path(__file__).resolve().parents[2]
WARP = 32


def _args():
    smem = np.zeros(512, dtype=np.uint8)
    addrs = np.arange(WARP) * 16
    regs = np.zeros((WARP, 4), dtype=np.uint32)
    a = model.matrix_to_wgmma_a(np.ones((64, 16), np.float32))
    img = np.zeros(4096, dtype=np.uint8)
    desc = model.wgmma_desc(0, 128, 256)
    c = np.zeros((128, 8), dtype=np.float32)
    return smem, addrs, regs, a, img, desc, c


def flag_calls():
    """(function, flag) -> call(flag value), every other argument valid."""
    smem, addrs, regs, a, img, desc, c = _args()
    return {
        ("ldmatrix", "trans"): lambda v: device.ldmatrix(smem, addrs, 4, v),
        ("stmatrix", "trans"): lambda v: device.stmatrix(smem, addrs, regs, v),
        ("wgmma_m64nNk16_rs", "scale_d"): lambda v: device.wgmma_m64nNk16_rs(a, img, desc, c, 16, v),
    }


NOT_BOOLS = ["no", "yes", "False", 0, 1, 1.0, None, np.array([True]), np.int64(1)]


def refused_calls():
    """(id, call, exception, message) for arguments the model refuses too."""
    smem, addrs, regs, a, img, desc, c = _args()
    fc = np.zeros((WARP, 4), np.float32)
    out = [(f"{k[0]}-{k[1]}={v!r}", lambda v=v, k=k: flag_calls()[k](v), TypeError,
            rf"{k[1]} must be a bool \(True or False\); got")
           for k in sorted(flag_calls()) for v in NOT_BOOLS]

    def mma(dtype):
        return lambda: device.mma_m16n8k16(regs, regs[:, :2], fc, dtype)

    def cp(*args, **kw):
        return lambda: device.cp_async(smem, smem, *args, **kw)

    def wgmma(n):
        return lambda: device.wgmma_m64nNk16_rs(a, img, desc, c, n)

    out += [
        ("mma-dtype=f32", mma("f32"), ValueError,
         r"dtype must be one of bfloat16, float16 \(aliases bf16, f16; or that numpy dtype\); got 'f32'"),
        ("mma-dtype=f8", mma("f8"), ValueError, "dtype must be one of"),
        ("mma-dtype=np.float32", mma(np.float32), ValueError, "dtype must be one of"),
        ("ldmatrix-num=True", lambda: device.ldmatrix(smem, addrs, True, False), ValueError,
         r"num must be 1, 2 or 4.*got True"),
        ("ldmatrix-num=2.0", lambda: device.ldmatrix(smem, addrs, 2.0, False), ValueError,
         r"num must be 1, 2 or 4.*got 2.0"),
        ("cp_async-size=16.0", cp(addrs, addrs, 16.0), ValueError, "size must be an int; got 16.0"),
        ("cp_async-size=True", cp(addrs, addrs, True), ValueError, "size must be an int; got True"),
        ("cp_async-size=2", cp(addrs, addrs, 2), ValueError, "size must be 4, 8 or 16"),
        ("cp_async-cg8", cp(addrs // 2, addrs // 2, 8, cache="cg"), ValueError,
         "cache='cg' copies only 16 bytes"),
        ("cp_async-cache=cs", cp(addrs, addrs, 16, cache="cs"), ValueError, "cache must be"),
        ("wgmma-n=16.0", wgmma(16.0), ValueError, r"n must be one of .*16.0"),
        ("wgmma-n=True", wgmma(True), ValueError, r"n must be one of .*True"),
    ]
    return out


def test_every_bool_flag_of_the_device_api_is_tested_here():
    import inspect

    found = {(name, p.name) for name in device.__all__
             for p in inspect.signature(getattr(device, name)).parameters.values()
             if p.annotation in (bool, "bool")}
    assert found == set(flag_calls())


# device twins of the layer above single instructions whose CPU model has another name (ptx_lab.ring), or
# is ml_dtypes' rounding itself (bf16_scalars: tests/ptx_lab/test_operand_fragments.py compares them)
LAYER_TWINS = {"ring_ids": "ring.barrier_ids", "ring_walk": "ring.walk", "mbarrier_ring_parities": "ring.mbarrier_parities",
               "mbarrier_ring_walk": "ring.mbarrier_walk", "bf16_scalars": "ml_dtypes"}


def test_the_device_api_is_the_models():
    from ptx_lab import fragments, ring

    for name in device.__all__:
        if name in LAYER_TWINS:
            module, _, attr = LAYER_TWINS[name].partition(".")
            assert not attr or callable(getattr({"ring": ring}[module], attr)), name
            continue
        assert any(callable(getattr(m, name, None)) for m in (model, fragments)), name


@pytest.mark.parametrize("case", refused_calls(), ids=[case[0] for case in refused_calls()])
def test_a_bad_argument_is_refused_by_name(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


def test_mma_dtypes_are_the_models_and_reach_a_probe_kernel():
    src = device.PROBES_CU.read_text()
    regs, c = np.zeros((WARP, 4), np.uint32), np.zeros((WARP, 4), np.float32)
    for name, suffix in device.MMA_DTYPES.items():
        assert f"(probe_mma_m16n8k16_{suffix}," in src, suffix
        model.mma_m16n8k16(regs, regs[:, :2], c, name)     # the model takes the same names
        model.mma_m16n8k16(regs, regs[:, :2], c, suffix)   # ... and the PTX aliases


def test_refusals_come_before_cupy_is_imported():
    # a fresh interpreter: CuPy (where installed) must still be unimported after every refusal
    code = (
        "import sys\n"
        "sys.path.insert(0, '.')\n"
        "from tests.ptx_lab.test_device_args import refused_calls\n"
        "assert 'cupy' not in sys.modules, 'imported before any call'\n"
        "n = 0\n"
        "for _, call, exc, match in refused_calls():\n"
        "    try:\n"
        "        call()\n"
        "    except exc:\n"
        "        n += 1\n"
        "    assert 'cupy' not in sys.modules, f'call {n} imported cupy'\n"
        "print(n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(refused_calls())
