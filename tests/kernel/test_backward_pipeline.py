"""kernel.backward_pipeline on the CPU: its setting, the groups, the order of the launches and where it applies
(its GPU test, the bits of A then B through kernel.chunk_kda: tests/kernel/test_fla_library_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kernel import backward_pipeline
from kernel.backward_pipeline import Pipeline, group_bounds, pipeline_order, reason_not


def test_it_is_off_by_default():
    assert backward_pipeline.PIPELINE is None
    assert reason_not(None, N=32, states_given=True, capturing=False, scan_splits=False) == "off"


@pytest.mark.parametrize("bad, error", [(dict(a_sms=0, groups=4), ValueError), (dict(a_sms=24, groups=1), ValueError),
                                        (dict(a_sms=24.0, groups=4), TypeError),
                                        (dict(a_sms=24, groups=True), TypeError)])
def test_a_pipeline_names_what_it_refuses(bad, error):
    with pytest.raises(error, match="a_sms|groups"):
        Pipeline(**bad)


@pytest.mark.parametrize("groups", [2, 3, 8])
def test_the_pipeline_runs_each_group_once_and_each_b_after_its_a(groups):
    order = pipeline_order(groups)
    assert sorted((k, j) for _, k, j in order) == sorted([("A", j) for j in range(groups)] +
                                                        [("B", j) for j in range(groups)])
    place = {(k, j): n for n, (_, k, j) in enumerate(order)}
    assert all(place[("A", j)] < place[("B", j)] for j in range(groups))
    assert order[0] == ("all", "A", 0) and order[-1] == ("all", "B", groups - 1)
    assert {w for w, k, _ in order[1:-1] if k == "A"} == {"a"} and {w for w, k, _ in order[1:-1] if k == "B"} == {"b"}


def test_groups_split_the_batch_into_even_runs_of_whole_sequences():
    assert group_bounds(np.arange(33), 8) == [(4 * j, 4 * j + 4) for j in range(8)]
    assert group_bounds(np.arange(6) * 100, 2) == [(0, 2), (2, 5)]   # a tie goes to the lower edge
    for bad in (1, 6):
        with pytest.raises(ValueError, match="groups"):
            group_bounds(np.arange(6), bad)


def test_a_varlen_batchs_groups_share_its_tokens_as_evenly_as_whole_sequences_allow():
    cu = np.cumsum([0, 1000, 10, 10, 10, 1000, 1000, 5, 5])   # 3040 tokens
    assert group_bounds(cu, 2) == [(0, 4), (4, 8)]              # the edge at 1030 tokens, the nearest to 1520
    assert group_bounds(cu, 3) == [(0, 2), (2, 5), (5, 8)]      # at 1010 and 2030, the nearest to 1013 and 2027


@given(lengths=st.lists(st.integers(1, 5000), min_size=2, max_size=64), data=st.data())
def test_every_sequence_is_in_exactly_one_group_of_at_least_one(lengths, data):
    groups = data.draw(st.integers(2, len(lengths)))
    bounds = group_bounds(np.cumsum([0, *lengths]), groups)
    assert len(bounds) == groups and bounds[0][0] == 0 and bounds[-1][1] == len(lengths)
    assert all(s0 < s1 for s0, s1 in bounds) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))



PLAN = Pipeline(a_sms=24, groups=4)
RUNS = dict(N=32, states_given=True, capturing=False, scan_splits=False)


@pytest.mark.parametrize("change, why", [
    (dict(N=7), "fewer than two a group"),
    (dict(states_given=False), "forward-state scan"),
    (dict(capturing=True), "CUDA graph"),
    (dict(scan_splits=True), "splits"),
])
def test_it_runs_only_where_each_group_does_the_batchs_work(change, why):
    assert reason_not(PLAN, **RUNS) is None and reason_not(PLAN, **dict(RUNS, N=8)) is None
    assert why in reason_not(PLAN, **dict(RUNS, **change))


def test_launch_wants_one_pair_of_jobs_a_group():
    with pytest.raises(ValueError, match="one \\(Kernel A, Kernel B\\) pair a group"):
        backward_pipeline.launch(PLAN, [(None, None)] * 3, 0)


def test_a_tool_names_a_pipeline_as_a_sms_comma_groups():
    assert Pipeline.parse("24,4") == Pipeline(a_sms=24, groups=4)
    assert Pipeline.parse(Pipeline(a_sms=32, groups=8).text()) == Pipeline(a_sms=32, groups=8)
    for bad in ("24", "24,4,2", "a,4", "24,-4", ""):
        with pytest.raises(ValueError, match="A_SMS,GROUPS"):
            Pipeline.parse(bad)
    with pytest.raises(ValueError, match="groups >= 2"):
        Pipeline.parse("24,1")
