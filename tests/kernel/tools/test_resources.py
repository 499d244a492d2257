"""ptx-lab resources (kernel.tools.resources): what it says before it compiles anything (CPU).

The README's install (`pip install -e '.[test]'`) has no cuobjdump; `--check` then cannot
judge the SASS and must say what to install instead of failing every variant.
"""
from __future__ import annotations

import shutil

import pytest

from kernel.ds_scan import config
from kernel.tools import resources


def _without_cuobjdump(name: str) -> str | None:
    # nvcc present (never run: main stops first), cuobjdump absent, as after the README's install
    return None if name == "cuobjdump" else shutil.which("true")


def test_check_without_cuobjdump_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(resources, "_tool", _without_cuobjdump)
    assert resources.main(["--check"], prog="ptx-lab resources") == 2
    out, err = capsys.readouterr()
    assert out == ""                                    # nothing compiled, no table
    assert err.count("\n") == 1, err                    # one line
    assert err.startswith("ptx-lab resources --check: cuobjdump not found")
    assert "pip install -e '.[sass]'" in err


def test_without_nvcc_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(resources, "_tool", lambda name: None)
    assert resources.main([]) == 2
    assert "nvcc not found on PATH" in capsys.readouterr().err


@pytest.mark.parametrize("jobs, message", [("0", "must be >= 1 (parallel nvcc jobs), got 0"),
                                           ("-3", "must be >= 1 (parallel nvcc jobs), got -3"),
                                           ("two", "expected a whole number of parallel nvcc jobs, got 'two'")])
def test_jobs_below_one_is_an_argument_error(jobs, message, capsys):
    with pytest.raises(SystemExit) as exc:
        resources.main(["--jobs", jobs])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument --jobs: {message}" in err and "Traceback" not in err


def _row(**over) -> dict:
    row = {"kernel": config.BUILD, "cfg": config.Config(vsplit=4), "regs": 128, "spill": 0, "stack": 0, "smem": 1000,
           "threads": 256, "ctas_per_sm": 1, "sass": {op: 1 for op in resources.SASS_OPS}}
    return {**row, **over}


def test_sass_problems_only_where_the_sass_was_read():
    assert resources.problems(_row()) == []
    assert resources.problems(_row(sass=None)) == []          # no cuobjdump: the plain report leaves it out
    assert resources.problems(_row(sass=None, sass_error="bad cubin")) == ["no SASS (cuobjdump failed: bad cubin)"]
    assert resources.problems(_row(sass={**_row()["sass"], "LDSM": 0})) == ["SASS has no LDSM"]
    assert resources.problems(_row(spill=8)) == ["spills 8 bytes, stack frame 0 bytes"]


def test_compare_digests_names_each_changed_variant():
    before = {"a": "1", "b": "2", "c": "3", "d": None}
    after = {"a": "1", "b": "9", "d": None, "e": "5"}
    assert resources.compare_digests(before, after) == [
        "b: SASS differs", "c: gone", "d: SASS differs", "e: new"]   # None: not read, never "the same"
    assert resources.compare_digests(after, after) == ["d: SASS differs"]


def test_against_needs_a_digest_and_an_existing_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(resources, "_tool", lambda name: shutil.which("true"))
    assert resources.main(["--against", str(tmp_path / "a.json")]) == 2
    assert "--against compares two digests and needs --sass-digest" in capsys.readouterr().err
    assert resources.main(["--sass-digest", str(tmp_path / "b.json"), "--against", str(tmp_path / "a.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_digest_without_cuobjdump_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(resources, "_tool", _without_cuobjdump)
    assert resources.main(["--sass-digest", str(tmp_path / "d.json")]) == 2
    assert "pip install -e '.[sass]'" in capsys.readouterr().err
