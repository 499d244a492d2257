"""kernel.studies.training: the arguments, the task, the model and the training loop on the CPU (with a
token-by-token KDA checked against the float64 reference); the real comparison on the GPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the training study needs torch")

from kernel.studies.training import compare, model  # noqa: E402


def test_the_defaults_are_the_studys():
    a = compare.parse_args([])
    assert (a.steps, a.layers, a.heads, a.T, a.batch, a.seed, a.noise_seed) == (300, 2, 4, 1024, 8, 0, 1)
    assert a.model == "study"
    assert str(a.out) == "docs/bench/training.png" and a.json is None


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--min-period", "64", "--max-period", "32"], "need 1 <= --min-period <= --max-period <= --T"),
    (["--T", "100", "--max-period", "128"], "need 1 <= --min-period <= --max-period <= --T"),
    (["--noise-seed", "0"], "--noise-seed must differ from --seed"),
    (["--lr", "0"], "need --warmup >= 0 and --lr > 0"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        compare.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_rows_repeat_their_segment():
    rows = model.repeated_segments(6, 200, 64, 5, 40, torch.Generator().manual_seed(3))
    assert rows.shape == (6, 201) and rows.dtype == torch.int64 and 0 <= int(rows.min()) and int(rows.max()) < 64
    for row in rows:
        period = next(p for p in range(5, 41) if torch.equal(row[p:], row[:-p]))
        assert torch.equal(row[period:], row[:-period])
    again = model.repeated_segments(6, 200, 64, 5, 40, torch.Generator().manual_seed(3))
    assert torch.equal(rows, again)


def test_naive_kda_is_the_float64_reference():
    from kernel.reference import kda_forward_reference

    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 2, 37, 2, 16, 8
    q, k, v = (torch.randn(B, T, H, d, generator=gen, dtype=torch.float64) for d in (K, K, V))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64))
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    h0 = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    o, ht = model.naive_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True)
    o_ref, ht_ref, _ = kda_forward_reference(*(x.numpy() for x in (q, k, v, g, beta)), initial_state=h0.numpy(),
                                             qk_l2norm=True)
    rel = lambda a, b: np.linalg.norm(a.double().numpy() - b) / np.linalg.norm(b)
    assert rel(o, o_ref) < 1e-5 and rel(ht, ht_ref) < 1e-5      # float32 arithmetic inside


def test_the_studys_model_builds_with_flas_shapes():
    a = compare.parse_args([])
    m = compare.build_model(a)
    mixer = m.blocks[0].mixer
    assert len(m.blocks) == 2 and (mixer.heads, mixer.head_dim) == (4, 128) and m.embed.embedding_dim == 512
    seen = {}

    def spy(q, k, v, g, beta, **kw):   # the real (slow) KDA, recording what the layer is given
        seen.update(q=q.shape, g=(float(g.detach().min()), float(g.detach().max())), beta=beta.shape, kw=kw)
        return model.naive_kda(q, k, v, g, beta, **kw)

    rows = model.repeated_segments(1, 12, a.vocab, 2, 4, torch.Generator().manual_seed(0))
    logits = m(rows[:, :-1], spy)
    assert logits.shape == (1, 12, a.vocab) and torch.isfinite(logits).all()
    assert seen["q"] == (1, 12, 4, 128) and seen["beta"] == (1, 12, 4)
    assert -5.0 <= seen["g"][0] <= seen["g"][1] < 0.0
    assert seen["kw"] == dict(use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5.0)


def test_flas_own_model_builds_with_the_studys_shape_and_its_layer_defaults():
    pytest.importorskip("transformers", reason="fla.models needs transformers")
    pytest.importorskip("fla.models", reason="flash-linear-attention 0.6.0 (fla.models) is not installed")
    from fla.layers.kda import KimiDeltaAttention

    a = compare.parse_args(["--model", "fla", "--layers", "2", "--heads", "4"])
    m = compare.build_model(a)
    layers = [mod for mod in m.modules() if isinstance(mod, KimiDeltaAttention)]
    assert len(layers) == 2
    for layer in layers:   # the layer at its defaults: gate unbounded, no safe gate, 4 heads of 128
        assert (layer.num_heads, layer.head_dim, layer.safe_gate, layer.lower_bound) == (4, 128, False, None)
    assert m.config.vocab_size == a.vocab and m.config.hidden_size == 512 and not m.config.fuse_cross_entropy
    assert "FLA's KDAForCausalLM" in compare.describe(a)


def test_training_is_reproducible_from_its_seed():
    a = compare.parse_args(["--steps", "3", "--T", "12", "--min-period", "2", "--max-period", "4", "--heads", "1",
                            "--layers", "1", "--log-every", "1"])
    lines = []
    first = compare.train(model.naive_kda, a, 0, device="cpu", label="x", log=lines.append)
    second = compare.train(model.naive_kda, a, 0, device="cpu", label="x", log=lambda s: None)
    other = compare.train(model.naive_kda, a, 1, device="cpu", label="x", log=lambda s: None)
    assert len(first["losses"]) == 3 and all(np.isfinite(first["losses"]))
    assert first["losses"] == second["losses"] and first["losses"] != other["losses"]
    assert len(lines) == 3 and lines[-1].startswith("[x] step 3/3  loss ")


def test_summary_table_and_picture(tmp_path):
    runs = {"a": {"losses": [4.0, 3.0, 2.0, 1.0], "seconds": 1.0}, "b": {"losses": [4.0, 3.5, 2.0, 1.0], "seconds": 2.0},
            "c": {"losses": [4.0, 3.0, 3.0, 2.0], "seconds": 3.0}}
    assert compare.smoothed([4.0, 3.0, 2.0, 1.0], 2) == [4.0, 3.5, 2.5, 1.5]
    s = compare.summarize(runs, 2, reference="a", same_seed="b", other_seed="c")
    assert s["final_loss"] == {"a": 1.5, "b": 1.5, "c": 2.5}
    assert s["max_abs_smoothed_difference"] == {"ours vs FLA, same seed": 0.25,
                                                "noise (FLA vs FLA, other seed)": 1.0}
    text = compare.table(runs, s)
    assert "| b   | 1.5000" in text and "noise (FLA vs FLA, other seed): 1.0000" in text
    pytest.importorskip("matplotlib")
    compare.plot(runs, s, tmp_path / "sub" / "t.png", "title", reference="a")
    assert (tmp_path / "sub" / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("which", compare.MODELS)
def test_the_comparison_runs_on_the_gpu(which, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    pytest.importorskip("fla.ops.kda", reason="fla-core 0.6.0 is not installed")
    pytest.importorskip("kernel.kda_backward", reason="kernel.kda_backward is not built yet")
    if which == "fla":
        pytest.importorskip("fla.models", reason="flash-linear-attention 0.6.0 (fla.models) is not installed")
    out, record = tmp_path / "t.png", tmp_path / "t.json"
    assert compare.main(["--model", which, "--steps", "20", "--T", "256", "--log-every", "10", "--smooth", "5",
                         "--out", str(out), "--json", str(record)]) == 0
    r = json.loads(record.read_text())
    assert len(r["runs"]) == 3 and all(len(run["losses"]) == 20 and all(np.isfinite(run["losses"]))
                                       for run in r["runs"].values())
    ours = [run for run in r["runs"].values() if run["implementation"] != "fla"]
    assert [run["implementation"] for run in ours] == (["kernel.patch_fla()"] if which == "fla" else ["kernel.chunk_kda"])
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_the_committed_run_redraws_without_a_gpu(tmp_path):
    from pathlib import Path

    from kernel.studies.training import compare

    recorded = Path(__file__).resolve().parents[3] / "docs" / "bench" / "training.json"
    out = tmp_path / "training.png"
    assert compare.main(["--replot", str(recorded), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, forward", [([], "ours"), (["--our-forward", "fla"], "fla")])
def test_run_two_names_the_forward_it_runs(argv, forward):
    a = compare.parse_args(argv)
    assert a.our_forward == forward
    words = {"ours": "our forward", "fla": "FLA's forward"}[forward]
    assert compare.title(a.our_forward, "shape") == \
        f"KDA LM, FLA's chunk_kda vs kernel.chunk_kda ({words}, our backward): shape"


def test_the_committed_run_is_titled_with_flas_forward(tmp_path, monkeypatch):
    # docs/bench/training.json was recorded before --our-forward, when kernel.chunk_kda ran FLA's forward
    from pathlib import Path

    drawn = {}
    monkeypatch.setattr(compare, "plot", lambda runs, summary, path, title, reference: drawn.update(
        title=title, reference=reference))
    recorded = Path(__file__).resolve().parents[3] / "docs" / "bench" / "training.json"
    assert compare.main(["--replot", str(recorded), "--out", str(tmp_path / "t.png")]) == 0
    assert "vs kernel.chunk_kda (FLA's forward, our backward)" in drawn["title"]
    assert drawn["reference"] == "FLA backward, seed 0"
