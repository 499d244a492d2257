"""python -m kernel.studies.row_rstd on the CPU: its arguments, its byte counts, its report, and a clean refusal without
a GPU."""
from __future__ import annotations

import json

import pytest

from kernel.studies.row_rstd.__main__ import bytes_moved, fla_bytes_moved, main, parse_args, report


def test_the_arguments_and_their_checks():
    args = parse_args([])
    assert args.configs == ["32x8192", "8x32768", "1x131072"] and args.heads == 32 and args.reps == 20
    assert args.depths == [4] and args.json is None
    args = parse_args(["--configs", "2x1000", "--heads", "4", "--reps", "3", "--depths", "2,8"])
    assert (args.configs, args.heads, args.reps, args.depths) == (["2x1000"], 4, 3, [2, 8])
    for bad in (["--configs", "32-8192"], ["--heads", "0"], ["--reps", "0"], ["--depths", "3"], ["--depths", "x"],
                ["--depths", ","]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_bytes_are_the_floors():
    rows = 32 * 8192 * 32
    assert bytes_moved(rows) == 2 * rows * 256 + 2 * rows * 4 == 4_362_076_160          # 4.36 GB at 32x8192
    assert fla_bytes_moved(rows) == bytes_moved(rows) + 2 * rows * 256                     # and the copies
    assert bytes_moved(rows) / 4.3e12 * 1e3 == pytest.approx(1.01, abs=0.01)               # ms at 4.3 TB/s


def _row(fla_ms):
    rows = 8 * 32768 * 32
    return {"config": "8x32768", "heads": 32, "reps": 20, "rows": rows, "depths": [2, 4], "device": "NVIDIA H200",
            "bytes": bytes_moved(rows), "fla_bytes": fla_bytes_moved(rows), "ours_ms": {"2": 1.2, "4": 1.05},
            "fla_ms": fla_ms, "fla_missing": None if fla_ms else "fla-core is not installed"}


def test_the_report_gives_each_sides_ms_rate_and_ratio():
    text = report(_row(2.03))
    assert "8x32768, H = 32 (8388608 rows of q and of k; median of 20 in turn, NVIDIA H200):" in text
    assert "rstd pass d4: 1.050 ms, 4154 GB/s of 4.36 GB (reads 2 x 8388608 x 256 B, writes 2 x 8388608 x 4 B)" in text
    assert "FLA's l2norm_fwd on q and k: 2.030 ms, 4265 GB/s of 8.66 GB" in text
    assert "ours / FLA's: d2 0.591, d4 0.517" in text
    json.dumps(_row(2.03))       # what --json writes
    assert "FLA's l2norm_fwd: not timed (fla-core is not installed)" in report(_row(None))


def test_without_a_gpu_it_says_why(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--configs", "1x1024"]) == 2
    assert "row_rstd: needs torch with a CUDA GPU and CuPy" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.fla      # FLA's l2norm_fwd runs beside ours where fla-core is installed
def test_a_small_configuration_is_measured():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    from kernel.studies.row_rstd.__main__ import measure

    row = measure("2x300", 3, 2, [1, 4])
    assert row["rows"] == 1800 and row["bytes"] == bytes_moved(1800) and set(row["ours_ms"]) == {"1", "4"}
    assert all(ms > 0 for ms in row["ours_ms"].values())
    assert (row["fla_ms"] is None) == (row["fla_missing"] is not None)
    assert "rstd pass d1:" in report(row)
