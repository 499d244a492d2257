"""kernel.forward_states.config on the CPU: the Config's refusals, the auto rule, and the build's knobs
(every one reaches the source, none has a default there)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernel import forward_states as fs
from kernel.forward_states import Config, choose_warps

SRC = fs.SOURCE_PATH.read_text()


@pytest.mark.parametrize("pairs, sm, warps", [
    (1, 132, 1), (16, 132, 1), (32, 132, 2), (64, 132, 4), (119, 132, 8), (118, 132, 4), (1024, 132, 8),
    (15, 132, 1), (30, 132, 2)])
def test_the_auto_rule_fills_the_sms(pairs, sm, warps):
    assert choose_warps(pairs, sm) == warps
    # the grid it gives covers 90% of the SMs unless even one warp per CTA cannot
    assert pairs * Config(warps=warps).vgroups >= 0.9 * sm or warps == 1


@pytest.mark.parametrize("field, value", [("warps", 3), ("warps", 16), ("warps", True), ("nstage", 1),
                                          ("nstage", 8), ("warps", 2.0), ("producers", 3), ("producers", 16),
                                          ("g6_split", 3), ("g6_split", 8)])
def test_config_refuses_what_the_source_cannot_build(field, value):
    with pytest.raises(ValueError, match=f"Config.{field} must be one of"):
        Config(**{field: value})


def test_config_refuses_what_an_sm_cannot_hold():
    with pytest.raises(ValueError, match=r"Config.warps \+ Config.producers must be at most 12, got 8 \+ 8"):
        Config(warps=8, producers=8)
    with pytest.raises(ValueError, match=r"Config w8-p4-st7-g4 needs 262\d+ B of shared memory"):
        Config(warps=8, producers=4, nstage=7)


@pytest.mark.parametrize("warps", fs.WARPS)
def test_the_auto_config_takes_the_deepest_ring_that_fits(warps):
    cfg = fs.auto_config(warps)
    assert (cfg.warps, cfg.producers, cfg.g6_split) == (warps, 4, 4)
    assert cfg.smem_bytes <= fs.SMEM_OPTIN
    deeper = cfg.nstage + 1
    assert cfg.nstage == 6 or Config(warps=warps, nstage=deeper).smem_bytes > fs.SMEM_OPTIN


# ----------------------------------------------------------------------------
# the build: every knob reaches the source, none has a default there
# ----------------------------------------------------------------------------

def test_every_config_field_is_a_knob_and_reaches_the_source():
    import dataclasses

    assert {f.name for f in dataclasses.fields(Config)} == set(fs.KNOB_MACROS) | set(fs.COMPILER_FLAGS)
    opts = fs.options(Config(warps=4, producers=2, nstage=2, g6_split=1))
    assert {"-DFS_WARPS=4", "-DFS_PRODUCERS=2", "-DFS_NSTAGE=2", "-DFS_G6_SPLIT=1", "-ftz=true"} <= set(opts)
    assert "-lineinfo" not in opts and "-lineinfo" in fs.options(Config(lineinfo=True))
    with pytest.raises(ValueError, match="Config.lineinfo must be True or False"):
        Config(lineinfo=1)
    for macro in fs.KNOB_MACROS.values():
        assert re.search(rf"#ifndef {macro}\n#error \"{macro} is not set: kernel/forward_states/config.py sets every knob",
                         SRC), macro
        uses = [line for line in SRC.splitlines()
                if re.search(rf"\b{macro}\b", line) and not re.match(rf"\s*#(ifndef|error)\b", line)]
        assert uses, f"{macro} is passed but the source never uses it"


def test_the_source_carries_the_header_digest():
    text = fs.source()
    assert text.startswith(f"// headers sha256 {fs.header_digest()}\n")
    assert text.endswith(SRC)
    assert [c.name() for c in fs.all_variants()] == ["w1-p4-st6-g4", "w2-p4-st6-g4", "w4-p4-st6-g4", "w8-p4-st6-g4"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_build_without_a_knob_stops_and_names_it(tmp_path):
    from ptx_lab import CUDA_INCLUDE_DIR

    opts = [o for o in fs.options(Config()) if not o.startswith("-DFS_NSTAGE=")]
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-I{CUDA_INCLUDE_DIR}", *opts, "-ptx",
                           str(fs.SOURCE_PATH), "-o", str(tmp_path / "x.ptx")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "FS_NSTAGE is not set: kernel/forward_states/config.py sets every knob" in proc.stderr
