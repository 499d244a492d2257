"""kernel.forward_states.config on the CPU: the Config's refusals, the auto rule, and the build's knobs
(every one reaches the source, none has a default there); the refusals (check_knobs) and the knobs'
path to the source for both scans that share them (Kernel S's, and the forward's, kernel.forward.config)."""
from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from kernel import forward as kf
from kernel import forward_states as fs
from kernel.forward_states import Config, choose_warps

from ..ptx_build import compile_ptx

SRC = fs.SOURCE_PATH.read_text()
# each scan's room: its config module, the prefix of its source's macros, and what the source says sets them
ROOMS = pytest.mark.parametrize("room, prefix, config_py", [(fs, "FS", "kernel/forward_states/config.py"),
                                                            (kf, "KF", "kernel/forward/config.py")],
                                ids=["forward_states", "forward"])


@pytest.mark.parametrize("pairs, sm, warps", [
    (1, 132, 1), (16, 132, 1), (32, 132, 2), (64, 132, 4), (119, 132, 8), (118, 132, 4), (1024, 132, 8),
    (15, 132, 1), (30, 132, 2)])
def test_the_auto_rule_fills_the_sms(pairs, sm, warps):
    assert choose_warps(pairs, sm) == warps
    # the grid it gives covers 90% of the SMs unless even one warp per CTA cannot
    assert pairs * Config(warps=warps).vgroups >= 0.9 * sm or warps == 1


@ROOMS
@pytest.mark.parametrize("field, value", [("warps", 3), ("warps", 16), ("warps", True), ("nstage", 1),
                                          ("nstage", 8), ("warps", 2.0), ("producers", 3), ("producers", 16),
                                          ("g6_split", 3), ("g6_split", 8)])
def test_config_refuses_what_the_source_cannot_build(room, prefix, config_py, field, value):
    with pytest.raises(ValueError, match=f"Config.{field} must be one of"):
        room.Config(**{field: value})


@pytest.mark.parametrize("room, deep, expect", [
    (fs, dict(producers=4, nstage=7), r"Config w8-p4-st7-g4 needs 262\d+ B of shared memory"),
    (kf, dict(producers=2, nstage=5), r"Config w8-p2-st5-g4 needs 256\d+ B of shared memory")],
    ids=["forward_states", "forward"])
def test_config_refuses_what_an_sm_cannot_hold(room, deep, expect):
    with pytest.raises(ValueError, match=r"Config.warps \+ Config.producers must be at most 12, got 8 \+ 8"):
        room.Config(warps=8, producers=8)
    with pytest.raises(ValueError, match=expect):
        room.Config(warps=8, **deep)


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

@ROOMS
def test_every_config_field_is_a_knob_and_reaches_the_source(room, prefix, config_py):
    src = room.SOURCE_PATH.read_text()
    assert {f.name for f in dataclasses.fields(room.Config)} == set(room.KNOB_MACROS) | set(room.COMPILER_FLAGS)
    opts = room.options(room.Config(warps=4, producers=2, nstage=2, g6_split=1))
    assert {f"-D{prefix}_WARPS=4", f"-D{prefix}_PRODUCERS=2", f"-D{prefix}_NSTAGE=2", f"-D{prefix}_G6_SPLIT=1",
            "-ftz=true"} <= set(opts)
    assert "-lineinfo" not in opts and "-lineinfo" in room.options(room.Config(lineinfo=True))
    with pytest.raises(ValueError, match="Config.lineinfo must be True or False"):
        room.Config(lineinfo=1)
    for macro in room.KNOB_MACROS.values():
        assert re.search(rf"#ifndef {macro}\n#error \"{macro} is not set: {config_py} sets every knob", src), macro
        uses = [line for line in src.splitlines()
                if re.search(rf"\b{macro}\b", line) and not re.match(r"\s*#(ifndef|error)\b", line)]
        assert uses, f"{macro} is passed but the source never uses it"


def test_the_source_carries_the_header_digest():
    text = fs.source()
    assert text.startswith(f"// headers sha256 {fs.header_digest()}\n")
    assert text.endswith(SRC)
    assert [c.name() for c in fs.all_variants()] == ["w1-p4-st6-g4", "w2-p4-st6-g4", "w4-p4-st6-g4", "w8-p4-st6-g4"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@ROOMS
def test_a_build_without_a_knob_stops_and_names_it(tmp_path, room, prefix, config_py):
    opts = [o for o in room.options(room.Config()) if not o.startswith(f"-D{prefix}_NSTAGE=")]
    proc = compile_ptx(room.SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0
    assert f"{prefix}_NSTAGE is not set: {config_py} sets every knob" in proc.stderr
