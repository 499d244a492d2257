"""The .x4 lane recipe of ldmatrix.cuh (X4Lane) and its model twin, ptx_lab.fragments.x4_lane_row_col,
and the addresses built on it (x4_addr_*, x4_lane_bytes_*) with theirs, fragments.x4_lane_offsets.

On the CPU: the twin's addresses load, through ptx_lab.model.ldmatrix (whose lane map is
ptx_lab.fragments.ldmatrix_map), exactly the mma fragment ldmatrix.cuh says each order and
.trans give, for any block of any tile and any row padding. On the GPU: the probe_x4_lanes probe
(probes.cu), which runs the header's code, writes every lane's (row, col), and the
probe_x4_addresses probe (operand_probes.cu) every lane's byte offsets, and they equal the twins'.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import fragments, model

LANE = np.arange(32)


def test_the_twin_names_row_lane_mod_8_of_matrix_lane_div_8():
    for order, corners in fragments.X4_ORDERS.items():
        rc = fragments.x4_lane_row_col(order)
        assert rc.shape == (32, 2) and rc.dtype == np.int64
        want = np.array([(corners[l // 8][0] + l % 8, corners[l // 8][1]) for l in LANE])
        assert (rc == want).all(), order
        # the 32 addressed rows cover the tile: every (row, 8-column half) exactly once
        assert len({(r, c) for r, c in rc}) == 32 and set(rc[:, 1]) == {0, 8}


def test_the_twin_checks_its_argument():
    with pytest.raises(ValueError, match="order must be one of rows_first, cols_first; got 'rows'"):
        fragments.x4_lane_row_col("rows")


# (order, .trans) -> what ldmatrix.cuh says the four registers are, as fragments of the tile T
EXPECTED = {
    ("rows_first", False): lambda T: model.matrix_to_fragments("mma.a", T, "b16"),
    ("rows_first", True): lambda T: np.concatenate([model.matrix_to_fragments("mma.b", T[:, :8], "b16"),
                                                     model.matrix_to_fragments("mma.b", T[:, 8:], "b16")], axis=1),
    ("cols_first", False): lambda T: np.concatenate([model.matrix_to_fragments("mma.b", T.T[:, :8], "b16"),
                                                      model.matrix_to_fragments("mma.b", T.T[:, 8:], "b16")], axis=1),
    ("cols_first", True): lambda T: model.matrix_to_fragments("mma.a", T.T, "b16"),
}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pad=st.sampled_from([0, 8, 16, 24, 40]),
       row0=st.integers(0, 2), col_block=st.integers(0, 1))
def test_each_order_loads_the_fragment_the_header_names(seed, pad, row0, col_block):
    # a 16x16 tile at (row0, 8 * col_block) of a bigger row-major b16 array, rows `stride` apart
    stride = 16 + 8 * col_block + pad
    rows = np.random.default_rng(seed).integers(0, 1 << 16, (16 + row0, stride), dtype=np.uint16)
    col0 = 8 * col_block
    T = rows[row0:row0 + 16, col0:col0 + 16]
    smem = rows.astype("<u2").view(np.uint8).ravel()
    for (order, trans), want in EXPECTED.items():
        addrs = fragments.x4_lane_offsets(order, 2 * stride, row0, col0)
        got = model.ldmatrix(smem, addrs, 4, trans)
        assert (got == want(T)).all(), (order, trans)


def test_the_offsets_are_the_lane_row_col_at_the_block():
    for order in fragments.X4_ORDERS:
        rc = fragments.x4_lane_row_col(order)
        got = fragments.x4_lane_offsets(order, 272, 16, 8)
        assert got.shape == (32,) and got.dtype == np.int64
        assert (got == (16 + rc[:, 0]) * 272 + (8 + rc[:, 1]) * 2).all(), order
    # the block's corner is a constant: the kernels add it to a lane part computed once
    assert (fragments.x4_lane_offsets("cols_first", 48, 3, 5) -
            fragments.x4_lane_offsets("cols_first", 48) == 3 * 48 + 5 * 2).all()


def test_the_offsets_check_their_arguments():
    with pytest.raises(ValueError, match="order must be one of"):
        fragments.x4_lane_offsets("rows", 32)
    with pytest.raises(TypeError, match="row_bytes must be an int; got 32.0"):
        fragments.x4_lane_offsets("rows_first", 32.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        fragments.x4_lane_offsets("rows_first", 32, -1)


def test_the_other_pairings_do_not_load_those_fragments():
    # the test can fail: rows first with .trans is not the A fragment, cols first plain not A either
    T = np.random.default_rng(1).integers(0, 1 << 16, (16, 16), dtype=np.uint16)
    smem = T.astype("<u2").view(np.uint8).ravel()
    for order, trans in (("rows_first", True), ("cols_first", False)):
        rc = fragments.x4_lane_row_col(order)
        got = model.ldmatrix(smem, 2 * (rc[:, 0] * 16 + rc[:, 1]), 4, trans)
        assert not (got == model.matrix_to_fragments("mma.a", T, "b16")).all()


@pytest.mark.gpu
@pytest.mark.parametrize("order", list(fragments.X4_ORDERS))
def test_the_probe_runs_the_headers_recipe_and_equals_the_twin(order):
    from ptx_lab import device

    got = device.x4_lane_row_col(order)
    want = fragments.x4_lane_row_col(order)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert (got == want).all(), np.argwhere(got != want)[:4]


@pytest.mark.gpu
@pytest.mark.parametrize("order", list(fragments.X4_ORDERS))
@settings(max_examples=20, deadline=None)
@given(stride=st.integers(16, 600), row0=st.integers(0, 64), col0=st.integers(0, 8))
def test_the_address_probe_runs_the_headers_addresses_and_equals_the_twin(order, stride, row0, col0):
    from ptx_lab import device

    col0 = min(col0 * 8, stride - 16)   # the block inside the row
    want = fragments.x4_lane_offsets(order, 2 * stride, row0, col0)
    got = device.x4_lane_offsets(order, 2 * stride, row0, col0)
    for name in ("addr", "lane_bytes"):
        assert (got[name] == want).all(), (name, np.argwhere(got[name] != want)[:4])
