"""forward_l2norm.cuh's reduction of a warp's rows, lane by lane on the CPU: group_rstd's levels transcribed (each
level halves the rows a lane holds while it holds more than one, then plain butterfly levels), in fp32 as the
lanes add. Held to a butterfly a row bit for bit (the same tree), and each lane to the row the scaling pass reads
from it; the shuffles counted against a butterfly a row."""
from __future__ import annotations

import numpy as np
import pytest

LANES = 32


def halving_reduction(partials: np.ndarray) -> tuple[np.ndarray, int]:
    """partials: fp32 [Group, 32], each lane's partial sum of each row. -> (each lane's sum [32], shuffles a lane)."""
    group = partials.shape[0]
    sums = [partials[r].astype(np.float32).copy() for r in range(group)]   # sums[i][lane]
    lane = np.arange(LANES)
    held, shuffles = group, 0
    for off in (16, 8, 4, 2, 1):
        if held > 1:
            upper = (lane & off) != 0
            half = held // 2
            new = []
            for i in range(half):
                keep = np.where(upper, sums[i + half], sums[i])
                send = np.where(upper, sums[i], sums[i + half])
                new.append((keep + send[lane ^ off]).astype(np.float32))   # __shfl_xor_sync(send, off)
                shuffles += 1
            sums, held = new, half
        else:
            sums[0] = (sums[0] + sums[0][lane ^ off]).astype(np.float32)
            shuffles += 1
    return sums[0], shuffles


def butterfly_a_row(partial: np.ndarray) -> np.ndarray:
    """The first form: one row's 5-level butterfly, own + partner at each level. -> every lane's sum [32]."""
    lane = np.arange(LANES)
    s = partial.astype(np.float32).copy()
    for off in (16, 8, 4, 2, 1):
        s = (s + s[lane ^ off]).astype(np.float32)
    return s


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16, 32])
def test_each_lane_holds_its_rows_sum_with_a_butterflys_bits(group):
    rng = np.random.default_rng(group)
    # partial sums of squares of bf16-sized values, of very different magnitudes, so that the order shows
    partials = (rng.random((group, LANES)) * np.exp2(rng.integers(-20, 20, (group, LANES)))).astype(np.float32)
    got, shuffles = halving_reduction(partials)
    for lane in range(LANES):
        row = lane // (LANES // group)
        want = butterfly_a_row(partials[row])
        assert np.all(want == want[0])   # a butterfly leaves every lane the same bits
        assert got[lane] == want[0], (group, lane, row)
    log2 = group.bit_length() - 1
    assert shuffles == group - 1 + 5 - log2 and shuffles <= 5 * group


def test_the_scaling_pass_reads_each_row_from_its_first_lane():
    # row r's sum is at lanes r (32 / G) .. r (32 / G) + 32 / G - 1: __shfl_sync(rstd, r * (32 / Group)) is row r's
    group = 8
    partials = np.zeros((group, LANES), np.float32)
    for r in range(group):
        partials[r] = r + 1
    got, _ = halving_reduction(partials)
    for r in range(group):
        assert got[r * (LANES // group)] == 32 * (r + 1)
