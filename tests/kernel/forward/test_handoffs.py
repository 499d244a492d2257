"""The forward's hand-offs between its roles, walked on the CPU (ptx_lab.ring.run_roles, named-barrier
semantics) over hypothesis's interleavings: the producers (loads, R1), the product warps (Mqk, and Akk
with INV) and the consumers, as kernel/forward/cuda/forward.cu's loops run them, on the barriers
forward_layout.cuh numbers (kernel.forward.barrier_ids) with the counts it gives them.

The token-gate build (Config.token_gate) adds the producers' barrier before R1 as well; its walks run
beside the others'.

Every tile must reach the consumers whole (its copies, R1 and both products in its stage), no stage or
scratch parity may be overwritten before it is read, and no walk may hang, for 1..8 tiles and rings of
2..5 stages. Two changes show what the protocol's parts are for: without PRODUCTS_DONE, R1 overwrites
a scratch the product warps have not read (at the last tiles, where no refill holds the producers
back); with the product warps on EMPTY, R1 never runs a tile ahead of them.

The checking build (Config.mbarrier_ring) runs the same hand-offs on mbarriers, each wait by the parity
forward.cu computes: walked on ptx_lab.ring.run_mbarrier_roles, which also checks that every parity
names the phase the wait means.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.forward import Config, auto_config, barrier_ids, max_stages
from ptx_lab import ring
from ptx_lab.model import MBarrier

CPU = settings(max_examples=300, deadline=None)
PRODUCTS = ("mqk", "inv")   # the two product warps, in the kernel's order (MQK_WARP, INV_WARP)
WARP = 32


def programs(nstage: int, ntiles: int, product_warps: int, *, products_done: bool = True,
             products_on_empty: bool = False, token_gate: bool = False) -> dict[str, list[tuple]]:
    """Each role's steps as forward.cu runs them (the ring's from ptx_lab.ring's predicates). Non-barrier
    steps: ("load", stage, tile), ("r1", stage, parity, tile), ("product", which, stage, parity, tile),
    ("read", stage, tile). `products_done` False drops PRODUCTS_DONE; `products_on_empty` puts the product
    warps on EMPTY, each waiting for the refill that its tile's producers wait for. `token_gate`: the
    token-gate build's producers' barrier before R1 too."""
    ids = barrier_ids(nstage, product_warps)
    full, empty = ids["full"], ids["empty"]
    prefetch = nstage - 1
    producers = [("load", j % nstage, j) for j in range(min(prefetch, ntiles))]   # kda_walk::prefetch
    for i in range(ntiles):
        s, p = i % nstage, i % 2
        if token_gate:   # every producer's gate rows in before R1 sums them
            producers.append(("sync", ids["producers"]))
        if product_warps and products_done and i >= 2:
            producers.append(("sync", ids["products_done"][p]))
        producers.append(("r1", s, p, i))
        if product_warps:
            producers.append(("arrive", ids["r1_done"][p]))
        else:
            producers += [("sync", ids["producers"]), *(("product", w, s, p, i) for w in PRODUCTS)]
        producers.append(("arrive", full[s]))                                   # hand_over: publish
        j = i + prefetch
        if ring.refill_waits(j, ntiles, nstage):
            producers.append(("sync", empty[j % nstage]))
        if j < ntiles:
            producers.append(("load", j % nstage, j))
    roles = {"producers": producers}
    for w in PRODUCTS if product_warps else ():
        prog = []
        for i in range(ntiles):
            s, p = i % nstage, i % 2
            prog += [("sync", ids["r1_done"][p]), ("product", w, s, p, i)]
            if products_done and i + 2 < ntiles:
                prog.append(("arrive", ids["products_done"][p]))
            prog.append(("arrive", full[s]))
            j = i + prefetch
            if products_on_empty and ring.refill_waits(j, ntiles, nstage):
                prog.append(("sync", empty[j % nstage]))
        roles[w] = prog
    consumers = []
    for i in range(ntiles):
        s = i % nstage
        consumers += [("sync", full[s]), ("read", s, i)]
        if ring.releases(i, ntiles, nstage):
            consumers.append(("arrive", empty[s]))
    roles["consumers"] = consumers
    return roles


def counts(cfg: Config, *, products_on_empty: bool = False) -> tuple[dict[str, int], dict[int, int]]:
    """(threads a role arrives with, the count of every barrier) as forward_layout.cuh gives them."""
    threads = {"producers": WARP * cfg.producers, "consumers": WARP * cfg.warps,
               **{w: WARP for w in (PRODUCTS if cfg.product_warps else ())}}
    on_empty = threads["producers"] + threads["consumers"] + (WARP * cfg.product_warps if products_on_empty else 0)
    ids = barrier_ids(cfg.nstage, cfg.product_warps)
    bars = ring.barrier_counts(cfg.nstage, cfg.threads, on_empty)
    bars[ids["producers"]] = threads["producers"]
    for b in ids.get("r1_done", []) + ids.get("products_done", []):
        bars[b] = threads["producers"] + WARP * cfg.product_warps
    return threads, bars


class Tiles:
    """What the stages and the scratch hold, checked at every step; `seen`: the tiles the consumers read;
    `lead[i]`: at R1 of tile i, how many tiles' products were still unfinished."""

    def __init__(self, nstage: int) -> None:
        self.stage: list[dict | None] = [None] * nstage     # {"tile", "parts", "read"}
        self.scratch: list[dict | None] = [None, None]      # by parity: {"tile", "unread": product warps to read it}
        self.finished: dict[int, set[str]] = {}
        self.seen: list[int] = []
        self.lead: dict[int, int] = {}

    def __call__(self, role: str, op: tuple) -> None:
        kind = op[0]
        if kind == "load":
            _, s, j = op
            old = self.stage[s]
            if old is not None and not old["read"]:
                raise ring.RingError(f"the producers load tile {j} into stage {s} before the consumers read "
                                     f"tile {old['tile']} there")
            self.stage[s] = {"tile": j, "parts": {"load"}, "read": False}
        elif kind == "r1":
            _, s, p, i = op
            self._holds(role, s, i, {"load"})
            sc = self.scratch[p]
            if sc is not None and sc["unread"]:
                raise ring.RingError(f"R1 of tile {i} overwrites the scratch of parity {p}, which holds tile "
                                     f"{sc['tile']}, before {', '.join(sorted(sc['unread']))} read it")
            self.scratch[p] = {"tile": i, "unread": set(PRODUCTS)}
            self.stage[s]["parts"].add("r1")
            self.lead[i] = sum(1 for t in range(i) if len(self.finished.get(t, ())) < len(PRODUCTS))
        elif kind == "product":
            _, w, s, p, i = op
            self._holds(f"{role} ({w})", s, i, {"load", "r1"})
            sc = self.scratch[p]
            if sc is None or sc["tile"] != i:
                held = "nothing" if sc is None else f"tile {sc['tile']}"
                raise ring.RingError(f"{w} of tile {i} reads the scratch of parity {p}, which holds {held}")
            if w not in sc["unread"]:
                raise ring.RingError(f"{w} reads the scratch of tile {i} twice")
            sc["unread"].discard(w)
            self.stage[s]["parts"].add(w)
            self.finished.setdefault(i, set()).add(w)
        elif kind == "read":
            _, s, i = op
            self._holds(role, s, i, {"load", "r1", *PRODUCTS})
            self.stage[s]["read"] = True
            self.seen.append(i)
        else:
            raise AssertionError(f"unknown step {op}")

    def _holds(self, who: str, s: int, i: int, parts: set[str]) -> None:
        st_ = self.stage[s]
        if st_ is None or st_["tile"] != i or st_["read"] or not parts <= st_["parts"]:
            have = "nothing" if st_ is None else f"tile {st_['tile']} with {sorted(st_['parts'])}" + \
                (", read" if st_["read"] else "")
            raise ring.RingError(f"the {who} of tile {i} finds stage {s} holding {have}, not {sorted(parts)}")


def run(cfg: Config, ntiles: int, order=(), roles=None, **change) -> Tiles:
    tiles = Tiles(cfg.nstage)
    threads, bars = counts(cfg, products_on_empty=change.get("products_on_empty", False))
    progs = programs(cfg.nstage, ntiles, cfg.product_warps, token_gate=cfg.token_gate, **change)
    if roles is not None:   # another order of preference among the roles
        progs = {r: progs[r] for r in roles}
    ring.run_roles(progs, bars, tiles, order, threads)
    return tiles


def config(warps: int, product_warps: int, nstage: int, token_gate: bool = False) -> Config:
    auto = auto_config(warps)
    return Config(warps=warps, producers=auto.producers, nstage=nstage, product_warps=product_warps,
                  token_gate=token_gate)


# ----------------------------------------------------------------------------
# the protocol as built
# ----------------------------------------------------------------------------

@CPU
@given(warps=st.sampled_from([1, 2, 4]), product_warps=st.sampled_from([0, 2]), nstage=st.integers(2, 5),
       ntiles=st.integers(1, 8), order=st.lists(st.integers(0, 3), max_size=300), token_gate=st.booleans())
def test_every_tile_reaches_the_consumers_whole_in_any_interleaving(warps, product_warps, nstage, ntiles, order,
                                                                    token_gate):
    tiles = run(config(warps, product_warps, nstage, token_gate), ntiles, order)
    assert tiles.seen == list(range(ntiles))
    assert all(tiles.finished[i] == set(PRODUCTS) for i in range(ntiles))
    # the scratch is double-buffered: R1 never runs more than one tile ahead of the products
    assert max(tiles.lead.values()) <= 1


@pytest.mark.parametrize("nstage", range(2, 6))
@pytest.mark.parametrize("ntiles", range(1, 9))
@pytest.mark.parametrize("preference", ["as listed", "products last", "consumers first"])
def test_the_first_and_last_tiles_finish_under_fixed_schedules(nstage, ntiles, preference):
    roles = {"as listed": None, "products last": ("producers", "consumers", *PRODUCTS),
             "consumers first": ("consumers", *PRODUCTS, "producers")}[preference]
    tiles = run(config(1, 2, nstage), ntiles, roles=roles)
    assert tiles.seen == list(range(ntiles))


def test_the_barriers_fit_the_ids_only_up_to_5_stages_with_product_warps():
    for nstage in range(2, 8):
        ids = barrier_ids(nstage, 2)
        used = ids["full"] + ids["empty"] + [ids["producers"]] + ids["r1_done"] + ids["products_done"]
        assert len(set(used)) == len(used) == 2 * nstage + 5 and min(used) == 1 and max(used) == ids["end"] - 1
        assert (ids["end"] <= 16) == (nstage <= 5)
    assert max_stages(2) == 5 and max_stages(0) == 7
    with pytest.raises(ValueError, match=r"Config.nstage must be at most 5 with 2 product warps, got 6: the ring's "
                                         r"2 nstage named barriers"):
        Config(warps=1, producers=4, nstage=6, product_warps=2)


# ----------------------------------------------------------------------------
# what each part is for
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("nstage", [3, 4, 5])
def test_without_products_done_r1_overwrites_a_scratch_the_products_have_not_read(nstage):
    # R1 of tile i + 2 waits on EMPTY for tile i's release (which needs its products) only where the
    # ring refills a stage; at the last tiles nothing holds it back (products last: the producers and
    # the consumers step first wherever they can)
    ntiles = 8
    with pytest.raises(ring.RingError, match=r"R1 of tile (\d+) overwrites the scratch of parity \d, which holds "
                                             r"tile \d+, before inv, mqk read it") as err:
        run(config(1, 2, nstage), ntiles, roles=("producers", "consumers", *PRODUCTS), products_done=False)
    tile = int(err.value.args[0].split()[3])
    assert tile >= ntiles - nstage + 2


@CPU
@given(ntiles=st.integers(1, 8), order=st.lists(st.integers(0, 3), max_size=300))
def test_without_products_done_two_stages_still_hold_r1_back(ntiles, order):
    # ... whereas at 2 stages R1 of tile i + 2 always comes after the refill wait for tile i's release
    assert run(config(1, 2, 2), ntiles, order, products_done=False).seen == list(range(ntiles))


def _waiting_tiles(nstage: int, ntiles: int) -> list[int]:
    """Tiles i + 1 whose R1 comes after a refill wait at tile i (hand_over(i) syncs on EMPTY)."""
    return [i + 1 for i in range(ntiles - 1) if ring.refill_waits(i + nstage - 1, ntiles, nstage)]


@pytest.mark.parametrize("nstage", range(2, 6))
def test_r1_runs_a_tile_ahead_of_the_products(nstage):
    # products last: R1 of tile i + 1 runs while tile i's products are unfinished, on every tile
    tiles = run(config(1, 2, nstage), 8, roles=("producers", "consumers", *PRODUCTS))
    assert _waiting_tiles(nstage, 8) and all(tiles.lead[i] == 1 for i in _waiting_tiles(nstage, 8))


@CPU
@given(nstage=st.integers(2, 5), order=st.lists(st.integers(0, 3), max_size=300),
       products_last=st.booleans())
def test_on_empty_the_product_warps_hold_r1_back(nstage, order, products_last):
    # on EMPTY the product warps meet the producers' refill wait after their own tile: R1 of tile
    # i + 1 then never starts before tile i's products are done, whatever the schedule
    roles = ("producers", "consumers", *PRODUCTS) if products_last else None
    tiles = run(config(1, 2, nstage), 8, order, roles=roles, products_on_empty=True)
    assert tiles.seen == list(range(8))
    assert all(tiles.lead[i] == 0 for i in _waiting_tiles(nstage, 8))


def test_on_empty_without_its_count_the_product_warps_stand_in_for_the_consumers():
    # the product warps on EMPTY, its count left at the consumers' and producers' threads: their arrivals
    # complete a phase in the consumers' place, and the producers refill a stage the consumers still read
    # (so EmptyThreads must count whoever arrives on EMPTY)
    threads, bars = counts(config(1, 2, 3))
    with pytest.raises(ring.RingError, match=r"the producers load tile \d+ into stage \d before the consumers read"):
        ring.run_roles(programs(3, 8, 2, products_on_empty=True), bars, Tiles(3), (), threads)


# ----------------------------------------------------------------------------
# the checking build: the same hand-offs on mbarriers
# ----------------------------------------------------------------------------

def mbarrier_programs(nstage: int, ntiles: int, product_warps: int, token_gate: bool = False) -> dict[str, list[tuple]]:
    """Each role's steps in the checking build (forward.cu with KF_MBARRIER_RING): programs()' hand-offs
    on mbarriers; a wait is ("wait", barrier, the parity forward.cu waits by, the phase it means). The
    producers' mbarrier counts its phases as forward.cu's producers_sync does (producer_phase): one or, with
    the token gate's before R1, two a tile."""
    prefetch = nstage - 1
    producers = [("load", j % nstage, j) for j in range(min(prefetch, ntiles))]
    producer_phase = 0

    def producers_sync():
        nonlocal producer_phase
        steps = [("arrive", "producers"), ("wait", "producers", producer_phase & 1, producer_phase)]
        producer_phase += 1
        return steps

    for i in range(ntiles):
        s, p = i % nstage, i % 2
        if token_gate:
            producers += producers_sync()
        if product_warps and i >= 2:   # tile i - 2's arrivals: use i / 2 - 1 of the parity's barrier
            producers.append(("wait", ("products_done", p), (i // 2 - 1) & 1, i // 2 - 1))
        producers.append(("r1", s, p, i))
        if product_warps:
            producers.append(("arrive", ("r1_done", p)))
        else:
            producers += [*producers_sync(), *(("product", w, s, p, i) for w in PRODUCTS)]
        producers.append(("arrive", ("full", s)))
        j = i + prefetch
        if ring.refill_waits(j, ntiles, nstage):
            producers.append(("wait", ("empty", j % nstage), ring.mbarrier_parities(j, nstage)[1], j // nstage - 1))
        if j < ntiles:
            producers.append(("load", j % nstage, j))
    roles = {"producers": producers}
    for w in PRODUCTS if product_warps else ():
        prog = []
        for i in range(ntiles):
            s, p = i % nstage, i % 2
            prog += [("wait", ("r1_done", p), (i // 2) & 1, i // 2), ("product", w, s, p, i)]
            if i + 2 < ntiles:
                prog.append(("arrive", ("products_done", p)))
            prog.append(("arrive", ("full", s)))
        roles[w] = prog
    consumers = []
    for i in range(ntiles):
        s = i % nstage
        consumers += [("wait", ("full", s), ring.mbarrier_parities(i, nstage)[0], i // nstage), ("read", s, i)]
        if ring.releases(i, ntiles, nstage):
            consumers.append(("arrive", ("empty", s)))
    roles["consumers"] = consumers
    return roles


def mbarriers(cfg: Config) -> tuple[dict[str, int], dict]:
    """(threads a role arrives with, the mbarriers with forward_layout.cuh's counts: Mbarriers::init)."""
    threads, _ = counts(cfg)
    producers, products = threads["producers"], WARP * cfg.product_warps
    bars = {**{("full", s): MBarrier(producers + products) for s in range(cfg.nstage)},
            **{("empty", s): MBarrier(threads["consumers"]) for s in range(cfg.nstage)},
            **{("r1_done", p): MBarrier(producers) for p in range(2)},
            **{("products_done", p): MBarrier(max(products, 1)) for p in range(2)},
            "producers": MBarrier(producers)}
    return threads, bars


@CPU
@given(warps=st.sampled_from([1, 2, 4]), product_warps=st.sampled_from([0, 2]), nstage=st.integers(2, 5),
       ntiles=st.integers(1, 8), order=st.lists(st.integers(0, 3), max_size=300), token_gate=st.booleans())
def test_the_checking_build_hands_every_tile_over_whole_by_the_right_parities(warps, product_warps, nstage, ntiles,
                                                                             order, token_gate):
    cfg = dataclasses.replace(config(warps, product_warps, nstage, token_gate), mbarrier_ring=True)
    threads, bars = mbarriers(cfg)
    tiles = Tiles(nstage)
    stuck = ring.run_mbarrier_roles(mbarrier_programs(nstage, ntiles, product_warps, token_gate), bars, tiles, order,
                                    threads)
    part_full = [f"{k} holds {b.count - b.pending} of {b.count}" for k, b in bars.items() if b.pending != b.count]
    assert not stuck and not part_full, (stuck, part_full)
    assert tiles.seen == list(range(ntiles)) and max(tiles.lead.values()) <= 1


@pytest.mark.parametrize("wrong", ["r1_done", "products_done"])
def test_the_checking_build_catches_a_parity_of_another_use(wrong):
    # R1_DONE waited by the tile's parity instead of its use's, PRODUCTS_DONE by the use of tile i
    # instead of tile i - 2's: the walk refuses either (the parity names another phase than the wait's)
    def parity(op):
        return op[1][1] if wrong == "r1_done" else op[2] ^ 1

    progs = mbarrier_programs(4, 8, 2)
    for role, prog in progs.items():
        progs[role] = [("wait", op[1], parity(op), op[3]) if op[0] == "wait" and op[1][0] == wrong else op
                       for op in prog]
    threads, bars = mbarriers(dataclasses.replace(config(1, 2, 4), mbarrier_ring=True))
    with pytest.raises(ring.RingError, match=rf"waits on {wrong.upper()}\(\d\) for its phase \d+ by parity \d, "
                                             rf"which is another phase's"):
        ring.run_mbarrier_roles(progs, bars, Tiles(4), (), threads)


def test_the_checking_build_counts_the_producers_phases_in_the_token_gate_build():
    # without product warps the token-gate build passes the producers' mbarrier twice a tile: waited by the
    # tile's parity (as the build without the token gate may), the second wait names another phase
    progs = mbarrier_programs(4, 8, 0, token_gate=True)
    waits = [op for op in progs["producers"] if op[0] == "wait" and op[1] == "producers"]
    assert [w[3] for w in waits] == list(range(16)) and [w[2] for w in waits] == [n & 1 for n in range(16)]
    progs["producers"] = [("wait", "producers", (op[3] // 2) & 1, op[3]) if op[0] == "wait" and op[1] == "producers"
                          else op for op in progs["producers"]]
    threads, bars = mbarriers(dataclasses.replace(config(1, 0, 4, True), mbarrier_ring=True))
    with pytest.raises(ring.RingError, match=r"waits on PRODUCERS for its phase \d+ by parity \d, which is another"):
        ring.run_mbarrier_roles(progs, bars, Tiles(4), (), threads)
