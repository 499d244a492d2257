"""The o pass: the forward's output from the state entering every 64-token chunk and each chunk's v_new,
three GEMMs a chunk and value head, every chunk at once.

    o = forward_output(qg, states, aqk, aqk_lo, v_new, cu_seqlens=cu)

What and why
------------
The third pass of the three-pass forward (docs/kda_forward.md, section 3, "three passes"): the first pass
builds every chunk's products (qg, Aqk among them), the second (``kernel.forward_chain``) walks each
(sequence, value head) chunk by chunk for the states and v_new; this pass forms o from them. Nothing is
carried from chunk to chunk, so it runs every (chunk, value head) at once, one CTA each
(kernel/forward_output/cuda/forward_output.cu)::

    o[chunk's real rows] = bf16(qg S + Aqk_hi v_new + Aqk_lo v_new)[:L]

in fp32 accumulators, L the chunk's real rows (64 but at a sequence's last chunk). Aqk comes in two bf16
parts, as the products pass writes it (hi = bf16(Aqk), lo = bf16(Aqk - hi)): in one bf16 its rounding makes
13% of o's error in the model. The numpy statement of the same arithmetic is ``o_pass`` of
tests/kernel/three_pass_model.py (it sums qg S and (hi + lo) v_new apart and in float64, the kernel's MMAs
into one fp32 accumulator, so the two agree to fp32 rounding before o's one bf16 rounding, not bit for bit).

Tensors (chunk-major: a sequence's chunks one after another, sequence after sequence; sequence n has
ceil(len_n / 64) chunks)::

    qg          bf16 [chunks, HV, 64, 128]    s q 2^gc
    states      bf16 [chunks, HV, 128, 128]   ([K, V]) the state entering the chunk (the chain's)
    aqk         bf16 [chunks, HV, 64, 64]     Aqk's hi part, lower triangular with its diagonal, taken whole
                                              as given
    aqk_lo      bf16 [chunks, HV, 64, 64]     Aqk's lo part (zeros: Aqk in one bf16), taken whole as given
    v_new       bf16 [chunks, HV, 64, 128]    (the chain's)
    cu_seqlens  host ints [N + 1]             token offsets of the sequences: 0 first, strictly increasing
                                              (None: one sequence of chunks * 64 tokens)
    -> o        bf16 [tokens, HV, 128]        FLA's layout: row t of sequence n is token cu_seqlens[n] + t

CuPy arrays (bf16 as uint16 bits) or torch CUDA tensors; torch in, torch out (allocated by torch). The
kernel runs on CuPy's current stream. :func:`plan_output` does every check on the host (no GPU, no
allocation); :func:`forward_output` plans, compiles (once per :class:`Config`) and launches.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..forward_products.launch import chunk_table
from ..runtime import builds
from ..runtime.arrays import ArrayInfo, describe, empty_output, expect, require_cupy, require_gpu, to_cupy
from ..shapes import CHUNK_TOKENS, HEAD_DIM, check_chunk_range, check_cu_seqlens, host_offsets, snapshot_offsets
from .config import BUILD, Config

__all__ = ["forward_output", "plan_output", "OutputPlan", "launch_planned", "allocate", "kernel"]

INT32_MAX = 2**31 - 1  # the grid's x (one CTA a chunk and value head) and the chunk table's tokens are int32
                       # (kernel.forward_products.launch.chunk_table: each chunk's first token and real rows)
HOST_ADVICE = ("forward_output runs on the GPU and takes CuPy arrays or torch CUDA tensors (cupy.asarray({name}); bf16 "
               "in CuPy as uint16 bits, kernel.runtime.arrays.bf16_bits). The same arithmetic in numpy is "
               "o_pass of tests/kernel/three_pass_model.py, in a checkout")


@dataclasses.dataclass(frozen=True)
class OutputPlan:
    chunks: int
    HV: int
    cu_seqlens: np.ndarray         # host int64 [N + 1]
    config: Config
    torch_out: bool

    @property
    def N(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def ctas(self) -> int:
        return self.chunks * self.HV


def _check_cu_seqlens(cu_seqlens, chunks: int) -> np.ndarray:
    """Host int64 offsets: kernel.shapes.check_cu_seqlens (the one check of a cu_seqlens), on host integers
    only (the launch lays out the chunks on the host), within the chunk table's int32 and laying out as many
    chunks as the operands hold."""
    if cu_seqlens is None:
        return np.array([0, chunks * CHUNK_TOKENS], dtype=np.int64)
    if not isinstance(cu_seqlens, (list, tuple, np.ndarray)):
        raise TypeError(f"cu_seqlens must be host integers (a list, tuple or numpy array) [N + 1], got "
                        f"{type(cu_seqlens).__name__}: the launch reads them on the host to lay out the chunks")
    offsets = host_offsets(cu_seqlens)
    cu = check_cu_seqlens(offsets, 1, int(offsets.reshape(-1)[-1]) if offsets.size else 0)
    if cu[-1] > INT32_MAX:
        raise ValueError(f"cu_seqlens ends at {int(cu[-1])} tokens: the chunk table holds tokens as int32, at most "
                         f"{INT32_MAX}")
    want = int(snapshot_offsets(np.diff(cu), CHUNK_TOKENS, 1)[-1])
    if want != chunks:
        raise ValueError(f"cu_seqlens lays out {want} chunks of {CHUNK_TOKENS} tokens (ceil(len / {CHUNK_TOKENS}) a "
                         f"sequence), the operands have {chunks}")
    return cu


def plan_output(qg, states, aqk, aqk_lo, v_new, *, cu_seqlens=None, config: Config | None = None) -> OutputPlan:
    """Every check of a call, on the host: shapes, dtypes, contiguity, one device, cu_seqlens, the
    config. No GPU needed, nothing allocated."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.forward_output.Config or None, got {type(config).__name__}")
    arrays: dict[str, ArrayInfo] = {"qg": describe("qg", qg, HOST_ADVICE)}
    qa = arrays["qg"]
    if len(qa.shape) != 4 or qa.shape[2:] != (CHUNK_TOKENS, HEAD_DIM) or min(qa.shape[:2]) < 1:
        raise ValueError(f"qg must be [chunks, HV, {CHUNK_TOKENS}, {HEAD_DIM}] with chunks, HV >= 1, got shape "
                         f"{qa.shape}")
    chunks, HV = qa.shape[:2]
    expect("qg", qa, qa.shape, f"[chunks, HV, {CHUNK_TOKENS}, {HEAD_DIM}]", ("bfloat16",))
    for name, x, shape, layout in (
            ("states", states, (chunks, HV, HEAD_DIM, HEAD_DIM), "[chunks, HV, K, V], chunks and HV as qg's"),
            ("aqk", aqk, (chunks, HV, CHUNK_TOKENS, CHUNK_TOKENS), f"[chunks, HV, {CHUNK_TOKENS}, {CHUNK_TOKENS}]"),
            ("aqk_lo", aqk_lo, (chunks, HV, CHUNK_TOKENS, CHUNK_TOKENS),
             f"[chunks, HV, {CHUNK_TOKENS}, {CHUNK_TOKENS}] as aqk"),
            ("v_new", v_new, qa.shape, f"[chunks, HV, {CHUNK_TOKENS}, {HEAD_DIM}] as qg")):
        arrays[name] = describe(name, x, HOST_ADVICE)
        expect(name, arrays[name], shape, layout, ("bfloat16",))
    cu = _check_cu_seqlens(cu_seqlens, chunks)
    devices = {a.device for a in arrays.values()}
    kinds = {a.torch for a in arrays.values()}
    if len(devices) > 1 or len(kinds) > 1:
        got = ", ".join(f"{n}: device {a.device} ({'torch' if a.torch else 'cupy'})" for n, a in arrays.items())
        raise ValueError(f"qg, states, aqk, aqk_lo and v_new must be on one device and all CuPy arrays or all torch "
                         f"tensors, got {got}")
    if chunks * HV > INT32_MAX:
        raise ValueError(f"the grid has one CTA a chunk and value head: chunks * HV = {chunks * HV} is more than "
                         f"{INT32_MAX}")
    return OutputPlan(chunks=chunks, HV=HV, cu_seqlens=cu, config=config if config is not None else Config(),
                      torch_out=qa.torch)


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads) of one configuration, cached per process."""
    return builds.kernel_function(BUILD, BUILD.module(cfg), label=f"the o pass {cfg.name()}",
                                  threads_expected=cfg.threads)


@functools.lru_cache(maxsize=64)
def _table_on_device(cu_bytes: bytes):
    import cupy

    return cupy.asarray(chunk_table(np.frombuffer(cu_bytes, dtype=np.int64)))


def launch_planned(plan: OutputPlan, qg, states, aqk, aqk_lo, v_new, o, chunks: tuple[int, int] | None = None) -> None:
    """The o pass on checked CuPy arrays (bf16 as uint16 bits) into ``o``: the launch alone. ``chunks``: only
    chunks c0 .. c1 - 1 of the plan's (None: all), for a caller that runs the pass in pieces: their rows of the
    chunk table and of the chunk-major operands; o is taken whole, addressed by the table's tokens."""
    fn, smem, threads = kernel(plan.config)
    c0, c1 = check_chunk_range(chunks, plan.chunks)
    table = _table_on_device(plan.cu_seqlens.tobytes())[c0:c1]
    fn(((c1 - c0) * plan.HV,), (threads,),
       (qg[c0:c1], states[c0:c1], aqk[c0:c1], aqk_lo[c0:c1], v_new[c0:c1], table, np.int32(plan.HV), o),
       shared_mem=smem)


def allocate(plan: OutputPlan, device=None):
    """o for ``plan``, uninitialised: (as returned, as a CuPy view); a torch tensor on ``device`` (torch's
    allocator, on torch's current stream) where the plan's operands are torch, else a CuPy array."""
    return empty_output((plan.tokens, plan.HV, HEAD_DIM), "bf16", device if plan.torch_out else None)


def forward_output(qg, states, aqk, aqk_lo, v_new, *, cu_seqlens=None, config: Config | None = None):
    """o [tokens, HV, 128] bf16 (module docstring)."""
    plan = plan_output(qg, states, aqk, aqk_lo, v_new, cu_seqlens=cu_seqlens, config=config)
    require_cupy("kernel.forward_output")
    require_gpu("kernel.forward_output")
    qg_c, states_c, aqk_c, lo_c, vn_c = (to_cupy(n, x, "bf16") for n, x in
                                         (("qg", qg), ("states", states), ("aqk", aqk), ("aqk_lo", aqk_lo),
                                          ("v_new", v_new)))
    o, o_c = allocate(plan, qg.device if plan.torch_out else None)
    launch_planned(plan, qg_c, states_c, aqk_c, lo_c, vn_c, o_c)
    return o
