"""kernel/row_rstd/cuda through nvcc (no GPU): the constants the launch reads back, the refusal of a build without
its knob, and the arithmetic the source promises: a correctly rounded square root and reciprocal, no approximate
one (rsqrtf's MUFU.RSQ is not correctly rounded), and fma of the squares."""
from __future__ import annotations

import re
import shutil

import pytest

from kernel.row_rstd import SOURCE_PATH, Config, all_variants, options

from ..ptx_build import compile_ptx, ptx_constant, ptx_of

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.mark.parametrize("cfg", all_variants(), ids=lambda c: c.name())
def test_the_source_exports_what_the_launch_reads(tmp_path, cfg):
    text = ptx_of(SOURCE_PATH, options(cfg), tmp_path / "rr.ptx")
    assert ptx_constant(text, "rr_smem_bytes") == 0          # no shared memory
    assert ptx_constant(text, "rr_threads") == cfg.threads
    assert re.search(rf"\.maxntid {cfg.threads}, 1, 1", text)
    assert re.search(rf"\.minnctapersm {cfg.ctas_per_sm}\b", text)   # the grid's CTAs an SM, the build's bounds


def test_the_rstd_is_a_rounded_square_root_and_reciprocal(tmp_path):
    text = ptx_of(SOURCE_PATH, options(Config()), tmp_path / "rr.ptx")
    assert re.search(r"\bsqrt\.rn\.ftz\.f32\b", text)
    assert re.search(r"\b(rcp|div)\.rn\.ftz\.f32\b", text)
    assert not re.search(r"\b(rsqrt|sqrt|rcp|div)\.(approx|full)\b", text)
    assert re.search(r"\bfma\.rn\.ftz\.f32\b", text)
    assert text.count("shfl.sync.bfly.b32") == 4 * Config().depth   # distances 8, 4, 2, 1 a row in flight
    assert re.search(r"\bld\.global\.nc\.v4\.u32\b", text)           # 16 bytes a lane


def test_a_build_without_the_knob_stops_and_names_it(tmp_path):
    opts = [o for o in options(Config()) if not o.startswith("-DRR_DEPTH=")]
    proc = compile_ptx(SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0
    assert "RR_DEPTH is not set: kernel/row_rstd/config.py sets every knob" in proc.stderr


def test_a_depth_the_source_does_not_take_stops(tmp_path):
    opts = [o for o in options(Config()) if not o.startswith("-DRR_DEPTH=")] + ["-DRR_DEPTH=3"]
    proc = compile_ptx(SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0 and "RR_DEPTH must be 1, 2, 4 or 8" in proc.stderr
