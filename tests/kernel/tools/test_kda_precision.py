"""ptx-lab kda-precision: FLA's whole-backward gradients and ours against float64.

On the CPU: the options and the refusal without a GPU. On the GPU (marked): one small case, whose table
has FLA's rows and ours (or says why ours is not there)."""
from __future__ import annotations

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
