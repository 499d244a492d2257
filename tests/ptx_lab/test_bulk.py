"""ptx_lab.model's mbarrier and bulk copies: the PTX ISA's state machine, checked on orderings.

The mbarrier tests draw the operations of a phase (arrivals, arrivals with
expect_tx, the complete_tx of each landed copy) in every order hypothesis
finds and require the same answer each time: the phase completes at its last
operation and not before, its parity flips once, and the next phase starts
clean. The expected values are written from the ISA's rules, not read back
from the model.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptx_lab import model
from ptx_lab.model import (BULK_ALIGN, MBARRIER_MAX_COUNT, MBARRIER_MAX_TX, MBarrier,
                           cp_async_bulk_g2s, cp_async_bulk_s2g)

DRAWS = settings(max_examples=80, deadline=None)


# ------------------------------------------------------------------ one phase, any order

@st.composite
def phase_ops(draw, count: int):
    """The operations of one phase of an mbarrier of `count`, in a drawn order.

    Each copy is owned by one of the `count` arrivals, whose expect_tx covers
    exactly the bytes of the copies it owns; an arrival that owns none arrives
    plainly or with expect_tx(0). Returns [(name, bytes), ...].
    """
    sizes = draw(st.lists(st.integers(1, 64).map(lambda k: BULK_ALIGN * k), max_size=6))
    owner = [draw(st.integers(0, count - 1)) for _ in sizes]
    arrivals = []
    for k in range(count):
        expect = sum(s for s, o in zip(sizes, owner) if o == k)
        if expect or draw(st.booleans()):
            arrivals.append(("arrive_expect_tx", expect))
        else:
            arrivals.append(("arrive", 0))
    ops = arrivals + [("complete_tx", s) for s in sizes]
    return draw(st.permutations(ops))


@st.composite
def phases(draw):
    """(count, the operations of one phase in a drawn order)."""
    count = draw(st.integers(1, 4))
    return count, draw(phase_ops(count))


def apply(bar: MBarrier, op: tuple[str, int]) -> None:
    name, nbytes = op
    if name == "arrive":
        bar.arrive()
    else:
        getattr(bar, name)(nbytes)


@DRAWS
@given(count_ops=phases())
def test_a_phase_completes_at_its_last_operation_in_any_order(count_ops):
    count, ops = count_ops
    bar = MBarrier(count)
    for i, op in enumerate(ops):
        assert not bar.try_wait_parity(0), (i, op, bar)
        apply(bar, op)
        if i < len(ops) - 1:
            assert bar.phase == 0, f"completed early, after {ops[:i + 1]}"
    assert bar.phase == 1 and bar.parity == 1
    assert (bar.pending, bar.tx_count) == (count, 0)
    assert bar.try_wait_parity(0) and not bar.try_wait_parity(1)


@DRAWS
@given(count=st.integers(1, 4), data=st.data())
def test_phases_in_any_order_give_the_same_parity_sequence(count, data):
    bar = MBarrier(count)
    parities = [bar.parity]
    n_phases = data.draw(st.integers(1, 5))
    for phase in range(n_phases):
        for op in data.draw(phase_ops(count)):
            apply(bar, op)
        parities.append(bar.parity)
        # After phase k: the parity of phase k reads completed, the current one not.
        assert bar.try_wait_parity(phase % 2) and not bar.try_wait_parity((phase + 1) % 2)
    assert parities == [k % 2 for k in range(n_phases + 1)]
    assert bar.phase == n_phases


def test_bytes_may_land_before_the_arrival_that_expects_them():
    bar = MBarrier(1)
    bar.complete_tx(48)
    bar.complete_tx(16)
    assert (bar.phase, bar.pending, bar.tx_count) == (0, 1, -64)   # negative, still phase 0
    assert not bar.try_wait_parity(0)
    bar.arrive_expect_tx(64)
    assert (bar.phase, bar.pending, bar.tx_count) == (1, 1, 0)


def test_arrivals_alone_do_not_complete_a_phase_with_bytes_outstanding():
    bar = MBarrier(2)
    bar.arrive_expect_tx(128)
    bar.arrive()
    assert (bar.phase, bar.pending, bar.tx_count) == (0, 0, 128)
    bar.complete_tx(64)
    assert bar.phase == 0
    bar.complete_tx(64)
    assert (bar.phase, bar.pending, bar.tx_count) == (1, 2, 0)


def test_a_phase_without_bytes_is_a_plain_arrival_barrier():
    bar = MBarrier(3)
    for _ in range(3):
        assert bar.phase == 0
        bar.arrive()
    assert bar.phase == 1 and bar.pending == 3


def test_parity_cannot_tell_phase_0_from_phase_2():
    bar = MBarrier(1)
    assert not bar.try_wait_parity(0)      # phase 0 current
    bar.arrive()
    assert bar.try_wait_parity(0)          # phase 0 done
    bar.arrive()
    assert not bar.try_wait_parity(0)      # phase 2 current: a waiter on phase 0 now blocks
    assert bar.try_wait_parity(1)
    bar.wait_parity(1)
    with pytest.raises(RuntimeError, match=r"wait_parity\(0\) would never return"):
        bar.wait_parity(0)


def test_init_starts_over():
    bar = MBarrier(2)
    bar.arrive_expect_tx(32)
    bar.init(1)
    assert (bar.count, bar.phase, bar.parity, bar.pending, bar.tx_count) == (1, 0, 0, 1, 0)


# ------------------------------------------------------------------ misuse

def test_misuse_is_refused_and_changes_nothing():
    cases = [
        (lambda b: b.init(0), r"count = 0: an mbarrier expects 1\.\.1048575"),
        (lambda b: b.init(MBARRIER_MAX_COUNT + 1), r"count = 1048576"),
        (lambda b: b.init(2.0), "count must be an int"),
        (lambda b: b.init(True), "count must be an int"),
        (lambda b: b.arrive_expect_tx(-16), "nbytes = -16; a byte count cannot be negative"),
        (lambda b: b.complete_tx(-1), "nbytes = -1"),
        (lambda b: b.arrive_expect_tx(MBARRIER_MAX_TX + 1), "tx-count would become 1048640"),
        (lambda b: b.complete_tx(MBARRIER_MAX_TX + 65), "tx-count would become -1048576"),
        (lambda b: b.try_wait_parity(2), "parity must be 0 or 1"),
    ]
    for call, match in cases:
        bar = MBarrier(2)
        bar.arrive_expect_tx(64)                   # tx-count 64, one arrival pending
        before = repr(bar)
        with pytest.raises(ValueError, match=match):
            call(bar)
        assert repr(bar) == before, match


def test_more_arrivals_than_pending_are_refused():
    bar = MBarrier(1)
    bar.arrive_expect_tx(32)                       # all arrivals in, 32 bytes to land
    with pytest.raises(ValueError, match="phase 0 has no arrival pending"):
        bar.arrive()
    with pytest.raises(ValueError, match="phase 0 has no arrival pending"):
        bar.arrive_expect_tx(16)
    assert (bar.phase, bar.pending, bar.tx_count) == (0, 0, 32)


def test_a_phase_that_could_never_complete_is_refused():
    bar = MBarrier(1)
    bar.arrive_expect_tx(32)
    with pytest.raises(ValueError, match="16 more bytes landed than expected"):
        bar.complete_tx(48)                        # overshoots the 32 expected
    bar = MBarrier(1)
    bar.complete_tx(32)                            # landed before any expect_tx ...
    with pytest.raises(ValueError, match="could never complete"):
        bar.arrive()                               # ... and the only arrival expects nothing


@pytest.mark.parametrize("count", [0, -1, MBARRIER_MAX_COUNT + 1])
def test_constructor_checks_count(count):
    with pytest.raises(ValueError, match=f"count = {count}"):
        MBarrier(count)


def test_largest_count_is_accepted():
    assert MBarrier(MBARRIER_MAX_COUNT).pending == MBARRIER_MAX_COUNT


# ------------------------------------------------------------------ bulk copies

SMEM_BYTES = 1024
GMEM_BYTES = 2048
offsets = st.integers(0, 63).map(lambda k: BULK_ALIGN * k)
lengths = st.integers(1, 16).map(lambda k: BULK_ALIGN * k)


def images(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, SMEM_BYTES, dtype=np.uint8),
            rng.integers(0, 256, GMEM_BYTES, dtype=np.uint8))


@DRAWS
@given(seed=st.integers(0, 2**32 - 1), dst=offsets, src=offsets, nbytes=lengths)
def test_g2s_moves_exactly_its_bytes_and_completes_them_on_the_barrier(seed, dst, src, nbytes):
    smem, gmem = images(seed)
    dst = min(dst, SMEM_BYTES - nbytes)
    before_smem, before_gmem = smem.copy(), gmem.copy()
    bar = MBarrier(1)
    bar.arrive_expect_tx(nbytes)
    out = cp_async_bulk_g2s(smem, gmem, dst, src, nbytes, bar)
    want = before_smem.copy()
    want[dst:dst + nbytes] = before_gmem[src:src + nbytes]
    assert (out == want).all()
    assert (smem == before_smem).all() and (gmem == before_gmem).all()   # inputs untouched
    assert bar.phase == 1                            # its bytes were the phase's last


@DRAWS
@given(seed=st.integers(0, 2**32 - 1), dst=offsets, src=offsets, nbytes=lengths)
def test_s2g_then_g2s_round_trips(seed, dst, src, nbytes):
    smem, gmem = images(seed)
    src = min(src, SMEM_BYTES - nbytes)
    stored = cp_async_bulk_s2g(gmem, smem, dst, src, nbytes)
    untouched = np.ones(GMEM_BYTES, dtype=bool)
    untouched[dst:dst + nbytes] = False
    assert (stored[untouched] == gmem[untouched]).all()
    bar = MBarrier(1)
    back = cp_async_bulk_g2s(np.zeros(SMEM_BYTES, np.uint8), stored, src, dst, nbytes, bar)
    assert (back[src:src + nbytes] == smem[src:src + nbytes]).all()
    assert bar.tx_count == -nbytes                   # landed before anyone expected it


@DRAWS
@given(seed=st.integers(0, 2**32 - 1),
       order=st.permutations(range(8)), arrive_at=st.integers(0, 8))
def test_rows_landing_in_any_order_give_the_same_image_and_completion(seed, order, arrive_at):
    # Eight lanes copy eight rows of 16..128 bytes; lane 0's arrive.expect_tx comes
    # anywhere among the copies. The image and the completion point never change.
    _, gmem = images(seed)
    sizes = [BULK_ALIGN * (1 + lane) for lane in range(8)]
    smem = np.zeros(SMEM_BYTES, np.uint8)
    bar = MBarrier(1)
    steps = [("copy", lane) for lane in order]
    steps.insert(arrive_at, ("arrive", None))
    for i, (what, lane) in enumerate(steps):
        assert bar.phase == 0, f"completed before step {i}"
        if what == "arrive":
            bar.arrive_expect_tx(sum(sizes))
        else:
            smem = cp_async_bulk_g2s(smem, gmem, 128 * lane, 128 * lane, sizes[lane], bar)
    assert bar.phase == 1 and bar.tx_count == 0
    for lane, n in enumerate(sizes):
        assert (smem[128 * lane:128 * lane + n] == gmem[128 * lane:128 * lane + n]).all()
        assert (smem[128 * lane + n:128 * (lane + 1)] == 0).all()


def test_bulk_copies_refuse_bad_sizes_and_alignment():
    smem, gmem = images(1)
    bar = MBarrier(1)
    cases = [
        (lambda: cp_async_bulk_g2s(smem, gmem, 0, 0, 0, bar), "nbytes = 0: a bulk copy moves a positive multiple of 16"),
        (lambda: cp_async_bulk_g2s(smem, gmem, 0, 0, 24, bar), "nbytes = 24"),
        (lambda: cp_async_bulk_g2s(smem, gmem, 8, 0, 16, bar), "dst = 8: a bulk copy's addresses must be 16-byte aligned"),
        (lambda: cp_async_bulk_g2s(smem, gmem, 0, 4, 16, bar), "src = 4: .*16-byte aligned"),
        (lambda: cp_async_bulk_g2s(smem, gmem, SMEM_BYTES - 16, 0, 32, bar),
         r"dst = 1008: \[1008, 1040\) is outside smem of 1024 bytes"),
        (lambda: cp_async_bulk_g2s(smem, gmem, 0, GMEM_BYTES, 16, bar), r"src = 2048: .* outside gmem"),
        (lambda: cp_async_bulk_g2s(smem, gmem, 0, 0, 16, "bar"), "bar: expected an MBarrier; got str"),
        (lambda: cp_async_bulk_g2s(smem.astype(np.uint16), gmem, 0, 0, 16, bar), "smem"),
        (lambda: cp_async_bulk_s2g(gmem, smem, 0, 0, 8), "nbytes = 8"),
        (lambda: cp_async_bulk_s2g(gmem, smem, 24, 0, 16), "dst = 24: .*aligned"),
        (lambda: cp_async_bulk_s2g(gmem, smem, 0, 1, 16), "src = 1: .*aligned"),
        (lambda: cp_async_bulk_s2g(gmem, smem, 0, SMEM_BYTES, 16), r"src = 1024: .* outside smem"),
        (lambda: cp_async_bulk_s2g(gmem, smem, -16, 0, 16), r"dst = -16: .* outside gmem"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    assert (bar.phase, bar.pending, bar.tx_count) == (0, 1, 0)   # no refused copy reached it


def test_public_names():
    assert set(model.__all__) >= {"MBarrier", "cp_async_bulk_g2s", "cp_async_bulk_s2g", "BULK_ALIGN"}
