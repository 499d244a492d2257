"""kernel.forward.config on the CPU: the auto rule, the shared-memory count, the registry entry and
the headers it shares with Kernel S. What it shares with Kernel S is tested for both scans in Kernel S's
tests: the Config's refusals and the knobs' path to the source (tests/kernel/forward_states/
test_config.py), every registered variant compiled for sm_90a with 0 spills (.../test_cuda.py)."""
from __future__ import annotations

import re
import shutil

import pytest

from kernel import forward as kf
from kernel import registry
from kernel.forward_states import choose_warps

from ..ptx_build import compile_ptx

SRC = kf.SOURCE_PATH.read_text()


@pytest.mark.parametrize("warps, producers, nstage, expect", [
    # sizeof(Shared) of forward_layout.cuh, read from nvcc (static_assert) for these configurations
    (8, 2, 4, 218704), (4, 4, 5, 231904), (2, 4, 5, 214496), (1, 4, 5, 205792), (1, 1, 2, 90960), (8, 8, 2, 155520)])
def test_the_shared_memory_count_is_the_sources(warps, producers, nstage, expect):
    assert kf.smem_bytes(warps, producers, nstage) == expect


@pytest.mark.parametrize("warps, producers, product_warps", [(1, 4, 2), (2, 4, 2), (4, 2, 2), (8, 2, 0)])
def test_the_auto_config_takes_the_deepest_ring_that_fits(warps, producers, product_warps):
    # product warps beside 1, 2 or 4 consumer warps (R1 on 4 producers beside 1 or 2, on 2 beside 4: 10
    # warps would cap a thread at 168 registers); beside 8, 2 producers and none in the plain build (the
    # token gate's, l2norm's and rstd's builds: test_the_builds_whose_producers_carry_more_get_product_warps)
    cfg = kf.auto_config(warps)
    assert (cfg.warps, cfg.producers, cfg.product_warps, cfg.g6_split) == (warps, producers, product_warps, 4)
    assert cfg.smem_bytes <= kf.SMEM_OPTIN
    deepest = min(kf.config.MAX_STAGES, kf.max_stages(product_warps))
    assert cfg.nstage == deepest or kf.smem_bytes(warps, cfg.producers, cfg.nstage + 1) > kf.SMEM_OPTIN
    assert cfg.threads == 32 * (warps + producers + product_warps)


@pytest.mark.parametrize("kw, message", [
    (dict(product_warps=1), r"Config.product_warps must be one of \(0, 2\), got 1"),
    (dict(product_warps=True), r"Config.product_warps must be one of \(0, 2\), got True"),
    (dict(product_warps=2.0), r"Config.product_warps must be one of \(0, 2\), got 2.0"),
    (dict(warps=2, producers=2, nstage=6, product_warps=2), r"Config.nstage must be at most 5 with 2 product warps"),
    (dict(warps=8, producers=4, product_warps=2),
     r"Config.warps \+ Config.producers \+ Config.product_warps must be at most 12, got 8 \+ 4 \+ 2: a consumer "
     r"thread needs ~168 registers")])
def test_config_refuses_product_warps_the_source_cannot_build(kw, message):
    with pytest.raises(ValueError, match=message):
        kf.Config(**kw)


def test_product_warps_name_the_build_and_count_in_its_threads():
    cfg = kf.Config(warps=1, producers=4, nstage=5, product_warps=2)
    assert cfg.name() == "w1-p4-st5-g4-pw2" and cfg.threads == 32 * 7
    assert kf.Config(warps=1, producers=4, nstage=5).name() == "w1-p4-st5-g4"   # the builds without: as before
    assert "-DKF_PRODUCT_WARPS=2" in kf.options(cfg) and "-DKF_PRODUCT_WARPS=0" in kf.options(kf.Config())
    assert cfg.smem_bytes == kf.smem_bytes(1, 4, 5)   # the product warps take no shared memory of their own


def test_the_grid_rule_is_kernel_s():
    # the same CTA per (sequence, head, v group) as Kernel S, so the same warps for the same pairs
    for pairs in (1, 16, 32, 64, 118, 119, 1024):
        assert kf.auto_config(choose_warps(pairs, 132)).vgroups == 128 // (16 * choose_warps(pairs, 132))


def test_the_registry_builds_the_forward():
    assert kf.BUILD in registry.KERNELS
    assert [kf.BUILD.label(c) for c in kf.BUILD.variants()] == [
        "forward-w1-p4-st5-g4-pw2", "forward-w2-p4-st5-g4-pw2", "forward-w4-p2-st5-g4-pw2", "forward-w8-p2-st4-g4",
        "forward-w1-p4-st5-g4-pw2-tg", "forward-w2-p4-st5-g4-pw2-tg", "forward-w4-p2-st5-g4-pw2-tg",
        "forward-w8-p2-st4-g4-pw2-tg",
        "forward-w1-p4-st5-g4-pw2-l2", "forward-w2-p4-st5-g4-pw2-l2", "forward-w4-p2-st5-g4-pw2-l2",
        "forward-w8-p2-st4-g4-pw2-l2",
        "forward-w1-p4-st5-g4-pw2-tg-l2", "forward-w2-p4-st5-g4-pw2-tg-l2", "forward-w4-p2-st5-g4-pw2-tg-l2",
        "forward-w8-p2-st4-g4-pw2-tg-l2",
        "forward-w1-p4-st5-g4-pw2-rs", "forward-w2-p4-st5-g4-pw2-rs", "forward-w4-p2-st5-g4-pw2-rs",
        "forward-w8-p2-st4-g4-pw2-rs",
        "forward-w1-p4-st5-g4-pw2-tg-rs", "forward-w2-p4-st5-g4-pw2-tg-rs", "forward-w4-p2-st5-g4-pw2-tg-rs",
        "forward-w8-p2-st4-g4-pw2-tg-rs",
        "forward-w1-p4-st5-g4-pw2-timing", "forward-w2-p4-st5-g4-pw2-timing", "forward-w4-p2-st5-g4-pw2-timing",
        "forward-w8-p2-st4-g4-timing"]
    assert kf.BUILD.default() == kf.auto_config(8)
    assert kf.BUILD.function == "kda_forward" and kf.BUILD.constants == "kf"
    assert set(kf.BUILD.required_sass(kf.BUILD.default())) >= {"HMMA", "LDSM", "LDGSTS", "STSM"}
    assert re.search(r'extern "C" __constant__ int kf_smem_bytes = SMEM_BYTES;', SRC)
    assert re.search(r'extern "C" __constant__ int kf_threads = THREADS;', SRC)


def test_the_l2norm_build_is_named_and_set_by_its_macro():
    cfg = kf.auto_config(8, l2norm=True)
    assert cfg.name() == "w8-p2-st4-g4-pw2-l2" and cfg.smem_bytes == kf.auto_config(8).smem_bytes
    assert "-DKF_L2NORM=1" in kf.options(cfg) and "-DKF_L2NORM=0" in kf.options(kf.Config())
    assert kf.auto_config(1, token_gate=True, l2norm=True).name() == "w1-p4-st5-g4-pw2-tg-l2"
    with pytest.raises(ValueError, match="Config.l2norm must be True or False, got 1"):
        kf.Config(l2norm=1)


def test_the_qk_rstd_build_is_named_set_by_its_macro_and_holds_each_stages_rstd():
    cfg = kf.auto_config(8, qk_rstd=True)
    assert cfg.name() == "w8-p2-st4-g4-pw2-rs" and "-DKF_QK_RSTD=1" in kf.options(cfg)
    assert "-DKF_QK_RSTD=0" in kf.options(kf.Config())
    # 16 fp32 rstd of q and 16 of k a stage, after everything the other builds lay out
    assert cfg.smem_bytes == kf.auto_config(8).smem_bytes + 2 * cfg.nstage * 16 * 4
    assert kf.auto_config(1, token_gate=True, qk_rstd=True).name() == "w1-p4-st5-g4-pw2-tg-rs"
    with pytest.raises(ValueError, match="Config.qk_rstd must be True or False, got 1"):
        kf.Config(qk_rstd=1)
    with pytest.raises(ValueError, match="Config.l2norm and Config.qk_rstd are two forms of raw q and k"):
        kf.Config(l2norm=True, qk_rstd=True)
    assert sum(c.qk_rstd for c in kf.all_variants()) == 2 * len(kf.WARPS)   # either gate, each warp count


def test_the_token_gate_build_is_named_and_set_by_its_macro():
    cfg = kf.auto_config(8, token_gate=True)
    assert cfg.name() == "w8-p2-st4-g4-pw2-tg" and cfg.smem_bytes == kf.auto_config(8).smem_bytes
    assert "-DKF_TOKEN_GATE=1" in kf.options(cfg) and "-DKF_TOKEN_GATE=0" in kf.options(kf.Config())
    with pytest.raises(ValueError, match="Config.token_gate must be True or False, got 1"):
        kf.Config(token_gate=1)


def test_the_source_carries_the_header_digest():
    text = kf.source()
    assert text.startswith(f"// headers sha256 {kf.header_digest()}\n")
    assert text.endswith(SRC)


@pytest.mark.parametrize("name", ["forward_states_copies.cuh", "forward_states_gate.cuh", "forward_states_chain.cuh",
                                  "forward_states_walk.cuh"])
def test_the_digest_follows_kernel_s_headers_which_the_source_includes(tmp_path, name):
    # the forward runs Kernel S's copies, gate, step of the chain and walk over the tiles: its build names those
    # headers, so a change there changes the forward's digest (CuPy's cache then compiles it again), as it
    # changes Kernel S's
    from kernel import forward_states as fs
    from kernel.runtime import builds

    shared = fs.SOURCE_DIR / name
    sources = SRC + "".join(p.read_text() for p in kf.SOURCE_DIR.glob("forward_*.cuh"))
    assert f'#include "../../forward_states/cuda/{name}"' in sources
    assert shared.resolve() in {p.resolve() for p in kf.BUILD.header_paths()}
    assert shared.resolve() in {p.resolve() for p in fs.BUILD.header_paths()}
    room = tmp_path / "kernel"
    package = kf.SOURCE_PATH.resolve().parents[2]   # kernel/: each file at its place under it
    for p in (kf.SOURCE_PATH, *kf.BUILD.header_paths()):
        copy = room / p.resolve().relative_to(package)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(p.read_text())
    moved = builds.KernelBuild(**{**{f: getattr(kf.BUILD, f) for f in kf.BUILD.__dataclass_fields__},
                                  "entry": room / "forward/cuda" / kf.SOURCE_PATH.name})
    before = moved.header_digest()
    (room / "forward_states/cuda" / name).write_text(shared.read_text() + "\n// changed\n")
    assert moved.header_digest() != before


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_source_refuses_a_ring_too_deep_for_the_product_warps_barriers(tmp_path):
    # what Config refuses (nstage 6 with product warps), the source refuses too, by a static_assert
    opts = [o.replace("-DKF_NSTAGE=5", "-DKF_NSTAGE=6") for o in kf.options(kf.auto_config(1))]
    assert "-DKF_NSTAGE=6" in opts and "-DKF_PRODUCT_WARPS=2" in opts
    proc = compile_ptx(kf.SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0
    assert "KF_NSTAGE must be 2 .. 7, and 2 .. 5 with product warps" in proc.stderr
    assert "with product warps KF_NSTAGE must be at most 5" in proc.stderr


def test_the_checking_build_is_named_and_adds_its_mbarriers_to_the_shared_memory():
    cfg = kf.Config(warps=1, producers=4, nstage=5, product_warps=2, mbarrier_ring=True)
    assert cfg.name() == "w1-p4-st5-g4-pw2-mb" and "-DKF_MBARRIER_RING=1" in kf.options(cfg)
    assert "-DKF_MBARRIER_RING=0" in kf.options(kf.Config())
    # after Shared: the ring's 2 nstage mbarriers, R1_DONE's and PRODUCTS_DONE's 2 each, the producers' one
    assert cfg.smem_bytes == kf.smem_bytes(1, 4, 5) + 8 * (2 * 5 + 5)
    with pytest.raises(ValueError, match="Config.mbarrier_ring must be True or False, got 1"):
        kf.Config(mbarrier_ring=1)
    assert not any(c.mbarrier_ring for c in kf.all_variants())   # a checking build, never launched by the API


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", [kf.Config(warps=1, producers=4, nstage=5, product_warps=2, mbarrier_ring=True),
                                 kf.Config(warps=8, producers=2, nstage=4, mbarrier_ring=True)], ids=lambda c: c.name())
def test_the_checking_build_hands_over_on_mbarriers_alone(tmp_path, cfg):
    # 0 spills, Config's shared memory is the source's, and no named barrier but __syncthreads (id 0) is left
    from kernel.tools import resources

    row = resources.compile_variant(kf.BUILD, cfg, tmp_path)
    assert "error" not in row, row.get("error")
    assert resources.problems(row) == [] and row["spill"] == 0 and row["smem"] == cfg.smem_bytes
    assert row["threads"] == cfg.threads
    if row["sass"] is not None:
        sass = resources._sass(tmp_path / f"{kf.BUILD.label(cfg)}.cubin").stdout
        assert row["sass"]["SYNCS"] > 0
        assert set(re.findall(BARRIER_IDS, sass)) == {"0x0"}


# a named barrier instruction's first operand: its id, a constant or a register
BARRIER_IDS = r"\bBAR\.(?:SYNC|ARV|RED)\S*\s+([^,;\s]+)"


@pytest.mark.parametrize("form", [dict(token_gate=True), dict(l2norm=True), dict(qk_rstd=True),
                                  dict(token_gate=True, qk_rstd=True)])
def test_the_builds_whose_producers_carry_more_get_product_warps(form):
    # beside 8 consumer warps only those builds take them (measured on the op's form, each token's gate and each
    # row's rstd); 2 producers, and the ring as deep as without them
    cfg = kf.auto_config(8, **form)
    assert (cfg.producers, cfg.product_warps, cfg.nstage, cfg.threads) == (2, 2, 4, 384)
    assert kf.auto_config(8).product_warps == 0
