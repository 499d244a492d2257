"""
wgmma: four warps multiply together, B straight from shared memory
===================================================================

What and why
------------
``wgmma.mma_async.m64nNk16`` is Hopper's warpgroup MMA: the 4 warps of a
warpgroup (128 threads) issue one D[64 x N] (+)= A[64 x 16] @ B[16 x N]
together. Kernel A's G4 and G5 are two of them per m-tile (N = 128), so two
layout claims carry its correctness:

1. **A and D are mma.sync's fragments, warp by warp.** Warp w supplies rows
   16w .. 16w + 15 of A in exactly the A fragment of ``mma.m16n8k16``, and
   holds rows 16w .. of D as the C fragments of its N / 8 column blocks in
   order (g = lane // 4, t = lane % 4):

       d[4j + e] = D[16w + g + 8 (e >> 1)][8j + 2t + (e & 1)]

   so a warp's mma.sync accumulators *are* its share of a wgmma accumulator.
2. **B is read through a descriptor**, as *core matrices* of 8 rows x 16
   contiguous bytes: LBO steps between the core matrices of k 0-7 and 8-15,
   SBO between blocks of 8 along N. K-major B (TRANS_B 0) has n as the rows
   and 8 k in the 16 bytes; N-major B (TRANS_B 1) has k as the rows and 8 n:

       K-major: byte of B[k][n] = (n / 8) SBO + (k / 8) LBO + (n % 8) 16 + (k % 8) 2
       N-major: byte of B[k][n] = (n / 8) SBO + (k / 8) LBO + (k % 8) 16 + (n % 8) 2

   Kernel A's qd / kd / kr tiles X[c][k] sit at (c % 8) 16 + (k % 8) 2 +
   (c / 8) 2304 + (k / 8) 144: one image that is qd as an N-major B (LBO 2304,
   SBO 144; N = k, 128) and kr^T as a K-major B (LBO 144, SBO 2304; N = c, 16).

Idea
----
A[i][k] = i and B[k][j] = j make D[i][j] = 16 i j (hand-checkable: row i of D
is i times the row 0 .. 15 j pattern times 16). That B is constant along k, so
it cannot see k misplaced; a second B, B[k][j] = k + 1, gives D[i][j] = 136 i
(constant along j), which cannot see n misplaced; together they pin both.
Each case runs with a K-major and an N-major B, at N = 16 and N = 128, in two
layouts: a compact one and Kernel A's 144 / 2304-byte tile.

Kernel
------
``ptx_lab/cuda/wgmma_probes.cu`` (through ``ptx_lab.device.wgmma_m64nNk16_rs``):
one warpgroup copies the shared-memory image in, fences the async proxy,
loads its A registers and accumulators, and issues fence / wgmma / commit /
wait before writing the accumulators out. The model backend runs
``ptx_lab.model.wgmma_m64nNk16_rs`` on the same image and descriptor.

Check
-----
Every thread's every accumulator against 16 i j (or 136 i), named by warp,
lane, register and the D element the formula above says it holds.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model

from . import _common
from ._common import Checker, num

NAME = "wgmma"
SUMMARY = "one warpgroup's m64nNk16 with B from shared-memory core matrices: D = 16 i j, K- and N-major B"

THREADS = model.WGMMA_THREADS
OP_KBLOCK, OP_CBLOCK = 144, 2304       # Kernel A's operand tiles (kernel/ds_scan/cuda/layout.cuh, op_offset)
IMAGE_BYTES = 2 * OP_CBLOCK            # 4608: the kernel's tile, and room for every layout here


def layouts(n: int, major: str) -> dict[str, int]:
    """Descriptors (start 0) for B [16 x n]: compact (core matrices back to back) and Kernel A's."""
    blocks = n // 8
    compact = (model.wgmma_desc(0, lbo=128, sbo=256) if major == "k"          # k halves inner
               else model.wgmma_desc(0, lbo=128 * blocks, sbo=128))           # n blocks inner
    kernel = (model.wgmma_desc(0, lbo=OP_KBLOCK, sbo=OP_CBLOCK) if major == "k"   # kr^T[k][c]
              else model.wgmma_desc(0, lbo=OP_CBLOCK, sbo=OP_KBLOCK))             # qd[c][k]
    return {"compact": compact, "kernel A's tile": kernel}


B_CASES = {"B[k][j] = j, D = 16 i j": lambda k, j: j, "B[k][j] = k + 1, D = 136 i": lambda k, j: k + 1}


def expected(case: str, n: int) -> np.ndarray:
    i = np.arange(64)[:, None]
    j = np.arange(n)[None, :]
    D = 16 * i * j if case.startswith("B[k][j] = j") else 136 * i + 0 * j
    return D.astype(np.float32)


def a_matrix() -> np.ndarray:
    return np.repeat(np.arange(64, dtype=np.float32)[:, None], 16, axis=1)   # A[i][k] = i


def b_matrix(case: str, n: int) -> np.ndarray:
    k = np.arange(16)[:, None]
    j = np.arange(n)[None, :]
    return (B_CASES[case](k, j) + 0 * (k + j)).astype(np.float32)


def b_image(B: np.ndarray, desc: int, major: str) -> np.ndarray:
    """The shared-memory image with B's bf16 bits where the descriptor says, zeros elsewhere."""
    return model.wgmma_b_image(B, desc, IMAGE_BYTES, major)


def case_names():
    for major in model.WGMMA_B_MAJORS:
        for n in model.WGMMA_N:
            for layout in ("compact", "kernel A's tile"):
                if layout == "kernel A's tile" and major == "k" and n != 16:
                    continue   # kr^T as a K-major B has N = c: 16 columns (G2's B), not 128
                for case in B_CASES:
                    yield major, n, layout, case


def key(major: str, n: int, layout: str, case: str) -> str:
    return f"m64n{n}k16 {major.upper()}-major B, {layout}, {case}"


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    _common.check_backend(backend)
    if backend == "gpu":
        from ptx_lab import device
        run = device.wgmma_m64nNk16_rs
    else:
        run = model.wgmma_m64nNk16_rs
    a = model.matrix_to_wgmma_a(a_matrix())
    obs = {}
    for major, n, layout, case in case_names():
        desc = layouts(n, major)[layout]
        img = b_image(b_matrix(case, n), desc, major)
        c = np.full((THREADS, n // 2), -1.0, dtype=np.float32)   # scale_d 0: must not show
        obs[key(major, n, layout, case)] = run(a, img, desc, c, n, scale_d=False, major=major)
    return obs


# ------------------------------------------------------------------ check

def element(thread: int, r: int) -> tuple[int, int]:
    """The D element accumulator r of `thread` holds (claim 1 above, independent of the model)."""
    w, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    j, e = divmod(r, 4)
    return 16 * w + g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1)


def where(thread: int, r: int) -> str:
    i, j = element(thread, r)
    return f"warp {thread // 32} lane {thread % 32} d[{r}] D[{i}][{j}]"


def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    for major, n, layout, case in case_names():
        k = key(major, n, layout, case)
        D = expected(case, n)
        want = np.array([[D[element(th, r)] for r in range(n // 2)] for th in range(THREADS)], dtype=np.float32)
        chk.compare(k, obs[k], want, where, num)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
