"""ptx-lab kda-precision: FLA's whole-backward gradients and ours against float64.

On the CPU: the options and the refusal without a GPU, the recipes' inputs, which backwards each recipe
runs, the verdict, and the catch of kernel.chunk_kda's fallback in every case. On the GPU (marked): one
small case, whose table has FLA's rows and ours (or says why ours is not there), and the trained-layer
recipe with and without a tile past our range."""
from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest

from kernel.tools import kda_precision


def _table(out: str, recipe: str) -> tuple[list[str], list[str]]:
    """The printed table's rows of ``recipe`` and each row's backward label (its third cell)."""
    rows = [line for line in out.splitlines() if line.startswith(f"| {recipe} ")]
    return rows, [r.split("|")[3].strip() for r in rows]


def test_ours_is_on_by_default_and_can_be_left_out(capsys):
    with pytest.raises(SystemExit):
        kda_precision.main(["--help"])
    assert "--no-ours" in capsys.readouterr().out


def test_refused_without_a_gpu(capsys):
    from ptx_lab.gpu import gpu_reason
    if gpu_reason() is None:
        pytest.skip("a GPU is usable here")
    assert kda_precision.main(["--T", "64", "--no-ours"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.fla
def test_one_case_has_flas_rows_and_ours(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("fla")
    # H = 2, as the drop-in's GPU tests: FLA compiles its kernels per H (a constexpr), minutes each
    assert kda_precision.main(["--T", "256", "--heads", "2", "--varlen", "0", "--recipes", "unit"]) == 0
    out = capsys.readouterr().out
    rows, labels = _table(out, "unit")
    assert labels[:3] == ["bf16 rounding", "FLA safe_gate=True", "FLA safe_gate=False"]
    if "kernel.kda_backward cannot be imported" not in out:
        assert labels[3:] == ["ours (kda_backward)", kda_precision.OURS_DROPIN]
        # a gradient the recipe does not have (dA_log, ddt_bias outside layer-call) is printed "-", and so are o
        # and ht in the row whose forward is FLA's
        err = [[None if c.strip() == "-" else float(c) for c in r.strip().strip("|").split("|")[3:]] for r in rows]
        outputs = [c in kda_precision.OUTPUTS for c in kda_precision.COLUMNS]
        assert [e is None for e in err[3]] == [e is None or o for e, o in zip(err[1], outputs)], rows
        assert [e is None for e in err[4]] == [e is None for e in err[1]], rows
        # the yardstick: each of ours no worse than FLA's worse row, with a factor 2 of slack at this small T
        for mine in err[3:]:
            assert all(o <= 2 * max(t, f) for o, t, f in zip(mine, err[1], err[2]) if o is not None), rows


def test_the_verdict_names_each_gradient_worse_than_flas_best():
    G = kda_precision.GRADIENTS
    row = lambda case, label, errs: ("unit", case, label, *(f"{e:.2e}" for e in errs))   # noqa: E731
    fla_t = [3.36e-3, 3.37e-3, 3.83e-3, 3.43e-3, 3.95e-3, 2.32e-3][:len(G)]
    fla_f = [3.36e-3, 3.37e-3, 3.76e-3, 3.40e-3, 3.85e-3, 2.32e-3][:len(G)]
    ours = [3.15e-3, 3.18e-3, 3.79e-3, 4.03e-3, 3.49e-3, 2.57e-3][:len(G)]
    rows = [row("1x8192", "bf16 rounding", [1.7e-3] * len(G)), row("1x8192", "FLA safe_gate=True", fla_t),
            row("1x8192", "FLA safe_gate=False", fla_f), row("1x8192", kda_precision.OURS, ours),
            row("2x64", "FLA safe_gate=True", fla_t), row("2x64", kda_precision.OURS, [1e-3] * len(G)),
            row("3x64", "FLA safe_gate=True", fla_t), ("unit", "3x64", kda_precision.OURS, *["failed"] * len(G)),
            row("4x64", "FLA safe_gate=True", fla_t)]                       # no row of ours: not judged
    got = kda_precision.verdict(rows)
    assert got[0] == "unit 1x8192: worse than FLA's best: dv 1.01x, dg 1.19x, dh0 1.11x"   # dv vs False's 3.76e-3
    assert got[1:] == ["unit 2x64: met", "unit 3x64: not judged (a backward failed)"]


def test_recipe_inputs_gives_either_recipe_and_refuses_others():
    unit = kda_precision.recipe_inputs("unit", 1, 32, 2, 16, 8, [20, 12], seed=3)
    rand = kda_precision.recipe_inputs("random_inputs", 1, 32, 2, 16, 8, [20, 12], seed=3)
    for raw in (unit, rand):
        assert raw["q"].shape == (1, 32, 2, 16) and raw["dht"].shape == (2, 2, 16, 8)
        assert raw["cu_seqlens"].tolist() == [0, 20, 32] and raw["cu_seqlens"].dtype.name == "int64"
    assert float(unit["g"].min()) >= -5.0 and kda_precision.recipe_inputs("unit", 1, 32, 2, 16, 8)["cu_seqlens"] is None
    with pytest.raises(ValueError, match="recipe must be one of"):
        kda_precision.recipe_inputs("gaussian", 1, 32, 2, 16, 8)


def test_the_trained_layer_recipe_is_the_unit_recipe_with_the_layers_gate():
    torch = pytest.importorskip("torch")
    from kernel.tools.trained_layer_gate import trained_layer_gate

    lengths = [20, 300]
    got = kda_precision.recipe_inputs("trained-layer", 1, 320, 2, 128, 128, lengths, seed=3)
    unit = kda_precision.recipe_inputs("unit", 1, 320, 2, 128, 128, lengths, seed=3)
    for name in ("q", "k", "v", "beta", "do", "dht", "cu_seqlens"):
        assert np.array_equal(got[name], unit[name]), name
    gate = trained_layer_gate(1, 320, 2, 2, lengths=lengths, seed=3)["g"]
    assert got["g"].dtype == np.float32 and np.array_equal(got["g"], gate.numpy())
    assert float(got["g"].min()) < -5.0                    # unlike unit's: the gate is unbounded below
    grown = kda_precision.recipe_inputs("trained-layer", 1, 320, 2, 128, 128, lengths, seed=3, projection_scale=8.0)
    assert float(grown["g"].min()) < float(got["g"].min())
    assert torch.equal(torch.from_numpy(grown["g"]),
                       trained_layer_gate(1, 320, 2, 2, lengths=lengths, seed=3, projection_scale=8.0)["g"])
    with pytest.raises(ValueError, match="K must be the layer's head dimension 128"):
        kda_precision.recipe_inputs("trained-layer", 1, 32, 2, 16, 8)
    with pytest.raises(ValueError, match="projection_scale belongs to the .trained-layer. and .layer-call. recipes"):
        kda_precision.recipe_inputs("unit", 1, 32, 2, 16, 8, projection_scale=2.0)


def test_each_recipe_runs_its_backwards():
    both = [True, False]
    fla = [("FLA safe_gate=True", True), ("FLA safe_gate=False", False)]
    # ours: our backward on FLA's forward, and kernel.chunk_kda (our forward too, so o and ht are judged)
    assert kda_precision.backwards_of("unit", both, True) == fla + [(kda_precision.OURS, None),
                                                                    (kda_precision.OURS_DROPIN, None)]
    assert kda_precision.backwards_of("random_inputs", both, False) == fla
    # FLA's safe_gate promises gates in [-5, 0]: never on the trained-layer recipe; ours there is kernel.chunk_kda
    assert kda_precision.backwards_of("trained-layer", both, True) == [fla[1], (kda_precision.OURS_DROPIN, None)]
    assert kda_precision.backwards_of("trained-layer", [True], True) == [(kda_precision.OURS_DROPIN, None)]


def test_a_fallback_row_is_never_judged_as_ours():
    G = kda_precision.GRADIENTS
    row = lambda case, label, e: ("trained-layer", case, label, *([f"{e:.2e}"] * len(G)))   # noqa: E731
    rows = [row("1x8192", "FLA safe_gate=False", 3e-3), row("1x8192", kda_precision.FALLBACK, 3e-3),
            row("varlen8x8192", "FLA safe_gate=False", 3e-3), row("varlen8x8192", kda_precision.OURS_DROPIN, 2e-3)]
    assert not kda_precision.FALLBACK.startswith("FLA") and kda_precision.FALLBACK != kda_precision.OURS_DROPIN
    assert kda_precision.verdict(rows) == [
        "trained-layer 1x8192: not judged (kernel.chunk_kda ran FLA's backward: a FallbackWarning)",
        "trained-layer varlen8x8192: met"]


def test_the_fallback_is_caught_in_every_case_though_the_drop_in_warns_once():
    pytest.importorskip("torch")
    from kernel.fla_dropin import function

    def falls_back():
        function.warn_once("kernel.chunk_kda: a 16-token tile's gates decay a channel past 2^-126 (test)")
        return "grads"

    assert kda_precision.catching_fallback(falls_back) == ("grads", True)
    assert kda_precision.catching_fallback(falls_back) == ("grads", True)     # the second case too
    assert kda_precision.catching_fallback(lambda: "grads") == ("grads", False)
    with pytest.warns(DeprecationWarning, match="passes on"):
        assert kda_precision.catching_fallback(lambda: warnings.warn("passes on", DeprecationWarning)) == (None, False)


@pytest.mark.parametrize("argv, message", [
    (["--projection-scale", "0"], "--projection-scale must be finite and > 0"),
    (["--projection-scale", "nan"], "--projection-scale must be finite and > 0"),
    (["--projection-scale", "2", "--recipes", "unit"],
     "--projection-scale belongs to the trained-layer and layer-call recipes"),
    (["--recipes", "trained"], "invalid choice"),
])
def test_the_trained_layer_options_are_checked_before_the_gpu(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        kda_precision.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_trained_layer_recipe_is_offered_and_its_pairwise_path_named_in_the_help(capsys):
    with pytest.raises(SystemExit):
        kda_precision.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "trained-layer" in out and "Kernel B forms the tile products pairwise" in out and "--projection-scale" in out
    from ptx_lab.gpu import gpu_reason
    if gpu_reason() is not None:
        assert kda_precision.main(["--recipes", "trained-layer", "--projection-scale", "2", "--T", "64"]) == 2
        assert "needs a GPU" in capsys.readouterr().err


def test_the_main_loop_with_stand_ins_for_the_gpu(monkeypatch, capsys, tmp_path):
    """main's orchestration on the CPU: the GPU check, the device, the float64 reference and the backwards
    replaced by stand-ins (FLA's rows 1% off, ours 0.5% off; chunk_kda falling back in the 1x case)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla")
    import json

    import ptx_lab.gpu

    ran = []

    def grads(off):
        return {n: np.full(3, 1.0 + off) for n in kda_precision.GRADIENTS}

    def cpu_inputs(raw):
        out = {n: torch.from_numpy(np.ascontiguousarray(raw[n])) for n in ("q", "k", "v", "g", "beta", "do", "dht")}
        out["h0"], out["cu_seqlens"] = torch.zeros_like(out["dht"]), raw["cu_seqlens"]
        return out

    def dropin(dev):
        ran.append(("dropin", dev["cu_seqlens"] is None))
        return grads(0.005), dev["cu_seqlens"] is None

    monkeypatch.setattr(ptx_lab.gpu, "gpu_reason", lambda: None)
    monkeypatch.setattr(kda_precision, "device_inputs", cpu_inputs)
    monkeypatch.setattr(kda_precision, "reference_gradients", lambda seen, cu: grads(0.0))
    monkeypatch.setattr(kda_precision, "fla_gradients",
                        lambda dev, safe_gate: ran.append(("fla", safe_gate)) or grads(0.01))
    monkeypatch.setattr(kda_precision, "ours_gradients", lambda dev, kb: ran.append(("ours", None)) or grads(0.005))
    monkeypatch.setattr(kda_precision, "dropin_gradients", dropin)
    out_json = tmp_path / "precision.json"
    assert kda_precision.main(["--T", "64", "--heads", "1", "--varlen", "5", "--recipes", "unit", "trained-layer",
                               "--json", str(out_json)]) == 0
    # every recipe gets kernel.chunk_kda's row (our forward: o and ht judged), the unit recipe ours on FLA's forward too
    assert ran == [("fla", True), ("fla", False), ("ours", None), ("dropin", True),
                   ("fla", True), ("fla", False), ("ours", None), ("dropin", False),
                   ("fla", False), ("dropin", True), ("fla", False), ("dropin", False)]
    out = capsys.readouterr().out
    labels = [(r.split("|")[1].strip(), r.split("|")[2].strip(), r.split("|")[3].strip())
              for r in out.splitlines() if r.startswith("| trained-layer ")]
    assert labels == [("trained-layer", "1x64", "bf16 rounding"), ("trained-layer", "1x64", "FLA safe_gate=False"),
                      ("trained-layer", "1x64", kda_precision.FALLBACK),
                      ("trained-layer", "varlen5x64", "bf16 rounding"),
                      ("trained-layer", "varlen5x64", "FLA safe_gate=False"),
                      ("trained-layer", "varlen5x64", kda_precision.OURS_DROPIN)]
    assert "trained-layer 1x64: FLA's ran (a FallbackWarning): the row is FLA's backward, not ours" in out
    assert "trained-layer varlen5x64: ours ran" in out
    assert "[trained-layer 1x64] gates: min_gate" in out
    # a gate past the float64 reference's range skips the case by name instead of stopping the run
    assert kda_precision.main(["--T", "64", "--heads", "1", "--varlen", "0", "--recipes", "trained-layer",
                               "--projection-scale", "40"]) == 0
    skipped = capsys.readouterr().out
    assert "[trained-layer 1x64] skipped: a tile decays a channel by e^" in skipped and ran[-1] == ("dropin", False)
    saved = json.loads(out_json.read_text())
    assert saved["fallback"] == {"unit 1x64": True, "unit varlen5x64": False,
                                 "trained-layer 1x64": True, "trained-layer varlen5x64": False}
    assert set(saved["gates"]) == {"trained-layer 1x64", "trained-layer varlen5x64"}
    assert saved["gates"]["trained-layer 1x64"]["min_gate"] < -5
    assert saved["verdict"] == [
        "unit 1x64: met", "unit varlen5x64: met",
        "trained-layer 1x64: not judged (kernel.chunk_kda ran FLA's backward: a FallbackWarning)",
        "trained-layer varlen5x64: met"]


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize("scale, past", [(4.0, False), (8.0, True)])
def test_the_trained_layer_recipe_runs_ours_past_the_tile_range(scale, past, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("fla")
    from kernel.tools.trained_layer_gate import gate_statistics, trained_layer_gate

    # at 256 tokens and 2 heads, seed 0: 4x puts gates below GATE_FLOOR but no tile past 2^-126, 8x some tiles
    stats = gate_statistics(trained_layer_gate(1, 256, 2, 2, seed=0, projection_scale=scale)["g"], [256])
    assert stats["below_gate_floor"] > 0 and (stats["tile_channels_past"] > 0) == past, stats
    argv = ["--T", "256", "--heads", "2", "--varlen", "0", "--recipes", "trained-layer",
            "--projection-scale", str(scale)]
    assert kda_precision.main(argv) == 0
    out = capsys.readouterr().out
    rows, labels = _table(out, "trained-layer")
    if "kernel.kda_backward cannot be imported" in out:
        assert labels == ["bf16 rounding", "FLA safe_gate=False"]
        return
    assert labels == ["bf16 rounding", "FLA safe_gate=False", kda_precision.OURS_DROPIN]
    assert "trained-layer 1x256: ours ran" in out
    judged = [line for line in out.splitlines() if line.strip().startswith("trained-layer 1x256:")
              and ("met" in line or "worse" in line)]
    assert judged, out     # judged against FLA's row, tiles past the range or not


def test_the_layer_call_recipe_passes_the_raw_gate_and_beta_logits():
    torch = pytest.importorskip("torch")
    import ml_dtypes

    lengths = [20, 300]
    call = kda_precision.recipe_inputs("layer-call", 1, 320, 2, 128, 128, lengths, seed=3)
    trained = kda_precision.recipe_inputs("trained-layer", 1, 320, 2, 128, 128, lengths, seed=3)
    for name in ("q", "k", "v", "g", "beta", "do", "dht", "cu_seqlens"):   # the trained-layer draws, unchanged
        assert np.array_equal(call[name], trained[name]), name
    assert call["g_raw"].shape == (1, 320, 2, 128) and call["A_log"].shape == (2,) and call["dt_bias"].shape == (256,)
    # the raw projection is the bf16 one the layer passes: its float32 values round-trip through bf16
    assert np.array_equal(call["g_raw"].astype(ml_dtypes.bfloat16).astype(np.float32), call["g_raw"])
    from kernel.activations import gate
    again = gate(torch.from_numpy(call["g_raw"]).bfloat16(), torch.from_numpy(call["A_log"]),
                 torch.from_numpy(call["dt_bias"]))
    assert torch.equal(again, torch.from_numpy(call["g"]))
    assert call["beta_raw"].shape == (1, 320, 2) and call["beta_raw"].min() < 0 < call["beta_raw"].max()
    assert kda_precision.backwards_of("layer-call", [True, False], True) == [
        ("FLA safe_gate=False", False), (kda_precision.OURS_DROPIN, None)]


def test_the_layer_call_references_chain_agrees_with_the_hand_written_gate_backward():
    # two independent routes to dA_log, ddt_bias, the raw gate's and the logits' gradients: torch's
    # float64 autograd through kernel.activations.gate (the reference) and activations.gate_backward's
    # formulas in fp32 (what the drop-in's tests check): they agree to fp32's rounding
    torch = pytest.importorskip("torch")
    from kernel.activations import beta_backward, gate_backward

    raw = kda_precision.recipe_inputs("layer-call", 1, 64, 2, 128, 128, seed=5)
    seen = {"g": raw["g_raw"].astype(np.float64), "beta": raw["beta_raw"].astype(np.float64),
            "A_log": raw["A_log"].astype(np.float64), "dt_bias": raw["dt_bias"].astype(np.float64)}
    g64, beta64 = kda_precision.layer_call_activations(seen)
    assert np.allclose(g64, raw["g"], rtol=1e-5, atol=1e-6) and np.allclose(beta64, 1 / (1 + np.exp(-seen["beta"])))
    rng = np.random.default_rng(0)
    dg, dbeta = rng.standard_normal(g64.shape), rng.standard_normal(beta64.shape)
    chain = kda_precision.layer_call_chain(seen, dg, dbeta)
    assert set(chain) == {"dg", "dbeta", "dA_log", "ddt_bias"} and chain["dA_log"].dtype == np.float64
    t = lambda x: torch.from_numpy(x).float()   # noqa: E731
    dx, dA, ddt = gate_backward(t(dg), t(seen["g"]), t(seen["A_log"]), t(seen["dt_bias"]))
    for name, hand in (("dg", dx), ("dA_log", dA), ("ddt_bias", ddt),
                       ("dbeta", beta_backward(t(dbeta), t(seen["beta"])))):
        assert kda_precision.rel_fro(hand.double().numpy(), chain[name]) < 1e-5, name


def test_the_verdict_and_the_per_head_line_judge_the_gates_parameters():
    C = kda_precision.COLUMNS
    assert C[-4:] == ("dA_log", "ddt_bias", "o", "ht")
    row = lambda recipe, label, errs: (recipe, "1x64", label, *errs)   # noqa: E731
    fla = [f"{3e-3:.2e}"] * len(C)
    ours = [f"{2e-3:.2e}"] * (len(C) - 4) + [f"{4.5e-3:.2e}", f"{2e-3:.2e}"] + [f"{2e-3:.2e}"] * 2
    no_params = lambda r: r[:-4] + ["-", "-"] + r[-2:]   # noqa: E731  (the unit recipe has no dA_log, ddt_bias)
    rows = [row("layer-call", "FLA safe_gate=False", fla), row("layer-call", kda_precision.OURS_DROPIN, ours),
            row("unit", "FLA safe_gate=True", no_params(fla)),
            row("unit", kda_precision.OURS, no_params(ours)[:-2] + ["-", "-"]),   # FLA's forward: no o, ht of ours
            row("unit", kda_precision.OURS_DROPIN, no_params(ours))]
    assert kda_precision.verdict(rows) == ["layer-call 1x64: worse than FLA's best: dA_log 1.50x", "unit 1x64: met"]
    # with two rows of ours each is judged on its own, and named
    rows[-1] = row("unit", kda_precision.OURS_DROPIN, no_params(ours)[:-2] + [f"{6e-3:.2e}", f"{2e-3:.2e}"])
    assert kda_precision.verdict(rows)[1] == f"unit 1x64: worse than FLA's best: {kda_precision.OURS_DROPIN} o 2.00x"
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    line = kda_precision.per_head_line({"FLA safe_gate=False": {"dA_log": ref + [1e-3, 1e-3, 1e-3, 0.0]},
                                        kda_precision.OURS_DROPIN: {"dA_log": ref + [5e-4, 2e-3, 1e-3, 0.0]}}, ref)
    assert line == "dA_log per head: ours at least as close as FLA's in 3 of 4 heads; median |error| ours / FLA's 1.00"
    assert "not compared" in kda_precision.per_head_line({"FLA safe_gate=False": {"dA_log": ref}}, ref)


@pytest.mark.gpu
@pytest.mark.fla
def test_the_layer_call_recipe_measures_the_gates_parameters(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("fla")
    assert kda_precision.main(["--T", "256", "--heads", "2", "--varlen", "0", "--recipes", "layer-call"]) == 0
    out = capsys.readouterr().out
    rows, labels = _table(out, "layer-call")
    assert labels[:2] == ["bf16 rounding", "FLA safe_gate=False"]
    if "kernel.kda_backward cannot be imported" in out:
        return
    assert labels[2] == kda_precision.OURS_DROPIN
    cells = [c.strip() for c in rows[2].strip().strip("|").split("|")[3:]]
    assert len(cells) == len(kda_precision.COLUMNS) and all(float(c) < 0.05 for c in cells), rows
    assert "[layer-call 1x256] dA_log per head: ours at least as close as FLA's in" in out


def _stand_ins_for_the_gpu(monkeypatch, look) -> list:
    """main's GPU work replaced by stand-ins on the CPU (fla only imported, the inputs torch tensors, every
    gradient ones); each call of kernel.chunk_kda's rows appends ``look()`` to the list returned."""
    torch = pytest.importorskip("torch")
    import ptx_lab.gpu

    seen = []
    grads = {n: np.ones(3) for n in kda_precision.GRADIENTS}

    def cpu_inputs(raw):
        out = {n: torch.from_numpy(np.ascontiguousarray(raw[n])) for n in ("q", "k", "v", "g", "beta", "do", "dht")}
        out["h0"], out["cu_seqlens"] = torch.zeros_like(out["dht"]), raw["cu_seqlens"]
        return out

    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))   # main only checks that it imports
    monkeypatch.setattr(ptx_lab.gpu, "gpu_reason", lambda: None)
    monkeypatch.setattr(kda_precision, "device_inputs", cpu_inputs)
    monkeypatch.setattr(kda_precision, "reference_gradients", lambda seen_, cu: grads)
    monkeypatch.setattr(kda_precision, "fla_gradients", lambda dev, safe_gate: grads)
    monkeypatch.setattr(kda_precision, "dropin_gradients", lambda dev: seen.append(look()) or (grads, False))
    return seen


@pytest.mark.parametrize("argv, forward, words", [([], "ours", "our forward"),
                                                  (["--our-forward", "fla"], "fla", "FLA's forward")])
def test_our_forward_sets_kernel_chunk_kdas_forward_in_its_rows(argv, forward, words, monkeypatch, capsys):
    """--our-forward reaches kernel.chunk_kda's rows through kernel.using_forward (the setting is back
    after), and the table's heading names it; the GPU work replaced by stand-ins."""
    import kernel

    seen = _stand_ins_for_the_gpu(monkeypatch, kernel.forward_setting)
    before = kernel.forward_setting()
    assert kda_precision.main(["--T", "64", "--heads", "1", "--varlen", "0", "--recipes", "trained-layer",
                               *argv]) == 0
    assert seen == [forward] and kernel.forward_setting() == before
    assert f"kernel.chunk_kda with {words} and our backward" in capsys.readouterr().out


def test_the_reference_has_the_forwards_o_and_final_state(monkeypatch):
    """reference_gradients' o and ht are the float64 forward's on the same inputs (numpy standing in for
    CuPy), beside the gradients, for an equal-length and a packed batch."""
    from kernel.reference import kda_forward_reference

    stand_in = types.ModuleType("cupy")
    stand_in.asarray, stand_in.asnumpy, stand_in.get_array_module = np.asarray, np.asarray, lambda *a: np
    monkeypatch.setitem(sys.modules, "cupy", stand_in)
    for lengths in (None, [5, 20, 7]):
        raw = kda_precision.recipe_inputs("unit", 1, 32, 2, 16, 8, lengths=lengths, seed=2)
        seen = {n: raw[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta", "do", "dht")}
        got = kda_precision.reference_gradients(seen, raw["cu_seqlens"])
        o, ht, _ = kda_forward_reference(seen["q"], seen["k"], seen["v"], seen["g"], seen["beta"],
                                         cu_seqlens=raw["cu_seqlens"], qk_l2norm=True)
        assert set(got) >= set(kda_precision.GRADIENTS) | set(kda_precision.OUTPUTS)
        assert np.array_equal(got["o"], o) and np.array_equal(got["ht"], ht)
        assert got["o"].shape == raw["v"].shape and got["ht"].shape == raw["dht"].shape


@pytest.mark.parametrize("argv, pays, words", [([], True, None),
                                               (["--passes", "one"], False, "the one pass"),
                                               (["--passes", "three"], True, "the three passes")])
def test_passes_forces_our_forward_in_chunk_kdas_rows(argv, pays, words, monkeypatch, capsys):
    """--passes reaches kernel.chunk_kda's rows through the rule's knob (its value back after), and the
    table's heading names it; at H = 2 and one sequence of 8192 the rule alone takes the three passes. The
    GPU work replaced by stand-ins."""
    import kernel.three_pass_forward as three_passes

    seen = _stand_ins_for_the_gpu(monkeypatch, lambda: three_passes.three_passes_pay(2, 1, 8192, None))
    before = three_passes.THREE_PASS_MAX_PAIRS
    assert kda_precision.main(["--T", "64", "--heads", "1", "--varlen", "0", "--recipes", "trained-layer",
                               *argv]) == 0
    assert seen == [pays] and three_passes.THREE_PASS_MAX_PAIRS == before
    out = capsys.readouterr().out
    assert (f"kernel.chunk_kda with our forward, {words} and our backward" in out if words
            else "kernel.chunk_kda with our forward and our backward" in out)


def test_passes_belongs_to_our_forward(capsys):
    with pytest.raises(SystemExit):
        kda_precision.main(["--passes", "one", "--our-forward", "fla"])
    assert "--passes one chooses among our forwards, and --our-forward fla runs FLA's" in capsys.readouterr().err
