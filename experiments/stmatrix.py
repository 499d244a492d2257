"""
stmatrix: the inverse of ldmatrix, x1 / x2 / x4 and .trans (sm_90)
====================================================================

What and why
------------
``stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`` writes fragments
back to shared memory: lanes 8i..8i+7 name the 16-byte rows of matrix i
(x1: lanes 0-7, x2: lanes 0-15), and register i of lane l supplies

    plain   { M_i[g][2t],  M_i[g][2t+1] }      g = lane // 4, t = lane % 4
    .trans  { M_i[2t][g],  M_i[2t+1][g] }

of the matrix as it will lie in memory. It is how an epilogue stores an mma
result without a per-lane scatter, so its layout must be exactly ldmatrix's.

Idea
----
Load every register with the coordinates its two elements must land on,
written in hex as in the ldmatrix experiment (M_i[r][c] = 0x0irc). After the
store, shared memory must read 0x0irc at row r, column c of matrix i, in the
shuffled row slots the lanes named, and 0xdead (the sentinel written before
the store) everywhere else, including the slot the ignored lanes point at.

Kernel
------
::

    smem[40 slots x 16 B] <- 0xdead;  __syncwarp
    stmatrix.x{num}[.trans](smem + addrs[lane], regs[lane][0..num-1]);  __syncwarp
    dump smem

Check
-----
Every 16-bit element of the dumped image against the closed form; a wrong one
is reported with the lane and register that should have written it, from
ptx_lab.fragments.inverse_map.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import inverse_map, ldmatrix_map

from . import _common
from ._common import HALF, WARP, Checker, hex16
from .ldmatrix import (ROW_BYTES, SENTINEL, SLOT_OF, SLOTS, SMEM_BYTES, row_addresses, value,
                       variant_name)

NAME = "stmatrix"
SUMMARY = "stmatrix x1/x2/x4 [.trans]: registers holding their own coordinates, stored and read back"

VARIANTS = [(num, trans) for trans in (False, True) for num in (1, 2, 4)]


def registers(num: int, trans: bool) -> np.ndarray:
    """uint32 (32, num): register i of lane l holds 0x0irc of the cells it will be stored to."""
    lmap = ldmatrix_map(num, trans)
    return _common.pack(value(lmap[..., 0], lmap[..., 1], lmap[..., 2]).astype(np.uint16))


def blank_image() -> np.ndarray:
    return np.full(SMEM_BYTES // 2, SENTINEL, dtype="<u2").view(np.uint8)


def expected_image(num: int) -> np.ndarray:
    """uint16 (SLOTS, 8): row r of matrix i < num in its slot, sentinels elsewhere."""
    elems = np.full((SLOTS, 8), SENTINEL, dtype=np.uint16)
    for m in range(num):
        for r in range(8):
            elems[SLOT_OF[8 * m + r]] = [value(m, r, c) for c in range(8)]
    return elems


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "stmatrix.cuh"
using namespace ptx_lab;

constexpr int WARP = 32;
constexpr int SMEM_BYTES = 640;            // 40 row slots x 16 B (SMEM_BYTES in ldmatrix.py)
constexpr int SMEM_WORDS = SMEM_BYTES / 4;
constexpr u32 SENTINEL2 = 0xdeaddeadu;     // two 16-bit sentinels

// addrs: (32,) byte offsets; regs: (32, 4) u32 (registers >= num unused);
// variant: 0..2 = x1, x2, x4; 3..5 with .trans. out: (SMEM_BYTES,) bytes as u32 words.
extern "C" __global__ void stmatrix_probe(const u32* addrs, const u32* regs, int variant, u32* out) {
    __shared__ __align__(16) u32 smem[SMEM_WORDS];
    const int lane = threadIdx.x;
    for (int i = lane; i < SMEM_WORDS; i += WARP) smem[i] = SENTINEL2;
    __syncwarp();  // the sentinel is down before any row is stored over it

    const u32 addr = smem_addr(smem) + addrs[lane];
    const u32 r0 = regs[lane * 4 + 0], r1 = regs[lane * 4 + 1];
    const u32 r2 = regs[lane * 4 + 2], r3 = regs[lane * 4 + 3];
    switch (variant) {  // uniform across the warp, as .aligned requires
        case 0: stmatrix_x1(addr, r0); break;
        case 1: stmatrix_x2(addr, r0, r1); break;
        case 2: stmatrix_x4(addr, r0, r1, r2, r3); break;
        case 3: stmatrix_x1_trans(addr, r0); break;
        case 4: stmatrix_x2_trans(addr, r0, r1); break;
        case 5: stmatrix_x4_trans(addr, r0, r1, r2, r3); break;
    }
    __syncwarp();  // every lane's rows are stored before the dump reads them
    for (int i = lane; i < SMEM_WORDS; i += WARP) out[i] = smem[i];
}
"""
assert f"SMEM_BYTES = {SMEM_BYTES};" in SOURCE
assert SENTINEL == 0xDEAD


def _variant_index(num: int, trans: bool) -> int:
    return {1: 0, 2: 1, 4: 2}[num] + (3 if trans else 0)


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    """variant name -> uint8 (SMEM_BYTES,): shared memory after the store."""
    _common.check_backend(backend)
    obs = {}
    for num, trans in VARIANTS:
        regs, addrs = registers(num, trans), row_addresses(num)
        if backend == "gpu":
            padded = np.zeros((WARP, 4), dtype=np.uint32)
            padded[:, :num] = regs
            (words,) = _common.run_warp(SOURCE, "stmatrix_probe",
                                        [addrs, padded, np.int32(_variant_index(num, trans))],
                                        [((SMEM_BYTES // 4,), np.uint32)])
            image = words.view(np.uint8)
        else:
            image = model.stmatrix(blank_image(), addrs, regs, trans)
        obs[variant_name(num, trans)] = image
    return obs


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    slot_row = {int(s): (k // 8, k % 8) for k, s in enumerate(SLOT_OF)}  # slot -> (matrix, row)
    for num, trans in VARIANTS:
        inv = inverse_map("m8n8.trans" if trans else "m8n8")  # [row, col] -> (lane, 0, half)

        def where(slot: int, col: int, num=num, inv=inv) -> str:
            at = f"smem byte {slot * ROW_BYTES + 2 * col}"
            m, r = slot_row.get(slot, (None, None))
            if m is None or m >= num:
                return f"{at} (slot {slot}, written by no lane)"
            lane, _, h = inv[r, col]
            return f"lane {lane} r{m}.{HALF[h]} -> M{m}[{r}][{col}] at {at}"

        got = np.asarray(obs[variant_name(num, trans)]).view("<u2").reshape(SLOTS, 8)
        chk.compare(variant_name(num, trans), got, expected_image(num), where, hex16)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
