"""Byte and tensor-core floors of the whole KDA backward, per design, from its GEMMs and tensors.

What and why
------------
The whole backward splits into serial scans (Kernel A's dS walk; a forward
walk for the states when they are recomputed) and one fully parallel
per-token kernel that rebuilds every gradient from a tile's inputs, the state
entering it and the dS leaving it (``kernel.reference.kda``). How often dS
and the states are stored, and in which dtype, decides how many bytes move
and how many GEMMs re-scan inside a group of tiles. This module counts both
from two tables, so that ``docs/kda_backward.md`` and this code cannot drift:

* :data:`GEMMS`: every GEMM of one tile (name, M, N, K), as in
  ``kernel/reference/kda.py``'s comments;
* :data:`TENSORS`: every per-token tensor (elements per token and head, dtype
  size) and which kernel reads or writes it.

A floor is the time at a device rate: bytes / :data:`COPY_BYTES_PER_S`
(DRAM read + write, as a device-to-device copy reaches it) and tensor FLOPs
/ :data:`MMA_FLOPS_PER_S` (bf16 dense mma). The rates are measured
constants; change one here and every table follows.

Run ``ptx-lab floors`` (``python -m kernel.tools.floors``) for the tables (``--copy-tbps``,
``--mma-tflops`` to try other rates).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Sequence

from kernel.reference import ragged_lengths
from kernel.shapes import HEAD_DIM, TILE_TOKENS

# H200, measured: device-to-device copy (read + write; 4.248 TB/s on 2026-12-01, `bash .ci/gpu-checks copy`)
# and bf16 dense mma
COPY_BYTES_PER_S = 4.248e12
MMA_FLOPS_PER_S = 790e12

HEADS = 32                # the bench's heads (H)
HEAD_DIM_K = HEAD_DIM_V = HEAD_DIM
BF16, FP32 = 2, 4


@dataclass(frozen=True)
class Gemm:
    name: str
    what: str
    m: str                # "C", "K" or "V"
    n: str
    k: str
    reads: str            # where the operands come from

    def flops(self, dims: dict) -> int:
        return 2 * dims[self.m] * dims[self.n] * dims[self.k]


GEMMS = {g.name: g for g in (
    Gemm("G1", "Mqk^T do", "C", "V", "C", "Mqk: global; do: global"),
    Gemm("G2", "Kr dS1", "C", "V", "K", "Kr: R1; dS1: snapshot or re-scan"),
    Gemm("G3", "INV^T dU", "C", "V", "C", "INV: global; dU: G1 + G2"),
    Gemm("G4", "Qd^T do", "K", "V", "C", "Qd: R1; do: global"),
    Gemm("G5", "Kd^T (beta dW)", "K", "V", "C", "Kd: R1; dW: G3"),
    Gemm("G6", "Kd S0", "C", "V", "K", "Kd: R1; S0: stored state or re-scan"),
    Gemm("G7", "INV (beta Vn)", "C", "V", "C", "INV: global; Vn = v - G6"),
    Gemm("G8", "Kr^T U", "K", "V", "C", "Kr: R1; U: G7"),
    Gemm("G9", "do U^T", "C", "C", "V", "do: global; U: G7"),
    Gemm("G10", "dW U^T", "C", "C", "V", "dW: G3; U: G7"),
    Gemm("G11", "do S0^T", "C", "K", "V", "do: global; S0"),
    Gemm("G12", "(beta dW) S0^T", "C", "K", "V", "dW: G3; S0"),
    Gemm("G13", "U dS1^T", "C", "K", "V", "U: G7; dS1"),
    Gemm("G14", "dMqk Kr", "C", "K", "C", "dMqk: G9 (strict lower); Kr: R1"),
    Gemm("G15", "dMqk^T Qe", "C", "K", "C", "dMqk: G9; Qe: R1"),
    Gemm("G16", "dLkk Kr", "C", "K", "C", "dLkk: G10 (strict lower); Kr: R1"),
    Gemm("G17", "dLkk^T (beta Ke)", "C", "K", "C", "dLkk: G10; Ke: R1"),
)}

# GEMMs run on every tile by each kernel; the re-scans run on a group's inner tiles
DSTATE_SCAN = ("G1", "G2", "G3", "G4", "G5")                      # Kernel A
STATE_SCAN = ("G6", "G7", "G8")                                     # forward states, recomputed
PER_TOKEN = ("G1", "G2", "G3", "G6", "G7", "G9", "G10", "G11", "G12", "G13",
             "G14", "G15", "G16", "G17")
DSTATE_RESCAN = ("G4", "G5")
STATE_RESCAN = ("G8",)


@dataclass(frozen=True)
class Tensor:
    name: str
    per_token: str        # elements per token and head: "K", "V", "C" or "1"
    size: int             # bytes per element
    read_by: tuple[str, ...]
    written_by: tuple[str, ...] = ()


# q, k, v, do, Mqk, INV in bf16 as the forward leaves them; the gate's cumsum,
# beta and their gradients in fp32; dq, dk, dv in bf16 (the inputs' dtype).
TENSORS = (
    Tensor("q", "K", BF16, ("dstate", "per_token")),
    Tensor("k", "K", BF16, ("dstate", "state", "per_token")),
    Tensor("v", "V", BF16, ("state", "per_token")),
    Tensor("do", "V", BF16, ("dstate", "per_token")),
    Tensor("gc", "K", FP32, ("dstate", "state", "per_token")),
    Tensor("beta", "1", FP32, ("dstate", "state", "per_token")),
    Tensor("Mqk", "C", BF16, ("dstate", "per_token")),
    Tensor("INV", "C", BF16, ("dstate", "state", "per_token")),
    Tensor("dq", "K", BF16, (), ("per_token",)),
    Tensor("dk", "K", BF16, (), ("per_token",)),
    Tensor("dv", "V", BF16, (), ("per_token",)),
    Tensor("dg", "K", FP32, (), ("per_token",)),
    Tensor("dbeta", "1", FP32, (), ("per_token",)),
)

KERNELS = ("dstate", "state", "per_token")
KERNEL_NAMES = {"dstate": "Kernel A (dS scan)", "state": "forward-state scan",
                "per_token": "per-token kernel"}


@dataclass(frozen=True)
class Design:
    name: str
    dstate_size: int          # bytes per element of a dS snapshot
    dstate_every: int         # tiles per dS snapshot
    states_saved: bool        # True: the forward leaves them; False: a forward scan recomputes them
    state_size: int
    state_every: int          # tiles per stored forward state


DESIGNS = (
    Design("fp32-every-tile dS, fp32 states every tile saved", FP32, 1, True, FP32, 1),
    Design("fp32-every-tile dS, bf16 states every 64 recomputed", FP32, 1, False, BF16, 4),
    Design("bf16-every-64 dS, bf16 states every 64 recomputed", BF16, 4, False, BF16, 4),
    Design("fp32-every-64 dS, fp32 states every 64 recomputed", FP32, 4, False, FP32, 4),
    Design("bf16-every-64 dS, bf16 states every 64 saved", BF16, 4, True, BF16, 4),
    Design("bf16-every-tile dS, bf16 states every 64 recomputed", BF16, 1, False, BF16, 4),
)
# docs/kda_backward.md, section 8: the design the GPU backward is built to
RECOMMENDED = next(d for d in DESIGNS if d.name == "bf16-every-64 dS, bf16 states every 64 recomputed")
# what kernel.kda_backward runs today (docs/kda_backward.md, section 9): Kernel B reads dS after
# every tile, so it needs no in-chunk re-scan of dS and no K x V matrices kept across tiles
BUILT = next(d for d in DESIGNS if d.name == "bf16-every-tile dS, bf16 states every 64 recomputed")

SHAPES = {
    "4x8192": [8192] * 4,
    "32x8192": [8192] * 32,
    "8x32768": [32768] * 8,
    "1x131072": [131072],
    "varlen 64 / 262144": ragged_lengths(64, 262144),
}


@dataclass(frozen=True)
class Count:
    bytes: dict               # kernel -> bytes
    flops: dict               # kernel -> tensor FLOPs

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())


def count(design: Design, lengths: Sequence[int], *, heads: int = HEADS, K: int = HEAD_DIM_K,
          V: int = HEAD_DIM_V, tile: int = TILE_TOKENS) -> Count:
    """Bytes and tensor FLOPs of each kernel of the backward for sequences of these lengths.

    Partial tiles cost a whole tile of GEMMs; snapshots and stored states count
    per sequence (ceil(n_t / every)), FLA's chunk_offsets packing. dht and the
    initial state are taken as present (read once per sequence), dh0 as written.
    """
    dims = {"C": tile, "K": K, "V": V, "1": 1}
    tokens = sum(lengths)
    tiles = sum(math.ceil(n / tile) for n in lengths)

    def groups(every: int) -> int:
        return sum(math.ceil(math.ceil(n / tile) / every) for n in lengths)

    state_bytes = K * V * heads
    per_seq = len(lengths) * state_bytes * FP32
    out_b = {name: 0.0 for name in KERNELS}
    for t in TENSORS:
        b = tokens * heads * dims[t.per_token] * t.size
        for kern in t.read_by + t.written_by:
            out_b[kern] += b
    snapshots = groups(design.dstate_every) * state_bytes * design.dstate_size
    states = groups(design.state_every) * state_bytes * design.state_size
    out_b["dstate"] += snapshots + 2 * per_seq          # writes dS, reads dht, writes dh0
    out_b["per_token"] += snapshots + states             # reads both
    if design.states_saved:
        out_b["state"] = 0.0
    else:
        out_b["state"] += states + per_seq               # writes the states, reads h0

    def flops(names, n_tiles) -> float:
        return heads * n_tiles * sum(GEMMS[g].flops(dims) for g in names)

    out_f = {
        "dstate": flops(DSTATE_SCAN, tiles),
        "state": 0.0 if design.states_saved else flops(STATE_SCAN, tiles),
        "per_token": flops(PER_TOKEN, tiles)
        + flops(DSTATE_RESCAN, tiles - groups(design.dstate_every))
        + flops(STATE_RESCAN, tiles - groups(design.state_every)),
    }
    return Count(out_b, out_f)


def byte_floor_ms(lengths: Sequence[int], *, heads: int = HEADS, design: Design = RECOMMENDED,
                  copy_bytes_per_s: float = COPY_BYTES_PER_S) -> float:
    """The whole backward's byte floor in ms: every byte `count` says the design moves, at the copy rate."""
    return count(design, lengths, heads=heads).total_bytes / copy_bytes_per_s * 1e3


@dataclass(frozen=True)
class Floor:
    design: str
    shape: str
    gbytes: float
    byte_ms: float
    tflops: float
    tensor_ms: float


def floors(copy_bytes_per_s: float = COPY_BYTES_PER_S,
           mma_flops_per_s: float = MMA_FLOPS_PER_S) -> list[Floor]:
    """Every design at every shape: bytes and the byte floor, tensor FLOPs and the tensor floor."""
    out = []
    for d in DESIGNS:
        for shape, lengths in SHAPES.items():
            c = count(d, lengths)
            out.append(Floor(d.name, shape, c.total_bytes / 1e9,
                             c.total_bytes / copy_bytes_per_s * 1e3, c.total_flops / 1e12,
                             c.total_flops / mma_flops_per_s * 1e3))
    return out


# ----------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------

def _gemm_table() -> list[str]:
    """Every GEMM of a tile: M/N/K, operands, FLOPs per tile, which kernels run it."""
    dims = {"C": TILE_TOKENS, "K": HEAD_DIM_K, "V": HEAD_DIM_V}
    runs = {"Kernel A": DSTATE_SCAN, "state scan": STATE_SCAN, "per-token": PER_TOKEN,
            "per-token (inner tiles)": DSTATE_RESCAN + STATE_RESCAN}
    lines = [f"GEMMs of one tile and head (C = {TILE_TOKENS}, K = {HEAD_DIM_K}, V = {HEAD_DIM_V})",
             "| GEMM | product | M x N x K | operands | FLOP | run by |",
             "|---|---|---|---|---:|---|"]
    for g in GEMMS.values():
        by = ", ".join(k for k, names in runs.items() if g.name in names)
        lines.append(f"| {g.name} | {g.what} | {g.m} x {g.n} x {g.k} | {g.reads} | "
                     f"{g.flops(dims):,} | {by} |")
    return lines


def _per_token_table() -> list[str]:
    """Bytes and FLOPs per token and head of each kernel, for long sequences."""
    lines = ["per token and head (H = 32, K = V = 128, 16-token tiles, long sequences)",
             "| design | Kernel A B | state scan B | per-token B | total B | total FLOP |",
             "|---|---:|---:|---:|---:|---:|"]
    n = 1 << 20
    for d in DESIGNS:
        c = count(d, [n], heads=1)
        b = {k: v / n for k, v in c.bytes.items()}
        lines.append(f"| {d.name} | {b['dstate']:,.0f} | {b['state']:,.0f} | "
                     f"{b['per_token']:,.0f} | {sum(b.values()):,.0f} | "
                     f"{c.total_flops / n:,.0f} |")
    return lines


def _floor_table(rows: list[Floor], copy: float, mma: float) -> list[str]:
    shapes = list(SHAPES)
    lines = [f"floors in ms: bytes at {copy / 1e12:.2f} TB/s / tensor FLOPs at "
             f"{mma / 1e12:.0f} TFLOP/s",
             "| design | " + " | ".join(shapes) + " |",
             "|---|" + "---:|" * len(shapes)]
    for d in DESIGNS:
        cells = []
        for s in shapes:
            f = next(r for r in rows if r.design == d.name and r.shape == s)
            cells.append(f"{f.byte_ms:.2f} / {f.tensor_ms:.2f}")
        lines.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return lines


def _kernel_table(shape: str, copy: float) -> list[str]:
    lines = [f"byte floor of each kernel at {shape}, ms",
             "| design | " + " | ".join(KERNEL_NAMES[k] for k in KERNELS) + " |",
             "|---|" + "---:|" * len(KERNELS)]
    for d in DESIGNS:
        c = count(d, SHAPES[shape])
        lines.append(f"| {d.name} | "
                     + " | ".join(f"{c.bytes[k] / copy * 1e3:.2f}" for k in KERNELS) + " |")
    return lines


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.floors") -> None:
    ap = argparse.ArgumentParser(prog=prog,
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--copy-tbps", type=float, default=COPY_BYTES_PER_S / 1e12,
                    help="DRAM read + write rate, TB/s (default: the measured copy)")
    ap.add_argument("--mma-tflops", type=float, default=MMA_FLOPS_PER_S / 1e12,
                    help="bf16 dense mma rate, TFLOP/s (default: the measured rate)")
    ap.add_argument("--gemms", action="store_true", help="print the GEMM table only")
    a = ap.parse_args(argv)
    if a.gemms:
        print("\n".join(_gemm_table()))
        return
    copy, mma = a.copy_tbps * 1e12, a.mma_tflops * 1e12
    rows = floors(copy, mma)
    print("\n".join(_per_token_table()))
    print()
    print("\n".join(_floor_table(rows, copy, mma)))
    print()
    print("\n".join(_kernel_table("32x8192", copy)))


if __name__ == "__main__":
    main()
