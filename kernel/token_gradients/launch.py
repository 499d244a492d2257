"""Kernel B, KDA's per-token gradients: the build and the launch.

Kernel B (``kernel/token_gradients/cuda/token_gradients.cu``) turns the forward's tensors,
do, Kernel A's dS after every 16-token tile and the forward state entering every
64-token chunk into dq, dk, dv, dg and dbeta, one CTA per 64-token chunk and (value) head.
:func:`kernel.kda_backward.kda_backward` checks the arguments and calls
:func:`launch`; this module only compiles, allocates and launches. Its float64
statement is ``kernel.reference.kda``'s ``_tile_backward``.

The kernel's shape (8 warps, two stages of tile inputs, about 229 KB of shared memory) is fixed
in the source, which exports the shared memory and thread count it was built with
(``kdb_smem_bytes``, ``kdb_threads``). It has two builds: the plain one writes dg; the gate build
(``KDB_GATE=1``, :class:`GateOut`) applies, where dg is formed, the backward of the gate activation
FLA's layer asks the op for (``kernel.activations``), and writes dg_raw and per-CTA partial sums of
dA_log and ddt_bias instead (a build of its own, so that the plain one's code stays as it was). Each
has a timing build (``KDB_TIMING=1``) for ``ptx-lab profile --kernel b``: the clock cycles of every
phase of a tile, per warp and CTA (``token_gradients_timing.cuh``).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from ..ds_scan.config import FAST_MATH
from ..runtime import builds
from ..shapes import TILE_TOKENS, TILES_PER_CHUNK, snapshot_offsets

SOURCE_PATH = Path(__file__).resolve().parent / "cuda" / "token_gradients.cu"
KERNEL_NAME = "kda_token_gradients"

__all__ = ["launch", "kernel", "source", "options", "tables", "chunk_count", "Build", "GateOut", "GATE_FORMS",
           "all_variants", "SOURCE_PATH", "KERNEL_NAME"]

# the gate epilogue's forms, as token_gradients_gate.cuh numbers them: softplus (no lower_bound) or sigmoid
GATE_FORMS = {"softplus": 1, "sigmoid": 2}


@dataclasses.dataclass(frozen=True)
class Build:
    """One build of Kernel B: what ``ptx-lab resources`` and CI compile. ``gate``: the gate activation's
    backward in the epilogue (``KDB_GATE``). ``token_gate``: g is each token's natural-log gate, which R1
    sums within the tile itself (``KDB_TOKEN_GATE``), instead of FLA's 64-chunk-local cumsum of the log2
    gate (docs/kda_forward.md, section 8: the cumsum folded into its readers). ``timing``: the clock
    accounting of each phase of a tile (``KDB_TIMING``, kernel.tools.profile's; the same arithmetic)."""
    gate: bool = False
    token_gate: bool = False
    timing: bool = False

    def name(self) -> str:
        return ("token-gradients" + ("-gate" if self.gate else "") + ("-token-gate" if self.token_gate else "")
                + ("-timing" if self.timing else ""))


def all_variants() -> list[Build]:
    """Every build the API can launch: the plain one and the gate epilogue's; and the plain one on each
    token's gate (launched only by its tests and ``ptx-lab source-ab`` until the other readers take it too);
    and the timing build of the training step's (``ptx-lab profile --kernel b``)."""
    return [Build(), Build(gate=True), Build(token_gate=True), Build(timing=True)]


@dataclasses.dataclass(frozen=True)
class GateOut:
    """The gate epilogue's inputs and outputs (CuPy arrays, checked by the caller). With x = g_raw +
    dt_bias: the softplus form g = -exp(A_log) softplus(x) (``lower_bound`` None) or the sigmoid form
    g = L sigmoid(a x), a = exp(A_log) or 1 (``lower_bound`` = L). Kernel B writes ``dg_raw`` (bf16 bits,
    [tokens, HV, 128]) instead of dg, and each CTA (chunk c, head h) its share of dA_log at ``da_part[c,
    h]`` and of ddt_bias at ``ddt_part[c, h, :]`` (fp32), for the caller to add over c in a fixed order."""
    g_raw: Any                  # bf16 bits [tokens, HV, 128]
    a_log: Any                  # fp32 [HV], or None (the sigmoid form only)
    dt_bias: Any                # fp32 [HV * 128], or None
    lower_bound: float | None
    dg_raw: Any                 # bf16 bits [tokens, HV, 128]
    da_part: Any                # fp32 [chunks, HV], or None where a_log is
    ddt_part: Any               # fp32 [chunks, HV, 128], or None where dt_bias is


def source() -> str:
    """The entry file's text, prefixed with a digest of its own headers (token_gradients_*.cuh) and
    ptx_lab's (BUILD.source): CuPy keys its compile cache on the text and the options only, so a
    header change alone would load a stale cubin."""
    return BUILD.source()


def options(build: Build | None = None) -> tuple[str, ...]:
    """What a build passes (CI's nvcc check, ``ptx-lab resources`` and the launch alike): -ftz=true, the
    entry file's directory, where its token_gradients_*.cuh sit (NVRTC compiles the text and has no file
    to look beside), KDB_GATE, KDB_TOKEN_GATE and KDB_TIMING (the source has no default)."""
    build = build or Build()
    return (*FAST_MATH, f"-I{SOURCE_PATH.parent}", f"-DKDB_GATE={int(build.gate)}",
            f"-DKDB_TOKEN_GATE={int(build.token_gate)}", f"-DKDB_TIMING={int(build.timing)}")


@functools.lru_cache(maxsize=None)
def kernel(build: Build = Build()):
    """(function, shared memory bytes, threads) of one of Kernel B's builds, compiled once."""
    return builds.kernel_function(BUILD, BUILD.module(build), label=f"Kernel B ({build.name()})",
                                  advice=" (it is built for sm_90a: H100 / H200)")


def tables(cu: np.ndarray) -> dict:
    """Host tables of a batch layout (cu: int64 [N + 1]): the first dS snapshot (tile) and the
    first 64-chunk state of each sequence, and the sequence of every 64-chunk (int32)."""
    lengths = np.diff(cu)
    tile_offs = snapshot_offsets(lengths, TILE_TOKENS, 1)
    chunk_offs = snapshot_offsets(lengths, TILE_TOKENS, TILES_PER_CHUNK)
    chunk_seq = np.repeat(np.arange(lengths.size, dtype=np.int32), np.diff(chunk_offs))
    return {"tile_offs": tile_offs, "chunk_offs": chunk_offs, "chunk_seq": chunk_seq,
            "tiles": int(tile_offs[-1]), "chunks": int(chunk_offs[-1])}


@functools.lru_cache(maxsize=64)
def _device_tables(cu_bytes: bytes):
    """The tables on the device, cached per batch layout (no host-to-device copy per call)."""
    import cupy

    cu = np.frombuffer(cu_bytes, dtype=np.int64)
    t = tables(cu)
    return (cupy.asarray(cu), cupy.asarray(t["tile_offs"]), cupy.asarray(t["chunk_offs"]),
            cupy.asarray(t["chunk_seq"]), t["chunks"])


def chunk_count(cu: np.ndarray) -> int:
    """The 64-token chunks of a batch layout (cu: int64 [N + 1]): Kernel B's CTAs per head, the rows of
    the gate epilogue's partial sums."""
    return _device_tables(np.ascontiguousarray(cu, dtype=np.int64).tobytes())[4]


def launch(q, k, v, g, beta, aqk, akk, do, ds, states, *, cu: np.ndarray, H: int, HV: int, scale: float,
           out: dict, rstd: tuple | None = None, gate: GateOut | None = None, token_gate: bool = False,
           timing: bool = False) -> None:
    """Kernel B on CuPy arrays (bf16 as uint16 bits; beta fp32), checked by the caller, into the
    preallocated CuPy arrays of ``out``: dq, dk (fp32, or bf16 bits: rounded once in the kernel), dg
    (fp32), dv (bf16 bits), dbeta (fp32). q and k (and their rstd) have ``H`` heads, every other array
    ``HV`` (H, or a multiple of it: FLA's grouped value heads, value head hv reading q and k at head
    hv // (HV / H)); dq and dk come out per value head, [tokens, HV, 128], for the caller to sum over
    each group. With ``rstd`` (q's and k's fp32 [tokens, H] 1 / |x| from the forward's l2norm, q and k
    then the normalised rows), dq and dk come out through the l2norm's backward: with respect to the
    raw q and k. With ``gate`` (:class:`GateOut`), the gate build runs: it writes gate's dg_raw and
    partial sums instead of out["dg"] (which it ignores). With ``token_gate``, g is each token's natural-log
    gate (fp32 [tokens, HV, 128]) instead of FLA's 64-chunk-local cumsum of it in log2 (not with ``gate``).
    ``timing``: the timing build, which also writes each warp's cycles a phase into the buffer whose address
    the caller stored in its module's ``kdb_timing`` (kernel.tools.profile)."""
    bf16_out = out["dq"].dtype == np.uint16
    if out["dk"].dtype != out["dq"].dtype or not (bf16_out or out["dq"].dtype == np.float32):
        raise ValueError(f"out: dq and dk must both be float32 or both bf16 bits (uint16), got {out['dq'].dtype} "
                         f"and {out['dk'].dtype}")
    if token_gate and gate is not None:
        raise ValueError("token_gate: Kernel B has no build of the gate epilogue on each token's gate")
    fn, smem, threads = kernel(Build(gate=gate is not None, token_gate=token_gate, timing=timing))
    cu_d, tile_d, chunk_d, seq_d, chunks = _device_tables(np.ascontiguousarray(cu, dtype=np.int64).tobytes())
    null = np.uint64(0)
    q_rstd, k_rstd = rstd if rstd is not None else (null, null)   # null pointers: no l2norm
    if gate is None:
        dg, gate_args = out["dg"], (null,) * 6 + (np.int32(0), np.float32(0))
    else:
        form = GATE_FORMS["softplus" if gate.lower_bound is None else "sigmoid"]
        dg = null
        gate_args = (gate.g_raw, *(null if x is None else x for x in (gate.a_log, gate.dt_bias)), gate.dg_raw,
                     *(null if x is None else x for x in (gate.da_part, gate.ddt_part)), np.int32(form),
                     np.float32(0.0 if gate.lower_bound is None else gate.lower_bound))
    fn((chunks, HV), (threads,),
       (q, k, v, do, g, beta, aqk, akk, ds, states, out["dq"], out["dk"], out["dv"], dg, out["dbeta"],
        q_rstd, k_rstd, cu_d, tile_d, chunk_d, seq_d, np.int32(HV), np.int32(H), np.float32(scale),
        np.int32(bf16_out), *gate_args),
       shared_mem=smem)


BUILD = builds.KernelBuild(title="Kernel B (the per-token gradients)", entry=SOURCE_PATH,
                           headers=("token_gradients_*.cuh", "../../lap_timer.cuh"), function=KERNEL_NAME,
                           constants="kdb", default=Build, options=options, variants=all_variants,
                           label=lambda build: build.name(),
                           required_sass=lambda build: ("HMMA", "LDSM", "LDGSTS", "STSM"))
