"""Kernel B, KDA's per-token gradients: the build and the launch.

Kernel B (``kernel/token_gradients/cuda/token_gradients.cu``) turns the forward's tensors,
do, Kernel A's dS after every 16-token tile and the forward state entering every
64-token chunk into dq, dk, dv, dg and dbeta, one CTA per 64-token chunk and (value) head.
:func:`kernel.kda_backward.kda_backward` checks the arguments and calls
:func:`launch`; this module only compiles, allocates and launches. Its float64
statement is ``kernel.reference.kda``'s ``_tile_backward``.

The kernel has no build knobs: its shape (8 warps, two stages of tile inputs, about
229 KB of shared memory) is fixed in the source, which exports the shared memory
and thread count it was built with (``kdb_smem_bytes``, ``kdb_threads``).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from ..ds_scan.config import FAST_MATH
from ..runtime import builds
from ..shapes import TILE_TOKENS, TILES_PER_CHUNK, snapshot_offsets

SOURCE_PATH = Path(__file__).resolve().parent / "cuda" / "token_gradients.cu"
KERNEL_NAME = "kda_token_gradients"

__all__ = ["launch", "kernel", "source", "options", "tables", "Build", "all_variants", "SOURCE_PATH", "KERNEL_NAME"]


@dataclasses.dataclass(frozen=True)
class Build:
    """Kernel B's one build (it has no knobs): what ``ptx-lab resources`` and CI compile."""

    def name(self) -> str:
        return "token-gradients"


def all_variants() -> list[Build]:
    """Every build the API can launch: the one."""
    return [Build()]


def source() -> str:
    """The entry file's text, prefixed with a digest of its own headers (token_gradients_*.cuh) and
    ptx_lab's (BUILD.source): CuPy keys its compile cache on the text and the options only, so a
    header change alone would load a stale cubin."""
    return BUILD.source()


def options(build: Build | None = None) -> tuple[str, ...]:
    """What every build passes (CI's nvcc check, ``ptx-lab resources`` and the launch alike): -ftz=true
    and the entry file's directory, where its token_gradients_*.cuh sit (NVRTC compiles the text and
    has no file to look beside)."""
    return (*FAST_MATH, f"-I{SOURCE_PATH.parent}")


@functools.lru_cache(maxsize=None)
def kernel():
    """(function, shared memory bytes, threads) of Kernel B's one build, compiled once."""
    return builds.kernel_function(BUILD, BUILD.module(Build()), label="Kernel B",
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


def launch(q, k, v, g, beta, aqk, akk, do, ds, states, *, cu: np.ndarray, H: int, HV: int, scale: float,
           out: dict, rstd: tuple | None = None) -> None:
    """Kernel B on CuPy arrays (bf16 as uint16 bits; beta fp32), checked by the caller, into the
    preallocated CuPy arrays of ``out``: dq, dk (fp32, or bf16 bits: rounded once in the kernel), dg
    (fp32), dv (bf16 bits), dbeta (fp32). q and k (and their rstd) have ``H`` heads, every other array
    ``HV`` (H, or a multiple of it: FLA's grouped value heads, value head hv reading q and k at head
    hv // (HV / H)); dq and dk come out per value head, [tokens, HV, 128], for the caller to sum over
    each group. With ``rstd`` (q's and k's fp32 [tokens, H] 1 / |x| from the forward's l2norm, q and k
    then the normalised rows), dq and dk come out through the l2norm's backward: with respect to the
    raw q and k."""
    bf16_out = out["dq"].dtype == np.uint16
    if out["dk"].dtype != out["dq"].dtype or not (bf16_out or out["dq"].dtype == np.float32):
        raise ValueError(f"out: dq and dk must both be float32 or both bf16 bits (uint16), got {out['dq'].dtype} "
                         f"and {out['dk'].dtype}")
    fn, smem, threads = kernel()
    cu_d, tile_d, chunk_d, seq_d, chunks = _device_tables(np.ascontiguousarray(cu, dtype=np.int64).tobytes())
    q_rstd, k_rstd = rstd if rstd is not None else (np.uint64(0), np.uint64(0))   # null pointers: no l2norm
    fn((chunks, HV), (threads,),
       (q, k, v, do, g, beta, aqk, akk, ds, states, out["dq"], out["dk"], out["dv"], out["dg"], out["dbeta"],
        q_rstd, k_rstd, cu_d, tile_d, chunk_d, seq_d, np.int32(HV), np.int32(H), np.float32(scale),
        np.int32(bf16_out)),
       shared_mem=smem)


BUILD = builds.KernelBuild(title="Kernel B (the per-token gradients)", entry=SOURCE_PATH,
                           headers="token_gradients_*.cuh", function=KERNEL_NAME, constants="kdb", default=Build, options=options,
                           variants=all_variants, label=lambda build: build.name(),
                           required_sass=lambda build: ("HMMA", "LDSM", "LDGSTS", "STSM"))
