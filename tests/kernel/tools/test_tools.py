"""kernel.tools.profile and Kernel A's config knobs: their pure parts on the CPU, the launches on the GPU."""
import dataclasses
import re

import numpy as np
import pytest

from kernel.tools import profile
from kernel.tools.resources import ptx_constant


# ----------------------------------------------------------------- profile

def test_tune_arguments_are_key_value_ints():
    from kernel.ds_scan import config

    assert config.parse_knobs(["nstage=3", "producers=8"]) == {"nstage": 3, "producers": 8}
    with pytest.raises(SystemExit, match="key=value"):
        config.parse_knobs(["nstage"])
    with pytest.raises(SystemExit, match="unknown knob 'stages'"):
        config.parse_knobs(["stages=3"])
    with pytest.raises(SystemExit, match="takes an integer"):
        config.parse_knobs(["ksplit=two"])


def test_profile_report_names_each_phase():
    r = dict(shape="1x64", H=2, vsplit=4, mode="bf16x4", tune={"nstage": 3}, producers=4, consumers=4,
             plain_ms=0.5, timed_ms=0.52, tiles=4,
             consumer=dict(zip(profile.CONSUMER_SLOTS, (1000.0, 100.0, 50.0, 800.0))), pair_wait=70.0,
             producer=dict(zip(profile.PRODUCER_SLOTS, (1000.0, 10.0, 600.0, 40.0, 300.0))))
    text = profile.format_result(r)
    assert "1x64 H2 vsplit 4 bf16x4 (nstage=3; 4 consumer, 4 producer warps)" in text
    assert "wait FULL 50" in text and "R1 600" in text and "issue loads 300" in text
    assert "of which pair wait 70" in text


@pytest.mark.gpu
@pytest.mark.parametrize("vsplit, mode, tune", [(4, "bf16x4", {}), (1, "f32x1", {}), (2, "bf16x4", {"ksplit": 2})])
def test_profile_phases_add_up_to_at_most_the_total(vsplit, mode, tune):
    r = profile.profile(1, 200, 2, vsplit, mode, tune)
    assert r["tiles"] == 13
    for role, phases in (("consumer", profile.CONSUMER_SLOTS[1:]), ("producer", profile.PRODUCER_SLOTS[1:])):
        total = r[role]["total"]
        parts = sum(r[role][p] for p in phases)
        assert 0 < parts <= total * 1.01, (role, r[role])
    if r["ksplit"] == 2:      # asked for here (the default only at vsplit 4 with fp32 snapshots)
        assert 0 < r["pair_wait"] < r["consumer"]["G1..G5"]
    else:
        assert r["pair_wait"] == 0


@pytest.mark.gpu
def test_tuning_knobs_are_checked():
    from kernel.ds_scan.launch import dstate_scan
    from tests.kernel.ds_scan.test_launch_gpu import _good_inputs

    k = _good_inputs()
    args = (k["q"], k["k"], k["gc"], k["beta"], k["mqk"], k["inv"], k["do"])
    with pytest.raises(ValueError, match="tuning must not set"):
        dstate_scan(*args, tuning={"vsplit": 2})
    with pytest.raises(ValueError, match="unknown knobs"):
        dstate_scan(*args, tuning={"stages": 3})
    with pytest.raises(ValueError, match="ksplit must be 1 or 2"):
        dstate_scan(*args, tuning={"ksplit": 3})
    # vsplit 1 with mt 2, two warps per band and fp32 staging: more shared memory than a CTA may have
    with pytest.raises(ValueError, match="B of shared memory per CTA"):
        dstate_scan(*args, vsplit=1, tuning={"mt": 2, "ksplit": 2})


# ----------------------------------------------------------------- profile --kernel b

def test_kernel_b_phases_are_the_timing_headers_in_its_order():
    from kernel.token_gradients.launch import SOURCE_PATH

    text = (SOURCE_PATH.parent / "token_gradients_timing.cuh").read_text()
    body = text[text.index("enum TimingPhase {"):text.index("TIMING_PHASES\n")]
    names = re.findall(r"^\s+(T_[A-Z0-9_]+),", body, flags=re.M)
    assert len(names) == len(profile.KERNEL_B_PHASES) == 12
    assert names[1:3] == ["T_WAIT_FIRST", "T_WAIT_LOADS"]
    assert names[0] == "T_ISSUE" and names[-1] == "T_END"


def test_kernel_b_tiles_follow_the_grid():
    # grid (runs, heads): CTA h x runs + r; a sequence of 130 tokens has chunks of 4, 4 and 1 tiles (2 tokens)
    np.testing.assert_array_equal(profile.kernel_b_tiles(2, 130, 2), [4, 4, 1] * 4)
    np.testing.assert_array_equal(profile.kernel_b_tiles(2, 130, 2, run_chunks=2), [8, 1] * 4)
    np.testing.assert_array_equal(profile.kernel_b_tiles(1, 600, 1, run_chunks=4), [16, 16, 6])   # 256, 256, 88
    assert profile.kernel_b_tiles(32, 8192, 32).sum() == 32 * 32 * 512
    assert profile.kernel_b_tiles(32, 8192, 32, run_chunks=8).sum() == 32 * 32 * 512


def test_kernel_b_summary_is_per_tile_and_names_the_slowest_warp():
    phases = len(profile.KERNEL_B_PHASES)
    cycles = np.zeros((3, 2, phases), dtype=np.uint32)
    V = profile.KERNEL_B_PHASES.index("V phase")
    cycles[:, 0, V] = 400      # the V phase: warp 0 400 cycles a CTA, warp 1 800
    cycles[:, 1, V] = 800
    cycles[:, 0, V + 1] = 400  # ... and warp 0 waits 400 at the barrier after it
    tiles = np.array([4, 4, 2])
    r = profile.summarize_kernel_b(cycles, tiles)
    v, barrier = r["phases"][V], r["phases"][V + 1]
    assert (r["tiles"], r["ctas"], r["warps"]) == (10, 3, 2)
    assert (v["phase"], v["cycles"], v["fastest"], v["slowest"]) == ("V phase", 180.0, 120.0, 240.0)
    assert barrier["cycles"] == 60.0 and r["tile_cycles"] == 240.0 and v["share"] == 0.75
    text = profile.format_kernel_b(dict(r, config="2x130", H=2, run_chunks=2, plain_ms=1.0, timed_ms=1.05))
    assert "Kernel B 2x130 H2, 2 chunks a CTA: 1.000 ms plain, 1.050 ms instrumented" in text
    assert "| V phase | 180 | 75.0% | 120 | 240 |" in text
    with pytest.raises(ValueError, match="cycles must be"):
        profile.summarize_kernel_b(cycles[:, :, :4], tiles)


@pytest.mark.gpu
def test_kernel_b_timing_build_charges_every_phase_and_costs_little():
    pytest.importorskip("torch")   # the bench's timer runs CuPy on torch's stream
    r = profile.profile_kernel_b("2x1000", 4, run_chunks=2)
    assert r["tiles"] == 2 * 4 * 63 and r["ctas"] == 2 * 4 * 8 and r["run_chunks"] == 2
    assert all(p["cycles"] > 0 for p in r["phases"]), r["phases"]
    # the accounting adds a clock read a phase: a few percent at most
    assert r["timed_ms"] < 1.25 * r["plain_ms"], (r["timed_ms"], r["plain_ms"])


# ----------------------------------------------------------------- profile --kernel f

def test_forward_slots_are_the_timing_headers_in_its_order():
    from kernel.forward.config import SOURCE_DIR

    text = (SOURCE_DIR / "forward_timing.cuh").read_text()
    body = text[text.index("enum TimingSlot {"):text.index("TIMING_SLOTS\n")]
    assert re.findall(r"^\s+(T_[A-Z]+),", body, flags=re.M) == ["T_WAIT", "T_WORK", "T_PASS", "T_REFILL"]
    assert len(profile.FORWARD_SLOTS) == 4 and all(len(v) == 4 for v in profile.FORWARD_ROLES.values())


def test_forward_summary_is_per_role_and_tile():
    # 2 CTAs of 8 consumer and 2 producer warps (no product warps), 10 tiles each
    cycles = np.zeros((2, 10, 4), dtype=np.uint32)
    cycles[:, :8] = [3000, 6000, 500, 500]      # consumers: wait, chain, pass, o store
    cycles[:, 8:] = [1000, 7000, 1500, 500]     # producers: copies, R1, products, refill
    r = profile.summarize_forward(cycles, 10, 8, 2, 0)
    assert set(r["roles"]) == {"consumers", "producers"} and (r["ctas"], r["tiles_per_cta"]) == (2, 10)
    assert r["roles"]["consumers"] == {"wait": 300.0, "work": 600.0, "pass": 50.0, "refill": 50.0}
    assert r["roles"]["producers"]["work"] == 700.0
    text = profile.format_forward(dict(r, config="1x160", H=2, build="w8-p2-st4-g4", plain_ms=1.0, timed_ms=1.02))
    assert "the forward 1x160 H2 (w8-p2-st4-g4): 1.000 ms plain, 1.020 ms instrumented; 2 CTAs of 10 tiles" in text
    assert "| producers | 100 (copies landed) | 700 (R1) | 150 (products or hand-over) | 50 (publish + EMPTY" in text
    assert "| 1,000 |" in text
    with pytest.raises(ValueError, match="cycles must be"):
        profile.summarize_forward(cycles, 10, 8, 4, 0)


def test_every_consumer_warp_count_has_a_timing_build():
    from kernel.forward import WARPS, all_variants, auto_config

    timed = [c for c in all_variants() if c.timing]
    assert [c.warps for c in timed] == list(WARPS) and all(c.name().endswith("-timing") for c in timed)
    assert all(dataclasses.replace(c, timing=False) == auto_config(c.warps) for c in timed)


@pytest.mark.gpu
def test_forward_timing_build_charges_every_role_and_costs_little():
    pytest.importorskip("torch")   # the bench's timer runs CuPy on torch's stream
    r = profile.profile_forward("2x1000", 4)
    assert r["tiles_per_cta"] == 63 and "consumers" in r["roles"] and "producers" in r["roles"]
    assert all(v > 0 for v in r["roles"]["consumers"].values())
    assert r["timed_ms"] < 1.25 * r["plain_ms"], (r["timed_ms"], r["plain_ms"])


# ----------------------------------------------------------------- config.Config

def test_ksplit_and_mt_set_the_consumer_warps_and_a_ring_that_leaves_barriers():
    from kernel.ds_scan import config

    c = config.Config(vsplit=4, snap_bf16=True, snap_every=4, ksplit=2, producers=4)
    assert (c.consumers, c.producers, c.nstage, c.threads) == (4, 4, 4, 256)
    assert "-DKSPLIT=2" in config.defines(c) and c.name().endswith("-ks2")
    # vsplit 1, mt 1: 8 bands need 8 pair barriers; FULL + EMPTY of 4 stages would make 16 of 15
    c1 = config.Config(vsplit=1, mt=1, ksplit=2)
    assert (c1.consumers, c1.nstage) == (16, 3)
    with pytest.raises(ValueError, match="needs 16 named barriers"):
        config.Config(vsplit=1, mt=1, ksplit=2, nstage=4)
    assert config.Config(vsplit=1, mt=2, ksplit=2).nstage == 4      # 4 bands of 32 v
    with pytest.raises(ValueError, match="ksplit must be 1 or 2"):
        config.Config(ksplit=4)
    with pytest.raises(ValueError, match="mt must be 1 or 2"):
        config.Config(vsplit=8, mt=2)                               # a 16-column CTA has no 32-wide band


def test_fp32_snapshots_at_vsplit_1_take_two_producers():
    from kernel.ds_scan import config

    assert config.Config(vsplit=1, snap_bf16=False).producers == 2
    assert config.Config(vsplit=2, snap_bf16=False).producers == 4


@pytest.mark.parametrize("vsplit, want", [
    (1, dict(mt=2, ksplit=1, g2_split=2, producers=8, consumers=4)),
    (2, dict(mt=1, ksplit=1, g2_split=4, producers=4, consumers=4)),
    (4, dict(mt=1, ksplit=1, g2_split=4, producers=8, consumers=2)),
    (8, dict(mt=1, ksplit=1, g2_split=4, producers=4, consumers=1)),
])
def test_auto_knobs(vsplit, want):
    from kernel.ds_scan import config

    c = config.Config(vsplit=vsplit, snap_bf16=True, snap_every=4)
    assert {k: getattr(c, k) for k in want} == want
    assert c.nstage == 4
    assert (c.loads, c.snap_store) == (config.LOADS_CP_ASYNC, config.SNAP_TMA)


@pytest.mark.parametrize("vsplit, store", [(1, 2), (2, 1), (4, 1), (8, 1)])
def test_fp32_snapshot_store_rule(vsplit, store):
    from kernel.ds_scan import config

    assert config.Config(vsplit=vsplit).snap_store == store   # staged at vsplit 1, direct elsewhere


@pytest.mark.parametrize("knobs, message", [
    (dict(snap_bf16=True, snap_store=1), "fp32 only"),
    (dict(snap_store=4), "snap_store must be"),
    (dict(loads=3), "loads must be"),
])
def test_store_and_load_knobs_are_checked(knobs, message):
    from kernel.ds_scan import config

    with pytest.raises(ValueError, match=message):
        config.Config(**knobs)


def test_the_kernel_built_from_build_options_has_build_configs_shape(tmp_path):
    """The device source derives its shape from the -D's config.defines passes: threads per CTA
    and whether G4/G5 are warpgroup MMAs agree with config.Config for every v-split."""
    import shutil
    import subprocess

    from kernel.ds_scan import config
    from kernel.tools import resources

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    for vsplit in config.VSPLITS:
        for bf16 in (0, 1):
            cfg = config.Config(vsplit=vsplit, snap_bf16=bool(bf16))
            out = tmp_path / f"vs{vsplit}-{bf16}.ptx"
            subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", f"-I{resources.CUDA_INCLUDE_DIR}",
                            *config.options(cfg), "-ptx", str(config.SOURCE_PATH), "-o", str(out)], check=True)
            ptx = out.read_text()
            assert ptx_constant(ptx, "kda_threads") == cfg.threads, (vsplit, bf16)
            wgmma = ptx_constant(ptx, "kda_wgmma")
            assert wgmma == cfg.wgmma and ("wgmma.mma_async" in ptx) == bool(wgmma), (vsplit, bf16)
            assert ptx_constant(ptx, "kda_reg_split") == cfg.regsplit, (vsplit, bf16)


def test_a_tensor_map_error_names_the_argument():
    # kernel.ds_scan.launch's tensor maps keep ptx_lab.tensormap's checks and say which input broke one;
    # validation runs before the driver, so no GPU is needed to see it.
    from kernel.ds_scan import launch

    dims = (64, 128, 64, 128, 32, 64)   # vsplit 1's boxes: do 64 cols / SW128, gc 64, snapshot 128 x 32 / SW64
    good = 0x7F00_0000_0000
    with pytest.raises(ValueError, match=r"^mqk: its tensor map .*: address = 0x7f0000000008: the tensor must "
                                         r"start 16-byte aligned"):
        launch.encode_tensor_maps(True, dims, 4096, 32, 32, (good, good, good, good, good + 8, good), None)


@pytest.mark.parametrize("producers, split", [(4, False), (8, True), (16, True)])
def test_more_producers_take_registers_from_the_pool_without_spilling(tmp_path, producers, split):
    # vsplit 1's 4 consumer warps (32-wide bands) need ~215 registers; 8 or 16 producer warps
    # beside them leave 168 or 96 per thread at launch, so setmaxnreg must move registers
    # to the consumers' warpgroup (sm_90a), and nothing may spill on either side.
    import shutil

    from kernel.ds_scan import config
    from kernel.tools import resources

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cfg = config.Config(vsplit=1, snap_bf16=True, snap_every=4, producers=producers)
    row = resources.compile_variant(config.BUILD, cfg, tmp_path)
    assert "error" not in row, row.get("error")
    assert row["spill"] == 0 and row["stack"] == 0, row["log"]
    ptx = (tmp_path / f"{cfg.name()}.ptx").read_text()
    assert ("setmaxnreg.inc.sync.aligned.u32 240" in ptx) == split
    assert ("setmaxnreg.dec.sync.aligned.u32" in ptx) == split
    assert cfg.regsplit == split
    if split:   # config.Config's count of what the producers keep is the kernel's
        assert f"setmaxnreg.dec.sync.aligned.u32 {cfg.producer_regs};" in ptx, cfg.producer_regs
    assert row["threads"] == 32 * (4 + producers)


def test_wgmma_auto_rule_and_its_checks():
    # on wherever the consumers are one warpgroup holding all 128 k: vsplit 1 (mt 2) and 2 (mt 1)
    from kernel.ds_scan import config

    assert [config.Config(vsplit=v).wgmma for v in config.VSPLITS] == [1, 1, 0, 0]
    assert config.Config(vsplit=1, wgmma=0).wgmma == 0
    assert "-wgmma" in config.Config(vsplit=1).name() and "-wgmma" not in config.Config(vsplit=4).name()
    assert "-DWGMMA=1" in config.defines(config.Config(vsplit=2))
    for knobs in (dict(vsplit=4, wgmma=1), dict(vsplit=1, mt=1, wgmma=1), dict(vsplit=2, ksplit=2, wgmma=1)):
        with pytest.raises(ValueError, match="one warpgroup"):
            config.Config(**knobs)
    with pytest.raises(ValueError, match="wgmma must be"):
        config.Config(wgmma=2)


def test_wgmma_builds_hold_transposed_hgmma_and_plain_sm90_compiles_it_out(tmp_path):
    # G4 / G5 are m64n128k16 with an N-major B (.tnspB) in the sm_90a build, 4 per tile; a plain
    # sm_90 build (no wgmma there) falls back to mma.sync and says so in kda_wgmma.
    import shutil
    import subprocess

    from kernel.ds_scan import config
    from kernel.tools import resources

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cfg = config.Config(vsplit=1, snap_bf16=True, snap_every=4)
    row = resources.compile_variant(config.BUILD, cfg, tmp_path)
    assert "error" not in row, row.get("error")
    assert row["spill"] == 0 and row["stack"] == 0, row["log"]
    if row["sass"] is not None:
        assert row["sass"]["HGMMA"] == 4, row["sass"]     # G4 and G5, two m-tiles each
    ptx = (tmp_path / f"{cfg.name()}.ptx").read_text()
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert "fence.proxy.async.shared::cta" in ptx          # R1's stores before the async proxy reads them
    plain = tmp_path / "plain_sm90.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", f"-I{resources.CUDA_INCLUDE_DIR}", *config.defines(cfg),
                    "-ptx", str(config.SOURCE_PATH), "-o", str(plain)], check=True)
    text = plain.read_text()
    assert ptx_constant(text, "kda_wgmma") == 0 and "wgmma" not in text.replace("kda_wgmma", "")

