"""ptx-lab kda-precision: FLA's whole-backward gradients and ours against float64.

On the CPU: the options and the refusal without a GPU, the recipes' inputs, which backwards each recipe
runs, the verdict, and the catch of kernel.chunk_kda's fallback in every case. On the GPU (marked): one
small case, whose table has FLA's rows and ours (or says why ours is not there), and the trained-layer
recipe with and without a tile past our range."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from kernel.tools import kda_precision


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
    rows = [line for line in out.splitlines() if line.startswith("| unit ")]
    labels = [r.split("|")[3].strip() for r in rows]
    assert labels[:3] == ["bf16 rounding", "FLA safe_gate=True", "FLA safe_gate=False"]
    if "kernel.kda_backward cannot be imported" not in out:
        assert labels[3] == "ours (kda_backward)"
        err = [[float(c) for c in r.strip().strip("|").split("|")[3:]] for r in rows]
        # the yardstick: ours no worse than FLA's worse row, with a factor 2 of slack at this small T
        assert all(o <= 2 * max(t, f) for o, t, f in zip(err[3], err[1], err[2])), rows


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
    with pytest.raises(ValueError, match="projection_scale belongs to the 'trained-layer' recipe"):
        kda_precision.recipe_inputs("unit", 1, 32, 2, 16, 8, projection_scale=2.0)


def test_each_recipe_runs_its_backwards():
    both = [True, False]
    fla = [("FLA safe_gate=True", True), ("FLA safe_gate=False", False)]
    assert kda_precision.backwards_of("unit", both, True) == fla + [(kda_precision.OURS, None)]
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
    (["--projection-scale", "2", "--recipes", "unit"], "--projection-scale belongs to the trained-layer recipe"),
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
    assert ran == [("fla", True), ("fla", False), ("ours", None)] * 2 + [("fla", False), ("dropin", True),
                                                                          ("fla", False), ("dropin", False)]
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
    assert saved["fallback"] == {"trained-layer 1x64": True, "trained-layer varlen5x64": False}
    assert set(saved["gates"]) == set(saved["fallback"]) and saved["gates"]["trained-layer 1x64"]["min_gate"] < -5
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
    rows = [line for line in out.splitlines() if line.startswith("| trained-layer ")]
    labels = [r.split("|")[3].strip() for r in rows]
    if "kernel.kda_backward cannot be imported" in out:
        assert labels == ["bf16 rounding", "FLA safe_gate=False"]
        return
    assert labels == ["bf16 rounding", "FLA safe_gate=False", kda_precision.OURS_DROPIN]
    assert "trained-layer 1x256: ours ran" in out
    judged = [line for line in out.splitlines() if line.strip().startswith("trained-layer 1x256:")
              and ("met" in line or "worse" in line)]
    assert judged, out     # judged against FLA's row, tiles past the range or not
