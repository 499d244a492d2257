"""What the split references' tests share (Kernel A's in test_segments.py, the forward's in
test_forward_segments.py): the bound, the hypothesis settings, the error measures and their worst
values, and where a cut may go."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, settings

RTOL = 1e-12        # float64 against float64; the split only reorders a few sums
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rel(out, ref) -> float:
    """||out - ref|| / ||ref||; an all-zero ref must be matched exactly."""
    num = float(np.linalg.norm(out - ref))
    den = float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def tile_edges(length: int, tile: int) -> list[int]:
    """Interior tile edges of a sequence: where a cut may go."""
    return list(range(tile, length, tile))


class WorstErrors(dict):
    """The worst errors a test module met ("rel": against the unsplit result, "scaled": summaries
    against explicit tile maps), asserting each against RTOL as it is measured."""

    def __init__(self):
        super().__init__(rel=0.0, scaled=0.0)

    def check_close(self, out, ref, what: str) -> None:
        r = rel(out, ref)
        self["rel"] = max(self["rel"], r)
        assert r < RTOL, f"{what}: relative error {r:.2e}"

    def check_scaled(self, out, ref, scale: float, what: str) -> None:
        """||out - ref|| / scale, for a ref whose own norm is no measure of its rounding."""
        err = float(np.linalg.norm(out - ref))
        err = err / scale if scale > 0 else err
        self["scaled"] = max(self["scaled"], err)
        assert err < RTOL, f"{what}: error {err:.2e} of the factors' scale {scale:.2e}"
