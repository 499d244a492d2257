"""The forward's knockout study: every patch applies exactly once to today's source and keeps the kernel's
parameters and barriers, each patched source compiles for sm_90a without spills and loses the SASS it
says it removes (nvcc), the arguments and the table (a stand-in timer); one small timing run (GPU)."""
import collections
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel.forward import config as forward_config
from kernel.studies.forward_critical_path import __main__ as study
from kernel.studies.forward_critical_path import knockouts
from kernel.tools import source_ab

REPO = source_ab.REPO
NAMES = [k.name for k in knockouts.KNOCKOUTS]
# the hand-offs between roles and inside the producers: a knockout must keep each one's count
RING_CALLS = ("Ring::publish", "Ring::wait_full", "Ring::release", "Ring::wait_to_refill")


def _text(root: Path, rel: str) -> str:
    return (root / rel).read_text()


@pytest.mark.parametrize("name", NAMES)
def test_every_patch_applies_exactly_once_to_todays_source(name, tmp_path):
    k = knockouts.BY_NAME[name]
    cuda = knockouts.build_tree(k, tmp_path)
    assert cuda == tmp_path / "kernel" / "forward" / "cuda"
    for edit in k.edits:
        assert _text(REPO, edit.path).count(edit.old) == 1          # today's source holds it once
        assert _text(tmp_path, edit.path).count(edit.old) == 0      # ... and the copy no longer
        assert edit.new in _text(tmp_path, edit.path) and "KNOCKOUT" in _text(tmp_path, edit.path)
    # nothing else changed: the files no edit names are the working tree's, byte for byte
    patched = {e.path for e in k.edits}
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert "kernel/forward_states/cuda/forward_states_chain.cuh" in copied and "kernel/shapes.cuh" in copied
    for rel in copied:
        if rel not in patched:
            assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), rel


@pytest.mark.parametrize("name", NAMES)
def test_a_knockout_keeps_the_parameters_and_every_barrier(name, tmp_path):
    k = knockouts.BY_NAME[name]
    knockouts.build_tree(k, tmp_path)
    entry = "kernel/forward/cuda/forward.cu"
    assert source_ab.kernel_parameters(_text(tmp_path, entry)) == source_ab.kernel_parameters(_text(REPO, entry))
    files = [p.relative_to(REPO).as_posix() for p in (REPO / "kernel/forward/cuda").iterdir()]
    for call in RING_CALLS + ("named_barrier_sync", "producers_sync()"):
        before = sum(_text(REPO, f).count(call) for f in files)
        after = sum(_text(tmp_path, f).count(call) for f in files)
        # the producer barrier's knockout removes its call after R1, which only the producers made
        expected = before - 1 if (name, call) == ("producer-barrier", "producers_sync()") else before
        assert after == expected, (call, before, after)


def test_a_patch_whose_text_moved_fails_loudly(tmp_path):
    # an edit of the source that the patch no longer matches (0 times) or matches twice stops the study
    k = knockouts.MQK
    source_ab.copy_tree(knockouts.KERNEL, tmp_path)
    path = tmp_path / k.edits[0].path
    text = path.read_text()
    path.write_text(text.replace(k.edits[0].old, k.edits[0].old.replace("tile_product", "tile_product_v2")))
    with pytest.raises(knockouts.PatchError, match=r"knockout mqk, edit 0: .*forward_intra.cuh holds its text 0 times"):
        knockouts.apply(k, tmp_path)
    path.write_text(text + "\n" + k.edits[0].old)
    with pytest.raises(knockouts.PatchError, match="holds its text 2 times"):
        knockouts.apply(k, tmp_path)


def test_the_knockouts_are_named_once_and_selected_in_table_order():
    assert len(set(NAMES)) == len(NAMES)
    assert [k.name for k in knockouts.select(["mqk", "r1-exp2"])] == ["r1-exp2", "mqk"]
    assert knockouts.select(None) == knockouts.KNOCKOUTS
    with pytest.raises(ValueError, match="unknown knockout.*no-such-part"):
        knockouts.select(["mqk", "no-such-part"])
    # the composite is exactly its parts' edits
    assert set(knockouts.INTRA_ALL.edits) == set(knockouts.MQK.edits + knockouts.AKK_PRODUCT.edits
                                                 + knockouts.INV_SOLVE.edits)


# ---------------------------------------------------------------------------------------------------
# nvcc: every patched source compiles for sm_90a at every configuration the forward launches, 0 spills
# ---------------------------------------------------------------------------------------------------

def _ptxas(cuda: Path, cfg, out: Path) -> str:
    from kernel.tools import resources

    # the build's options with the tree's directory where the working tree's is (as source_ab.use_source)
    options = (*(o for o in forward_config.options(cfg) if not o.startswith("-I")), f"-I{cuda}")
    cmd = resources._nvcc_cmd(cuda / "forward.cu", options, out, "-cubin")
    proc = subprocess.run(cmd + ["-Xptxas", "-v"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def _sass_counts(cubin: Path) -> collections.Counter | None:
    from kernel.tools import resources

    if resources._tool("cuobjdump") is None:
        return None
    sass = resources._sass(cubin)
    assert sass.returncode == 0, sass.stderr
    # each instruction's mnemonic, after its address and any predicate
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_.]+)", sass.stdout, re.M)
    return collections.Counter(ops)


def _count(counts: collections.Counter, prefix: str) -> int:
    return sum(v for op, v in counts.items() if op == prefix or op.startswith(prefix + "."))


@pytest.fixture(scope="module")
def intact_sass(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("intact") / "forward.cubin"
    _ptxas(REPO / "kernel/forward/cuda", forward_config.auto_config(8), out)
    return _sass_counts(out)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", NAMES)
def test_each_knockout_compiles_without_spills_and_loses_its_sass(name, tmp_path, intact_sass):
    k = knockouts.BY_NAME[name]
    cuda = knockouts.build_tree(k, tmp_path / "tree")
    # the study's knockouts patch the plain builds' code paths (the token-gate, l2norm and timing builds are not its
    # subject)
    for cfg in (c for c in forward_config.all_variants() if not (c.token_gate or c.l2norm or c.timing)):
        cubin = tmp_path / f"{cfg.name()}.cubin"
        log = _ptxas(cuda, cfg, cubin)
        assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", log), (cfg.name(), log)
        if cfg == forward_config.auto_config(8) and intact_sass is not None:
            counts = _sass_counts(cubin)
            for op, fewer in k.removes:
                lost = _count(intact_sass, op) - _count(counts, op)
                assert lost >= fewer, (name, op, _count(intact_sass, op), _count(counts, op))


# ---------------------------------------------------------------------------------------------------
# the study's arguments, order of runs and table (a stand-in for source_ab.time_sides)
# ---------------------------------------------------------------------------------------------------

def test_arguments_default_to_the_layers_size_and_every_knockout(capsys):
    a = study.parse_args([])
    assert [s.name for s in a.specs] == ["32x8192"] and a.reps == 7 and a.heads == 32
    assert a.knockouts == knockouts.KNOCKOUTS
    a = study.parse_args(["--configs", "32x8192,32x8192:w4", "--parts", "inv-solve, mqk", "--reps", "9"])
    assert [s.name for s in a.specs] == ["32x8192", "32x8192:w4"] and a.reps == 9
    assert [k.name for k in a.knockouts] == ["mqk", "inv-solve"]
    for argv, message in ((["--parts", "mqk,nope"], "unknown knockout"), (["--configs", "32x8192:2"], "takes :w"),
                          (["--reps", "0"], "at least 1"), (["--configs", ","], "no configuration"),
                          (["--parts", ","], "no knockout")):
        with pytest.raises(SystemExit):
            study.parse_args(argv)
        assert message in capsys.readouterr().err, argv


def test_each_knockout_runs_between_two_intact_runs_and_is_measured_against_the_faster():
    trees = [(knockouts.MQK, Path("/t/mqk")), (knockouts.INV_SOLVE, Path("/t/inv"))]
    ms = iter([12.0, 11.0, 12.4, 9.0, 11.8])   # intact, mqk, intact, inv-solve, intact
    calls, progress = [], []

    def fake_time_sides(kernel, spec, H, reps, sides, on_side=None, hashed=None):
        calls.append((kernel, spec.name, H, reps, [label for label, _ in sides], hashed))
        rows = []
        for label, source in sides:
            rows.append(dict(label=label, source=str(source), first_call_s=0.5, ms=next(ms), digest=None))
            on_side(rows[-1])
        return rows

    rows, intact = study.measure([source_ab.Spec(32, 8192)], trees, heads=32, reps=7, time_sides=fake_time_sides,
                                 log=progress.append)
    assert calls == [("f", "32x8192", 32, 7, ["intact", "mqk", "intact", "inv-solve", "intact"], ())]
    assert [(r["knockout"], r["intact_ms"], r["knocked_out_ms"]) for r in rows] == [("mqk", 12.0, 11.0),
                                                                                  ("inv-solve", 11.8, 9.0)]
    assert rows[1]["saved_ms"] == pytest.approx(2.8) and rows[1]["share"] == pytest.approx(2.8 / 11.8)
    assert intact == [dict(config="32x8192", runs_ms=[12.0, 12.4, 11.8], spread=pytest.approx(12.4 / 11.8 - 1))]
    assert len(progress) == 1 + 5 and "  32x8192 inv-solve: first call 0.5 s, median 9.000 ms" in progress
    text = study.table(rows, intact)
    assert text.splitlines()[0] == \
        "| config | part knocked out | ms intact | ms knocked out | saved ms | share of intact |"
    assert f"| 32x8192 | inv-solve: {knockouts.INV_SOLVE.part} | 11.800 | 9.000 | +2.800 | +23.7% |" in text
    assert f"| 32x8192 | mqk: {knockouts.MQK.part} | 12.000 | 11.000 | +1.000 | +8.3% |" in text
    assert "32x8192: 3 intact runs, 11.800 .. 12.400 ms (spread 5.1%)" in text


def test_trees_are_written_for_review_without_a_gpu(tmp_path, capsys):
    assert study.main(["--trees", str(tmp_path / "trees"), "--parts", "snapshot-store"]) == 0
    written = tmp_path / "trees" / "snapshot-store" / "kernel" / "forward" / "cuda" / "forward.cu"
    assert "KNOCKOUT snapshot-store" in written.read_text()
    assert "wrote 1 patched tree(s)" in capsys.readouterr().out
    assert study.main(["--trees", str(tmp_path / "trees")]) == 2                 # not over an earlier run
    assert "not an empty directory" in capsys.readouterr().err


def test_without_a_gpu_it_says_so(capsys):
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is here")
    assert study.main(["--parts", "mqk"]) == 2
    assert "the study times kernels on a GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_study_runs_every_knockout_without_hanging(tmp_path):
    # every knockout launched and timed (a hang would stop here), the working tree's source back after
    pytest.importorskip("torch", reason="the study times with the bench's timer (torch)")
    trees = study.build_trees(knockouts.KNOCKOUTS, tmp_path, log=lambda s: None)
    rows, intact = study.measure([source_ab.Spec(2, 256), source_ab.Spec(1, 256, warps=8)], trees, heads=2, reps=2,
                                 log=lambda s: None)
    assert [r["knockout"] for r in rows] == NAMES * 2
    assert all(r["intact_ms"] > 0 and r["knocked_out_ms"] > 0 for r in rows)
    assert [len(r["runs_ms"]) for r in intact] == [len(NAMES) + 1] * 2
    assert source_ab.source_dir("f") == REPO / "kernel" / "forward" / "cuda"
