"""The products pass: every 64-token chunk's state-free products at once, the first pass of the
three-pass forward (docs/kda_forward.md, the design "three passes (64-token chain)").

    out = forward_products(q, k, v, g, beta, scale=s, cu_seqlens=cu, training=True)
    out.w, out.u, out.u_scale, out.kg, out.qg, out.aqk, out.aqk_lo, out.decay, out.cu_chunks, out.Aqk, out.Akk
    out = forward_products(q, k, v, g, beta, ..., token_gate=True, l2norm=True)   # the gate, q and k as they come
    out.q, out.k, out.q_rstd, out.k_rstd                                          # ... and q, k normalised

What and why
------------
At one long sequence the one-pass forward's time is its serial chain of 16-token tiles, each building
its own INV and products on the way. The three passes take all of that off the chain: this pass builds
every chunk's products across all SMs, ``kernel.forward_chain`` walks the chunks, and the o pass forms o
from the states. Per chunk (kernel/forward_products/cuda/forward_products.cu)::

    Aqk = tril(s q k^T weighted 2^(gc_i - gc_j));  Lkk = strict_tril(diag(beta) k k^T weighted the same)
    INV = (I + Lkk)^-1;  w = INV (beta k 2^gc);  u = INV (beta v);  kg = k 2^(gT - gc);  qg = s q 2^gc
    decay = 2^gT

u goes out in fp16 divided by a power of two a chunk, u_scale: the chain subtracts w S from u, so u's
rounding goes straight into v_new, and fp16 keeps 8 more bits than bf16 in the same bytes. The scale puts a
bound on |u| (INV's largest row sum of magnitudes times the largest |beta v|) in (2^14, 2^15], within
fp16's range for any v (docs/log/49). Aqk goes out in two bf16, aqk = bf16(Aqk) and aqk_lo = bf16(Aqk - aqk),
so that the o pass reads it to about 16 bits: in one bf16 its rounding makes 13% of o's error in the model.

The numpy statement, rounding for rounding, is ``chunk_operands`` of tests/kernel/three_pass_model.py
(its ``operands`` over a batch); the kernel's MMAs and exp2 differ from numpy's in their last bits.

Tensors: the inputs as :func:`kernel.forward.forward` takes them (q, k bf16 [.., H, 128]; v bf16 [.., HV,
128]; g fp32 [.., HV, 128], FLA's 64-chunk-local cumsum / ln 2; beta fp32 [.., HV]; ``..`` = ``B, T`` or
``1, total`` with cu_seqlens), with its two forms: ``token_gate`` (g each token's natural-log gate, which the
pass sums over each chunk by kernel.shapes.tile_gate_sums' rule: the gate's cumsum pass folded in) and
``l2norm`` (q and k as the caller has them: each row's rstd taken here, as FLA's l2norm_fwd takes it, and
folded into the fp32 operands the pass forms from the raw rows, its pass folded in; the normalised rows it writes
for the backward are FLA's bf16 rounding of them). Out, chunk-major (a sequence's chunks one after another,
sequence after sequence; rows past a sequence's end zero)::

    w, kg, qg      bf16 [chunks, HV, 64, 128]
    u              fp16 [chunks, HV, 64, 128]   u / u_scale
    u_scale        fp32 [chunks, HV, 4]         (2^e, 0, 0, 0): 16 bytes, the chain's smallest bulk copy
    aqk, aqk_lo    bf16 [chunks, HV, 64, 64]    Aqk's two parts, hi + lo within 2^-16 of it (zero above the
                                                diagonal)
    decay          fp32 [chunks, HV, 128]
    cu_chunks      host int64 [N + 1]           sequence n's chunks
    Aqk, Akk       bf16 [.., HV, 64] (training): the 16 x 16 diagonal blocks of Aqk and of INV in FLA's
                   layout, as kernel.forward writes them for our backward (the rest of a row is not written;
                   INV's the one pass's bits, Aqk's aqk's bits, nearer float64 than the one pass's: its operands
                   are two bf16 each)
    q, k           bf16 [.., H, 128] (l2norm, training): q and k normalised, the backward's q and k
    q_rstd, k_rstd fp32 [.., H] (l2norm, training): each row's 1 / sqrt(sum x^2 + 1e-6), the backward's rstd

CuPy arrays (bf16 as uint16 bits, fp16 as float16) or torch CUDA tensors; torch in, torch out. The kernel runs on CuPy's
current stream.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import numpy as np

from ..forward.launch import check_forms, plan_forward
from ..runtime import builds
from ..runtime.arrays import beta_f32, empty_output, require_cupy, require_gpu, to_cupy
from ..shapes import CHUNK_TOKENS, HEAD_DIM, check_chunk_range, snapshot_offsets
from .config import BUILD, Config

__all__ = ["forward_products", "plan_products", "ProductsPlan", "ProductsOutputs", "chunk_table", "launch_planned",
           "allocate", "CHUNK_MAJOR", "TOKEN_MAJOR"]

# the outputs indexed by chunk, and those indexed by token (None where the plan writes none), each in the
# kernel's argument order
CHUNK_MAJOR = ("w", "u", "u_scale", "kg", "qg", "aqk", "aqk_lo", "decay")
TOKEN_MAJOR = ("Aqk", "Akk", "q", "k", "q_rstd", "k_rstd")


class ProductsOutputs(NamedTuple):
    w: Any
    u: Any
    u_scale: Any
    kg: Any
    qg: Any
    aqk: Any
    aqk_lo: Any
    decay: Any
    cu_chunks: np.ndarray
    Aqk: Any     # None unless training
    Akk: Any
    q: Any = None        # the l2norm build's, in training (else None)
    k: Any = None
    q_rstd: Any = None
    k_rstd: Any = None


@dataclasses.dataclass(frozen=True)
class ProductsPlan:
    B: int
    T: int
    H: int
    HV: int
    scale: float
    cu_seqlens: np.ndarray     # host int64 [N + 1] token offsets
    training: bool
    torch_out: bool
    beta_bf16: bool
    config: Config = Config()   # the build: the form of the gate and of q and k (token_gate, l2norm)
    norm_copies: bool = True    # the l2norm build in training writes q and k normalised beside their rstd (False:
                                # the rstd alone, for a backward that reads the raw rows)

    @property
    def writes_norms(self) -> bool:
        """Whether the pass writes the rows' rstd (the l2norm build, in training), and with ``norm_copies`` q and
        k normalised."""
        return self.config.l2norm and self.training

    @property
    def cu_chunks(self) -> np.ndarray:
        return snapshot_offsets(np.diff(self.cu_seqlens), CHUNK_TOKENS, 1)   # FLA's chunk offsets

    @property
    def chunks(self) -> int:
        return int(self.cu_chunks[-1])


def plan_products(q, k, v, g, beta, *, scale: float | None = None, cu_seqlens=None, training: bool = True,
                  token_gate: bool = False, l2norm: bool = False, config: Config | None = None,
                  norm_copies: bool = True) -> ProductsPlan:
    """Every check of :func:`forward_products`, on the host: those of :func:`kernel.forward.plan_forward`,
    whose inputs this pass takes in the same two forms (``token_gate``, ``l2norm``), and that ``config`` (None:
    the build for those forms) is the build for them. ``norm_copies``: :attr:`ProductsPlan.norm_copies`."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.forward_products.Config or None, got {type(config).__name__}")
    if not isinstance(norm_copies, (bool, np.bool_)):
        raise TypeError(f"norm_copies must be True or False, got {norm_copies!r}")
    fp = plan_forward(q, k, v, g, beta, scale=scale, cu_seqlens=cu_seqlens, training=training,
                      token_gate=token_gate, l2norm=l2norm)
    cfg = config if config is not None else Config(token_gate=fp.config.token_gate, l2norm=fp.config.l2norm)
    check_forms(cfg, token_gate=fp.config.token_gate, l2norm=fp.config.l2norm)
    return ProductsPlan(B=fp.B, T=fp.T, H=fp.H, HV=fp.HV, scale=fp.scale, cu_seqlens=fp.cu_seqlens,
                        training=fp.blocks_shape is not None, torch_out=fp.torch_out, beta_bf16=fp.beta_bf16,
                        config=cfg, norm_copies=bool(norm_copies))


def chunk_table(cu_seqlens: np.ndarray) -> np.ndarray:
    """int32 [chunks, 2]: each chunk's first token and its real rows, sequence after sequence."""
    rows = []
    for bos, eos in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        for t0 in range(int(bos), int(eos), CHUNK_TOKENS):
            rows.append((t0, min(CHUNK_TOKENS, int(eos) - t0)))
    return np.asarray(rows, dtype=np.int32).reshape(-1, 2)


@functools.lru_cache(maxsize=64)
def _table_on_device(cu_bytes: bytes):
    import cupy

    return cupy.asarray(chunk_table(np.frombuffer(cu_bytes, dtype=np.int64)))


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads), cached per process."""
    return builds.kernel_function(BUILD, BUILD.module(cfg), label="the forward's products pass")


def launch_planned(plan: ProductsPlan, q, k, v, g, beta, out: dict, chunks: tuple[int, int] | None = None) -> None:
    """The pass on checked CuPy arrays (bf16 as uint16 bits, beta fp32) into ``out``'s arrays (as
    :func:`allocate` makes them), in the plan's build. ``chunks``: only chunks c0 .. c1 - 1 of the plan's
    (None: all), for a caller that runs the pass in pieces: their rows of the chunk table and of the
    chunk-major outputs; the inputs and the token-major outputs (Aqk's and INV's blocks, q and k normalised and
    their rstd) are taken whole, addressed by the table's tokens."""
    fn, smem, threads = kernel(plan.config)
    c0, c1 = check_chunk_range(chunks, plan.chunks)
    null = np.uint64(0)
    table = _table_on_device(np.ascontiguousarray(plan.cu_seqlens, dtype=np.int64).tobytes())[c0:c1]
    part = {n: out[n][c0:c1] for n in CHUNK_MAJOR}
    fn(((c1 - c0) * plan.HV,), (threads,),
       (q, k, v, g, beta, table, np.int32(plan.H), np.int32(plan.HV), np.float32(plan.scale), part["w"], part["u"],
        part["kg"], part["qg"], part["aqk"], part["aqk_lo"], part["decay"], part["u_scale"],
        *(out[n] if out[n] is not None else null for n in TOKEN_MAJOR)),
       shared_mem=smem)


def allocate(plan: ProductsPlan, device=None) -> tuple[dict, dict]:
    """The pass's outputs for ``plan``, uninitialised: (as returned, as CuPy views). Torch tensors on
    ``device`` (torch's allocator, on torch's current stream) where the plan's inputs are torch, else CuPy
    arrays; Aqk and Akk None unless the plan trains, q, k and their rstd None unless it writes them."""
    C, HV, D = plan.chunks, plan.HV, HEAD_DIM
    shapes = {"w": ((C, HV, CHUNK_TOKENS, D), "bf16"), "u": ((C, HV, CHUNK_TOKENS, D), "f16"),
              "u_scale": ((C, HV, 4), "f32"),
              "kg": ((C, HV, CHUNK_TOKENS, D), "bf16"), "qg": ((C, HV, CHUNK_TOKENS, D), "bf16"),
              "aqk": ((C, HV, CHUNK_TOKENS, CHUNK_TOKENS), "bf16"),
              "aqk_lo": ((C, HV, CHUNK_TOKENS, CHUNK_TOKENS), "bf16"), "decay": ((C, HV, D), "f32")}
    if plan.training:
        blocks = (plan.B, plan.T, HV, CHUNK_TOKENS)
        shapes.update(Aqk=(blocks, "bf16"), Akk=(blocks, "bf16"))
    if plan.writes_norms:
        rows = (plan.B, plan.T, plan.H)
        shapes.update(q_rstd=(rows, "f32"), k_rstd=(rows, "f32"))
        if plan.norm_copies:
            shapes.update(q=((*rows, D), "bf16"), k=((*rows, D), "bf16"))
    out_t, out_c = dict.fromkeys(TOKEN_MAJOR), dict.fromkeys(TOKEN_MAJOR)
    for name, (shape, dt) in shapes.items():
        out_t[name], out_c[name] = empty_output(shape, dt, device if plan.torch_out else None)
    return out_t, out_c


def forward_products(q, k, v, g, beta, *, scale: float | None = None, cu_seqlens=None, training: bool = True,
                     token_gate: bool = False, l2norm: bool = False, config: Config | None = None,
                     norm_copies: bool = True) -> ProductsOutputs:
    """Every chunk's products (module docstring); ``token_gate``, ``l2norm``: the inputs' forms; ``config``: the
    build (None: the one for those forms, without -lineinfo); ``norm_copies`` False: the l2norm build writes the
    rows' rstd alone (q and k None)."""
    plan = plan_products(q, k, v, g, beta, scale=scale, cu_seqlens=cu_seqlens, training=training,
                         token_gate=token_gate, l2norm=l2norm, config=config, norm_copies=norm_copies)
    require_cupy("kernel.forward_products")
    require_gpu("kernel.forward_products")
    q_c, k_c, v_c = (to_cupy(n, x, "bf16") for n, x in (("q", q), ("k", k), ("v", v)))
    g_c = to_cupy("g", g, "f32")
    beta_c = beta_f32(beta)
    out_t, out_c = allocate(plan, q.device if plan.torch_out else None)
    launch_planned(plan, q_c, k_c, v_c, g_c, beta_c, out_c)
    return ProductsOutputs(**{n: out_t[n] for n in (*CHUNK_MAJOR, *TOKEN_MAJOR)}, cu_chunks=plan.cu_chunks)
