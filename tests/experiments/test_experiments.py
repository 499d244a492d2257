"""Every experiment passes on the model (and, with a GPU, on the hardware),
and its checker has teeth: tampered observations fail, naming the lanes."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import EXPERIMENTS, NAMES, _common
from experiments._common import swap_lanes

REPO = Path(__file__).resolve().parents[2]


def lanes_named(result) -> set[int]:
    return {int(m) for m in re.findall(r"\blane (\d+)\b", "\n".join(result.failures))}


def test_registry_is_complete_and_ordered():
    assert list(EXPERIMENTS) == list(NAMES)
    assert set(NAMES) == {"mma_m16n8k16", "ldmatrix", "stmatrix", "movmatrix", "cp_async",
                          "bulk_copy", "accumulator_as_a", "two_part_operand", "banks", "tma_tile", "wgmma"}
    for name, module in EXPERIMENTS.items():
        assert module.NAME == name
        assert module.SUMMARY and "\n" not in module.SUMMARY
        assert module.__doc__ and "Check" in module.__doc__


@pytest.mark.parametrize("name", NAMES)
def test_passes_on_the_model(name):
    result = EXPERIMENTS[name].run("model")
    assert result.passed, result.report()
    assert result.checked > 0


WITH_SOURCE = [n for n in NAMES if isinstance(getattr(EXPERIMENTS[n], "SOURCE", None), str)]


@pytest.mark.parametrize("name", WITH_SOURCE)
def test_its_kernel_compiles_for_sm_90a(name, tmp_path):
    """nvcc builds the experiment's CUDA source (the GPU twin) where there is no GPU too, as CI does."""
    import shutil

    from ptx_lab import CUDA_INCLUDE_DIR

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    src = tmp_path / f"{name}.cu"
    src.write_text(EXPERIMENTS[name].SOURCE)
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", f"-I{CUDA_INCLUDE_DIR}", "-o",
                           str(tmp_path / f"{name}.cubin"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_passes_on_the_gpu(name):
    result = EXPERIMENTS[name].run("gpu")
    assert result.passed, result.report()


@pytest.mark.parametrize("name", ["ldmatrix", "movmatrix", "mma_m16n8k16", "accumulator_as_a",
                                  "two_part_operand", "bulk_copy"])
def test_swapped_lanes_are_both_named(name):
    module = EXPERIMENTS[name]
    result = module.check(swap_lanes(module.observe("model"), 3, 17)).result(name, "model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_two_part_operand_without_its_second_part_fails_where_one_part_is_not_enough():
    module = EXPERIMENTS["two_part_operand"]
    obs = module.observe("model")
    obs["d2"] = obs["d1"]                     # the second mma skipped: D = bf16(A) @ B
    result = module.check(obs).result("two_part_operand", "model")
    assert not result.passed
    assert all(f.startswith("two parts") for f in result.failures), result.report()


@pytest.mark.parametrize("name, call", [("accumulator_as_a", "acc_to_a("), ("two_part_operand", "two_part_bf16x2(")])
def test_the_register_experiments_run_the_kernels_header(name, call):
    # the kernels' packing and split come from fragments.cuh; a copy in the experiment could drift
    source = EXPERIMENTS[name].SOURCE
    assert '#include "fragments.cuh"' in source and call in source
    assert "pack_bf16x2(" not in source and "__uint_as_float" not in source


def test_stmatrix_swapped_registers_are_both_named(monkeypatch):
    module = EXPERIMENTS["stmatrix"]
    honest = module.registers

    def swapped(num, trans):
        regs = honest(num, trans).copy()
        regs[[3, 17]] = regs[[17, 3]]
        return regs

    monkeypatch.setattr(module, "registers", swapped)
    result = module.run("model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_cp_async_swapped_chunks_are_both_named():
    module = EXPERIMENTS["cp_async"]
    obs = module.observe("model")
    for cache, size, zfill in module.CASES:
        dst, _ = module.layout(size)
        image = obs[module.case_name(cache, size, zfill)]
        a, b = image[dst[3]:dst[3] + size].copy(), image[dst[17]:dst[17] + size].copy()
        image[dst[3]:dst[3] + size], image[dst[17]:dst[17] + size] = b, a
    result = module.check(obs).result("cp_async", "model")
    assert not result.passed
    assert lanes_named(result) == {3, 17}, result.report()


def test_bulk_copy_failures_name_the_row_byte_and_lane():
    module = EXPERIMENTS["bulk_copy"]
    obs = module.observe("model")
    row = module.STORED_ROW
    obs["out_a"][row, 2] = 1000 * row + 2      # the stale word a missing proxy fence could leave
    obs["out_b"][0, 31] = 31                   # src row 0's word where row 16's belongs
    obs["flags"][9, 0] = 1                     # a phase that completed before its arrival
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "bulk store out_a: row 5 word 2 (byte 8), in lane 5's bulk store of 96 bytes of rows_a[5], "
        "rewritten by fenced ordinary stores: got 5002, expected 905002",
        "bulk store out_b: row 0 word 31 (byte 124), in lane 0's bulk store of 128 bytes of "
        "rows_b[0]: got 31, expected 16031",
        "mbarrier: lane 9 try_wait(0) after the phase-0 copies, before the arrival: got 1, expected 0",
    ], result.report()


def test_bulk_copy_untouched_words_and_reuse_are_checked():
    module = EXPERIMENTS["bulk_copy"]
    obs = module.observe("model")
    obs["smem_b"][1, 30] = 1030                # a copy that ran past its 112 bytes
    obs["out_a"][4, 0] = module.REUSED         # rows_a reused before its bulk store read it
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "phase 1 rows_b: row 1 word 30 (byte 120), past lane 1's bulk copy of 112 bytes: "
        "written by nothing: got 1030, expected 0xffffffff",
        "bulk store out_a: row 4 word 0 (byte 0), in lane 4's bulk store of 80 bytes of rows_a[4]: "
        "got 0xa5a5a5a5, expected 4000",
    ], result.report()


@pytest.mark.gpu
def test_bulk_copy_gpu_equals_the_model_word_for_word():
    module = EXPERIMENTS["bulk_copy"]
    on_gpu, on_model = module.observe("gpu"), module.observe("model")
    assert on_gpu.keys() == on_model.keys()
    for key in on_model:
        assert on_gpu[key].shape == on_model[key].shape, key
        diff = np.argwhere(on_gpu[key] != on_model[key])
        assert diff.size == 0, f"{key}: GPU and model differ at (row/lane, word/flag) {diff[:8].tolist()}"


def test_tma_tile_failures_name_the_row_col_and_where_it_came_from():
    module = EXPERIMENTS["tma_tile"]
    obs = module.observe("model")
    obs["smem"][9, 3] = 41 * 512 + 256 + 3     # row 41 read past the map instead of zero fill
    obs["smem"][0, 0] = 0xFFFF                 # an element the load never wrote
    obs["dst"][5, 0], obs["dst"][6, 1] = obs["dst"][6, 1], obs["dst"][5, 0]   # two rows swapped
    obs["dst"][40, 448] = 0                    # store B not clipped at the map's last row
    obs["dst"][31, 0] = 30 * 512 + 2 * 128 + 64   # store B wrapped a row's 65th column into the next
    obs["flags"][7, 0] = 0                     # lane 7's wait gave up
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "mbarrier: lane 7 wait(0) for the load's phase returned (a phase that never completes: "
        "the load completed fewer than the box's 4096 bytes, or none): got 0, expected 1",
        "tensor load: box row 0 col 0 (token 32, head 2, d 0): got 0xffff (sentinel: written by nothing), "
        "expected 0x4100 (token 32, head 2, d 0)",
        "tensor load: box row 9 col 3 (token 41, head 2, d 3), past the tensor's 40 rows: zero fill: "
        "got 0x5303 (token 41, head 2, d 3), expected 0x0000 (zero)",
        "tensor stores: dst row 5 col 0 (token 5, head 0, d 0), store A of box row 0 col 0: "
        "got 0x4301 (token 33, head 2, d 1), expected 0x4100 (token 32, head 2, d 0)",
        "tensor stores: dst row 6 col 1 (token 6, head 0, d 1), store A of box row 1 col 1: "
        "got 0x4100 (token 32, head 2, d 0), expected 0x4301 (token 33, head 2, d 1)",
        "tensor stores: dst row 31 col 0 (token 31, head 0, d 0), outside both stores: written by "
        "nothing: got 0x3d40 (token 30, head 2, d 64), expected 0xffff (sentinel: written by nothing)",
        "tensor stores: dst row 40 col 448 (token 40, head 3, d 64), past the map's 40 rows: written "
        "by nothing: got 0x0000 (zero), expected 0xffff (sentinel: written by nothing)",
    ], result.report()


def test_tma_tile_rewritten_row_and_map_echo_are_checked():
    module = EXPERIMENTS["tma_tile"]
    obs = module.observe("model")
    row = module.STORE_A[1] + module.REWRITTEN_ROW
    obs["dst"][row, 2] = 35 * 512 + 256 + 2    # the loaded value: the ordinary stores were not fenced
    sent = np.arange(32, dtype=np.uint64).reshape(2, 16)
    obs["map_sent"], obs["map_received"] = sent, sent.copy()
    obs["map_received"][1, 15] = 0
    obs["map_address_mod_64"] = np.array([0, 48], dtype=np.uint64)
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == [
        "tensor map: dst_map word 15 as the kernel received it: got 0x0000000000000000, "
        "expected 0x000000000000001f",
        "tensor map: dst_map's parameter address mod 64: got 48, expected 0",
        "tensor stores: dst row 8 col 2 (token 8, head 0, d 2), store A of box row 3 col 2: "
        "got 0x4702 (token 35, head 2, d 2), expected 0xc002 (rewritten row, col 2)",
    ], result.report()


def test_tma_tile_closed_form_by_hand():
    module = EXPERIMENTS["tma_tile"]
    box = module.expected_box()
    assert hex(box[0, 2]) == "0x4102" and (box[8:] == 0).all() and box[7, 127] == 39 * 512 + 383
    dst, who = module.expected_dst()
    assert (who == 0).sum() == 16 * 128 and (who == 1).sum() == 10 * 64
    assert dst[8, 5] == 0xC005 and dst[13, 0] == 0            # rewritten row; zero-filled row stored
    assert dst[33, 448] == 0xC000 and dst[37, 511] == 39 * 512 + 256 + 63   # store B: box row 7
    assert dst[39, 511] == 0                                  # box row 9 was zero-filled
    assert (dst[40:] == module.SENTINEL).all()


def test_tma_tile_swizzled_closed_form_by_hand():
    module = EXPERIMENTS["tma_tile"]
    assert module.swizzled_box(128) == (192, 8) and module.swizzled_box(32) == (144, 8)
    raw128, raw32 = module.expected_swizzled_raw(128), module.expected_swizzled_raw(32)
    # SW128 box [3][10] (token 11, column 192 + 10): dense byte 3*128 + 20 = 404, chunk 1 of row 3
    # -> chunk 1^3 = 2: byte 384 + 32 + 4 = 420, word 210.
    assert raw128[210] == 11 * 512 + 202
    assert raw128[64] == 9 * 512 + 192 + 8          # row 1, slot 0 holds chunk 1 (cols 8..15)
    # SW32 box [6][3] (token 14, column 147): dense byte 198, chunk 0 of row 6 -> 1: byte 214.
    assert raw32[107] == 14 * 512 + 147
    assert (raw32[256:] == module.SENTINEL).all()  # 16 rows x 32 bytes = 512 bytes, then nothing
    assert module.chunk_slots(module.expected_swizzled_raw(64), 64)[:8].tolist() == [
        [0, 1, 2, 3], [0, 1, 2, 3], [1, 0, 3, 2], [1, 0, 3, 2],
        [2, 3, 0, 1], [2, 3, 0, 1], [3, 2, 1, 0], [3, 2, 1, 0]]
    dst = module.expected_swizzled_dst(64)
    assert dst[8, 160] == 8 * 512 + 160 and dst[23, 191] == 23 * 512 + 191
    assert (dst != module.SENTINEL).sum() == 16 * 32


def test_tma_tile_swizzled_failures_name_the_chunk_row_col_and_shared_byte():
    module = EXPERIMENTS["tma_tile"]
    obs = module.observe("model")
    raw = obs["sw128_smem"]                    # row 1's slots 0 and 1 exchanged (words 64..79)
    raw[64:72], raw[72:80] = raw[72:80].copy(), raw[64:72].copy()
    obs["sw32_smem"][1000] = 0x1090            # the load wrote past its 512-byte box
    obs["sw32_dst"][8, 144] = module.SENTINEL  # the store dropped box element [0][0]
    obs["sw64_buf_mod"][0] = 512               # a buffer only 512-byte aligned
    obs["sw64_flags"][5, 0] = 0
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures[:7] == [
        "swizzle 32 B, tensor load: shared byte 2000, past the box's 512 bytes: written by nothing: "
        "got 0x1090 (token 8, head 1, d 16), box row 0 col 0, expected 0xffff (sentinel: written by nothing)",
        "swizzle 32 B, tensor store: dst row 8 col 144 (token 8, head 1, d 16), stored from box row 0 col 0: "
        "got 0xffff (sentinel: written by nothing), expected 0x1090 (token 8, head 1, d 16), box row 0 col 0",
        "swizzle 64 B, buffer: the buffer's shared address mod 1024 (the pattern is reported to follow "
        "the address bits: the placements below assume 0): got 512, expected 0",
        "swizzle 64 B, mbarrier: lane 5 wait(0) for the load's phase returned (a phase that never "
        "completes: the load completed fewer than the box's 1024 bytes, or none): got 0, expected 1",
        "swizzle 128 B, chunks: box row 1 shared bytes 128..143 of the box (slot 0 of the row): "
        "got chunk 0, expected chunk 1",
        "swizzle 128 B, chunks: box row 1 shared bytes 144..159 of the box (slot 1 of the row): "
        "got chunk 1, expected chunk 0",
        "swizzle 128 B, tensor load: box row 1 col 0 (token 9, head 1, d 64) at shared byte 144 of the box "
        "(chunk 1 of its row; dense, chunk 0): got 0x12c8 (token 9, head 1, d 72), box row 1 col 8, "
        "expected 0x12c0 (token 9, head 1, d 64), box row 1 col 0",
    ], result.report()
    assert len(result.failures) == 7 + 15      # the other 15 elements of row 1's two chunks
    assert all("swizzle 128 B, tensor load: box row 1 col " in f for f in result.failures[7:])


def test_tma_tile_a_dense_load_is_not_a_swizzled_one():
    # A GPU that ignored the map's swizzle would leave the box dense: every swizzle case fails.
    module = EXPERIMENTS["tma_tile"]
    obs = module.observe("model")
    for swizzle in module.SWIZZLES:
        obs[f"sw{swizzle}_smem"][:8 * swizzle] = module.expected_swizzled_box(swizzle).reshape(-1)
    failures = module.check(obs).result(module.NAME, "model").failures
    assert {f.split(",")[0] for f in failures} == {"swizzle 32 B", "swizzle 64 B", "swizzle 128 B"}


@pytest.mark.parametrize("dtype", ["uint16", "float32", "uint32"])
def test_tma_tile_same_bytes_through_every_map_type_on_the_model(dtype):
    # The same buffers described in 2- or 4-byte elements: columns and boxes halve, bytes do not move.
    module = EXPERIMENTS["tma_tile"]
    tmap = module.tensor_map(0, dtype=dtype)
    assert tmap.box_bytes == module.BOX_BYTES and tmap.row_stride == module.ROW_BYTES
    result = module.check(module._observe_model(dtype)).result(f"tma_tile as {dtype}", "model")
    assert result.passed, result.report()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["uint16", "float32", "uint32"])
def test_tma_tile_same_bytes_through_every_map_type_on_the_gpu(dtype):
    module = EXPERIMENTS["tma_tile"]
    result = module.check(module._observe_gpu(dtype)).result(f"tma_tile as {dtype}", "gpu")
    assert result.passed, result.report()


@pytest.mark.gpu
def test_tma_tile_gpu_equals_the_model_word_for_word():
    module = EXPERIMENTS["tma_tile"]
    on_gpu, on_model = module.observe("gpu"), module.observe("model")
    assert set(on_model) <= set(on_gpu)
    for key in on_model:
        assert on_gpu[key].shape == on_model[key].shape, key
        diff = np.argwhere(on_gpu[key] != on_model[key])
        assert diff.size == 0, f"{key}: GPU and model differ at (row, col) {diff[:8].tolist()}"
    assert (on_gpu["map_received"] == on_gpu["map_sent"]).all()
    assert (on_gpu["map_address_mod_64"] == 0).all()


def test_mma_failure_line_reads_like_the_blog():
    module = EXPERIMENTS["mma_m16n8k16"]
    obs = module.observe("model")
    obs["bf16, C = 0: d"][14, 1] = 0.0  # D[3][5] = 16 * 3 * 5 lives in lane 14, c1
    result = module.check(obs).result(module.NAME, "model")
    assert result.failures == ["bf16, C = 0: lane 14 c1 D[3][5]: got 0, expected 240"]


def test_sentinel_rows_are_checked():
    module = EXPERIMENTS["stmatrix"]
    obs = module.observe("model")
    image = obs["x1"]
    spare = module.row_addresses(1)[31]  # the row the ignored lanes point at
    image[spare] ^= 0xFF
    result = module.check(obs).result(module.NAME, "model")
    assert len(result.failures) == 1 and "written by no lane" in result.failures[0]


def test_result_needs_something_checked():
    assert not _common.Result("x", "model", [], 0).passed
    assert _common.Result("x", "model", [], 1).passed


def test_main_exit_codes(monkeypatch, capsys):
    module = EXPERIMENTS["movmatrix"]
    assert _common.main(module, ["--emulate"]) == 0
    out = capsys.readouterr().out
    assert "--emulate: running on the CPU model" in out and "[PASS] movmatrix on model" in out
    monkeypatch.setattr(module, "run",
                        lambda backend: _common.Result("movmatrix", backend, ["lane 0 r0.lo: got 1, expected 2"], 1))
    assert _common.main(module, ["--emulate"]) == 1
    assert "[FAIL]" in capsys.readouterr().out


def test_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "experiments.ldmatrix", "--emulate"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[PASS] ldmatrix on model" in proc.stdout
    assert "RuntimeWarning" not in proc.stderr


def test_backend_is_validated():
    with pytest.raises(ValueError, match="backend"):
        EXPERIMENTS["ldmatrix"].observe("cpu")


def test_wgmma_swapped_threads_are_both_named():
    # a warpgroup's accumulators are thread-first (128 threads): swap thread 3 (warp 0) and 97 (warp 3)
    module = EXPERIMENTS["wgmma"]
    obs = module.observe("model")
    for arr in obs.values():
        arr[[3, 97]] = arr[[97, 3]]
    result = module.check(obs).result("wgmma", "model")
    assert not result.passed
    named = {(int(w), int(l)) for w, l in re.findall(r"\bwarp (\d) lane (\d+)\b", "\n".join(result.failures))}
    assert named == {(0, 3), (3, 1)}, result.report()


def test_wgmma_cases_pin_both_b_coordinates():
    # B = j cannot see k misplaced and B = k + 1 cannot see n misplaced: a descriptor with LBO and
    # SBO swapped (a wrong layout claim) must fail at least one of them for each major
    from ptx_lab import model

    module = EXPERIMENTS["wgmma"]
    a = model.matrix_to_wgmma_a(module.a_matrix())
    for major in model.WGMMA_B_MAJORS:
        right = module.layouts(16, major)["kernel A's tile"]
        f = model.wgmma_desc_fields(right)
        wrong = model.wgmma_desc(0, lbo=f["sbo"], sbo=f["lbo"])
        bad = 0
        for case in module.B_CASES:
            img = module.b_image(module.b_matrix(case, 16), right, major)
            d = model.wgmma_m64nNk16_rs(a, img, wrong, np.zeros((128, 8), np.float32), 16, False, major)
            bad += not np.array_equal(model.wgmma_d_to_matrix(d, 16), module.expected(case, 16))
        assert bad >= 1, major
