"""Fixtures shared by the kernel package's tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def offsets_reads(monkeypatch) -> list:
    """Every read of a torch cu_seqlens tensor's values to the host (kernel.shapes.host_offsets), as a
    list of the tensors read, from an empty set of kept copies."""
    from kernel import shapes

    reads, read = [], shapes._read_torch
    monkeypatch.setattr(shapes, "_read_torch", lambda cu: reads.append(cu) or read(cu))
    monkeypatch.setattr(shapes, "_offsets_kept", type(shapes._offsets_kept)())
    return reads
