"""
movmatrix: transpose an 8x8 fragment without touching shared memory
====================================================================

What and why
------------
``movmatrix.sync.aligned.m8n8.trans.b16`` takes one register per lane holding
an 8x8 matrix of 16-bit elements in the plain ldmatrix layout and returns the
fragment of its transpose (g = lane // 4, t = lane % 4):

    in   lane l: { M[g][2t],  M[g][2t+1] }
    out  lane l: { M[2t][g],  M[2t+1][g] }   ( = { M^T[g][2t], M^T[g][2t+1] } )

It is the register-only way to turn an accumulator-shaped tile into a
B-shaped one, the alternative to stmatrix + ldmatrix.trans. (Kernel A does not
need it: see accumulator_as_a.)

Idea
----
M[r][c] = 0x00rc: each element spells its row and column. Two routes in:

1. the input register built on the host from the formula above;
2. ldmatrix.x1 of M from shared memory; then movmatrix of that fragment must
   equal ldmatrix.x1.trans of the same addresses, and both must equal the
   closed form.

Kernel
------
::

    smem[8][8] <- M;  __syncwarp
    plain = ldmatrix.x1(&smem[lane % 8][0]);  trans = ldmatrix.x1.trans(same)
    dump movmatrix(frag_in[lane]), plain, movmatrix(plain), trans

Check
-----
Every lane's register against the closed form, naming lane, half and the
element of M it should hold.
"""
from __future__ import annotations

import numpy as np

from ptx_lab import model
from ptx_lab.fragments import fragment_map

from . import _common
from ._common import HALF, WARP, Checker, hex16, lane_values

NAME = "movmatrix"
SUMMARY = "movmatrix.trans of a host-built fragment and of an ldmatrix fragment vs ldmatrix.trans"

ROW_BYTES = 16


def value(r, c):
    """M[r][c] = 0x00rc."""
    return (r << 4) | c


def plain_fragment() -> np.ndarray:
    """uint32 (32,): lane l holds {M[g][2t], M[g][2t+1]}."""
    return _common.pack(lane_values("m8n8", value).astype(np.uint16))[:, 0]


def matrix_image() -> np.ndarray:
    """uint8 (128,): M row-major, one 16-byte row per matrix row."""
    M = np.array([[value(r, c) for c in range(8)] for r in range(8)], dtype="<u2")
    return M.view(np.uint8).ravel()


ROUTES = ("movmatrix(host fragment)", "ldmatrix.x1", "movmatrix(ldmatrix.x1)", "ldmatrix.x1.trans")
# which layout each route must produce
LAYOUT = {"movmatrix(host fragment)": "m8n8.trans", "ldmatrix.x1": "m8n8",
          "movmatrix(ldmatrix.x1)": "m8n8.trans", "ldmatrix.x1.trans": "m8n8.trans"}


# ------------------------------------------------------------------ the kernel

SOURCE = r"""
#include "ldmatrix.cuh"
#include "movmatrix.cuh"
using namespace ptx_lab;

constexpr int WARP = 32;
constexpr int ROW_BYTES = 16;  // one row of M: 8 x b16

// frag_in: (32,) u32; image: (8, 8) b16 row-major M as 32 u32 words.
// out: (4, 32) u32 = movmatrix(frag_in), ldmatrix.x1, movmatrix(ldmatrix.x1), ldmatrix.x1.trans.
extern "C" __global__ void movmatrix_probe(const u32* frag_in, const u32* image, u32* out) {
    __shared__ __align__(16) u32 smem[WARP];  // M: 128 bytes = one word per lane
    const int lane = threadIdx.x;
    smem[lane] = image[lane];
    __syncwarp();  // M is complete before ldmatrix reads it

    // x1 reads the addresses of lanes 0..7 (row lane); the others repeat them, valid but unused.
    const u32 row = smem_addr(smem) + (lane % 8) * ROW_BYTES;
    u32 plain, trans;
    ldmatrix_x1(plain, row);
    ldmatrix_x1_trans(trans, row);
    out[0 * WARP + lane] = movmatrix_trans(frag_in[lane]);
    out[1 * WARP + lane] = plain;
    out[2 * WARP + lane] = movmatrix_trans(plain);
    out[3 * WARP + lane] = trans;
}
"""


# ------------------------------------------------------------------ observe

def observe(backend: str) -> dict[str, np.ndarray]:
    """route -> uint32 (32,)."""
    _common.check_backend(backend)
    frag, image = plain_fragment(), matrix_image()
    if backend == "gpu":
        (out,) = _common.run_warp(SOURCE, "movmatrix_probe", [frag, image.view(np.uint32)],
                                  [((4, WARP), np.uint32)])
        return dict(zip(ROUTES, out))
    rows = (np.arange(WARP) % 8) * ROW_BYTES
    plain = model.ldmatrix(image, rows, 1, False)[:, 0]
    return {"movmatrix(host fragment)": model.movmatrix_trans(frag),
            "ldmatrix.x1": plain,
            "movmatrix(ldmatrix.x1)": model.movmatrix_trans(plain),
            "ldmatrix.x1.trans": model.ldmatrix(image, rows, 1, True)[:, 0]}


# ------------------------------------------------------------------ check

def check(obs: dict[str, np.ndarray]) -> Checker:
    chk = Checker()
    for route in ROUTES:
        layout = LAYOUT[route]
        fmap = fragment_map(layout)[:, 0]  # (32, 2, 2): (row, col) of M per lane and half
        want = value(fmap[..., 0], fmap[..., 1]).astype(np.uint16)
        chk.compare(route, _common.unpack(obs[route]), want,
                    lambda l, h, fm=fmap: f"lane {l} r0.{HALF[h]} M[{fm[l, h, 0]}][{fm[l, h, 1]}]", hex16)
    return chk


def run(backend: str) -> _common.Result:
    return check(observe(backend)).result(NAME, backend)


if __name__ == "__main__":
    _common.entry_point(__name__)
