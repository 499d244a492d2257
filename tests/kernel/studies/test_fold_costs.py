"""The fold-costs study: its arguments and its arithmetic on the CPU (a fold's net is its builds' costs less the
passes it removes; the gate's fold counts every reader of the gate), its run on the GPU."""
from __future__ import annotations

import pytest

from kernel.studies.fold_costs.__main__ import (BACKWARDS, FORMS, FORWARDS, KERNELS, REMOVED, costs, forms_of, main,
                                                measure, nets, parse_args, report)


def _row(backward: bool = True) -> dict:
    row = {"config": "32x8192", "heads": 32, "passes by": "FLA",
           "passes": {"cumsum": 2.0, "l2norm q": 1.0, "l2norm k": 1.0},
           "one pass": {"plain": 12.0, "token gate": 12.5, "l2norm": 20.0, "token gate + l2norm": 20.5},
           "products pass": {"plain": 6.0, "token gate": 6.1, "l2norm": 6.5, "token gate + l2norm": 6.6}}
    if backward:
        row.update({"Kernel A": {"plain": 8.0, "token gate": 8.25}, "Kernel B": {"plain": 27.0, "token gate": 27.5}})
    return row


def test_a_folds_net_is_its_costs_less_the_passes_it_removes():
    # without the backward's readers: the forward kernel's cost alone
    n = nets(_row(backward=False))
    assert n["one pass"] == {"token gate": -1.5, "l2norm": 6.0, "token gate + l2norm": 4.5}
    assert n["products pass"]["token gate"] == pytest.approx(-1.9)
    # with them, the gate's fold also pays Kernel A's 0.25 and Kernel B's 0.5 ms; the l2norm's does not
    n = nets(_row())
    assert n["one pass"] == {"token gate": -0.75, "l2norm": 6.0, "token gate + l2norm": 5.25}
    assert n["products pass"]["token gate + l2norm"] == pytest.approx(-2.65)
    assert costs(_row())["Kernel B"] == {"token gate": 0.5}
    # every fold names the passes it removes; the backward's readers have the gate's fold alone
    assert set(REMOVED) == set(FORMS) - {"plain"} and FORMS["plain"] == (False, False)
    assert all(forms_of(k) == ["plain", "token gate"] for k in BACKWARDS)
    assert all(forms_of(k) == list(FORMS) for k in FORWARDS) and KERNELS == FORWARDS + BACKWARDS


def test_the_report_gives_each_build_its_cost_and_net():
    text = report(_row())
    assert "32x8192, H = 32: the passes the folds remove (FLA's): cumsum 2.000 ms, l2norm q 1.000 ms" in text
    assert "net of the passes it removes (with Kernel A's and B's token-gate costs)" in text
    assert "| one pass | l2norm | 20.000 | +8.000 | +6.000 |" in text
    assert "| one pass | token gate | 12.500 | +0.500 | -0.750 |" in text
    assert "| products pass | plain | 6.000 |  |  |" in text
    assert "| Kernel B | token gate | 27.500 | +0.500 |  |" in text
    one = {k: v for k, v in _row(backward=False).items() if k != "products pass"}
    assert "products pass" not in report(one) and "with Kernel A" not in report(one)
    assert nets(one).keys() == {"one pass"}


def test_arguments_are_checked_before_any_gpu_work():
    args = parse_args(["--configs", "4x8192, 1x131072", "--kernels", "products pass,Kernel B"])
    assert args.configs == ["4x8192", "1x131072"] and args.kernels == ["products pass", "Kernel B"]
    assert parse_args([]).kernels == list(KERNELS)
    for bad in (["--configs", "4x"], ["--kernels", "kernel b"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--configs", "2x128"]) == 2
    assert "needs torch with a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_every_build_and_pass_is_timed():
    pytest.importorskip("torch")
    row = measure("2x1000", 2, 2, KERNELS)
    assert set(row["passes"]) == {"cumsum", "l2norm q", "l2norm k"} and all(v > 0 for v in row["passes"].values())
    for kernel in KERNELS:
        assert set(row[kernel]) == set(forms_of(kernel)) and all(v > 0 for v in row[kernel].values())
    assert set(nets(row)) == set(FORWARDS)
