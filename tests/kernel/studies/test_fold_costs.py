"""The fold-costs study: its arguments and its arithmetic on the CPU (a fold's net is its build's cost less the
passes it removes), its run on the GPU."""
from __future__ import annotations

import pytest

from kernel.studies.fold_costs.__main__ import FORMS, KERNELS, REMOVED, main, measure, nets, parse_args, report


def _row() -> dict:
    return {"config": "32x8192", "heads": 32, "passes by": "FLA",
            "passes": {"cumsum": 2.0, "l2norm q": 1.0, "l2norm k": 1.0},
            "one pass": {"plain": 12.0, "token gate": 12.5, "l2norm": 20.0, "token gate + l2norm": 20.5},
            "products pass": {"plain": 6.0, "token gate": 6.1, "l2norm": 6.5, "token gate + l2norm": 6.6}}


def test_a_folds_net_is_its_cost_less_the_passes_it_removes():
    n = nets(_row())
    assert n["one pass"] == {"token gate": -1.5, "l2norm": 6.0, "token gate + l2norm": 4.5}
    assert n["products pass"]["token gate"] == pytest.approx(-1.9)
    assert n["products pass"]["token gate + l2norm"] == pytest.approx(-3.4)
    # the plain build has no net, and every fold names the passes it removes
    assert set(REMOVED) == set(FORMS) - {"plain"} and FORMS["plain"] == (False, False)


def test_the_report_gives_each_build_its_cost_and_net():
    text = report(_row())
    assert "32x8192, H = 32: the passes the folds remove (FLA's): cumsum 2.000 ms, l2norm q 1.000 ms" in text
    assert "| one pass | l2norm | 20.000 | +8.000 | +6.000 |" in text
    assert "| products pass | plain | 6.000 | +0.000 |  |" in text
    one = {k: v for k, v in _row().items() if k != "products pass"}
    assert "products pass" not in report(one) and nets(one).keys() == {"one pass"}


def test_arguments_are_checked_before_any_gpu_work():
    args = parse_args(["--configs", "4x8192, 1x131072", "--kernels", "products pass"])
    assert args.configs == ["4x8192", "1x131072"] and args.kernels == ["products pass"]
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
        assert set(row[kernel]) == set(FORMS) and all(v > 0 for v in row[kernel].values())
    assert set(nets(row)) == set(KERNELS)
