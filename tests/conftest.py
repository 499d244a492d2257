"""Shared pytest setup: the `gpu` marker.

Tests marked `@pytest.mark.gpu` launch device code through CuPy. Where no GPU
is usable they are skipped, each with the one-line reason from
``ptx_lab.gpu.gpu_reason()`` (e.g. "CuPy is not installed"), so a CPU-only run
stays green and says why it ran less. Select only them with ``pytest -m gpu``;
leave them out with ``pytest -m "not gpu"``. The GPU tests that also run fla-core's
Triton kernels are marked `fla` too: ``pytest -m "gpu and not fla"`` leaves out the
minutes FLA compiles for on a fresh machine, and ``pytest -m "gpu and fla"`` runs only them.
"""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; registering here keeps the marker known
    # when pytest runs with another ini file (e.g. -c /dev/null).
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU through CuPy; skipped with the reason where there is none")
    config.addinivalue_line(
        "markers", "fla: runs fla-core's Triton kernels (minutes of compiling on a fresh machine)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from ptx_lab.gpu import gpu_reason

    reason = gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
