"""Byte and tensor-core floors of the whole KDA backward and of the forward, per design, from GEMMs and tensors.

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

The forward (our own, counted before it is built) has the same two
kinds of table: :data:`FORWARD_GEMMS` (one 16-token tile of our design, each
GEMM on the serial state chain or off it) and :data:`FLA_FORWARD_GEMMS` (FLA
0.6.0's, per 64-token chunk), :data:`FORWARD_TENSORS` and, per design in
:data:`FORWARD_DESIGNS`, what each kernel reads and writes: FLA's forward
kernel by kernel as its source has it, one-pass designs that save nothing
(inference), what our backward reads today, or the states only, and two that
take the state-free products off the chain (a products pass before the one
pass; three passes with the chain in 64-token steps, for few sequences). Beside
the floors: FLA's and cuDNN's measured forward, and the latency of the state
chain at B = 1, in 16-token tiles and in 64-token steps.

A floor is the time at a device rate: bytes / :data:`COPY_BYTES_PER_S`
(DRAM read + write, as a device-to-device copy reaches it) and tensor FLOPs
/ :data:`MMA_FLOPS_PER_S` (bf16 dense mma). The rates are measured
constants; change one here and every table follows.

Run ``ptx-lab floors`` (``python -m kernel.tools.floors``) for the backward's tables,
``ptx-lab floors --forward`` for the forward's (``--gemms`` for the GEMM tables only;
``--copy-tbps``, ``--mma-tflops`` to try other rates).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Sequence

from kernel.reference import ragged_lengths
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, TILES_PER_CHUNK, TILE_TOKENS

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

# The tile's own products, which the forward computes and the backward reads as Mqk and INV (the
# 16 x 16 diagonal blocks of FLA's Aqk and Akk), or rebuilds from q, k, gc and beta. INV's 2 C^3
# is the forward substitution FLA runs on CUDA cores (C rows, each a [1, C] x [C, C] product).
TILE_PRODUCTS = {g.name: g for g in (
    Gemm("A1", "Qe Kr^T (Mqk below its diagonal)", "C", "C", "K", "Qe, Kr: R1"),
    Gemm("A2", "Ke Kr^T (Akk)", "C", "C", "K", "Ke, Kr: R1"),
    Gemm("INV", "(I + diag(beta) Akk)^-1", "C", "C", "C", "Akk: A2; beta: global"),
)}
# what a backward that rebuilds Mqk or INV runs instead of reading it
REBUILT_FROM = {"Mqk": ("A1",), "INV": ("A2", "INV")}

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
          V: int = HEAD_DIM_V, tile: int = TILE_TOKENS, rebuilt: Sequence[str] = ()) -> Count:
    """Bytes and tensor FLOPs of each kernel of the backward for sequences of these lengths.

    Partial tiles cost a whole tile of GEMMs; snapshots and stored states count
    per sequence (ceil(n_t / every)), FLA's chunk_offsets packing. dht and the
    initial state are taken as present (read once per sequence), dh0 as written.
    ``rebuilt`` names tensors of :data:`REBUILT_FROM` (Mqk, INV) that every kernel
    rebuilds on chip instead of reading: their bytes go, their GEMMs come in.
    """
    unknown = sorted(set(rebuilt) - set(REBUILT_FROM))
    if unknown:
        raise ValueError(f"rebuilt must name tensors of {sorted(REBUILT_FROM)}, got {unknown}")
    dims = {"C": tile, "K": K, "V": V, "1": 1}
    tokens = sum(lengths)
    tiles = sum(math.ceil(n / tile) for n in lengths)

    def groups(every: int) -> int:
        return sum(math.ceil(math.ceil(n / tile) / every) for n in lengths)

    state_bytes = K * V * heads
    per_seq = len(lengths) * state_bytes * FP32
    out_b = {name: 0.0 for name in KERNELS}
    rebuild = {name: 0.0 for name in KERNELS}            # FLOPs a tile
    for t in TENSORS:
        b = tokens * heads * dims[t.per_token] * t.size
        for kern in t.read_by + t.written_by:
            if t.name in rebuilt and kern in t.read_by:
                rebuild[kern] += sum(TILE_PRODUCTS[g].flops(dims) for g in REBUILT_FROM[t.name])
            else:
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
    for kern in KERNELS:
        if out_f[kern]:                                  # a kernel that runs (the state scan may not)
            out_f[kern] += heads * tiles * rebuild[kern]
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


def _floor_rows(designs, shapes: dict, count_of, copy_bytes_per_s: float, mma_flops_per_s: float) -> list[Floor]:
    """Every design at every shape, counted by ``count_of(design, lengths)``: bytes and the byte floor,
    tensor FLOPs and the tensor floor."""
    out = []
    for d in designs:
        for shape, lengths in shapes.items():
            c = count_of(d, lengths)
            out.append(Floor(d.name, shape, c.total_bytes / 1e9, c.total_bytes / copy_bytes_per_s * 1e3,
                             c.total_flops / 1e12, c.total_flops / mma_flops_per_s * 1e3))
    return out


def floors(copy_bytes_per_s: float = COPY_BYTES_PER_S,
           mma_flops_per_s: float = MMA_FLOPS_PER_S) -> list[Floor]:
    """Every backward design at every shape: bytes and the byte floor, tensor FLOPs and the tensor floor."""
    return _floor_rows(DESIGNS, SHAPES, count, copy_bytes_per_s, mma_flops_per_s)


# ----------------------------------------------------------------------------
# the forward: our one-pass designs against FLA 0.6.0's chunk_kda_fwd
# ----------------------------------------------------------------------------
#
# Our own forward, counted before it is built. Our design walks each sequence in 16-token tiles
# with the backward's tile algebra (docs/kda_backward.md, section 2; kernel/reference/kda.py,
# _tile_forward): per tile the intra-tile products, which need no state and can run for any tile at
# any time, then the serial chain S -> S (G6 -> G7 -> G8) and the output hanging off it. FLA's
# forward is the yardstick: its kernels, what each reads and writes, and its GEMMs per 64-token
# chunk, read from fla-core 0.6.0's source (fla/ops/kda/chunk_fwd.py, chunk_intra.py, wy_fast.py,
# fla/ops/common/chunk_delta_h.py, fla/ops/gla/chunk.py).


@dataclass(frozen=True)
class Stage:
    """A GEMM as a kernel runs it: ``times`` per unit of tokens (our tile, or FLA's 64-token chunk)."""
    gemm: Gemm
    kernel: str
    times: int = 1
    role: str = "parallel"    # "chain": on S -> S; "off chain": reads S or U, feeds no later S;
    #                           "parallel": needs no state
    unit: str = "mma"         # "mma" (bf16), "mma tf32" or "CUDA cores"
    reads: str = ""           # where the operands come from here, where not as ``gemm.reads`` says

    @property
    def operands(self) -> str:
        return self.reads or self.gemm.reads


ONE_PASS = "one pass"
FORWARD_GEMMS = (             # our forward, one 16-token tile and head
    Stage(TILE_PRODUCTS["A1"], ONE_PASS),
    Stage(TILE_PRODUCTS["A2"], ONE_PASS),
    Stage(TILE_PRODUCTS["INV"], ONE_PASS, unit="CUDA cores"),
    Stage(GEMMS["G6"], ONE_PASS, role="chain", reads="Kd: R1; S0: the chain"),
    Stage(GEMMS["G7"], ONE_PASS, role="chain", reads="INV: on chip; Vn = v - G6"),
    Stage(GEMMS["G8"], ONE_PASS, role="chain", reads="Kr: R1; U: G7"),
    Stage(Gemm("F1", "Qd S0", "C", "V", "K", "Qd: R1; S0: the chain (one GEMM with G6, M = 2C)"),
          ONE_PASS, role="off chain"),
    Stage(Gemm("F2", "Mqk U", "C", "V", "C", "Mqk: A1 + diag(s q . k); U: G7"), ONE_PASS, role="off chain"),
)

FLA_INTRA, FLA_INTER, FLA_WU, FLA_H, FLA_O = (
    "chunk_kda_fwd_kernel_intra_sub_chunk", "chunk_kda_fwd_kernel_inter_solve_fused",
    "recompute_w_u_fwd_kda_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_gla_fwd_kernel_o")
BELOW_DIAGONAL = TILES_PER_CHUNK * (TILES_PER_CHUNK - 1) // 2   # 16 x 16 blocks below a chunk's diagonal
FLA_FORWARD_GEMMS = (         # FLA 0.6.0 with safe_gate, one 64-token chunk (BT) and head
    Stage(Gemm("Aqk diag", "(q 2^g) (k 2^-g)^T, diagonal blocks", "C", "C", "K", "q, k, gc: global"),
          FLA_INTRA, TILES_PER_CHUNK),
    Stage(Gemm("Akk diag", "(k 2^g) (k 2^-g)^T, diagonal blocks", "C", "C", "K", "k, gc, beta: global"),
          FLA_INTRA, TILES_PER_CHUNK),
    Stage(TILE_PRODUCTS["INV"], FLA_INTRA, TILES_PER_CHUNK, unit="CUDA cores"),
    Stage(Gemm("Aqk below", "(q 2^g) (k 2^-g)^T, blocks below the diagonal", "C", "C", "K",
               "q, k, gc: global"), FLA_INTER, BELOW_DIAGONAL),
    Stage(Gemm("Akk below", "(k 2^g) (k 2^-g)^T, blocks below the diagonal", "C", "C", "K",
               "k, gc, beta: global"), FLA_INTER, BELOW_DIAGONAL),
    # the 64 x 64 inverse's blocks below the diagonal from the diagonal ones: 2 + 2 + 3 + 2 + 3 + 4
    # dots of 16 x 16 x 16 in the source, at tf32
    Stage(Gemm("Akk^-1 merge", "the inverse's blocks below the diagonal", "C", "C", "C",
               "Akkd: global; Akk below: on chip"), FLA_INTER, 16, unit="mma tf32"),
    Stage(Gemm("w", "Akk^-1 (beta k 2^g)", "BT", "K", "BT", "Akk, k, beta, gc: global"), FLA_WU),
    Stage(Gemm("u", "Akk^-1 (beta v)", "BT", "V", "BT", "Akk, v, beta: global"), FLA_WU),
    Stage(Gemm("v_new", "u - w h", "BT", "V", "K", "u, w: global; h: the chain"), FLA_H, role="chain"),
    Stage(Gemm("h", "h 2^gT + kg^T v_new", "K", "V", "BT", "kg: global; v_new: on chip"), FLA_H, role="chain"),
    Stage(Gemm("qg h", "(q 2^g) h", "BT", "V", "K", "q, gc, h: global"), FLA_O, role="off chain"),
    Stage(Gemm("Aqk v_new", "Aqk v_new", "BT", "V", "BT", "Aqk, v_new: global"), FLA_O, role="off chain"),
)


@dataclass(frozen=True)
class FwdTensor:
    name: str
    per: str              # elements per token and head: "K", "V", "C", "BT" or "1";
    #                       or one K x V state per 64-token "chunk" or per "sequence"
    size: int             # bytes per element
    what: str


FORWARD_TENSORS = {t.name: t for t in (
    FwdTensor("q", "K", BF16, "the call's q (raw when the l2norm is in the op)"),
    FwdTensor("k", "K", BF16, "the call's k"),
    FwdTensor("v", "V", BF16, "the call's v"),
    FwdTensor("g", "K", FP32, "the per-token log gate, activated"),
    FwdTensor("g_raw", "K", BF16, "the gate's raw projection (use_gate_in_kernel)"),
    FwdTensor("beta", "1", FP32, "after its sigmoid"),
    FwdTensor("h0", "sequence", FP32, "the initial state"),
    FwdTensor("ht", "sequence", FP32, "the final state"),
    FwdTensor("o", "V", BF16, "the output"),
    FwdTensor("qn", "K", BF16, "l2norm(q)"),
    FwdTensor("kn", "K", BF16, "l2norm(k)"),
    FwdTensor("q_rstd", "1", FP32, "1 / norm(q), for the l2norm's backward (in Kernel B's epilogue)"),
    FwdTensor("k_rstd", "1", FP32, "1 / norm(k)"),
    FwdTensor("gc", "K", FP32, "the gate's 64-chunk-local cumsum / ln 2 (FLA's g_cumsum)"),
    FwdTensor("Aqk", "BT", BF16, "FLA's [.., 64] rows: Mqk over the chunk"),
    FwdTensor("Aqk_lo", "BT", BF16, "bf16(Aqk - bf16(Aqk)): the three passes' o pass reads Aqk in two parts"),
    FwdTensor("Akk", "BT", BF16, "FLA's [.., 64] rows: (I + Lkk)^-1 over the chunk"),
    FwdTensor("Akkd", "C", FP32, "FLA's fp32 diagonal blocks of Akk, then of its inverse"),
    FwdTensor("Mqk", "C", BF16, "Aqk's 16 x 16 diagonal blocks only"),
    FwdTensor("INV", "C", BF16, "Akk's 16 x 16 diagonal blocks only"),
    FwdTensor("w", "K", BF16, "Akk^-1 (beta k 2^g)"),
    FwdTensor("u", "V", BF16, "Akk^-1 (beta v)"),
    FwdTensor("kg", "K", BF16, "k decayed to its chunk's end"),
    FwdTensor("v_new", "V", BF16, "u - w h (our U)"),
    FwdTensor("h", "chunk", BF16, "the state entering every 64-token chunk"),
)}


@dataclass(frozen=True)
class FwdKernel:
    name: str
    reads: tuple          # (tensor, share): share = the fraction of the tensor's elements it moves
    writes: tuple
    note: str = ""


DIAGONAL_BLOCK = TILE_TOKENS / CHUNK_TOKENS              # a 16-column block of a 64-wide row
L2NORM_PASS = FwdKernel("l2norm_fwd_kernel (q, then k)", (("q", 1), ("k", 1)),
                        (("qn", 1), ("kn", 1), ("q_rstd", 1), ("k_rstd", 1)))


def _fla_kernels(gate: str) -> tuple[FwdKernel, ...]:
    """FLA 0.6.0's forward as autograd runs it (use_qk_l2norm_in_kernel, safe_gate,
    disable_recompute False), kernel by kernel; ``gate``: "g" given, or "g_raw" activated in the op."""
    cumsum = "chunk_local_cumsum_vector_kernel" if gate == "g" else "kda_gate_chunk_cumsum_vector_kernel"
    return (
        L2NORM_PASS,
        FwdKernel(cumsum, ((gate, 1),), (("gc", 1),)),
        FwdKernel("torch.zeros (Akk)", (), (("Akk", 1),), "Akk is zeroed: the solve writes its lower blocks"),
        FwdKernel(FLA_INTRA, (("qn", 1), ("kn", 1), ("gc", 1), ("beta", 1)),
                  (("Aqk", DIAGONAL_BLOCK), ("Akkd", 1)),
                  "Akkd is stored twice in place (the products, then their inverse): counted once"),
        # row block i of a chunk holds i blocks below the diagonal; block 0's q and beta are not read
        FwdKernel(FLA_INTER, (("qn", 1 - 1 / TILES_PER_CHUNK), ("kn", 1), ("gc", 1),
                              ("beta", 1 - 1 / TILES_PER_CHUNK), ("Akkd", 1)),
                  (("Aqk", (TILES_PER_CHUNK - 1) / 2 * DIAGONAL_BLOCK),
                   ("Akk", (TILES_PER_CHUNK + 1) / 2 * DIAGONAL_BLOCK))),
        FwdKernel(FLA_WU, (("kn", 1), ("v", 1), ("beta", 1), ("Akk", 1), ("gc", 1)),
                  (("w", 1), ("u", 1), ("kg", 1))),
        FwdKernel(FLA_H, (("kg", 1), ("w", 1), ("u", 1), ("gc", 1 / CHUNK_TOKENS), ("h0", 1)),
                  (("h", 1), ("v_new", 1), ("ht", 1)),
                  "one CTA per V block reads all of kg and w: counted once (estimate: the blocks walk "
                  "the chunks together, so L2 serves the repeats); gc: the chunk's last row"),
        FwdKernel("torch.zeros (o, ht)", (), (("o", 1), ("ht", 1))),
        FwdKernel(FLA_O, (("qn", 1), ("gc", 1), ("h", 1), ("v_new", 1), ("Aqk", 1)), (("o", 1),),
                  "one CTA per V block (BV 64 or 128) reads qn, gc and Aqk: counted once (estimate)"),
    )


def _one_pass(*, gate: str = "g", l2norm_pass: bool = False, saves: tuple = ()) -> tuple[FwdKernel, ...]:
    """One kernel: read the inputs once, write o, the final state and ``saves``. With ``l2norm_pass``,
    FLA's l2norm_fwd runs first and the kernel reads its qn, kn (else it normalises on chip)."""
    q, k = ("qn", "kn") if l2norm_pass else ("q", "k")
    body = FwdKernel(ONE_PASS, ((q, 1), (k, 1), ("v", 1), (gate, 1), ("beta", 1), ("h0", 1)),
                     (("o", 1), ("ht", 1)) + tuple((name, 1) for name in saves))
    return ((L2NORM_PASS,) if l2norm_pass else ()) + (body,)


# kernel.kda_backward.run's inputs that the forward makes (v, beta and h0 are the caller's):
# q and k as the forward used them with the l2 norms for the l2norm's backward (Kernel B), the gate's 64-chunk
# cumsum, Mqk and INV (the diagonal blocks of Aqk and Akk: all its kernels read of them), the states
OUR_BACKWARD_READS = ("qn", "kn", "q_rstd", "k_rstd", "gc", "Mqk", "INV", "h")
# our backward today (BUILT) on states the forward saved: the forward-state scan goes
SAVED_STATES = Design("bf16-every-tile dS, bf16 states every 64 saved", BF16, 1, True, BF16, TILES_PER_CHUNK)


# kernel.chunk_kda's one pass today (kernel.fla_dropin.setting.RAW_QK_ROWS): the rstd pass writes each row's rstd
# alone; the one pass reads the raw rows with it and sums each token's gate itself, and the backward reads the
# caller's q, k and g with the rstd, Mqk, INV and the states: no normalised copy and no cumsum is written
RSTD_PASS = FwdKernel("kda_row_rstd (q and k)", (("q", 1), ("k", 1)), (("q_rstd", 1), ("k_rstd", 1)))


def _rstd_then_one_pass() -> tuple[FwdKernel, ...]:
    body = FwdKernel(ONE_PASS, (("q", 1), ("k", 1), ("q_rstd", 1), ("k_rstd", 1), ("v", 1), ("g", 1), ("beta", 1),
                                ("h0", 1)),
                     (("o", 1), ("ht", 1), ("Mqk", 1), ("INV", 1), ("h", 1)))
    return RSTD_PASS, body


# Two passes: the state-free products (Mqk, INV) of every tile first, across all SMs, then the chain,
# which reads them instead of forming them. Where a (sequence, head) spans several CTAs (B = 1: 8 at
# 16 heads) the one pass forms them in every CTA, on the producers' path of every tile.
PRODUCTS_PASS, CHAIN_PASS = "products pass", "chain pass"
PRODUCTS_FIRST_GEMMS = tuple(replace(s, kernel=PRODUCTS_PASS if s.role == "parallel" else CHAIN_PASS)
                             for s in FORWARD_GEMMS)


def _products_first(saves: tuple) -> tuple[FwdKernel, ...]:
    """The products pass (raw q and k, normalised on chip like the one pass), then the chain pass,
    which writes o, the final state and ``saves`` (Mqk and INV are the first pass's)."""
    products = FwdKernel(PRODUCTS_PASS, (("q", 1), ("k", 1), ("g", 1), ("beta", 1)), (("Mqk", 1), ("INV", 1)),
                         "R1's Qe, Ke and Kr on chip, one tile a warp, no state")
    chain = FwdKernel(CHAIN_PASS, (("q", 1), ("k", 1), ("v", 1), ("g", 1), ("beta", 1), ("h0", 1), ("Mqk", 1),
                                   ("INV", 1)),
                      (("o", 1), ("ht", 1)) + tuple((name, 1) for name in saves if name not in ("Mqk", "INV")))
    return products, chain


# Three passes, for few sequences x heads, where the one pass's chain of 16-token tiles is the time
# (1x131072: 8,192 tiles in series): every 64-token chunk's state-free products across all SMs (w, u, kg
# and Aqk as FLA's forward makes them, and what our backward reads: Aqk holds Mqk's blocks, and INV is
# the diagonal blocks of the chunk's inverse), then the chain in 64-token steps (FLA's h kernel's two
# GEMMs a step: 2,048 steps at 1x131072), then o from the states across all SMs (FLA's o kernel).
THREE_PRODUCTS, THREE_CHAIN, THREE_O = "products pass (64-token chunks)", "chain pass (64-token steps)", "o pass"
THREE_PASS_GEMMS = tuple(replace(s, kernel={FLA_H: THREE_CHAIN, FLA_O: THREE_O}.get(s.kernel, THREE_PRODUCTS))
                         for s in FLA_FORWARD_GEMMS)


def _three_passes(saves: tuple) -> tuple[FwdKernel, ...]:
    """The products pass (raw q and k, normalised on chip), the 64-token chain, the o pass; ``saves`` as
    the one pass's (the states from the chain, Mqk inside Aqk)."""
    products = FwdKernel(THREE_PRODUCTS, (("q", 1), ("k", 1), ("v", 1), ("g", 1), ("beta", 1)),
                         tuple((name, 1) for name in saves if name not in ("h", "Mqk"))
                         + (("Aqk", 1), ("Aqk_lo", 1), ("w", 1), ("u", 1), ("kg", 1)),
                         "the chunk's 64 x 64 inverse on chip; Aqk whole, in two parts (the o pass reads them)")
    chain = FwdKernel(THREE_CHAIN, (("kg", 1), ("w", 1), ("u", 1), ("gc", 1 / CHUNK_TOKENS), ("h0", 1)),
                      (("h", 1), ("v_new", 1), ("ht", 1)),
                      "one CTA per V block reads all of kg and w: counted once (L2 serves the repeats)")
    o = FwdKernel(THREE_O, (("qn", 1), ("gc", 1), ("h", 1), ("v_new", 1), ("Aqk", 1), ("Aqk_lo", 1)), (("o", 1),))
    return products, chain, o


@dataclass(frozen=True)
class ForwardDesign:
    name: str
    kernels: tuple[FwdKernel, ...]
    gemms: tuple[Stage, ...]
    gemm_tokens: int                  # tokens one unit of ``gemms`` covers
    backward: Design | None = None    # the backward that reads what it leaves (None: inference)
    rebuilt: tuple[str, ...] = ()     # what that backward rebuilds instead of reading


FORWARD_DESIGNS = (
    ForwardDesign("FLA 0.6.0", _fla_kernels("g"), FLA_FORWARD_GEMMS, CHUNK_TOKENS, BUILT),
    ForwardDesign("FLA 0.6.0, gate in the op", _fla_kernels("g_raw"), FLA_FORWARD_GEMMS, CHUNK_TOKENS, BUILT),
    ForwardDesign("one pass, inference", _one_pass(), FORWARD_GEMMS, TILE_TOKENS),
    ForwardDesign("one pass, inference, gate in the op", _one_pass(gate="g_raw"), FORWARD_GEMMS, TILE_TOKENS),
    ForwardDesign("one pass, inference, l2norm a pass before", _one_pass(l2norm_pass=True), FORWARD_GEMMS,
                  TILE_TOKENS),
    ForwardDesign("one pass, for our backward on normalised copies", _one_pass(saves=OUR_BACKWARD_READS),
                  FORWARD_GEMMS, TILE_TOKENS, SAVED_STATES),
    ForwardDesign("the rstd pass, then one pass, for our backward on raw rows", _rstd_then_one_pass(),
                  FORWARD_GEMMS, TILE_TOKENS, SAVED_STATES),
    ForwardDesign("products a pass before, for our backward on normalised copies",
                  _products_first(OUR_BACKWARD_READS), PRODUCTS_FIRST_GEMMS, TILE_TOKENS, SAVED_STATES),
    ForwardDesign("three passes (64-token chain), for our backward on normalised copies",
                  _three_passes(OUR_BACKWARD_READS), THREE_PASS_GEMMS, CHUNK_TOKENS, SAVED_STATES),
    ForwardDesign("one pass, states only (backward rebuilds Mqk, INV)", _one_pass(saves=("h",)), FORWARD_GEMMS,
                  TILE_TOKENS, SAVED_STATES, rebuilt=("Mqk", "INV")),
)
FLA_FORWARD = FORWARD_DESIGNS[0]
# the forward's moonshot (within 2x of its byte floor at 32x8192) is this design's: o, the final
# state and the bf16 states
STATES_ONLY = FORWARD_DESIGNS[-1]

FORWARD_SHAPES = {**SHAPES, "varlen 24 / 131072": ragged_lengths(24, 131072)}
# the forward of a training step through torch autograd, one H200, 2026-12-02 (H = 32, K = V = 128,
# q and k l2-normalised in the op, given gates and beta, safe_gate with lower_bound -5, h0 and the final
# state): FLA's chunk_kda and cuDNN frontend's kda_hopper_cuda, ms. The measured varlen batch had 24
# sequences of 306..15330 tokens, not this module's draw (its bytes differ by partial tiles only).
FORWARD_MEASURED_MS = {
    "4x8192": (3.78, 4.70),
    "32x8192": (26.8, 36.1),
    "1x131072": (17.0, 18.2),
    "varlen 24 / 131072": (14.3, 19.1),
}
# Kernel S's chain, one 16-token tile: G6 -> G7 -> G8 and the state's decay, with 2 consumer warps,
# one CTA an SM (1x131072: 8,192 tiles in series; log 36)
CHAIN_TILE_S = 0.69e-6
# the serial step of 64 tokens (v_new = u - w S, then S's update: 8 + 4 dependent k-steps), measured alone
# on 128 CTAs with a bf16 state stored a step: 1.791 ms for 2,048 steps (Kernel A's composed step,
# docs/log/26-b1-redesign-in-parts.md; the forward's chain step has the same two GEMMs)
CHAIN_STEP_S = 1.791e-3 / 2048


def _elements(t: FwdTensor, lengths: Sequence[int], heads: int) -> int:
    if t.per == "chunk":
        return heads * sum(math.ceil(n / CHUNK_TOKENS) for n in lengths) * HEAD_DIM * HEAD_DIM
    if t.per == "sequence":
        return heads * len(lengths) * HEAD_DIM * HEAD_DIM
    dims = {"K": HEAD_DIM, "V": HEAD_DIM, "C": TILE_TOKENS, "BT": CHUNK_TOKENS, "1": 1}
    return heads * sum(lengths) * dims[t.per]


def kernel_bytes(kernel: FwdKernel, lengths: Sequence[int], *, heads: int = HEADS) -> tuple[float, float]:
    """(bytes read, bytes written) of one forward kernel for sequences of these lengths. Shares of
    a chunk's rows (FLA's blocks) are taken over all tokens: exact for whole chunks."""
    def moved(accesses) -> float:
        return sum(share * _elements(FORWARD_TENSORS[name], lengths, heads) * FORWARD_TENSORS[name].size
                   for name, share in accesses)
    return moved(kernel.reads), moved(kernel.writes)


def forward_count(design: ForwardDesign, lengths: Sequence[int], *, heads: int = HEADS) -> Count:
    """Bytes and tensor FLOPs of each kernel of a forward design. Partial tiles (chunks, for FLA)
    cost whole ones; the CUDA-core INV is counted with the tensor FLOPs (under 1% of them)."""
    dims = {"C": TILE_TOKENS, "BT": CHUNK_TOKENS, "K": HEAD_DIM, "V": HEAD_DIM}
    out_b = {k.name: sum(kernel_bytes(k, lengths, heads=heads)) for k in design.kernels}
    units = sum(math.ceil(n / design.gemm_tokens) for n in lengths)
    out_f = {k.name: 0.0 for k in design.kernels}
    for s in design.gemms:
        out_f[s.kernel] += heads * units * s.times * s.gemm.flops(dims)
    return Count(out_b, out_f)


def backward_after(design: ForwardDesign, lengths: Sequence[int], *, heads: int = HEADS) -> Count | None:
    """The count of the backward that reads what ``design`` leaves (None for inference)."""
    if design.backward is None:
        return None
    return count(design.backward, lengths, heads=heads, rebuilt=design.rebuilt)


def chain_tiles(lengths: Sequence[int], tokens: int = TILE_TOKENS) -> int:
    """The serial chain of one CTA per (sequence, head, v-group): the longest sequence's steps of ``tokens``
    (a tile; or CHUNK_TOKENS, the chain in 64-token steps)."""
    return max(math.ceil(n / tokens) for n in lengths)


def chain_floor_ms(lengths: Sequence[int], tile_s: float = CHAIN_TILE_S, tokens: int = TILE_TOKENS) -> float:
    """The latency floor of that chain at ``tile_s`` a step: Kernel S's measured tile, or CHAIN_STEP_S with
    64-token steps."""
    return chain_tiles(lengths, tokens) * tile_s * 1e3


def forward_floors(copy_bytes_per_s: float = COPY_BYTES_PER_S,
                   mma_flops_per_s: float = MMA_FLOPS_PER_S) -> list[Floor]:
    """Every forward design at every shape: bytes and the byte floor, tensor FLOPs and the tensor floor."""
    return _floor_rows(FORWARD_DESIGNS, FORWARD_SHAPES, forward_count, copy_bytes_per_s, mma_flops_per_s)


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


def _floor_table(rows: list[Floor], copy: float, mma: float, designs=None, shapes=None,
                 title: str = "floors") -> list[str]:
    """One row a design, one column a shape: byte floor / tensor floor in ms (the backward's designs
    and shapes unless others are given)."""
    designs = DESIGNS if designs is None else designs
    shapes = list(SHAPES if shapes is None else shapes)
    lines = [f"{title} in ms: bytes at {copy / 1e12:.2f} TB/s / tensor FLOPs at "
             f"{mma / 1e12:.0f} TFLOP/s",
             "| design | " + " | ".join(shapes) + " |",
             "|---|" + "---:|" * len(shapes)]
    for d in designs:
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


def _forward_gemm_table() -> list[str]:
    """Our forward's GEMMs a tile, then FLA's a chunk: shapes, FLOPs, and where each sits."""
    dims = {"C": TILE_TOKENS, "BT": CHUNK_TOKENS, "K": HEAD_DIM, "V": HEAD_DIM}
    lines = [f"GEMMs of our forward, one tile and head (C = {TILE_TOKENS}, K = V = {HEAD_DIM})",
             "| GEMM | product | M x N x K | operands | FLOP | runs on | role |",
             "|---|---|---|---|---:|---|---|"]
    for s in FORWARD_GEMMS:
        g = s.gemm
        lines.append(f"| {g.name} | {g.what} | {g.m} x {g.n} x {g.k} | {s.operands} | {g.flops(dims):,} | "
                     f"{s.unit} | {s.role} |")
    lines += ["", _roles(FORWARD_GEMMS, dims, TILE_TOKENS, "tile"), "",
              f"FLA 0.6.0's forward GEMMs, one chunk and head (BT = {CHUNK_TOKENS}, C = {TILE_TOKENS})",
              "| kernel | GEMM | product | M x N x K | times | FLOP | runs on | role |",
              "|---|---|---|---|---:|---:|---|---|"]
    for s in FLA_FORWARD_GEMMS:
        g = s.gemm
        lines.append(f"| {s.kernel} | {g.name} | {g.what} | {g.m} x {g.n} x {g.k} | {s.times} | "
                     f"{s.times * g.flops(dims):,} | {s.unit} | {s.role} |")
    lines += ["", _roles(FLA_FORWARD_GEMMS, dims, CHUNK_TOKENS, "chunk")]
    return lines


def _roles(stages: tuple[Stage, ...], dims: dict, tokens: int, unit: str) -> str:
    by = {}
    for s in stages:
        by[s.role] = by.get(s.role, 0) + s.times * s.gemm.flops(dims)
    total = sum(by.values())
    parts = ", ".join(f"{role} {f:,}" for role, f in by.items())
    return f"a {unit}: {parts}; {total:,} FLOP in all, {total // tokens:,} a token"


def _forward_tensor_table() -> list[str]:
    """Every tensor a forward design moves: its size per token and head, and what it is."""
    lines = [f"tensors of the forward (K = V = {HEAD_DIM}; a state is K x V)",
             "| tensor | bytes | what |", "|---|---:|---|"]
    for t in FORWARD_TENSORS.values():
        one = _elements(t, [CHUNK_TOKENS], 1) * t.size
        size = {"chunk": f"{one // CHUNK_TOKENS:,} a token ({one:,} a chunk)",
                "sequence": f"{one:,} a sequence"}.get(t.per, f"{one // CHUNK_TOKENS:,} a token")
        lines.append(f"| {t.name} | {size} | {t.what} |")
    return lines


def _forward_kernel_table(design: ForwardDesign) -> list[str]:
    """What each kernel of a design reads and writes, per token and head (long sequences)."""
    n = 1 << 20
    lines = [f"{design.name}, kernel by kernel: bytes per token and head (K = V = {HEAD_DIM}, long sequences)",
             "| kernel | reads | writes | B read | B written | note |",
             "|---|---|---|---:|---:|---|"]

    def names(accesses) -> str:
        return ", ".join(name if share == 1 else f"{name} x{Fraction(share).limit_denominator(CHUNK_TOKENS)}"
                         for name, share in accesses)

    for k in design.kernels:
        r, w = kernel_bytes(k, [n], heads=1)
        lines.append(f"| {k.name} | {names(k.reads)} | {names(k.writes)} | {r / n:,.0f} | {w / n:,.0f} | "
                     f"{k.note} |")
    return lines


def _forward_per_token_table() -> list[str]:
    """Every design's bytes and FLOPs per token and head, and the backward's after it."""
    n = 1 << 20
    lines = [f"per token and head (K = V = {HEAD_DIM}, long sequences; the backward: kernel.kda_backward's "
             "kernels on what the forward leaves)",
             "| design | B read | B written | forward B | forward FLOP | backward B | backward FLOP | "
             "forward + backward B |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for d in FORWARD_DESIGNS:
        r = sum(kernel_bytes(k, [n], heads=1)[0] for k in d.kernels)
        w = sum(kernel_bytes(k, [n], heads=1)[1] for k in d.kernels)
        c = forward_count(d, [n], heads=1)
        b = backward_after(d, [n], heads=1)
        back = ("-", "-", "-") if b is None else (
            f"{b.total_bytes / n:,.0f}", f"{b.total_flops / n:,.0f}", f"{(c.total_bytes + b.total_bytes) / n:,.0f}")
        lines.append(f"| {d.name} | {r / n:,.0f} | {w / n:,.0f} | {c.total_bytes / n:,.0f} | "
                     f"{c.total_flops / n:,.0f} | " + " | ".join(back) + " |")
    return lines


def _forward_floor_table(rows: list[Floor], copy: float, mma: float) -> list[str]:
    shapes = list(FORWARD_SHAPES)
    lines = _floor_table(rows, copy, mma, FORWARD_DESIGNS, shapes, title="forward floors")
    for i, who in enumerate(("FLA chunk_kda, measured", "cuDNN kda_hopper_cuda, measured")):
        lines.append(f"| {who} | " + " | ".join(
            f"{FORWARD_MEASURED_MS[s][i]:.2f}" if s in FORWARD_MEASURED_MS else "-" for s in shapes) + " |")
    for label, step_s, tokens in ((f"chain: tiles a CTA x {CHAIN_TILE_S * 1e6:.2f} us", CHAIN_TILE_S, TILE_TOKENS),
                                  (f"chain in 64-token steps x {CHAIN_STEP_S * 1e6:.2f} us", CHAIN_STEP_S,
                                   CHUNK_TOKENS)):
        lines.append(f"| {label} | " + " | ".join(
            f"{chain_tiles(FORWARD_SHAPES[s], tokens):,}: {chain_floor_ms(FORWARD_SHAPES[s], step_s, tokens):.2f}"
            for s in shapes) + " |")
    return lines


def _step_table(copy: float) -> list[str]:
    """The byte floor of the forward, its backward and both, for the designs that feed our backward."""
    shapes = list(FORWARD_SHAPES)
    lines = [f"training step's byte floor in ms (forward + the backward after it = both, at {copy / 1e12:.2f} TB/s)",
             "| design | " + " | ".join(shapes) + " |",
             "|---|" + "---:|" * len(shapes)]
    for d in FORWARD_DESIGNS:
        if d.backward is None:
            continue
        cells = []
        for s in shapes:
            f = forward_count(d, FORWARD_SHAPES[s]).total_bytes / copy * 1e3
            b = backward_after(d, FORWARD_SHAPES[s]).total_bytes / copy * 1e3
            cells.append(f"{f:.2f} + {b:.2f} = {f + b:.2f}")
        lines.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return lines


def forward_tables(copy: float = COPY_BYTES_PER_S, mma: float = MMA_FLOPS_PER_S) -> list[str]:
    """``ptx-lab floors --forward``: every table of the forward."""
    out = []
    for block in (_forward_tensor_table(), _forward_per_token_table(), _forward_kernel_table(FLA_FORWARD),
                  _forward_floor_table(forward_floors(copy, mma), copy, mma), _step_table(copy)):
        out += block + [""]
    return out[:-1]


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.floors") -> None:
    ap = argparse.ArgumentParser(prog=prog,
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--copy-tbps", type=float, default=COPY_BYTES_PER_S / 1e12,
                    help="DRAM read + write rate, TB/s (default: the measured copy)")
    ap.add_argument("--mma-tflops", type=float, default=MMA_FLOPS_PER_S / 1e12,
                    help="bf16 dense mma rate, TFLOP/s (default: the measured rate)")
    ap.add_argument("--gemms", action="store_true", help="print the GEMM table only")
    ap.add_argument("--forward", action="store_true",
                    help="the forward's tables instead: our one-pass designs against FLA 0.6.0's forward")
    a = ap.parse_args(argv)
    if a.gemms:
        print("\n".join(_forward_gemm_table() if a.forward else _gemm_table()))
        return
    copy, mma = a.copy_tbps * 1e12, a.mma_tflops * 1e12
    if a.forward:
        print("\n".join(forward_tables(copy, mma)))
        return
    rows = floors(copy, mma)
    print("\n".join(_per_token_table()))
    print()
    print("\n".join(_floor_table(rows, copy, mma)))
    print()
    print("\n".join(_kernel_table("32x8192", copy)))


if __name__ == "__main__":
    main()
