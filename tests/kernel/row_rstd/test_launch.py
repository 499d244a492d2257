"""kernel.row_rstd on the CPU: the plan's checks, each refusal naming its argument, the knob and the build, the
grid, and the launch's arguments in the kernel's order. The arguments are stand-ins for GPU arrays (no memory),
so every check runs without a GPU."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from kernel import row_rstd
from kernel.row_rstd import DEPTHS, KNOB_MACROS, SOURCE_PATH, Config, all_variants, options, plan_row_rstd
from kernel.row_rstd import config as rr_config
from kernel.row_rstd import launch as rr_launch

from ..ds_scan.test_fla import DeviceArray
from ..kernel_signature import launched, parameters

D = 128
BF16 = np.uint16


def _pair(shape=(2, 100, 3, D), dtype=BF16, **kw):
    return DeviceArray(shape, dtype, **kw), DeviceArray(shape, dtype, **kw)


def _misaligned(a: DeviceArray, by: int) -> DeviceArray:
    ptr, ro = a.__cuda_array_interface__["data"]
    a.__cuda_array_interface__["data"] = (ptr + by, ro)
    return a


# ----------------------------------------------------------------------------- the plan

@pytest.mark.parametrize("shape, rows", [((2, 100, 3, D), 600), ((1, 4099, 5, D), 4099 * 5), ((7, D), 7), ((D,), 1),
                                         ((3, 0, 2, D), 0)])
def test_the_plan_counts_rows_and_bytes(shape, rows):
    plan = plan_row_rstd(*_pair(shape))
    assert plan.rows == rows and plan.out_shape == shape[:-1] and plan.shape == shape
    assert plan.bytes_moved == 2 * rows * 256 + 2 * rows * 4      # both read, both rstd written
    assert plan.config == Config() and not plan.torch_out and plan.device == 0


def test_the_plan_takes_a_config():
    assert plan_row_rstd(*_pair(), config=Config(depth=2)).config.depth == 2
    with pytest.raises(TypeError, match="config must be a kernel.row_rstd.Config or None, got dict"):
        plan_row_rstd(*_pair(), config={"depth": 2})


@pytest.mark.parametrize("bad, error, words", [
    ("q_head", ValueError, r"q must be \[\.\.\., 128\] \(rows of the head size 128\), got shape \(2, 100, 3, 64\)"),
    ("k_head", ValueError, r"k must be \[\.\.\., 128\]"),
    ("q_scalar", ValueError, r"q must be \[\.\.\., 128\].*got shape \(\)"),
    ("q_dtype", TypeError, r"q must be bf16 \(torch.bfloat16, or uint16 bf16 bits in CuPy\), got float32"),
    ("k_dtype", TypeError, r"k must be bf16 .*got float16"),
    ("q_strided", ValueError, r"q must be C-contiguous"),
    ("k_strided", ValueError, r"k must be C-contiguous"),
    ("q_misaligned", ValueError, r"q's data must be 16-byte aligned .* 8 bytes past a multiple of 16"),
    ("k_misaligned", ValueError, r"k's data must be 16-byte aligned .* 2 bytes past"),
    ("k_shape", ValueError, r"k must have q's shape \(2, 100, 3, 128\), got \(2, 99, 3, 128\)"),
    ("k_device", ValueError, r"q and k must be on one device .* q: device 0 \(cupy\), k: device 1 \(cupy\)"),
    ("q_host", TypeError, r"q is a numpy.ndarray \(host memory\): row_rstd runs on the GPU"),
    ("k_host", TypeError, r"k is a numpy.ndarray \(host memory\)"),
    ("k_list", TypeError, r"k must be a CuPy array or a torch CUDA tensor, got list"),
])
def test_each_refusal_names_its_argument(bad, error, words):
    shape = (2, 100, 3, D)
    q, k = _pair(shape)
    strides = (100 * 3 * D * 2 * 2, 3 * D * 2 * 2, D * 2 * 2, 2 * 2)   # every other row
    which, what = bad.split("_")
    made = {"head": lambda: DeviceArray((2, 100, 3, 64), BF16), "scalar": lambda: DeviceArray((), BF16),
            "dtype": lambda: DeviceArray(shape, np.float32 if which == "q" else np.float16),
            "strided": lambda: DeviceArray(shape, BF16, strides=strides),
            "misaligned": lambda: _misaligned(DeviceArray(shape, BF16), 8 if which == "q" else 2),
            "shape": lambda: DeviceArray((2, 99, 3, D), BF16), "device": lambda: DeviceArray(shape, BF16, device=1),
            "host": lambda: np.zeros(shape, BF16), "list": lambda: [0] * D}[what]()
    q, k = (made, k) if which == "q" else (q, made)
    with pytest.raises(error, match=words):
        plan_row_rstd(q, k)


def test_torch_tensors_on_the_cpu_are_refused_by_name():
    torch = pytest.importorskip("torch")
    q = torch.zeros(2, 5, 1, D, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"q must be a CUDA tensor, got a tensor on cpu \(use .cuda\(\)\)"):
        row_rstd.row_rstd(q, q)     # the plan's check, before CuPy or a GPU is asked for
    with pytest.raises(TypeError, match=r"k must be a CUDA tensor"):
        plan_row_rstd(DeviceArray((2, 5, 1, D), BF16), q)


def test_torch_and_cupy_together_are_refused():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("a torch CUDA tensor needs a GPU")
    q = torch.zeros(2, 5, 1, D, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"both torch tensors or both CuPy arrays"):
        plan_row_rstd(q, DeviceArray((2, 5, 1, D), BF16, device=q.device.index))


# ----------------------------------------------------------------------------- the knob and the build

def test_the_knob_and_its_checks():
    assert [c.depth for c in all_variants()] == list(DEPTHS) and Config().depth == 4
    assert [c.name() for c in all_variants()] == ["d1", "d2", "d4", "d8"]
    for bad in (3, 16, True, 4.0, "4"):
        with pytest.raises(ValueError, match="Config.depth must be one of"):
            Config(depth=bad)
    with pytest.raises(ValueError, match="Config.lineinfo must be True or False"):
        Config(lineinfo=1)
    assert Config(depth=np.int64(2)).depth == 2


def test_every_config_field_is_a_knob_and_reaches_the_source():
    src = SOURCE_PATH.read_text()
    assert {f.name for f in dataclasses.fields(Config)} == set(KNOB_MACROS) | set(rr_config.COMPILER_FLAGS)
    opts = options(Config(depth=2))
    assert {"-DRR_DEPTH=2", "-ftz=true", f"-I{rr_config.SOURCE_DIR}"} <= set(opts)
    # the division and the square root stay IEEE's: nothing that turns them into approximations
    assert not any(o.startswith(("-use_fast_math", "--use_fast_math", "-prec-div", "-prec-sqrt")) for o in opts)
    assert "-lineinfo" not in opts and "-lineinfo" in options(Config(lineinfo=True))
    for macro in KNOB_MACROS.values():
        assert re.search(rf"#ifndef {macro}\n#error \"{macro} is not set: kernel/row_rstd/config.py sets every knob",
                         src), macro
        uses = [line for line in src.splitlines()
                if re.search(rf"\b{macro}\b", line) and not re.match(r"\s*#(ifndef|error)\b", line)]
        assert uses, f"{macro} is passed but the source never uses it"
    assert "asm" not in src      # the inline PTX lives in ptx_lab/cuda's headers


def test_the_build_and_its_report_rows():
    build = row_rstd.BUILD
    assert build.function == "kda_row_rstd" and build.constants == "rr" and build.entry == SOURCE_PATH
    assert [build.label(c) for c in build.variants()] == ["row-rstd-d1", "row-rstd-d2", "row-rstd-d4", "row-rstd-d8"]
    assert build.required_sass(build.default()) == ("LDG",)
    assert build.source().startswith(f"// headers sha256 {build.header_digest()}\n")


def test_the_grid_is_eight_ctas_an_sm_or_the_steps():
    cfg = Config()
    assert (cfg.threads, cfg.ctas_per_sm, cfg.rows_per_step) == (256, 8, 64)
    assert (Config(depth=8).ctas_per_sm, Config(depth=8).rows_per_step) == (4, 128)
    big = plan_row_rstd(*_pair((32, 8192, 32, D)))
    assert rr_launch.grid(big, 132) == 8 * 132
    assert rr_launch.grid(plan_row_rstd(*_pair((32, 8192, 32, D)), config=Config(depth=8)), 132) == 4 * 132
    small = plan_row_rstd(*_pair((1, 33, 1, D)))        # 66 rows of q and k: two steps of 64
    assert rr_launch.grid(small, 132) == 2
    assert rr_launch.grid(plan_row_rstd(*_pair((1, D))), 132) == 1


# ----------------------------------------------------------------------------- the launch

def test_the_launch_passes_the_kernels_parameters_in_order(monkeypatch):
    assert parameters(SOURCE_PATH, "kda_row_rstd") == ["q", "k", "rows", "q_rstd", "k_rstd"]
    calls = []

    def fn(grid, block, args, shared_mem):
        calls.append((grid, block, args, shared_mem))

    monkeypatch.setattr(rr_launch, "kernel", lambda cfg: (fn, 0, cfg.threads))
    monkeypatch.setattr(rr_launch.builds, "sm_count", lambda: 132)
    plan = plan_row_rstd(*_pair((2, 1000, 3, D)))
    rr_launch.launch_planned(plan, "q", "k", "q_rstd", "k_rstd")
    (grid, block, args, smem), = calls
    got = launched(SOURCE_PATH, "kda_row_rstd", args)
    assert got == {"q": "q", "k": "k", "rows": 6000, "q_rstd": "q_rstd", "k_rstd": "k_rstd"}
    assert isinstance(got["rows"], np.int64)                 # the kernel's long long
    assert grid == (-(-12000 // 64),) and block == (256,) and smem == 0


def test_no_rows_launch_nothing(monkeypatch):
    monkeypatch.setattr(rr_launch, "kernel", lambda cfg: pytest.fail("compiled for no rows"))
    rr_launch.launch_planned(plan_row_rstd(*_pair((2, 0, 3, D))), None, None, None, None)
