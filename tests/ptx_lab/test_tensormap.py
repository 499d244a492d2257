"""ptx_lab.tensormap: every argument the driver would refuse is refused first, by name,
and encode() hands cuTensorMapEncodeTiled what its documentation asks for.

The driver itself is not needed: stand-ins for libcuda.so.1 (the ctypes path) and
for cuda.bindings.driver (the cuda-bindings path) record the call. The real driver
runs in the GPU tests, through the experiment tma_tile and here, where both paths
encode every map of DRIVER_PROBES and must produce the same 128 bytes.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ptx_lab import tensormap
from ptx_lab.tensormap import (TENSOR_MAP_BYTES, TENSOR_MAP_DTYPE, CudaDriverError, TensorMap2D,
                               dtype_name, encode)

REPO = Path(__file__).resolve().parents[2]
GOOD = dict(address=0x7F00_0000_0000, dtype="bfloat16", shape=(40, 512), row_stride=1024,
            box=(16, 128))


def make(**changes) -> TensorMap2D:
    return TensorMap2D(**{**GOOD, **changes})


# ------------------------------------------------------------------ accepted

def test_kernel_a_q_map_is_accepted_and_encoded_innermost_first():
    tmap = make(l2_promotion=128)
    assert tmap.shape == (40, 512) and tmap.box == (16, 128)
    assert (tmap.element_bytes, tmap.box_row_bytes, tmap.box_bytes) == (2, 256, 4096)
    assert tmap.driver_args() == {
        "tensorDataType": 9, "tensorRank": 2, "globalAddress": GOOD["address"],
        "globalDim": (512, 40), "globalStrides": (1024,), "boxDim": (128, 16),
        "elementStrides": (1, 1), "interleave": 0, "swizzle": 0, "l2Promotion": 2, "oobFill": 0}


@pytest.mark.parametrize("dtype, name, code, size", [
    ("bfloat16", "bfloat16", 9, 2), (ml_dtypes.bfloat16, "bfloat16", 9, 2),
    ("uint16", "uint16", 1, 2), (np.uint16, "uint16", 1, 2),
    ("float32", "float32", 7, 4), (np.dtype(np.float32), "float32", 7, 4),
    ("uint32", "uint32", 2, 4), (np.uint32, "uint32", 2, 4)])
def test_dtypes(dtype, name, code, size):
    assert dtype_name(dtype) == name
    tmap = make(dtype=dtype, row_stride=2048, box=(8, 64))
    assert tmap.dtype == name and tmap.element_bytes == size
    assert tmap.driver_args()["tensorDataType"] == code


@pytest.mark.parametrize("alias, name", [("bf16", "bfloat16"), ("b16", "uint16"), ("u16", "uint16"),
                                         ("f32", "float32"), ("b32", "uint32"), ("u32", "uint32")])
def test_ptx_spellings_are_aliases_of_the_numpy_names(alias, name):
    # ptx_lab.model spells bf16 the same way and takes the same aliases (tests/ptx_lab/test_model.py)
    assert dtype_name(alias) == name
    assert make(dtype=alias, row_stride=2048, box=(8, 64)) == make(dtype=name, row_stride=2048, box=(8, 64))


def test_limits_are_inclusive():
    make(shape=(2**32, 8), box=(256, 8))                          # globalDim <= 2^32, box <= 256
    make(dtype="float32", shape=(1, 4), row_stride=16, box=(1, 4))  # the smallest 16-byte box row
    make(row_stride=2**40 - 16)                                   # stride < 2^40
    make(box=(1, 256), shape=(1, 8), row_stride=16)               # a box larger than the tensor
    make(address=0)                                               # an image offset for the model
    assert make(shape=[40, 512], box=[16, 128]).shape == (40, 512)   # lists become tuples


@pytest.mark.parametrize("dtype, box, swizzle, code, align", [
    ("bfloat16", (16, 128), 0, 0, 128), ("bfloat16", (16, 16), 32, 1, 256),
    ("bfloat16", (16, 32), 64, 2, 512), ("bfloat16", (16, 64), 128, 3, 1024),
    ("float32", (8, 8), 32, 1, 256), ("float32", (256, 32), 128, 3, 1024)])
def test_swizzle_code_and_shared_alignment(dtype, box, swizzle, code, align):
    tmap = make(dtype=dtype, row_stride=2048, box=box, swizzle=swizzle)
    assert tmap.swizzle == swizzle and tmap.smem_align == align
    assert tmap.driver_args()["swizzle"] == code     # CU_TENSOR_MAP_SWIZZLE_{NONE, 32B, 64B, 128B}
    assert tmap.box_row_bytes == (swizzle or 256)


def test_frozen():
    with pytest.raises(AttributeError):
        make().row_stride = 2048


# ------------------------------------------------------------------ refused, one rule each

@pytest.mark.parametrize("changes, message", [
    (dict(dtype="float16"), r"dtype must be one of uint16, uint32, float32, bfloat16 \(aliases "
                            r"bf16, f32, b16, u16, b32, u32; or that numpy dtype\); got 'float16'"),
    (dict(dtype="f16"), r"dtype must be one of .*got 'f16'"),
    (dict(dtype=np.float16), r"dtype must be one of .*got <class 'numpy.float16'>"),
    (dict(dtype="f2"), r"dtype must be one of .*got 'f2'"),      # numpy's own codes are not names
    (dict(dtype=np.float64), "dtype must be one of"),
    (dict(dtype=None), "dtype must be one of"),
    (dict(address=1.0), "address must be an int; got 1.0"),
    (dict(address=True), "address must be an int"),
    (dict(address=-16), "address = -0x10: the tensor must start 16-byte aligned"),
    (dict(address=0x7F00_0000_0008), "address = 0x7f0000000008: the tensor must start 16-byte aligned"),
    (dict(shape=(40,)), r"shape must be a pair \(rows, cols\); got \(40,\)"),
    (dict(shape=40), "shape must be a pair"),
    (dict(shape=(40, 512.0)), r"shape\[1\] must be an int"),
    (dict(shape=(0, 512)), r"shape: rows = 0; each dimension must be 1..2\^32"),
    (dict(shape=(40, 2**32 + 1), row_stride=2**34), "shape: cols = 4294967297"),
    (dict(row_stride=1000), "row_stride = 1000: must be a positive multiple of 16 bytes"),
    (dict(row_stride=0), "row_stride = 0: must be a positive multiple of 16"),
    (dict(row_stride=-1024), "row_stride = -1024"),
    (dict(row_stride=2**40), r"row_stride = 1099511627776: must be below 2\^40 bytes"),
    (dict(row_stride=1008), "row_stride = 1008: rows of 512 bfloat16 elements are 1024 bytes long, "
                            "so rows 1008 bytes apart would overlap"),
    (dict(row_stride="1024"), "row_stride must be an int"),
    (dict(box=(16,)), r"box must be a pair \(box_rows, box_cols\)"),
    (dict(box=(0, 128)), "box: box_rows = 0; each box dimension must be 1..256 elements"),
    (dict(box=(16, 264)), "box: box_cols = 264; each box dimension must be 1..256"),
    (dict(box=(257, 8)), "box: box_rows = 257"),
    (dict(box=(16, 100)), "box: box_cols = 100 bfloat16 elements are 200 bytes; a box row must be "
                          "a multiple of 16 bytes"),
    (dict(dtype="float32", row_stride=2048, box=(16, 6)), "box_cols = 6 float32 elements are 24 bytes"),
    (dict(l2_promotion=64), r"l2_promotion = 64: must be 0 \(none\) or 128 \(bytes\)"),
    (dict(l2_promotion=None), "l2_promotion must be an int"),
    (dict(swizzle=16, box=(16, 8)), r"swizzle = 16: must be 0 \(none\), 32, 64 or 128 \(bytes\)"),
    (dict(swizzle=None), "swizzle must be an int"),
    (dict(swizzle=128), "swizzle = 128: a box row of 128 bfloat16 elements is 256 bytes; ptx_lab "
                        "swizzles only box rows of exactly 128 bytes"),
    (dict(swizzle=64, box=(16, 16)), "swizzle = 64: a box row of 16 bfloat16 elements is 32 bytes"),
    # the H200's driver refused exactly the 256 KiB boxes of --probe-driver (2026-11-30)
    (dict(dtype="float32", shape=(300, 256), box=(256, 256)),
     "box: 256 x 256 float32 elements are 262144 bytes; a box must fit one CTA's shared memory"),
    (dict(shape=(300, 512), box=(256, 256 + 8 * 16)), "box: box_cols = 384"),
])
def test_every_rule_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        make(**changes)


def test_encode_refuses_what_only_a_device_pointer_can_be():
    with pytest.raises(ValueError, match="tmap: expected a TensorMap2D; got dict"):
        encode(GOOD)
    with pytest.raises(ValueError, match="address = 0x0: encode.. needs the tensor's device pointer"):
        encode(make(address=0))


# ------------------------------------------------------------------ the driver, stood in for

class FakeDriver:
    """libcuda.so.1 as far as encode() uses it: records the call, writes a recognisable map."""

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.calls: list[dict] = []

    def cuInit(self, flags):
        assert flags == 0
        return 0

    def cuGetErrorName(self, code, name_ptr):
        name_ptr._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, estrides,
                               interleave, swizzle, l2, oob):
        self.calls.append(dict(
            out=out.value, dtype=dtype, rank=rank, address=address.value, dims=tuple(dims),
            strides=tuple(strides), box=tuple(box), estrides=tuple(estrides), interleave=interleave,
            swizzle=swizzle, l2=l2, oob=oob))
        pattern = (np.arange(TENSOR_MAP_BYTES) ^ 0x5A).astype(np.uint8)
        ctypes.memmove(out.value, pattern.ctypes.data, TENSOR_MAP_BYTES)
        return self.result


@pytest.fixture
def ctypes_path(monkeypatch):
    """encode() as it runs where cuda-bindings is not installed."""
    monkeypatch.setattr(tensormap, "_bindings", lambda: None)
    assert tensormap.backend() == "ctypes"


@pytest.fixture
def fake_driver(monkeypatch, ctypes_path):
    fake = FakeDriver()
    monkeypatch.setattr(tensormap, "_driver", lambda: fake)
    return fake


def test_encode_passes_the_documented_arguments(fake_driver):
    out = encode(make(l2_promotion=128))
    (call,) = fake_driver.calls
    assert call["out"] % 64 == 0, "the driver writes the map to a 64-byte aligned address"
    assert {k: v for k, v in call.items() if k != "out"} == dict(
        dtype=9, rank=2, address=GOOD["address"], dims=(512, 40), strides=(1024,), box=(128, 16),
        estrides=(1, 1), interleave=0, swizzle=0, l2=2, oob=0)
    assert out.shape == (1,) and out.dtype == TENSOR_MAP_DTYPE and out.nbytes == TENSOR_MAP_BYTES
    assert out.tobytes() == bytes((np.arange(TENSOR_MAP_BYTES) ^ 0x5A).astype(np.uint8))
    assert out["opaque"][0][0] == int.from_bytes(out.tobytes()[:8], "little")


def test_encode_passes_the_swizzle(fake_driver):
    encode(make(box=(16, 32), swizzle=64))
    (call,) = fake_driver.calls
    assert (call["swizzle"], call["box"]) == (2, (32, 16))


def test_the_driver_refusing_is_a_clear_error(fake_driver):
    fake_driver.result = 1
    with pytest.raises(CudaDriverError, match=r"cuTensorMapEncodeTiled returned 1 "
                                              r"\(CUDA_ERROR_INVALID_VALUE\) for TensorMap2D"):
        encode(make())


def test_a_missing_driver_is_a_clear_error(monkeypatch, ctypes_path):
    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    tensormap._driver.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    try:
        with pytest.raises(CudaDriverError, match="cannot load libcuda.so.1, the CUDA driver"):
            encode(make())
    finally:
        tensormap._driver.cache_clear()


def test_a_driver_without_tensor_maps_is_a_clear_error(monkeypatch, ctypes_path):
    class OldDriver:
        pass

    tensormap._driver.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: OldDriver())
    try:
        with pytest.raises(CudaDriverError, match="has no cuTensorMapEncodeTiled"):
            encode(make())
    finally:
        tensormap._driver.cache_clear()


def test_the_map_dtype_is_what_the_kernel_declares():
    # ptx_lab::TensorMap is { u64 opaque[16]; } aligned to 64: 128 bytes, 16 little-endian words.
    assert TENSOR_MAP_DTYPE.itemsize == 128
    assert TENSOR_MAP_DTYPE["opaque"].shape == (16,) and TENSOR_MAP_DTYPE["opaque"].base == np.dtype("<u8")
    from ptx_lab import CUDA_INCLUDE_DIR
    header = (CUDA_INCLUDE_DIR / "tma.cuh").read_text()
    assert "struct alignas(64) TensorMap {\n    u64 opaque[16];\n};" in header


# ------------------------------------------------------------------ cuda-bindings, stood in for

class FakeBindings:
    """cuda.bindings.driver as far as encode() uses it (the calls and return shapes of
    cuda-bindings 12.x/13.x: a tuple whose first item is the CUresult; typed scalars and
    enums wrap ints; the CUtensorMap object gives its address by getPtr())."""

    class _Wrapped:
        def __init__(self, value):
            self.value = int(value)

        def __int__(self):
            return self.value

        def __eq__(self, other):
            return type(self) is type(other) and self.value == other.value

        def __repr__(self):
            return f"{type(self).__name__}({self.value})"

    class cuuint64_t(_Wrapped): pass           # noqa: E701,N801
    class cuuint32_t(_Wrapped): pass           # noqa: E701,N801
    class CUresult(_Wrapped): pass             # noqa: E701
    class CUtensorMapDataType(_Wrapped): pass  # noqa: E701
    class CUtensorMapInterleave(_Wrapped): pass   # noqa: E701
    class CUtensorMapSwizzle(_Wrapped): pass   # noqa: E701
    class CUtensorMapL2promotion(_Wrapped): pass  # noqa: E701
    class CUtensorMapFloatOOBfill(_Wrapped): pass  # noqa: E701

    class CUtensorMap:
        def __init__(self):
            self.buffer = ctypes.create_string_buffer(bytes((np.arange(TENSOR_MAP_BYTES) ^ 0xA5)
                                                            .astype(np.uint8)), TENSOR_MAP_BYTES)

        def getPtr(self):   # noqa: N802 (cuda-bindings' name)
            return ctypes.addressof(self.buffer)

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.calls: list[tuple] = []

    def cuInit(self, flags):   # noqa: N802
        assert flags == 0
        return (self.CUresult(0),)

    def cuGetErrorName(self, error):   # noqa: N802
        assert isinstance(error, self.CUresult)
        return self.CUresult(0), b"CUDA_ERROR_INVALID_VALUE"

    def cuDriverGetVersion(self):   # noqa: N802
        return self.CUresult(0), 13000

    def cuTensorMapEncodeTiled(self, *args):   # noqa: N802
        self.calls.append(args)
        return self.CUresult(self.result), (self.CUtensorMap() if self.result == 0 else None)


@pytest.fixture
def fake_bindings(monkeypatch):
    fake = FakeBindings()
    monkeypatch.setattr(tensormap, "_bindings", lambda: fake)
    monkeypatch.setattr(tensormap, "_driver", lambda: pytest.fail("the ctypes path was taken"))
    assert tensormap.backend() == "cuda-bindings"
    return fake


def test_cuda_bindings_get_the_documented_arguments_typed(fake_bindings):
    F = FakeBindings
    out = encode(make(box=(16, 32), swizzle=64, l2_promotion=128))
    (call,) = fake_bindings.calls
    assert call == (F.CUtensorMapDataType(9), 2, GOOD["address"],
                    [F.cuuint64_t(512), F.cuuint64_t(40)], [F.cuuint64_t(1024)],
                    [F.cuuint32_t(32), F.cuuint32_t(16)], [F.cuuint32_t(1), F.cuuint32_t(1)],
                    F.CUtensorMapInterleave(0), F.CUtensorMapSwizzle(2), F.CUtensorMapL2promotion(2),
                    F.CUtensorMapFloatOOBfill(0))
    assert out.shape == (1,) and out.dtype == TENSOR_MAP_DTYPE
    assert out.tobytes() == bytes((np.arange(TENSOR_MAP_BYTES) ^ 0xA5).astype(np.uint8))


def test_cuda_bindings_refusing_is_the_same_clear_error(fake_bindings):
    fake_bindings.result = 1
    with pytest.raises(CudaDriverError, match=r"cuTensorMapEncodeTiled returned 1 "
                                              r"\(CUDA_ERROR_INVALID_VALUE\) for TensorMap2D"):
        encode(make())
    assert tensormap.driver_version() == "13000"


def test_both_paths_pass_the_driver_the_same_arguments(monkeypatch, fake_bindings):
    ctypes_fake = FakeDriver()
    monkeypatch.setattr(tensormap, "_driver", lambda: ctypes_fake)
    for probe in tensormap.DRIVER_PROBES:
        tmap = probe.tensor_map(0x7F00_0000_0000)
        tensormap._encode_call(tmap, via="cuda-bindings")
        tensormap._encode_call(tmap, via="ctypes")
    assert len(fake_bindings.calls) == len(ctypes_fake.calls) == len(tensormap.DRIVER_PROBES)
    for typed, raw in zip(fake_bindings.calls, ctypes_fake.calls):
        plain = [[int(v) for v in a] if isinstance(a, list) else int(a) for a in typed]
        assert plain == [raw["dtype"], raw["rank"], raw["address"], list(raw["dims"]), list(raw["strides"]),
                         list(raw["box"]), list(raw["estrides"]), raw["interleave"], raw["swizzle"],
                         raw["l2"], raw["oob"]]


def test_via_names_a_path(monkeypatch, ctypes_path):
    with pytest.raises(ValueError, match="via must be one of cuda-bindings, ctypes or None"):
        encode(make(), via="cupy")
    with pytest.raises(CudaDriverError, match="via='cuda-bindings': cuda-bindings is not installed"):
        encode(make(), via="cuda-bindings")


# ------------------------------------------------------------------ the real driver (GPU machine)

def _encode_on_device(dtype, shape, box, l2=0):
    import cupy

    esize = tensormap.ELEMENT_BYTES[dtype]
    stride = -(-shape[1] * esize // 16) * 16
    buf = cupy.zeros(shape[0] * stride, dtype=cupy.uint8)
    out = encode(TensorMap2D(buf.data.ptr, dtype, shape, stride, box, l2_promotion=l2))
    assert out.shape == (1,) and out.dtype == TENSOR_MAP_DTYPE and out.tobytes() != bytes(128)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape, box", [
    ("bfloat16", (40, 512), (16, 128)), ("uint16", (7, 24), (3, 8)), ("float32", (40, 256), (16, 64)),
    ("uint32", (300, 256), (256, 4))])
@pytest.mark.parametrize("l2", [0, 128])
def test_the_driver_accepts_what_validation_accepts(dtype, shape, box, l2):
    _encode_on_device(dtype, shape, box, l2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape, box", [("uint32", (1, 4), (256, 4))])
def test_the_driver_on_a_box_taller_than_the_tensor(dtype, shape, box):
    # Validation accepts a box larger than the tensor (the load is then mostly zero fill), and the
    # H200 took this one. It refused float32 (300, 8) with box (256, 256) (CUDA_ERROR_INVALID_VALUE):
    # --probe-driver then showed it refuses 256 KiB boxes of any shape and accepts every box of up
    # to 128 KiB, so TensorMap2D refuses boxes larger than one CTA's shared memory (MAX_BOX_BYTES).
    _encode_on_device(dtype, shape, box)


PROBE_ROW = re.compile(r"^(\d+)\s+(\S+)\s+(\d+)x(\d+)\s+(\d+)\s+(\d+)x(\d+)\s+(\d+)\s+.*?"
                       r"\s(accepted|\S+ \(-?\d+\))\s")


def probe_rows(table: str) -> dict[int, tuple[str, ...]]:
    """Probe number -> (dtype, rows, cols, row_stride, box rows, box cols, swizzle, answer)."""
    found = {}
    for line in table.splitlines():
        m = PROBE_ROW.match(line)
        if m:
            found[int(m[1])] = m.groups()[1:]
    return found


def expected_rows() -> dict[int, tuple[str, ...]]:
    return {n: (p.dtype, str(p.shape[0]), str(p.shape[1]), str(p.row_stride), str(p.box[0]),
                str(p.box[1]), str(p.swizzle)) for n, p in enumerate(tensormap.DRIVER_PROBES)}


@pytest.mark.gpu
def test_the_driver_probe_records_every_answer(capsys):
    # Passes whatever the driver answers, as long as the answer to every probe is recorded: the
    # table is written to the terminal (outside pytest's capture) for the run's log.
    run = subprocess.run([sys.executable, "-m", "ptx_lab.tensormap", "--probe-driver"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    with capsys.disabled():
        print("\n" + run.stdout + run.stderr)
    assert run.returncode == 0, run.stderr
    found = probe_rows(run.stdout)
    assert {n: row[:-1] for n, row in found.items()} == expected_rows(), run.stdout


@pytest.mark.gpu
def test_cuda_bindings_and_ctypes_encode_byte_identical_maps():
    # The same maps through both paths, on the real driver: every map of DRIVER_PROBES at two
    # addresses (one 16 bytes past a 256-byte boundary), with and without L2 promotion. Both
    # paths must agree on the answer and, where the driver accepts, on all 128 bytes.
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed: only ctypes here")
    import cupy

    buf = cupy.zeros(max(p.tensor_bytes for p in tensormap.DRIVER_PROBES) + 256, dtype=cupy.uint8)
    compared = 0
    for probe in tensormap.DRIVER_PROBES:
        for address in (buf.data.ptr, buf.data.ptr + 16):
            for l2 in (0, 128):
                tmap = dataclasses.replace(probe.tensor_map(address), l2_promotion=l2)
                (code_b, bytes_b), (code_c, bytes_c) = (tensormap._encode_call(tmap, via=v)
                                                        for v in ("cuda-bindings", "ctypes"))
                assert code_b == code_c, (probe, address, l2)
                if code_b == 0:
                    assert bytes_b.tobytes() == bytes_c.tobytes(), (probe, address, l2)
                    assert bytes_b.tobytes() != bytes(TENSOR_MAP_BYTES)
                    compared += 1
    assert compared >= 4 * (len(tensormap.DRIVER_PROBES) - 4), compared   # most probes are accepted
    assert tensormap.backend() == "cuda-bindings"     # what encode() takes by default here
    kernel_a_do = next(p for p in tensormap.DRIVER_PROBES if p.why == "Kernel A: do, 128-byte swizzle")
    kernel_a_do = kernel_a_do.tensor_map(buf.data.ptr)
    assert encode(kernel_a_do).tobytes() == encode(kernel_a_do, via="ctypes").tobytes()


# ------------------------------------------------------------------ the probe, stood in for

class RuleDriver(FakeDriver):
    """A driver that refuses box rows over 512 bytes: a made-up rule, to see the table show it."""

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, estrides,
                               interleave, swizzle, l2, oob):
        super().cuTensorMapEncodeTiled(out, dtype, rank, address, dims, strides, box, estrides,
                                       interleave, swizzle, l2, oob)
        esize = 2 if dtype in (1, 9) else 4
        return 1 if box[0] * esize > 512 else 0

    def cuDriverGetVersion(self, version_ptr):
        version_ptr._obj.value = 13000
        return 0


def test_every_probe_is_a_map_validation_accepts():
    assert len(tensormap.DRIVER_PROBES) >= 20
    for probe in tensormap.DRIVER_PROBES:
        tmap = probe.tensor_map(0x7F00_0000_0000)
        assert tmap.row_stride * tmap.shape[0] == probe.tensor_bytes
    # The shape of the case the H200 refused (at a size validation now accepts), and the case it
    # accepted, are both asked again.
    cases = {(p.dtype, p.shape, p.box) for p in tensormap.DRIVER_PROBES}
    assert {("float32", (300, 8), (256, 200)), ("uint32", (1, 4), (256, 4))} <= cases


def test_the_probe_table_has_every_row_and_the_driver_s_answer(monkeypatch, capsys, ctypes_path):
    fake = RuleDriver()
    monkeypatch.setattr(tensormap, "_driver", lambda: fake)
    assert tensormap.main(["--probe-driver"], allocate=lambda n: (0x7F00_0000_0000, "Fake GPU", None)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cuTensorMapEncodeTiled on {len(tensormap.DRIVER_PROBES)} boxes (Fake GPU, "
                          "driver 13000 through ctypes; tensor at 0x7f0000000000, rows padded to 16 B):"
                          "\n#   dtype")
    found = probe_rows(out)
    assert {n: row[:-1] for n, row in found.items()} == expected_rows(), out
    for n, probe in enumerate(tensormap.DRIVER_PROBES):
        refused = probe.box[1] * tensormap.ELEMENT_BYTES[probe.dtype] > 512
        assert found[n][-1] == ("CUDA_ERROR_INVALID_VALUE (1)" if refused else "accepted")
    assert len(fake.calls) == len(tensormap.DRIVER_PROBES)
    refused_shape = next(n for n, p in enumerate(tensormap.DRIVER_PROBES) if p.shape == (300, 8))
    assert fake.calls[refused_shape]["box"] == (200, 256) and fake.calls[refused_shape]["dims"] == (8, 300)


def test_the_probe_without_a_gpu_says_so(monkeypatch, capsys):
    from ptx_lab import gpu

    monkeypatch.setattr(gpu, "gpu_reason", lambda: "CuPy is not installed")
    assert tensormap.main(["--probe-driver"]) == 2
    assert "--probe-driver needs a GPU machine with CuPy" in capsys.readouterr().err
