"""
cp.async: per-lane global -> shared copies, with and without zero-fill
=======================================================================

What and why
------------
``cp.async.{ca,cg}.shared.global [dst], [src], size{, src_bytes}`` copies
`size` bytes (4, 8 or 16; .cg only 16) per lane from global to shared memory
without passing through registers, completing later, per commit group. The
zero-fill form copies only `src_bytes` (0..size) and writes zeros over the
rest; src_bytes = 0 reads nothing at all, which is how a kernel clears the
rows of a tile that run past the end of a sequence. Kernel A loads every tile
this way, so the copy sizes, the caching variants and the zero-fill must all
do exactly what they say.

Idea
----
Global memory holds fixed pseudo-random bytes in 1..254; shared memory starts
as 0xff, a value the copies can never produce. Each lane copies one chunk
from a shuffled source chunk to a shuffled destination chunk (the two
shuffles differ), so a wrong address shows up as the wrong byte, a byte that
was never written stays 0xff, and a zero-filled byte reads 0x00. In the
zero-fill cases lane l copies l % (size + 1) bytes: 0, every partial count and
the full chunk all occur.

Kernel
------
::

    smem[768] <- 0xff;  __syncthreads
    cp.async.{ca,cg}[.zfill] smem + dst[lane] <- gmem + src[lane], size[, src_bytes[lane]]
    cp.async.commit_group; cp.async.wait_group 0; __syncthreads
    dump smem

Check
-----
For every lane and byte j < size: smem[dst + j] = gmem[src + j] if j <
src_bytes else 0; every byte no lane writes is still 0xff.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model

from . import _common
from ._common import WARP, Checker, hex8

NAME = "cp_async"
SUMMARY = "cp.async 4/8/16 B .ca, 16 B .cg, zero-fill with src_bytes 0..size: every lane's bytes"

SMEM_BYTES = 768          # 48 chunks of 16 B: room for 32 chunks of any size plus untouched ones
GMEM_BYTES = 1024
CHUNKS = 48               # destination/source chunk slots per case
SENTINEL = 0xFF

# (cache, size, zero-fill) in the order they are run
CASES = [("ca", 4, False), ("ca", 8, False), ("ca", 16, False), ("cg", 16, False),
         ("ca", 4, True), ("ca", 8, True), ("ca", 16, True), ("cg", 16, True)]


def case_name(cache: str, size: int, zfill: bool) -> str:
    return f"{cache}.{size}" + (".zfill" if zfill else "")


def gmem_image() -> np.ndarray:
    """uint8 (GMEM_BYTES,): fixed pseudo-random bytes in 1..254 (never 0x00 nor 0xff)."""
    return np.random.default_rng(7).integers(1, 255, GMEM_BYTES).astype(np.uint8)


def layout(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dst, src) byte offsets of every lane: distinct shuffled chunk slots, multiples of size."""
    rng = np.random.default_rng(1000 + size)
    dst = rng.permutation(CHUNKS)[:WARP] * size
    src = rng.permutation(GMEM_BYTES // size)[:WARP] * size
    assert dst.max() + size <= SMEM_BYTES and src.max() + size <= GMEM_BYTES
    return dst.astype(np.uint32), src.astype(np.uint32)


def src_bytes(size: int, zfill: bool) -> np.ndarray:
    return (np.arange(WARP) % (size + 1) if zfill else np.full(WARP, size)).astype(np.uint32)


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "cp_async.cuh"
using namespace ptx_lab;

constexpr int WARP = 32;
constexpr int SMEM_BYTES = 768;            // SMEM_BYTES in cp_async.py
constexpr unsigned char SENTINEL = 0xff;   // never produced by a copy or a zero-fill

// gmem: source bytes; dst, src, src_bytes: (32,) per lane. out: (SMEM_BYTES,) bytes.
template <int BYTES, bool CG, bool ZFILL>
__device__ void cp_async_probe(const unsigned char* gmem, const u32* dst, const u32* src,
                               const u32* src_bytes, unsigned char* out) {
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    const int lane = threadIdx.x;
    for (int i = lane; i < SMEM_BYTES; i += WARP) smem[i] = SENTINEL;
    __syncthreads();  // the sentinel is down before any lane's copy lands on it

    const u32 d = smem_addr(smem) + dst[lane];
    const void* s = gmem + src[lane];
    if constexpr (CG) {
        if constexpr (ZFILL) cp_async_cg16_zfill(d, s, src_bytes[lane]);
        else                 cp_async_cg16(d, s);
    } else {
        if constexpr (ZFILL) cp_async_ca_zfill<BYTES>(d, s, src_bytes[lane]);
        else                 cp_async_ca<BYTES>(d, s);
    }
    cp_async_commit();
    cp_async_wait<0>();  // this lane's copies have landed ...
    __syncthreads();     // ... and, after the barrier, every lane's are visible to all

    for (int i = lane; i < SMEM_BYTES; i += WARP) out[i] = smem[i];
}

#define PROBE(NAME, BYTES, CG, ZFILL)                                                        \
    extern "C" __global__ void NAME(const unsigned char* gmem, const u32* dst, const u32* src, \
                                    const u32* src_bytes, unsigned char* out) {              \
        cp_async_probe<BYTES, CG, ZFILL>(gmem, dst, src, src_bytes, out);                    \
    }
PROBE(cp_async_ca4, 4, false, false)
PROBE(cp_async_ca8, 8, false, false)
PROBE(cp_async_ca16, 16, false, false)
PROBE(cp_async_cg16, 16, true, false)
PROBE(cp_async_ca4_zfill, 4, false, true)
PROBE(cp_async_ca8_zfill, 8, false, true)
PROBE(cp_async_ca16_zfill, 16, false, true)
PROBE(cp_async_cg16_zfill, 16, true, true)
"""
assert f"SMEM_BYTES = {SMEM_BYTES};" in SOURCE


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    """case name -> uint8 (SMEM_BYTES,): shared memory after the copies."""
    _common.check_backend(backend)
    gmem = gmem_image()
    obs = {}
    for cache, size, zfill in CASES:
        dst, src = layout(size)
        nbytes = src_bytes(size, zfill)
        if backend == "gpu":
            kernel = f"cp_async_{cache}{size}" + ("_zfill" if zfill else "")
            (image,) = _common.run_warp(SOURCE, kernel, [gmem, dst, src, nbytes],
                                        [((SMEM_BYTES,), np.uint8)])
        else:
            image = model.cp_async(np.full(SMEM_BYTES, SENTINEL, dtype=np.uint8), gmem, dst, src,
                                   size, nbytes if zfill else None, cache)
        obs[case_name(cache, size, zfill)] = image
    return obs


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    gmem = gmem_image()
    for cache, size, zfill in CASES:
        name = case_name(cache, size, zfill)
        dst, src = layout(size)
        nbytes = src_bytes(size, zfill)
        got = np.asarray(obs[name])
        # Each lane's chunk: copied bytes, then zeros.
        want = np.array([[gmem[src[l] + j] if j < nbytes[l] else 0 for j in range(size)]
                         for l in range(WARP)], dtype=np.uint8)
        lane_bytes = got[dst[:, None].astype(np.int64) + np.arange(size)]
        chk.compare(name, lane_bytes, want,
                    lambda l, j: (f"lane {l} byte {j} -> smem[{dst[l] + j}] "
                                  + (f"(from gmem[{src[l] + j}])" if j < nbytes[l] else
                                     f"(zero-fill, src_bytes {nbytes[l]})")), hex8)
        # Bytes no lane writes keep the sentinel.
        untouched = np.ones(SMEM_BYTES, dtype=bool)
        for l in range(WARP):
            untouched[dst[l]:dst[l] + size] = False
        idx = np.flatnonzero(untouched)
        chk.compare(name, got[idx], np.full(idx.size, SENTINEL, dtype=np.uint8),
                    lambda k: f"smem[{idx[k]}] (written by no lane)", hex8)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
