"""kernel.token_gradients.launch on the CPU: Kernel B's batch tables (first tile, first chunk and
sequence of every chunk)."""
from __future__ import annotations

import numpy as np

from kernel.token_gradients import tables


def test_tables_name_every_chunk_s_sequence_and_first_tile():
    cu = np.array([0, 1, 65, 130, 330], dtype=np.int64)
    t = tables(cu)
    assert t["tile_offs"].tolist() == [0, 1, 5, 10, 23]      # ceil(n / 16) tiles a sequence
    assert t["chunk_offs"].tolist() == [0, 1, 2, 4, 8]       # ceil(n / 64) chunks a sequence
    assert t["chunk_seq"].tolist() == [0, 1, 2, 2, 3, 3, 3, 3]
    assert (t["tiles"], t["chunks"]) == (23, 8)
    # a chunk's first tile is its sequence's first tile + 4 (chunk - first chunk)
    for c, n in enumerate(t["chunk_seq"]):
        assert t["tile_offs"][n] + 4 * (c - t["chunk_offs"][n]) < t["tile_offs"][n + 1]
