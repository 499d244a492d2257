"""
cp.async.bulk and the mbarrier: one instruction per row, completion by bytes
============================================================================

What and why
------------
``cp.async.bulk`` (Hopper, bulk.cuh) copies one contiguous run of bytes (a
multiple of 16, both addresses 16-byte aligned) between global and shared
memory, issued by ONE thread with ONE instruction and carried out by the
SM's copy engine (the async proxy), not by the thread's load/store path.
``cp.async`` (experiment ``cp_async``) moves at most 16 bytes per thread per
instruction: a 256-byte row is 16 thread-copies, and a tile of q, k, gc and
do rows is hundreds of them, every one an entry in the SM's global-memory
(LG) queue that the warp's other loads and stores wait behind. A bulk copy
of the same row is one request, whatever its length.

A global -> shared bulk copy completes on an mbarrier, an 8-byte object in
shared memory that counts two things per phase: arrivals (``mbarrier.init``
says how many) and transaction bytes. ``mbarrier.arrive.expect_tx(bar, n)``
adds n bytes to the phase's tx-count and arrives; every copy that names the
barrier takes its bytes off the tx-count when they land. The phase completes
when all arrivals are in and the tx-count is back at 0; then its parity flips
(0, 1, 0, ...). ``mbarrier.try_wait.parity(bar, p)`` is true once the phase
with parity p has completed, which is all a waiter can ask: a waiter two
phases behind sees the parity it waits for as the current one and blocks.
Bytes may land before the arrival that expects them (the tx-count goes
negative for a while); the phase still cannot complete without the arrival.

Shared -> global bulk copies complete per thread in bulk groups (commit,
then wait until at most N groups still READ their source, or are pending at
all). Shared memory written by ordinary stores must be fenced for the async
proxy (``fence.proxy.async.shared::cta``) before a bulk store reads it.

Idea
----
Global row r of src [32][32] u32 holds ``1000 r + c`` in column c, so every
word says where it came from; shared memory and the bulk stores'
destinations start as 0xffffffff, a value no copy produces. Lane l copies
a different number of bytes per row (16..128), so a copy that is too long or
too short shows up as a wrong or a leftover word.

Kernel (``ptx_lab/cuda/bulk_probes.cu``, one CTA of one warp, one mbarrier of count 1)
---------------------------------------------------------------------------------------
::

    rows_a, rows_b <- 0xffffffff; fence.proxy.async; lane 0: mbarrier.init(bar, 1)
    phase 0 (parity 0): lane l: bulk copy src row l -> rows_a[l], BYTES0[l] bytes
                        try_wait(0)                           # 0: lane 0 has not arrived
                        lane 0: arrive.expect_tx(sum BYTES0); wait(0)
                        try_wait(0), try_wait(1)              # 1, 0
    phase 1 (parity 1): lane 0: arrive.expect_tx(sum BYTES1) first, then
                        lane l: bulk copy src row SRC_ROW1[l] -> rows_b[l], BYTES1[l] bytes; wait(1)
                        try_wait(1), try_wait(0)              # 1, 0 (phase 2 has parity 0)
    phase 2 (parity 0): lane 0: plain arrive (no bytes); wait(0)
                        try_wait(0), try_wait(1)              # 1, 0
    rows_a[STORED_ROW] <- ordinary stores; fence.proxy.async; __syncwarp
    lane l: bulk store rows_a[l] -> out_a row l (BYTES0[l]); commit; wait_group.read 0
    rows_a <- 0xa5a5a5a5 (the source is free once read); bulk store rows_b[l] -> out_b; wait_group 0

The model backend runs the same steps, in the same order, through
``ptx_lab.model.MBarrier`` and ``cp_async_bulk_g2s``/``cp_async_bulk_s2g``.

Check
-----
rows_a after phase 0 and out_a: row r word c = 1000 r + c for 4c < BYTES0[r]
(STORED_ROW: the stored words instead), 0xffffffff after; rows_b and out_b:
1000 SRC_ROW1[r] + c for 4c < BYTES1[r], 0xffffffff after; every lane's
try_wait answers as listed above. The reuse of rows_a must not reach out_a.
"""
from __future__ import annotations

import re

import numpy as np

from ptx_lab import CUDA_INCLUDE_DIR, model

from . import _common
from ._common import WARP, Checker

NAME = "bulk_copy"
SUMMARY = "cp.async.bulk rows of 16..128 B on an mbarrier (3 phases, parity), bulk stores back"

BULK_PROBES_CU = CUDA_INCLUDE_DIR / "bulk_probes.cu"

ROWS = WARP                 # one row per lane
WORDS = 32                  # u32 per row
ROW_BYTES = 4 * WORDS       # 128: the longest copy
SENTINEL = 0xFFFFFFFF       # shared memory and out_a/out_b before anything lands
STORE_MARK = 900000         # STORED_ROW word c, rewritten by ordinary stores: STORE_MARK + 1000 r + c
REUSED = 0xA5A5A5A5         # rows_a after its bulk store has read it (must not reach out_a)
STORED_ROW = 5              # BYTES0 = 96: the bulk store takes 24 of the 32 stored words

LANES = np.arange(WARP)
BYTES0 = (16 * (1 + LANES % 8)).astype(np.uint32)   # phase 0: 16, 32, ..., 128, 16, ...
BYTES1 = (16 * (8 - LANES % 8)).astype(np.uint32)   # phase 1: 128, 112, ..., 16, 128, ...
SRC_ROW1 = ((LANES + 16) % ROWS).astype(np.uint32)  # phase 1 reads the other half's rows

# The kernel's try_wait answers, in its FLAG_... order, and what each must be.
FLAGS = (("try_wait(0) after the phase-0 copies, before the arrival", 0),
         ("try_wait(0) after wait(0)", 1),
         ("try_wait(1) after wait(0)", 0),
         ("try_wait(1) after wait(1)", 1),
         ("try_wait(0) after wait(1): phase 2 is current, parity 0 again", 0),
         ("try_wait(0) after phase 2", 1),
         ("try_wait(1) after phase 2", 0))
FLAG_NAMES = ("FLAG_P0_ISSUED", "FLAG_P0_DONE", "FLAG_P1_AFTER_P0", "FLAG_P1_DONE",
              "FLAG_P0_AFTER_P1", "FLAG_P0_DONE_AGAIN", "FLAG_P1_AFTER_P2")
EXPECTED_FLAGS = np.array([want for _, want in FLAGS], dtype=np.uint32)

SOURCE = BULK_PROBES_CU.read_text()
# The kernel and this file must agree on the layout and on the order of the flags.
for _line in (f"WORDS = {WORDS};", "SENTINEL = 0xffffffffu;", f"STORE_MARK = {STORE_MARK};",
              "REUSED = 0xa5a5a5a5u;"):
    assert _line in SOURCE, f"{BULK_PROBES_CU.name} no longer says {_line!r}"
assert re.findall(r"^\s*(FLAG_\w+),", SOURCE, re.M) == list(FLAG_NAMES), \
    f"the FLAG_ enum of {BULK_PROBES_CU.name} differs from FLAG_NAMES"


def src_rows() -> np.ndarray:
    """uint32 (ROWS, WORDS): src[r][c] = 1000 r + c."""
    r, c = np.indices((ROWS, WORDS))
    return (1000 * r + c).astype(np.uint32)


def stored_words() -> np.ndarray:
    """uint32 (WORDS,): what the ordinary stores put in rows_a[STORED_ROW] (lane c writes word c)."""
    return (STORE_MARK + 1000 * STORED_ROW + np.arange(WORDS)).astype(np.uint32)


# ------------------------------------------------------------------ observe

def _to_bytes(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(words, dtype="<u4").reshape(-1).view(np.uint8)


def _to_rows(image: np.ndarray) -> np.ndarray:
    return image.view("<u4").astype(np.uint32).reshape(ROWS, WORDS)


def _observe_model() -> dict[str, np.ndarray]:
    """The kernel's steps, in its order, on ptx_lab.model (one lane after another)."""
    gmem = _to_bytes(src_rows())
    buffer = ROWS * ROW_BYTES
    a, b = 0, buffer                                  # rows_a, rows_b in one shared image
    smem = np.full(2 * buffer, 0xFF, dtype=np.uint8)
    bar = model.MBarrier(1)
    flags = np.zeros(len(FLAGS), dtype=np.uint32)

    # phase 0: copies first, the arrival after
    for lane in range(WARP):
        smem = model.cp_async_bulk_g2s(smem, gmem, a + lane * ROW_BYTES, lane * ROW_BYTES,
                                       int(BYTES0[lane]), bar)
    flags[0] = bar.try_wait_parity(0)
    bar.arrive_expect_tx(int(BYTES0.sum()))
    bar.wait_parity(0)
    flags[1], flags[2] = bar.try_wait_parity(0), bar.try_wait_parity(1)
    smem_a = _to_rows(smem[a:a + buffer])

    # phase 1: the arrival first, the copies after
    bar.arrive_expect_tx(int(BYTES1.sum()))
    for lane in range(WARP):
        smem = model.cp_async_bulk_g2s(smem, gmem, b + lane * ROW_BYTES,
                                       int(SRC_ROW1[lane]) * ROW_BYTES, int(BYTES1[lane]), bar)
    bar.wait_parity(1)
    flags[3], flags[4] = bar.try_wait_parity(1), bar.try_wait_parity(0)
    smem_b = _to_rows(smem[b:b + buffer])

    # phase 2: no bytes, one plain arrival
    bar.arrive()
    bar.wait_parity(0)
    flags[5], flags[6] = bar.try_wait_parity(0), bar.try_wait_parity(1)

    # shared -> global
    row = a + STORED_ROW * ROW_BYTES
    smem[row:row + ROW_BYTES] = _to_bytes(stored_words())
    out_a = np.full(buffer, 0xFF, dtype=np.uint8)
    for lane in range(WARP):
        out_a = model.cp_async_bulk_s2g(out_a, smem, lane * ROW_BYTES, a + lane * ROW_BYTES,
                                        int(BYTES0[lane]))
    # wait_group.read 0: the stores have read rows_a, so reusing it cannot reach out_a
    smem[a:a + buffer] = _to_bytes(np.full(ROWS * WORDS, REUSED, dtype=np.uint32))
    out_b = np.full(buffer, 0xFF, dtype=np.uint8)
    for lane in range(WARP):
        out_b = model.cp_async_bulk_s2g(out_b, smem, lane * ROW_BYTES, b + lane * ROW_BYTES,
                                        int(BYTES1[lane]))
    return {"smem_a": smem_a, "smem_b": smem_b, "flags": np.tile(flags, (WARP, 1)),
            "out_a": _to_rows(out_a), "out_b": _to_rows(out_b)}


def _observe_gpu() -> dict[str, np.ndarray]:
    rows = ((ROWS, WORDS), np.uint32)
    untouched = np.full((ROWS, WORDS), SENTINEL, dtype=np.uint32)
    smem_a, smem_b, flags, out_a, out_b = _common.run_warp(
        SOURCE, "bulk_copy_rows",
        [src_rows(), BYTES0, BYTES1, SRC_ROW1, np.uint32(STORED_ROW)],
        [rows, rows, ((WARP, len(FLAGS)), np.uint32), untouched, untouched])
    return {"smem_a": smem_a, "smem_b": smem_b, "flags": flags, "out_a": out_a, "out_b": out_b}


def observe(backend: str) -> dict[str, np.ndarray]:
    """smem_a, smem_b, out_a, out_b: uint32 (ROWS, WORDS); flags: uint32 (32, len(FLAGS))."""
    _common.check_backend(backend)
    return _observe_gpu() if backend == "gpu" else _observe_model()


# ------------------------------------------------------------------ check

def expected_rows(src_row: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """uint32 (ROWS, WORDS): row r holds src row src_row[r] over its first nbytes[r] bytes."""
    _, c = np.indices((ROWS, WORDS))
    copied = 4 * c < nbytes[:, None]
    return np.where(copied, src_rows()[src_row[:, None], c], SENTINEL).astype(np.uint32)


def _where(nbytes: np.ndarray, what: str, source):
    """Names row r, word c of a checked image; source(r) says where row r's bytes come from."""
    def where(r: int, c: int) -> str:
        place, n = f"row {r} word {c} (byte {4 * c})", int(nbytes[r])
        if 4 * c < n:
            return f"{place}, in lane {r}'s {what} of {n} bytes {source(r)}"
        return f"{place}, past lane {r}'s {what} of {n} bytes: written by nothing"
    return where


def _word(v) -> str:
    return f"0x{int(v):08x}" if int(v) >= 2**31 else str(int(v))


def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    want_a = expected_rows(np.arange(ROWS), BYTES0)
    want_b = expected_rows(SRC_ROW1, BYTES1)
    want_out_a = want_a.copy()
    stored = 4 * np.arange(WORDS) < BYTES0[STORED_ROW]
    want_out_a[STORED_ROW, stored] = stored_words()[stored]

    chk.compare("phase 0 rows_a", obs["smem_a"], want_a,
                _where(BYTES0, "bulk copy", lambda r: f"from src row {r}"), _word)
    chk.compare("phase 1 rows_b", obs["smem_b"], want_b,
                _where(BYTES1, "bulk copy", lambda r: f"from src row {int(SRC_ROW1[r])}"), _word)
    chk.compare("bulk store out_a", obs["out_a"], want_out_a,
                _where(BYTES0, "bulk store", lambda r: (
                    f"of rows_a[{r}], rewritten by fenced ordinary stores" if r == STORED_ROW
                    else f"of rows_a[{r}]")), _word)
    chk.compare("bulk store out_b", obs["out_b"], want_b,
                _where(BYTES1, "bulk store", lambda r: f"of rows_b[{r}]"), _word)
    chk.compare("mbarrier", obs["flags"], np.tile(EXPECTED_FLAGS, (WARP, 1)),
                lambda l, k: f"lane {l} {FLAGS[k][0]}")
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
