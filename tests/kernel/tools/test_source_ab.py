"""ptx-lab source-ab: its arguments and the old source it builds from (CPU); one small timing run (GPU)."""
from pathlib import Path

import numpy as np
import pytest

from kernel.tools import source_ab


def test_configurations_parse_and_only_kernel_a_takes_a_vsplit():
    assert source_ab.parse_spec("1x131072:2", "a") == source_ab.Spec(1, 131072, 2)
    assert source_ab.parse_spec(" 32x8192 ", "b") == source_ab.Spec(32, 8192)
    assert source_ab.parse_spec("1x131072:2", "a").name == "1x131072:2"
    with pytest.raises(ValueError, match="only Kernel A"):
        source_ab.parse_spec("4x8192:2", "b")
    with pytest.raises(ValueError, match="one of"):
        source_ab.parse_spec("4x8192:3", "a")
    with pytest.raises(ValueError, match="BxT"):
        source_ab.parse_spec("8192", "a")
    with pytest.raises(ValueError, match="at least 1"):
        source_ab.parse_spec("0x8192", "a")


def test_the_forward_takes_a_consumer_warp_count_and_no_vsplit():
    assert source_ab.parse_spec("32x8192", "f") == source_ab.Spec(32, 8192)
    assert source_ab.parse_spec("32x8192:w4", "f") == source_ab.Spec(32, 8192, warps=4)
    assert source_ab.parse_spec("32x8192:w4", "f").name == "32x8192:w4"
    for bad in ("32x8192:2", "32x8192:w3", "32x8192:w", "32x8192:4w"):
        with pytest.raises(ValueError, match="the forward takes :w<consumer warps>"):
            source_ab.parse_spec(bad, "f")
    with pytest.raises(ValueError, match="only Kernel A takes a v-split"):
        source_ab.parse_spec("32x8192:w4", "s")
    with pytest.raises(ValueError, match="the v-split must be one of"):
        source_ab.parse_spec("32x8192:w4", "a")


def test_arguments_need_exactly_one_old_source(capsys):
    with pytest.raises(SystemExit):
        source_ab.parse_args(["--kernel", "a"], "ptx-lab source-ab")
    assert "one of the arguments --old --old-rev is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        source_ab.parse_args(["--kernel", "a", "--old", "x", "--old-rev", "HEAD"], "ptx-lab source-ab")
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        source_ab.parse_args(["--kernel", "b", "--old-rev", "HEAD", "--configs", "4x8192:2"], "ptx-lab source-ab")
    assert "only Kernel A takes a v-split" in capsys.readouterr().err
    a = source_ab.parse_args(["--kernel", "a", "--old-rev", "HEAD", "--configs", "1x131072:2,32x8192"], "p")
    assert [s.name for s in a.specs] == ["1x131072:2", "32x8192"]
    a = source_ab.parse_args(["--kernel", "f", "--old-rev", "HEAD", "--configs", "32x8192,32x8192:w4"], "p")
    assert [s.name for s in a.specs] == ["32x8192", "32x8192:w4"]


def test_a_rooms_shared_headers_are_what_its_build_includes_from_outside():
    # the forward includes Kernel S's shared pieces from its room: a copy or an old tree must carry them
    shared = [Path(f"kernel/forward_states/cuda/forward_states_{name}.cuh") for name in ("chain", "copies", "gate", "walk")]
    timer = Path("kernel/lap_timer.cuh")   # the timing builds' (Kernel B's and the forward's)
    assert source_ab.shared_headers("f") == [*shared, timer, Path("kernel/shapes.cuh")]
    assert source_ab.shared_headers("b") == [timer, Path("kernel/shapes.cuh")]
    for kernel in ("a", "s"):
        assert source_ab.shared_headers(kernel) == [Path("kernel/shapes.cuh")]
    # the products pass includes the one pass's diagonal-block solve and l2norm
    assert source_ab.shared_headers("p") == [Path("kernel/forward/cuda/forward_l2norm.cuh"),
                                             Path("kernel/forward/cuda/forward_solve.cuh"), Path("kernel/shapes.cuh")]


@pytest.mark.parametrize("kernel", sorted(source_ab.ROOMS))
def test_a_copy_of_the_working_tree_holds_the_room_and_its_shared_headers(kernel, tmp_path):
    room = source_ab.copy_tree(kernel, tmp_path)
    assert room == tmp_path / source_ab.source_dir(kernel).relative_to(source_ab.REPO)
    assert sorted(p.name for p in room.iterdir()) == sorted(p.name for p in source_ab.source_dir(kernel).iterdir())
    for rel in source_ab.shared_headers(kernel):
        assert (tmp_path / rel).read_bytes() == (source_ab.REPO / rel).read_bytes()
    assert source_ab.check_old(room, kernel) == room


@pytest.mark.parametrize("kernel", sorted(source_ab.ROOMS))
def test_the_old_source_comes_from_a_git_revision(kernel, tmp_path):
    if not (source_ab.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    old = source_ab.check_old(source_ab.old_tree_from_rev("HEAD", kernel, tmp_path), kernel)
    new = source_ab.source_dir(kernel)
    assert old.name == new.name and (old / source_ab._entry_name(kernel)).is_file()
    assert sorted(p.name for p in old.glob("*.cuh")) == sorted(p.name for p in new.glob("*.cuh"))
    for rel in source_ab.shared_headers(kernel):   # each where the room's includes look for it
        assert (tmp_path / rel).read_bytes() == (source_ab.REPO / rel).read_bytes()


@pytest.mark.parametrize("kernel", sorted(source_ab.ROOMS))
def test_the_old_build_compiles_the_old_tree(kernel, tmp_path):
    # the build description, its options and the kernel cache all follow use_source, and go back
    import importlib

    if not (source_ab.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    holder = importlib.import_module(source_ab.ROOMS[kernel].holders[0])
    new = source_ab.source_dir(kernel)
    old = source_ab.old_tree_from_rev("HEAD", kernel, tmp_path)
    entry = old / source_ab._entry_name(kernel)
    entry.write_text(entry.read_text() + "\n// the old tree\n")
    variant = holder.BUILD.default()
    try:
        source_ab.use_source(kernel, old)
        assert holder.BUILD.source().endswith("// the old tree\n")
        assert f"-I{old}" in holder.BUILD.options(variant)
    finally:
        source_ab.use_source(kernel, new)
    assert not holder.BUILD.source().endswith("// the old tree\n")
    assert f"-I{new}" in holder.BUILD.options(variant) and holder.BUILD.entry.parent == new


def test_a_bad_revision_or_source_is_refused_with_its_reason(tmp_path):
    if not (source_ab.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(ValueError, match="git archive no-such-revision"):
        source_ab.old_tree_from_rev("no-such-revision", "a", tmp_path)
    with pytest.raises(ValueError, match="no dstate_scan.cu"):
        source_ab.check_old(tmp_path, "a")
    with pytest.raises(ValueError, match="Kernel B's source directory"):
        source_ab.check_old(tmp_path, "b")


@pytest.mark.parametrize("kernel", sorted(source_ab.ROOMS))
def test_each_rooms_kernel_parameters_are_read(kernel):
    entry = source_ab.source_dir(kernel) / source_ab._entry_name(kernel)
    params = source_ab.kernel_parameters(entry.read_text())
    assert len(params) > 5 and all(p and "(" not in p for p in params), params


def test_an_old_kernel_with_other_arguments_is_refused(tmp_path):
    # the working tree's launch code runs both builds: another parameter list is refused by name
    import shutil

    old = tmp_path / "cuda"
    shutil.copytree(source_ab.source_dir("b"), old)
    entry = old / source_ab._entry_name("b")
    text = entry.read_text()
    assert "float scale," in text
    entry.write_text(text.replace("float scale,", "float scale, int added,", 1))
    with pytest.raises(ValueError, match=r"takes other arguments.*old 'int added'"):
        source_ab.check_old(old, "b")
    entry.write_text(text)
    assert source_ab.check_old(old, "b") == old


def test_an_old_forward_with_other_arguments_is_refused(tmp_path):
    old = source_ab.copy_tree("f", tmp_path)
    entry = old / "forward.cu"
    text = entry.read_text()
    assert text.count("int HV, int H)") == 1
    entry.write_text(text.replace("int HV, int H)", "int HV)", 1))
    with pytest.raises(ValueError, match=r"takes other arguments.*old 20 parameters, new 21"):
        source_ab.check_old(old, "f")


def test_without_a_gpu_it_says_so(capsys):
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is here")
    assert source_ab.main(["--kernel", "a", "--old-rev", "HEAD", "--configs", "1x256"]) == 2
    assert "source-ab times kernels on a GPU" in capsys.readouterr().err


def test_only_the_forwards_written_blocks_of_aqk_and_akk_are_hashed():
    # the forward writes token t's 16 columns of its tile within the 64-chunk; the rest is never written
    B, T, HV = 2, 200, 3
    blocks = np.full((B, T, HV, 64), np.nan, np.float32)
    for t in range(T):
        c0 = 16 * (t % 64 // 16)
        blocks[:, t, :, c0:c0 + 16] = t + np.arange(16)[None, None, :]
    got = source_ab.written_blocks(blocks)
    assert got.shape == (T, 16, B, HV) and not np.isnan(got).any()
    assert (got == (np.arange(T)[:, None] + np.arange(16)[None, :])[:, :, None, None]).all()


def test_the_outputs_digest_sees_every_bit_dtype_and_shape():
    a = {"dq": np.arange(6, dtype=np.float32).reshape(2, 3), "dbeta": np.ones(3, np.float32)}
    same = {"dbeta": np.ones(3, np.float32), "dq": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert source_ab.digest(a) == source_ab.digest(same)                       # dicts by key
    flipped = {**a, "dq": a["dq"].copy()}
    flipped["dq"].view(np.uint32)[1, 2] ^= 1                                   # one bit of one element
    assert source_ab.digest(flipped) != source_ab.digest(a)
    assert source_ab.digest({**a, "dq": a["dq"].reshape(3, 2)}) != source_ab.digest(a)
    assert source_ab.digest({**a, "dq": a["dq"].view(np.int32)}) != source_ab.digest(a)
    assert source_ab.digest((a["dq"], None, 3)) == source_ab.digest([a["dq"]])  # not an array: skipped
    assert source_ab.digest((a["dq"], a["dbeta"])) != source_ab.digest((a["dbeta"], a["dq"]))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(source_ab.ROOMS))
def test_the_same_source_twice_takes_about_the_same_time(kernel, tmp_path, capsys):
    pytest.importorskip("torch", reason="source-ab times with the bench's timer (torch)")
    working_tree = source_ab.source_dir(kernel)
    # the "old" tree is a copy of the working tree's room (and its shared headers, kernel/shapes.cuh
    # among them, at their places), so the test runs on an exported tree without git history too
    old = source_ab.copy_tree(kernel, tmp_path)
    rows = source_ab.measure(kernel, old, [source_ab.Spec(2, 256)], H=2, reps=3)
    assert [r["config"] for r in rows] == ["2x256"]
    assert all(v > 0 for v in rows[0]["runs_ms"].values())
    assert 0.5 < rows[0]["ratio"] < 2.0
    assert rows[0]["same_bits"] and rows[0]["repeats"]     # one source, three builds: one set of bits
    # the working tree's source is back in place afterwards
    assert source_ab.source_dir(kernel) == working_tree != old
