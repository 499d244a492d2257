"""kernel.forward.config on the CPU: the Config's refusals, the auto rule, the shared-memory count, the
registry entry and the build's knobs (every one reaches the source, none has a default there); and,
where nvcc is on PATH, every registered variant compiled for sm_90a with 0 spills."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernel import forward as kf
from kernel import registry
from kernel.forward import Config
from kernel.forward_states import choose_warps

SRC = kf.SOURCE_PATH.read_text()


@pytest.mark.parametrize("field, value", [("warps", 3), ("warps", 16), ("warps", True), ("nstage", 1),
                                          ("nstage", 8), ("warps", 2.0), ("producers", 3), ("producers", 16),
                                          ("g6_split", 3), ("g6_split", 8)])
def test_config_refuses_what_the_source_cannot_build(field, value):
    with pytest.raises(ValueError, match=f"Config.{field} must be one of"):
        Config(**{field: value})


def test_config_refuses_what_an_sm_cannot_hold():
    with pytest.raises(ValueError, match=r"Config.warps \+ Config.producers must be at most 12, got 8 \+ 8"):
        Config(warps=8, producers=8)
    with pytest.raises(ValueError, match=r"Config w8-p2-st5-g4 needs 256\d+ B of shared memory"):
        Config(warps=8, producers=2, nstage=5)
    with pytest.raises(ValueError, match="Config.lineinfo must be True or False"):
        Config(lineinfo=1)


@pytest.mark.parametrize("warps, producers, nstage, expect", [
    # sizeof(Shared) of forward_layout.cuh, read from nvcc (static_assert) for these configurations
    (8, 2, 4, 218704), (4, 4, 5, 231904), (2, 4, 5, 214496), (1, 4, 5, 205792), (1, 1, 2, 90960), (8, 8, 2, 155520)])
def test_the_shared_memory_count_is_the_sources(warps, producers, nstage, expect):
    assert kf.smem_bytes(warps, producers, nstage) == expect


@pytest.mark.parametrize("warps", kf.WARPS)
def test_the_auto_config_takes_the_deepest_ring_that_fits(warps):
    cfg = kf.auto_config(warps)
    assert (cfg.warps, cfg.producers, cfg.g6_split) == (warps, 2 if warps == 8 else 4, 4)
    assert cfg.smem_bytes <= kf.SMEM_OPTIN
    assert cfg.nstage == 6 or kf.smem_bytes(warps, cfg.producers, cfg.nstage + 1) > kf.SMEM_OPTIN


def test_the_grid_rule_is_kernel_s():
    # the same CTA per (sequence, head, v group) as Kernel S, so the same warps for the same pairs
    for pairs in (1, 16, 32, 64, 118, 119, 1024):
        assert kf.auto_config(choose_warps(pairs, 132)).vgroups == 128 // (16 * choose_warps(pairs, 132))


def test_the_registry_builds_the_forward():
    assert kf.BUILD in registry.KERNELS
    assert [kf.BUILD.label(c) for c in kf.BUILD.variants()] == [
        "forward-w1-p4-st5-g4", "forward-w2-p4-st5-g4", "forward-w4-p4-st5-g4", "forward-w8-p2-st4-g4"]
    assert kf.BUILD.default() == kf.auto_config(8)
    assert kf.BUILD.function == "kda_forward" and kf.BUILD.constants == "kf"
    assert set(kf.BUILD.required_sass(kf.BUILD.default())) >= {"HMMA", "LDSM", "LDGSTS", "STSM"}
    assert re.search(r'extern "C" __constant__ int kf_smem_bytes = SMEM_BYTES;', SRC)
    assert re.search(r'extern "C" __constant__ int kf_threads = THREADS;', SRC)


def test_every_config_field_is_a_knob_and_reaches_the_source():
    import dataclasses

    assert {f.name for f in dataclasses.fields(Config)} == set(kf.KNOB_MACROS) | set(kf.COMPILER_FLAGS)
    opts = kf.options(Config(warps=4, producers=2, nstage=2, g6_split=1))
    assert {"-DKF_WARPS=4", "-DKF_PRODUCERS=2", "-DKF_NSTAGE=2", "-DKF_G6_SPLIT=1", "-ftz=true"} <= set(opts)
    assert "-lineinfo" not in opts and "-lineinfo" in kf.options(Config(lineinfo=True))
    for macro in kf.KNOB_MACROS.values():
        assert re.search(rf"#ifndef {macro}\n#error \"{macro} is not set: kernel/forward/config.py sets every knob",
                         SRC), macro
        uses = [line for line in SRC.splitlines()
                if re.search(rf"\b{macro}\b", line) and not re.match(rf"\s*#(ifndef|error)\b", line)]
        assert uses, f"{macro} is passed but the source never uses it"


def test_the_source_carries_the_header_digest():
    text = kf.source()
    assert text.startswith(f"// headers sha256 {kf.header_digest()}\n")
    assert text.endswith(SRC)


def _nvcc(cfg: Config, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    from ptx_lab import CUDA_INCLUDE_DIR

    return subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-Xptxas", "-v",
                           f"-I{CUDA_INCLUDE_DIR}", *kf.options(cfg), *extra, "-cubin", str(kf.SOURCE_PATH),
                           "-o", str(tmp_path / "x.cubin")], capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_build_without_a_knob_stops_and_names_it(tmp_path):
    from ptx_lab import CUDA_INCLUDE_DIR

    opts = [o for o in kf.options(Config()) if not o.startswith("-DKF_NSTAGE=")]
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}", *opts, "-ptx",
                           str(kf.SOURCE_PATH), "-o", str(tmp_path / "x.ptx")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "KF_NSTAGE is not set: kernel/forward/config.py sets every knob" in proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", kf.all_variants(), ids=lambda c: c.name())
def test_every_variant_compiles_without_a_spill(cfg, tmp_path):
    proc = _nvcc(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert spills and all(s == ("0", "0") for s in spills), proc.stderr[-2000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_shared_memory_count_holds_for_the_default(tmp_path):
    # the host's count against the source's sizeof(Shared), by a static_assert the compile must pass
    cfg = Config()
    probe = tmp_path / "probe.cu"
    probe.write_text(f'#include "forward.cu"\nstatic_assert(kf::SMEM_BYTES == {cfg.smem_bytes}, "smem");\n')
    from ptx_lab import CUDA_INCLUDE_DIR

    proc = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}",
                           *kf.options(cfg), "-cubin", str(probe), "-o", str(tmp_path / "p.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
