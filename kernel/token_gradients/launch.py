"""Kernel B, KDA's per-token gradients: the build and the launch.

Kernel B (``kernel/token_gradients/cuda/token_gradients.cu``) turns the forward's tensors,
do, Kernel A's dS after every 16-token tile and the forward state entering every
64-token chunk into dq, dk, dv, dg and dbeta, one CTA per run of consecutive 64-token chunks of
a sequence and (value) head. A run reads the state at its start and carries it on chip, so its
CTA's start (its first loads, with nothing else on the SM) is paid once for its chunks:
:func:`run_plan` picks the chunks a run (``RUN_CHUNKS``) by a cost model of the waves of CTAs.
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
phase of a tile, per warp and CTA (``token_gradients_timing.cuh``), and a qk_rstd build (``KDB_QK_RSTD=1``,
:class:`Build`) that reads q and k before the l2norm and normalises them on chip with their rstd.
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

__all__ = ["launch", "kernel", "source", "options", "tables", "run_plan", "RunPlan", "Build", "GateOut",
           "GATE_FORMS", "RUN_CHUNKS", "RUN_START_CHUNKS", "all_variants", "SOURCE_PATH", "KERNEL_NAME"]

# the gate epilogue's forms, as token_gradients_gate.cuh numbers them: softplus (no lower_bound) or sigmoid
GATE_FORMS = {"softplus": 1, "sigmoid": 2}

# The chunks a run may have: a CTA walks one run. 1 is the walk before runs: every CTA one chunk, its state
# read from the forward's.
RUN_CHUNKS = (1, 2, 4, 8)
# What a CTA's start costs, in chunks of work: its first tile's loads (with S0, 90 KB) and the CTA's launch, with
# nothing else on the SM (one CTA an SM). kernel.studies.kernel_b_runs fits it to the times of every run length:
# 0.048 at 4x8192 and 0.055 at 1x131072 on the H200 (docs/log/57; predicted 0.1).
RUN_START_CHUNKS = 0.05


@dataclasses.dataclass(frozen=True)
class Build:
    """One build of Kernel B: what ``ptx-lab resources`` and CI compile. ``gate``: the gate activation's
    backward in the epilogue (``KDB_GATE``). ``token_gate``: g is each token's natural-log gate, which R1
    sums within the tile itself (``KDB_TOKEN_GATE``), instead of FLA's 64-chunk-local cumsum of the log2
    gate (docs/kda_forward.md, section 8: the cumsum folded into its readers). ``timing``: the clock
    accounting of each phase of a tile (``KDB_TIMING``, kernel.tools.profile's; the same arithmetic).
    ``qk_rstd``: q and k are the rows before the forward's l2norm and their rstd is required (``KDB_QK_RSTD``):
    each tile's rstd rows are staged with its inputs and R1 normalises q and k on chip, so that no pass writes
    normalised copies of them."""
    gate: bool = False
    token_gate: bool = False
    timing: bool = False
    qk_rstd: bool = False

    def name(self) -> str:
        return ("token-gradients" + ("-gate" if self.gate else "") + ("-token-gate" if self.token_gate else "")
                + ("-qk-rstd" if self.qk_rstd else "") + ("-timing" if self.timing else ""))


def all_variants() -> list[Build]:
    """Every build the API can launch: the plain one and the gate epilogue's; the plain one on each token's gate
    (``kernel.chunk_kda``'s backward on our forward, where the call's gate is not activated in the op); the same
    three on the raw q and k (qk_rstd: the backward's ``qk_raw``); and the plain one's timing build (``ptx-lab
    profile --kernel b``: its phases stand for the other builds', which differ in R1's gate sums, its
    normalisation or dg's epilogue only)."""
    launched = [Build(), Build(gate=True), Build(token_gate=True)]
    return [*launched, *(dataclasses.replace(b, qk_rstd=True) for b in launched), Build(timing=True)]


@dataclasses.dataclass(frozen=True)
class GateOut:
    """The gate epilogue's inputs and outputs (CuPy arrays, checked by the caller). With x = g_raw +
    dt_bias: the softplus form g = -exp(A_log) softplus(x) (``lower_bound`` None) or the sigmoid form
    g = L sigmoid(a x), a = exp(A_log) or 1 (``lower_bound`` = L). Kernel B writes ``dg_raw`` (bf16 bits,
    [tokens, HV, 128]) instead of dg, and each CTA (run r, head h) its share of dA_log at ``da_part[r,
    h]`` and of ddt_bias at ``ddt_part[r, h, :]`` (fp32), for the caller to add over r in a fixed order."""
    g_raw: Any                  # bf16 bits [tokens, HV, 128]
    a_log: Any                  # fp32 [HV], or None (the sigmoid form only)
    dt_bias: Any                # fp32 [HV * 128], or None
    lower_bound: float | None
    dg_raw: Any                 # bf16 bits [tokens, HV, 128]
    da_part: Any                # fp32 [runs, HV], or None where a_log is
    ddt_part: Any               # fp32 [runs, HV, 128], or None where dt_bias is


def source() -> str:
    """The entry file's text, prefixed with a digest of its own headers (token_gradients_*.cuh) and
    ptx_lab's (BUILD.source): CuPy keys its compile cache on the text and the options only, so a
    header change alone would load a stale cubin."""
    return BUILD.source()


def options(build: Build | None = None) -> tuple[str, ...]:
    """What a build passes (CI's nvcc check, ``ptx-lab resources`` and the launch alike): -ftz=true, the
    entry file's directory, where its token_gradients_*.cuh sit (NVRTC compiles the text and has no file
    to look beside), KDB_GATE, KDB_TOKEN_GATE, KDB_TIMING and KDB_QK_RSTD (the source has no default)."""
    build = build or Build()
    return (*FAST_MATH, f"-I{SOURCE_PATH.parent}", f"-DKDB_GATE={int(build.gate)}",
            f"-DKDB_TOKEN_GATE={int(build.token_gate)}", f"-DKDB_TIMING={int(build.timing)}",
            f"-DKDB_QK_RSTD={int(build.qk_rstd)}")


@functools.lru_cache(maxsize=None)
def kernel(build: Build = Build()):
    """(function, shared memory bytes, threads) of one of Kernel B's builds, compiled once."""
    return builds.kernel_function(BUILD, BUILD.module(build), label=f"Kernel B ({build.name()})",
                                  advice=" (it is built for sm_90a: H100 / H200)")


def tables(cu: np.ndarray, run_chunks: int = 1) -> dict:
    """Host tables of a batch layout (cu: int64 [N + 1]): the first dS snapshot (tile) and the
    first 64-chunk state of each sequence, the sequence of every 64-chunk (int32), and the first chunk
    of every run of ``run_chunks`` consecutive chunks of a sequence (int64; a sequence's last run has
    what is left)."""
    lengths = np.diff(cu)
    tile_offs = snapshot_offsets(lengths, TILE_TOKENS, 1)
    chunk_offs = snapshot_offsets(lengths, TILE_TOKENS, TILES_PER_CHUNK)
    chunk_seq = np.repeat(np.arange(lengths.size, dtype=np.int32), np.diff(chunk_offs))
    within = np.arange(chunk_seq.size, dtype=np.int64) - chunk_offs[chunk_seq]   # each chunk's place in its sequence
    run_chunk0 = np.flatnonzero(within % run_chunks == 0).astype(np.int64)
    return {"tile_offs": tile_offs, "chunk_offs": chunk_offs, "chunk_seq": chunk_seq, "run_chunk0": run_chunk0,
            "tiles": int(tile_offs[-1]), "chunks": int(chunk_offs[-1]), "runs": int(run_chunk0.size)}


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Kernel B's runs for one batch layout: ``run_chunks`` chunks a run, ``runs`` runs a head (the grid's x,
    and the rows of the gate epilogue's partial sums)."""
    run_chunks: int
    runs: int


def _check_run_chunks(run_chunks) -> None:
    if isinstance(run_chunks, (bool, np.bool_)) or run_chunks not in RUN_CHUNKS:
        raise ValueError(f"run_chunks must be 'auto' or one of {RUN_CHUNKS}, got {run_chunks!r}")


def run_plan(cu: np.ndarray, HV: int, run_chunks: int | str = "auto", sms: int | None = None) -> RunPlan:
    """The runs of a batch layout (cu: int64 [N + 1]) at ``HV`` heads. ``run_chunks`` "auto": the value of
    RUN_CHUNKS with the least predicted time, waves x (chunks a run + RUN_START_CHUNKS), a wave being ``sms``
    CTAs (one CTA an SM; default: the current GPU's SMs), the smallest on a tie. Longer runs pay fewer CTA
    starts; fewer CTAs fill the last wave less, which at few sequences and heads leaves SMs idle."""
    cu_bytes = np.ascontiguousarray(cu, dtype=np.int64).tobytes()
    if run_chunks != "auto":
        _check_run_chunks(run_chunks)
        return RunPlan(int(run_chunks), _runs(cu_bytes, int(run_chunks)))
    return _auto_plan(cu_bytes, int(HV), builds.sm_count() if sms is None else int(sms))


@functools.lru_cache(maxsize=256)
def _auto_plan(cu_bytes: bytes, HV: int, sms: int) -> RunPlan:
    def cost(c: int) -> float:
        waves = -(-_runs(cu_bytes, c) * HV // sms)
        return waves * (c + RUN_START_CHUNKS)

    best = min(RUN_CHUNKS, key=lambda c: (cost(c), c))
    return RunPlan(best, _runs(cu_bytes, best))


@functools.lru_cache(maxsize=256)
def _runs(cu_bytes: bytes, run_chunks: int) -> int:
    return tables(np.frombuffer(cu_bytes, dtype=np.int64), run_chunks)["runs"]


@functools.lru_cache(maxsize=64)
def _device_tables(cu_bytes: bytes, run_chunks: int):
    """The tables on the device, cached per batch layout and run length (no host-to-device copy per call)."""
    import cupy

    cu = np.frombuffer(cu_bytes, dtype=np.int64)
    t = tables(cu, run_chunks)
    return (cupy.asarray(cu), cupy.asarray(t["tile_offs"]), cupy.asarray(t["chunk_offs"]),
            cupy.asarray(t["chunk_seq"]), cupy.asarray(t["run_chunk0"]), t["runs"])


def launch(q, k, v, g, beta, aqk, akk, do, ds, states, *, cu: np.ndarray, H: int, HV: int, scale: float,
           out: dict, rstd: tuple | None = None, gate: GateOut | None = None, token_gate: bool = False,
           timing: bool = False, run_chunks: int | str = "auto", qk_rstd: bool = False) -> RunPlan:
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
    the caller stored in its module's ``kdb_timing`` (kernel.tools.profile). ``run_chunks``: the chunks a CTA
    walks (:func:`run_plan`; the gate's partial sums have a row per run). ``qk_rstd``: q and k are the rows before
    the l2norm whose rstd ``rstd`` gives (required): the qk_rstd build normalises them on chip, to the bits of
    ``bf16(x rstd)``, and gives what the other builds give on those rows. Returns the plan it ran."""
    if not isinstance(qk_rstd, (bool, np.bool_)):
        raise TypeError(f"qk_rstd must be True or False, got {qk_rstd!r}")
    if qk_rstd and rstd is None:
        raise ValueError("qk_rstd: q and k are the raw rows, and their l2norm's rstd (rstd=(q_rstd, k_rstd)) is "
                         "required to normalise them")
    bf16_out = out["dq"].dtype == np.uint16
    if out["dk"].dtype != out["dq"].dtype or not (bf16_out or out["dq"].dtype == np.float32):
        raise ValueError(f"out: dq and dk must both be float32 or both bf16 bits (uint16), got {out['dq'].dtype} "
                         f"and {out['dk'].dtype}")
    if token_gate and gate is not None:
        raise ValueError("token_gate: Kernel B has no build of the gate epilogue on each token's gate")
    plan = run_plan(cu, HV, run_chunks)
    if gate is not None:
        for name in ("da_part", "ddt_part"):
            part = getattr(gate, name)
            if part is not None and part.shape[0] != plan.runs:
                raise ValueError(f"gate.{name} has {part.shape[0]} rows; Kernel B writes one a run: {plan.runs} at "
                                 f"{plan.run_chunks} chunks a run (run_plan(cu, HV, run_chunks))")
    fn, smem, threads = kernel(Build(gate=gate is not None, token_gate=token_gate, timing=timing,
                                     qk_rstd=bool(qk_rstd)))
    cu_d, tile_d, chunk_d, seq_d, run_d, runs = _device_tables(np.ascontiguousarray(cu, dtype=np.int64).tobytes(),
                                                                plan.run_chunks)
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
    fn((runs, HV), (threads,),
       (q, k, v, do, g, beta, aqk, akk, ds, states, out["dq"], out["dk"], out["dv"], dg, out["dbeta"],
        q_rstd, k_rstd, cu_d, tile_d, chunk_d, seq_d, run_d, np.int32(plan.run_chunks), np.int32(HV), np.int32(H),
        np.float32(scale), np.int32(bf16_out), *gate_args),
       shared_mem=smem)
    return plan


BUILD = builds.KernelBuild(title="Kernel B (the per-token gradients)", entry=SOURCE_PATH,
                           headers=("token_gradients_*.cuh", "../../lap_timer.cuh"), function=KERNEL_NAME,
                           constants="kdb", default=Build, options=options, variants=all_variants,
                           label=lambda build: build.name(),
                           required_sass=lambda build: ("HMMA", "LDSM", "LDGSTS", "STSM"))
