"""pyproject's extras: the default test install (README: pip install -e '.[test]') runs the
whole CPU suite, so it must bring every package a CPU test would otherwise skip without."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What CPU tests skip without: matplotlib for the PNG pictures (tests/ptx_lab/test_render.py)
# and the image commands of the docs (tests/test_docs.py); pytest-xdist for the test ledger's
# run in several processes (tests/kernel/tools/test_pytest_ledger.py).
CPU_TEST_NEEDS = {"pytest", "hypothesis", "matplotlib", "pytest-xdist"}


def _extra(name: str) -> set[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() for req in extras[name]}


def test_the_test_extra_brings_everything_the_cpu_suite_needs():
    assert CPU_TEST_NEEDS <= _extra("test"), sorted(CPU_TEST_NEEDS - _extra("test"))


def test_the_plot_extra_still_brings_matplotlib():
    assert "matplotlib" in _extra("plot")
