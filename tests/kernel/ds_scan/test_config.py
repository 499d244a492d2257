"""kernel.ds_scan.config: every knob of Kernel A is defined once, in config.Config, and reaches the device source.

The device source (kernel/ds_scan/cuda/) derives its constants from the -D's that
config.defines passes and chooses no value of its own; these tests fail if a knob stops
reaching it, if the source gains a default again, or if config.py and the source disagree.
"""
import dataclasses
import re
import shutil

import pytest

from kernel.ds_scan import config

from ..ptx_build import compile_ptx

SOURCES = sorted(config.SOURCE_DIR.glob("*.cu")) + sorted(config.SOURCE_DIR.glob("*.cuh"))
TEXT = {p.name: p.read_text() for p in SOURCES}
ALL_TEXT = "\n".join(TEXT.values())
DEFINE = re.compile(r"^-D(\w+)=(-?\d+)$")


def _macros(cfg: config.Config) -> dict[str, int]:
    out = {}
    for opt in config.defines(cfg):
        if opt.startswith("-D"):
            m = DEFINE.match(opt)
            assert m, f"{opt!r} is not -DNAME=int"
            out[m.group(1)] = int(m.group(2))
    return out


def test_every_config_field_is_a_knob_or_a_compiler_flag():
    fields = {f.name for f in dataclasses.fields(config.Config)}
    assert fields == set(config.KNOB_MACROS) | set(config.COMPILER_FLAGS)
    assert set(_macros(config.Config())) == set(config.KNOB_MACROS.values())


@pytest.mark.parametrize("macro", sorted(config.KNOB_MACROS.values()))
def test_every_knob_is_consumed_by_the_device_source(macro):
    # used somewhere other than its own #ifndef / #error check
    uses = [line for line in ALL_TEXT.splitlines()
            if re.search(rf"\b{macro}\b", line) and not re.match(rf"\s*#(ifndef|error)\b.*\b{macro}\b", line)]
    assert uses, f"{macro} is passed by config.defines but no line of kernel/ds_scan/cuda uses it"


@pytest.mark.parametrize("macro", sorted(config.KNOB_MACROS.values()))
def test_a_missing_knob_is_an_error_naming_it_and_build_py(macro):
    assert re.search(rf"#ifndef {macro}\n#error \"{macro} is not set: kernel/ds_scan/config.py sets every knob",
                     TEXT["config.cuh"]), f"config.cuh has no #error for a missing {macro}"


def test_no_default_is_chosen_under_kernel_cuda():
    # `#ifndef KNOB` followed by a `#define KNOB ...` (a default) in any kernel's sources (kernel/*/cuda)
    for path in sorted(config.SOURCE_DIR.parent.parent.glob("*/cuda/*.cu*")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            m = re.match(r"\s*#\s*ifndef\s+(\w+)", line)
            if m:
                assert not re.match(rf"\s*#\s*define\s+{m.group(1)}\b", lines[i + 1]), \
                    f"{path.name}:{i + 2} defines a default for {m.group(1)}; kernel/ds_scan/config.py sets every knob"


def test_the_enum_values_agree_with_build_py():
    for name in ("LOADS_CP_ASYNC", "LOADS_TMA", "SNAP_DIRECT", "SNAP_STAGED", "SNAP_TMA"):
        m = re.search(rf"#define {name} (\d+)", TEXT["config.cuh"])
        assert m and int(m.group(1)) == getattr(config, name), name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_build_without_a_knob_stops_and_says_who_sets_it(tmp_path):
    opts = [o for o in config.options(config.Config()) if not o.startswith("-DSPREAD_EXTRA=")]
    proc = compile_ptx(config.SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0
    assert "SPREAD_EXTRA is not set: kernel/ds_scan/config.py sets every knob" in proc.stderr


# ------------------------------------------------------- the knobs that used to live in the .cu only

@pytest.mark.parametrize("vsplit, bf16, want", [
    (1, True, dict(gt_shared=1, spread_extra=1, r1_lanes=16, regsplit=1, producers=8)),
    (1, False, dict(gt_shared=0, spread_extra=0, r1_lanes=32, regsplit=0, producers=2)),
    (2, True, dict(gt_shared=0, spread_extra=0, r1_lanes=32, regsplit=0, producers=4)),
    (4, True, dict(gt_shared=0, spread_extra=0, r1_lanes=32, regsplit=0, producers=8)),
    (8, False, dict(gt_shared=0, spread_extra=0, r1_lanes=32, regsplit=0, producers=4)),
])
def test_moved_knobs_follow_their_rules(vsplit, bf16, want):
    c = config.Config(vsplit=vsplit, snap_bf16=bf16)
    assert {k: getattr(c, k) for k in want} == want
    assert (c.g4_with_g5, c.snap_late_issue, c.consumer_regs) == (True, True, 240)


def test_rules_follow_the_knobs_they_depend_on():
    # 16 producers leave one token per warp: R1 keeps 32 lanes; regsplit still fits (56 left)
    c = config.Config(vsplit=1, snap_bf16=True, producers=16)
    assert (c.r1_lanes, c.regsplit, c.producer_regs) == (32, 1, 56)
    # gT shared needs cp.async loads and a ring of 3 or more
    assert config.Config(vsplit=1, snap_bf16=True, loads=config.LOADS_TMA).gt_shared == 0
    assert config.Config(vsplit=1, snap_bf16=True, nstage=2).gt_shared == 0
    # setmaxnreg is needed only where the launch leaves the consumers fewer than consumer_regs
    assert config.Config(vsplit=1, snap_bf16=True, producers=4).regsplit == 0     # 256 threads: 255 each
    assert config.Config(vsplit=1, snap_bf16=True, consumer_regs=168).regsplit == 0


@pytest.mark.parametrize("knobs, message", [
    (dict(gt_shared=2), "gt_shared must be"),
    (dict(vsplit=1, snap_bf16=True, loads=2, gt_shared=1), "gt_shared 1 needs cp.async loads"),
    (dict(spread_extra=3), "spread_extra must be"),
    (dict(r1_lanes=8), "r1_lanes must be"),
    (dict(vsplit=1, producers=16, r1_lanes=16), "r1_lanes 16 needs an even number of tokens"),
    (dict(regsplit=2), "regsplit must be"),
    (dict(vsplit=4, snap_bf16=True, regsplit=1), "regsplit 1 moves registers between whole warpgroups"),
    (dict(consumer_regs=250), "consumer_regs must be a multiple of 8"),
    (dict(consumer_regs=264), "consumer_regs must be a multiple of 8"),
    (dict(vsplit=4, g4_with_g5=False), "g4_with_g5 0 places G4's warpgroup MMA"),
    (dict(vsplit=1, snap_bf16=False, snap_late_issue=False), "snap_late_issue 0 places the snapshot's tensor store"),
    (dict(g4_with_g5=2), "g4_with_g5 must be 0 or 1"),
])
def test_moved_knobs_are_checked(knobs, message):
    with pytest.raises(ValueError, match=message):
        config.Config(**knobs)


def test_tune_sees_the_moved_knobs():
    assert config.parse_knobs(["r1_lanes=32", "gt_shared=0", "consumer_regs=232", "snap_late_issue=0"]) == \
        {"r1_lanes": 32, "gt_shared": 0, "consumer_regs": 232, "snap_late_issue": 0}
    c = config.Config(vsplit=1, snap_bf16=True, **config.parse_knobs(["r1_lanes=32", "g4_with_g5=0"]))
    assert "-DR1_LANES=32" in config.defines(c) and "-DG4_WITH_G5=0" in config.defines(c)


def test_names_show_every_knob_that_differs_from_its_rule():
    base = config.Config(vsplit=1, snap_bf16=True, snap_every=4)
    # the API's variants keep the names they had before the knobs moved
    assert base.name() == "vs1-bf16x4-st4-g2s2-p8-tmastore-mt2-wgmma"
    variants = [base] + [config.Config(vsplit=1, snap_bf16=True, snap_every=4, **{k: v}) for k, v in [
        ("g4_with_g5", False), ("snap_late_issue", False), ("gt_shared", 0), ("spread_extra", 0),
        ("r1_lanes", 32), ("regsplit", 0), ("consumer_regs", 232)]]
    names = [c.name() for c in variants]
    assert len(set(names)) == len(names), names
    # asking for what the rule picks anyway is the same build and the same name
    assert config.Config(vsplit=1, snap_bf16=True, snap_every=4, gt_shared=1, r1_lanes=16) == base
    assert len({c.name() for c in config.all_variants()}) == len(config.all_variants())


def test_source_text_carries_a_digest_of_every_header(tmp_path, monkeypatch):
    text = config.source()
    first, rest = text.split("\n", 1)
    assert first == f"// headers sha256 {config.header_digest()}" and rest == config.SOURCE_PATH.read_text()
    # a change to one header alone changes the text CuPy keys its cache on
    fake = tmp_path / "dstate_scan"
    fake.mkdir()
    for p in config.SOURCE_DIR.iterdir():
        (fake / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(config, "BUILD", dataclasses.replace(config.BUILD, entry=fake / "dstate_scan.cu"))
    before = config.source()
    (fake / "operands.cuh").write_text((fake / "operands.cuh").read_text() + "\n// edited\n")
    assert config.source() != before
