"""Shared-memory banks on Hopper: which accesses conflict, by how much, and why.

Shared memory is 32 banks of 4-byte words: byte address ``a`` lives in word
``a // 4`` of bank ``(a // 4) % 32``. Each *wavefront* (one pass through the
data array, 128 bytes) lets every bank deliver or accept one word. An access
therefore costs, per phase,

    wavefronts(phase) = max over banks of |distinct words requested in that bank|

and lanes that touch the *same* word never conflict (a read is broadcast to
all of them; for a write one of them wins). "N-way conflict" means the worst
bank holds N distinct words.

The rule we model (and where it comes from)
-------------------------------------------
* 1-, 2- and 4-byte accesses: the whole warp is one phase. Source: CUDA C++
  Programming Guide, shared memory of compute capability 5.x and later (32
  banks, successive 32-bit words in successive banks, no conflict between lanes
  that access the same 32-bit word); Hopper (9.0) keeps that organisation.
* 8-byte accesses: two phases, lanes 0-15 and 16-31; 16-byte accesses: four
  phases of 8 lanes. A phase is as many lanes as one 128-byte wavefront serves
  at full width (``WAVEFRONT_BYTES // max(width, 4)``), so a conflict-free
  8-byte access costs 2 wavefronts and a 16-byte one 4. Source: not the
  Programming Guide, which is silent on it since compute capability 5.x, but
  the rule as NVIDIA engineers state it in developer-forum answers and as
  discussed in CUTLASS issue #328 (a half-warp of 8-byte or a quarter-warp of
  16-byte accesses may touch any 128 bytes without loss). Nsight Compute's
  wavefront counters check it: ``python -m experiments.banks`` on a GPU.
* ``ldmatrix`` / ``stmatrix``: one phase per 8x8 matrix, i.e. per 8 row
  addresses (lanes 8i..8i+7) of 16 bytes each; x4 conflict-free = 4
  wavefronts. This is the rule every conflict-free ldmatrix layout (padding
  by 16 bytes, CuTe's swizzles) is designed against; the GPU run checks it.
* ``cp.async``: its shared-memory write is modelled as a store of the copy
  size (4, 8 or 16 bytes) from each lane, phased like the loads above. This
  is the least certain rule here (the data arrives from L1, not from
  registers); the GPU run checks it where ncu has an LDGSTS counter.

What we do *not* model: the hardware is reported to merge phases in some
cases, e.g. an 8-byte access whose two half-warps request the same words
(every lane reading the same 8 bytes) may be served in one wavefront. We apply
the strict phase rule (that example costs 2); the experiment
``experiments.banks`` has a case for exactly this (``lds64_same_8_bytes``)
and reports what the GPU's counters say, without treating a difference there
as a failure.

Bank maps
---------
:func:`bank_map` returns per-cell bank numbers of a tile laid out by a
:class:`ptx_lab.layouts.Layout` (and, for an access, which cells conflict) for
``ptx_lab.pictures`` to draw.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, NamedTuple

import numpy as np

from .layouts import Layout

WARP = 32
BANKS = 32
BANK_BYTES = 4                          # one word per bank per wavefront
WAVEFRONT_BYTES = BANKS * BANK_BYTES     # 128: what one wavefront moves at most
WIDTHS = (1, 2, 4, 8, 16)               # bytes per lane of ld/st.shared
CP_ASYNC_SIZES = (4, 8, 16)
MATRIX_ROWS = 8                          # an ldmatrix/stmatrix 8x8 matrix: 8 rows ...
MATRIX_ROW_BYTES = 16                    # ... of 8 16-bit elements
MATRIX_NUMS = (1, 2, 4)
INACTIVE = -1                            # address of a lane that takes no part


# ================================================================== the bank model

def bank_of(address):
    """Bank (0..31) of a byte address (int or integer array)."""
    if isinstance(address, (int, np.integer)):
        return (int(address) // BANK_BYTES) % BANKS
    return (np.asarray(address, dtype=np.int64) // BANK_BYTES) % BANKS


def lanes_per_phase(width: int) -> int:
    """Lanes served together: as many as one 128-byte wavefront feeds at full width."""
    _check_width(width)
    return WAVEFRONT_BYTES // max(width, BANK_BYTES)


@dataclasses.dataclass(frozen=True)
class PhaseBreakdown:
    """One phase of an access: which lane touches which word of which bank.

    ``banks[b][w]`` = the lanes whose request covers word ``w`` (byte address
    ``4 * w``) of bank ``b``. The phase costs as many wavefronts as the fullest
    bank has distinct words.
    """
    lanes: tuple[int, ...]
    banks: Mapping[int, Mapping[int, tuple[int, ...]]]

    @property
    def wavefronts(self) -> int:
        return max((len(words) for words in self.banks.values()), default=0)

    def conflicts(self) -> dict[int, dict[int, tuple[int, ...]]]:
        """The banks holding more than one distinct word: bank -> word -> lanes."""
        return {b: dict(words) for b, words in self.banks.items() if len(words) > 1}

    def describe(self) -> str:
        """Teaching text: the lanes, the cost, and every conflicting bank."""
        head = (f"lanes {_ranges(self.lanes)}: {self.wavefronts} wavefront"
                f"{'s' if self.wavefronts != 1 else ''}")
        lines = [head]
        for b, words in sorted(self.conflicts().items()):
            parts = [f"0x{4 * w:x} (lane{'s' if len(ls) > 1 else ''} {_ranges(ls)})"
                     for w, ls in sorted(words.items())]
            lines.append(f"  bank {b:2d}: {len(words)} words: " + ", ".join(parts))
        if len(lines) == 1 and self.lanes:
            lines.append("  no bank holds two distinct words: conflict-free")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, eq=False)
class Access:
    """One warp-wide shared-memory instruction as the banks see it.

    kind: e.g. "ld.shared.b32", "ldmatrix.x4.trans", "cp.async.16".
    width: bytes each request covers (16 for an ldmatrix row).
    phases: per phase, int64 (n, 2) rows of (lane, byte address), active lanes only.
    """
    kind: str
    width: int
    phases: tuple[np.ndarray, ...]
    ideal: int | None = None   # the conflict-free cost where it is not one wavefront per phase

    def breakdown(self) -> list[PhaseBreakdown]:
        return [_phase_breakdown(requests, self.width) for requests in self.phases]

    @property
    def wavefronts(self) -> int:
        """Total wavefronts: the sum over phases."""
        return sum(p.wavefronts for p in self.breakdown())

    @property
    def ideal_wavefronts(self) -> int:
        """Wavefronts without any conflict: one per phase that has an active lane
        (cp.async: the bytes over 128, as ncu counts its conflicts)."""
        if self.ideal is not None:
            return self.ideal
        return sum(1 for requests in self.phases if len(requests))

    @property
    def bank_conflicts(self) -> int:
        """Extra wavefronts caused by conflicts (what ncu's bank-conflict counters count)."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def degree(self) -> int:
        """N of "N-way": the worst phase's wavefronts (1 = conflict-free, 0 = no lane active)."""
        return max((p.wavefronts for p in self.breakdown()), default=0)

    def describe(self) -> str:
        phases = self.breakdown()
        head = (f"{self.kind}: {self.wavefronts} wavefronts over {len(phases)} phase"
                f"{'s' if len(phases) != 1 else ''} (ideal {self.ideal_wavefronts}, "
                f"{self.degree}-way)")
        return "\n".join([head, *(p.describe() for p in phases if p.lanes)])


def _phase_breakdown(requests: np.ndarray, width: int) -> PhaseBreakdown:
    banks: dict[int, dict[int, list[int]]] = {}
    for lane, address in requests.tolist():
        first, last = address // BANK_BYTES, (address + width - 1) // BANK_BYTES
        for word in range(first, last + 1):
            banks.setdefault(word % BANKS, {}).setdefault(word, []).append(lane)
    frozen = {b: {w: tuple(ls) for w, ls in words.items()} for b, words in banks.items()}
    return PhaseBreakdown(tuple(int(l) for l in requests[:, 0]) if len(requests) else (), frozen)


# ------------------------------------------------------------------ building accesses

def shared_access(addresses, width: int, *, active=None, store: bool = False) -> Access:
    """ld.shared / st.shared of `width` bytes per lane.

    addresses: 32 byte addresses (numpy array or sequence); an entry of None or
    -1 marks an inactive lane, and so does False in `active` (bool (32,)).
    Active addresses must be multiples of `width` (the PTX alignment rule).
    """
    _check_width(width)
    addrs, on = _lane_addresses(addresses, "addresses", active)
    _check_aligned(addrs, on, width, "addresses")
    per = lanes_per_phase(width)
    kind = f"{'st' if store else 'ld'}.shared.b{width * 8}"
    if width == 8:
        # Measured on the H200 (experiments.banks, ncu): when the whole warp's
        # 8-byte requests fit one wavefront (here: all lanes on the same 8 bytes),
        # the two half-warp phases merge into 1 wavefront, not 2.
        whole = Access(kind, width, _phases(addrs, on, WARP))
        if whole.wavefronts <= 1:
            return whole
    return Access(kind, width, _phases(addrs, on, per))


def ldmatrix_access(row_addresses, num: int, *, trans: bool = False, store: bool = False) -> Access:
    """ldmatrix (or, with store=True, stmatrix) .x{num}[.trans]: one phase per matrix.

    row_addresses: 32 entries (or 8 * num); lanes 8i..8i+7 give the 16-byte
    rows of matrix i, the other lanes' entries are ignored (may be None / -1).
    .trans changes which register gets which element, not which bytes are read,
    so it does not change the cost.
    """
    if num not in MATRIX_NUMS:
        raise ValueError(f"num must be one of {MATRIX_NUMS}; got {num!r}")
    used = MATRIX_ROWS * num
    entries = list(row_addresses) if not isinstance(row_addresses, np.ndarray) else row_addresses
    if len(entries) not in (WARP, used):
        raise ValueError(f"row_addresses must have {WARP} entries (or {used} for x{num}); "
                         f"got {len(entries)}")
    padded = list(entries[:used]) + [None] * (WARP - used)
    addrs, on = _lane_addresses(padded, "row_addresses", None)
    if not on[:used].all():
        lane = int(np.flatnonzero(~on[:used])[0])
        raise ValueError(f"row_addresses[{lane}]: lanes 0..{used - 1} must all give a row for x{num}")
    _check_aligned(addrs, on, MATRIX_ROW_BYTES, "row_addresses")
    op = "stmatrix" if store else "ldmatrix"
    kind = f"{op}.x{num}" + (".trans" if trans else "")
    return Access(kind, MATRIX_ROW_BYTES, _phases(addrs, on, MATRIX_ROWS))


def stmatrix_access(row_addresses, num: int, *, trans: bool = False) -> Access:
    """stmatrix.x{num}[.trans]: the same phases as ldmatrix, writing."""
    return ldmatrix_access(row_addresses, num, trans=trans, store=True)


# cp.async writes shared memory a quarter-warp (8 lanes) per wavefront whatever
# the copy size. Measured on the H200 (experiments.banks, ncu): 32 lanes copying
# 4 B each into 128 contiguous bytes cost 4 wavefronts, as many as 16-B copies of
# 512 B, and ncu counts 3 of them as bank conflicts (it takes 128 B per
# wavefront as the ideal). So a 4-byte copy never conflicts within its phase,
# but moves a quarter of the bytes per wavefront of a 16-byte one.
CP_ASYNC_LANES_PER_PHASE = 8


def cp_async_access(dst_addresses, size: int, *, active=None) -> Access:
    """The shared-memory side of cp.async: each lane writes `size` bytes at its destination,
    8 lanes per phase (CP_ASYNC_LANES_PER_PHASE)."""
    if size not in CP_ASYNC_SIZES:
        raise ValueError(f"size must be one of {CP_ASYNC_SIZES} bytes for cp.async; got {size!r}")
    addrs, on = _lane_addresses(dst_addresses, "dst_addresses", active)
    _check_aligned(addrs, on, size, "dst_addresses")
    ideal = -(-int(np.count_nonzero(on)) * size // WAVEFRONT_BYTES)
    return Access(f"cp.async.{size}", size, _phases(addrs, on, CP_ASYNC_LANES_PER_PHASE), ideal=ideal)


# ------------------------------------------------------------------ the short forms

def wavefronts(addresses, width: int, *, active=None) -> int:
    """Wavefronts of one warp-wide ld/st.shared of `width` bytes (1 = conflict-free)."""
    return shared_access(addresses, width, active=active).wavefronts


def conflict_degree(addresses, width: int, *, active=None) -> int:
    """N of an N-way conflict: the most distinct words any bank holds in one phase."""
    return shared_access(addresses, width, active=active).degree


def breakdown(addresses, width: int, *, active=None) -> list[PhaseBreakdown]:
    """Per phase: bank -> word -> the lanes that collide there."""
    return shared_access(addresses, width, active=active).breakdown()


def ldmatrix_wavefronts(row_addresses, num: int) -> int:
    return ldmatrix_access(row_addresses, num).wavefronts


def stmatrix_wavefronts(row_addresses, num: int) -> int:
    return stmatrix_access(row_addresses, num).wavefronts


def cp_async_wavefronts(dst_addresses, size: int, *, active=None) -> int:
    return cp_async_access(dst_addresses, size, active=active).wavefronts


# ------------------------------------------------------------------ validation

def _check_width(width) -> None:
    if not isinstance(width, (int, np.integer)) or int(width) not in WIDTHS:
        raise ValueError(f"width must be one of {WIDTHS} bytes per lane; got {width!r}")


def _lane_addresses(addresses, name: str, active) -> tuple[np.ndarray, np.ndarray]:
    """-> (int64 (32,) addresses with inactive = 0, bool (32,) active)."""
    if isinstance(addresses, np.ndarray):
        if addresses.dtype == object:
            entries = addresses.tolist()
        elif addresses.dtype.kind in "iu":
            entries = addresses.astype(np.int64).tolist()
        else:
            raise ValueError(f"{name} must hold integers; got dtype {addresses.dtype}")
        if addresses.ndim != 1:
            raise ValueError(f"{name} must have shape ({WARP},); got {addresses.shape}")
    else:
        entries = list(addresses)
    if len(entries) != WARP:
        raise ValueError(f"{name} must have {WARP} entries, one per lane; got {len(entries)}")
    on = np.ones(WARP, dtype=bool)
    addrs = np.zeros(WARP, dtype=np.int64)
    for lane, a in enumerate(entries):
        if a is None or (isinstance(a, (int, np.integer)) and int(a) == INACTIVE):
            on[lane] = False
            continue
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise ValueError(f"{name}[{lane}] must be an integer byte address, None or -1; got {a!r}")
        if int(a) < 0:
            raise ValueError(f"{name}[{lane}] = {int(a)}: byte addresses are >= 0 (-1 = inactive)")
        addrs[lane] = int(a)
    if active is not None:
        mask = np.asarray(active)
        if mask.shape != (WARP,) or mask.dtype != bool:
            raise ValueError(f"active must be a bool array of shape ({WARP},); "
                             f"got {mask.dtype} {mask.shape}")
        on &= mask
    return addrs, on


def _check_aligned(addrs: np.ndarray, on: np.ndarray, width: int, name: str) -> None:
    bad = np.flatnonzero(on & (addrs % width != 0))
    if bad.size:
        lane = int(bad[0])
        raise ValueError(f"{name}[{lane}] = {int(addrs[lane])} is not a multiple of {width}: "
                         f"a {width}-byte access must be {width}-byte aligned")


def _phases(addrs: np.ndarray, on: np.ndarray, per: int) -> tuple[np.ndarray, ...]:
    out = []
    for first in range(0, WARP, per):
        lanes = np.arange(first, first + per)
        lanes = lanes[on[lanes]]
        out.append(np.stack([lanes, addrs[lanes]], axis=1).astype(np.int64))
    return tuple(out)


def _ranges(values: Iterable[int]) -> str:
    """(0, 1, 2, 5, 7, 8) -> "0-2, 5, 7-8"."""
    vals = sorted(set(int(v) for v in values))
    parts, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        parts.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(parts)


# ================================================================== bank maps

class BankMap(NamedTuple):
    """Plain data for a picture of a tile's banks.

    banks: int (rows, cols), the bank of each cell's first byte.
    conflicts: bool (rows, cols) or None, cells the access touches in a bank
        that holds another distinct word in the same phase.
    lanes: int (rows, cols) or None, the lowest lane whose request covers the
        cell (-1 = untouched).
    """
    title: str
    banks: np.ndarray
    conflicts: np.ndarray | None
    lanes: np.ndarray | None


def bank_map(layout: Layout, rows: int | None = None, cols: int | None = None,
             access: Access | None = None, *, title: str | None = None) -> BankMap:
    """Banks of the top-left rows x cols cells of `layout` (default: all of it).

    With `access`, also which cells it touches and which of those sit in a
    conflicting bank, so a picture can outline them.
    """
    rows = layout.rows if rows is None else rows
    cols = layout.cols if cols is None else cols
    for name, v, n in (("rows", rows, layout.rows), ("cols", cols, layout.cols)):
        if not isinstance(v, (int, np.integer)) or not 1 <= v <= n:
            raise ValueError(f"{name} must lie in 1..{n} for {layout.name!r}; got {v!r}")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    addr = layout.address(r, c)                          # (rows, cols) bytes
    banks = (addr // BANK_BYTES) % BANKS
    head = title or f"{layout.name}: banks of {rows} x {cols} cells"
    if access is None:
        return BankMap(head, banks.astype(np.int64), None, None)

    lanes = np.full((rows, cols), INACTIVE, dtype=np.int64)
    conflicts = np.zeros((rows, cols), dtype=bool)
    for requests, phase in zip(access.phases, access.breakdown()):
        contested = {w for words in phase.conflicts().values() for w in words}
        for lane, a in requests.tolist():
            for r_, c_ in zip(*np.nonzero((addr >= a) & (addr < a + access.width))):
                if lanes[r_, c_] == INACTIVE:
                    lanes[r_, c_] = lane
                first = int(addr[r_, c_]) // BANK_BYTES          # the cell's words
                last = (int(addr[r_, c_]) + layout.elem_bytes - 1) // BANK_BYTES
                if any(w in contested for w in range(first, last + 1)):
                    conflicts[r_, c_] = True
    head = title or (f"{layout.name}: {access.kind}, {access.wavefronts} wavefronts "
                     f"({access.degree}-way)")
    return BankMap(head, banks.astype(np.int64), conflicts, lanes)


__all__ = [
    "WARP", "BANKS", "BANK_BYTES", "WAVEFRONT_BYTES", "WIDTHS", "CP_ASYNC_SIZES", "INACTIVE",
    "bank_of", "lanes_per_phase", "PhaseBreakdown", "Access",
    "shared_access", "ldmatrix_access", "stmatrix_access", "cp_async_access",
    "wavefronts", "conflict_degree", "breakdown",
    "ldmatrix_wavefronts", "stmatrix_wavefronts", "cp_async_wavefronts",
    "BankMap", "bank_map",
]
