"""kernel.studies.kernel_b_runs on the CPU: the waves, the fit of the launch's cost model, the report."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.studies.kernel_b_runs.__main__ import fit_start_cost, parse_args, report, waves


def test_waves_round_up():
    assert (waves(132, 132), waves(133, 132), waves(2048, 132)) == (1, 2, 16)


def test_the_fit_recovers_a_model_that_made_the_times():
    t_chunk, start = 0.027, 0.15   # ms a chunk, chunks a CTA's start
    rows = [{"run_chunks": c, "waves": w, "ms": t_chunk * w * (c + start)}
            for c, w in ((1, 993), (2, 497), (4, 249), (8, 125))]
    fit = fit_start_cost(rows)
    assert fit["t_chunk_ms"] == pytest.approx(t_chunk) and fit["start_chunks"] == pytest.approx(start)
    np.testing.assert_allclose(fit["model_ms"], [r["ms"] for r in rows])


def test_the_report_names_the_fit_the_choice_and_each_length_against_one_chunk():
    runs = [{"run_chunks": 1, "ctas": 264, "waves": 2, "ms": 2.0}, {"run_chunks": 2, "ctas": 132, "waves": 1, "ms": 1.5}]
    row = {"config": "2x8192", "heads": 2, "sms": 132, "runs": runs, "fit": fit_start_cost(runs), "auto": 2,
           "assumed_start_chunks": 0.1, "fastest": 2}
    text = report(row)
    assert "a CTA's start fitted at 1.000 chunks of 500.00 us (the launch assumes 0.1)" in text
    assert "auto picks 2 chunks a run, the fastest was 2" in text
    assert "| 2 | 132 | 1 | 1.500 | 0.750 | 1.500 |" in text


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        parse_args(["--configs", "8192"])
    assert parse_args(["--configs", "1x64, 2x128"]).configs == ["1x64", "2x128"]
