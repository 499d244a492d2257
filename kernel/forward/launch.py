"""The forward: KDA's chunked forward on the GPU in one pass over 16-token tiles.

    out = forward(q, k, v, g, beta, scale=s, initial_state=h0, cu_seqlens=cu,
                  output_final_state=True, training=True)
    out.o, out.final_state, out.states, out.Aqk, out.Akk

What and why
------------
One serial scan per (sequence, value head, v group), as Kernel S (kernel.forward_states) runs it,
with q beside k, Mqk and INV built on chip instead of read, and o written
(kernel/forward/cuda/forward.cu; docs/kda_forward.md counts its bytes and FLOPs). Per tile (rows
c < L; rows >= L: gc = gT and q, k, v, beta zero)::

    gc = g - g[row before the tile]  (nothing to subtract at a 64-chunk's first tile); gT = gc[L-1]
    Kd = k 2^gc;  Kr = k 2^(gT-gc);  Qd = s q 2^gc;  Qe = s q 2^(gc-gT);  Ke = k 2^(gc-gT);  gamma = 2^gT
    Mqk = strict_tril(Qe Kr^T) + diag(s q . k);  INV = (I + diag(beta) strict_tril(Ke Kr^T))^-1
    Vn = v - Kd S;  U = INV (beta Vn);  o = Qd S + Mqk U;  S <- diag(gamma) S + Kr^T U

A tile whose gate spans more than 110 (log2) in some channel (:data:`kernel.shapes.SPAN_LIMIT`: short of
fp32's 126, as -ftz=true flushes the small entries of Kr) has its Mqk and Akk formed pairwise instead,
entry by entry, decided on the device: any gate FLA accepts runs.
The float64 statement is :func:`kernel.reference.kda_forward_reference` (qk_l2norm off: q and k as
given), up to the kernel's roundings: bf16 MMA operands (S, Kd, Kr, Qd, Qe, Ke, W = beta Vn, U, INV,
Mqk), fp32 products, and the bf16 outputs.

Tensors (FLA 0.6.0's ``chunk_kda_fwd`` conventions, chunk_size 64; ``..`` = ``B, T`` or ``1, total``)::

    q, k           bf16 [.., H, 128]    as the caller wants them used (l2-normalise first if so), or with
                                        l2norm=True as the caller has them: the kernel normalises them
    v              bf16 [.., HV, 128]
    g              fp32 [.., HV, 128]   FLA's g: the 64-chunk-local cumsum of the log gate / ln 2; with
                                        token_gate=True each token's own natural-log gate, which the
                                        kernel sums within each tile (kernel.shapes.tile_gate_sums)
    beta           fp32 or bf16 [.., HV]
    initial_state  fp32 [N, HV, 128, 128] ([K, V]) or None (zeros)
    -> o           bf16 [.., HV, 128]
    -> final_state fp32 [N, HV, 128, 128] (output_final_state)
    -> states      bf16 [B, NT, HV, 128, 128] (varlen [1, sum NT_n, HV, 128, 128]): the state entering
                   every 64-token chunk, Kernel S's output and kernel.kda_backward's ``states`` (training)
    -> Aqk, Akk    bf16 [.., HV, 64]: their 16 x 16 diagonal blocks, Mqk and INV as FLA stores them
                   (zero above the diagonal); the rest of each row is not written, and our backward
                   reads only these blocks (training)
    -> q, k        bf16 [.., H, 128]: with l2norm=True in training mode, q and k normalised as the kernel used
                   them (FLA's l2norm_fwd: x / sqrt(sum x^2 + 1e-6) in fp32, rounded), the backward's q and k
    -> q_rstd, k_rstd  fp32 [.., H]: ... and each row's 1 / sqrt(sum x^2 + 1e-6), the backward's rstd

or, with ``rstd=(q_rstd, k_rstd)`` (fp32 [.., H], :func:`kernel.row_rstd.row_rstd`'s), q and k as the caller
has them: the kernel uses each row times its rstd, folded into the fp32 factors the row already takes (not rounded
to bf16 first, as FLA's normalised copies are); the copies are never written, and the backward reads the raw rows
and the same rstd.

HV = H, or a multiple of it: FLA's grouped value heads (GVA), value head hv reading q and k at head
hv // (HV / H) (kernel.shapes.qk_head), in place (never repeated in memory).

CuPy arrays (bf16 as uint16 bits) or torch CUDA tensors; torch in, torch out (allocated by torch).
The kernel runs on CuPy's current stream. Values are not checked, as in kernel.forward_states.

:func:`plan_forward` does every check on the host (no GPU, no allocation); :func:`forward` plans,
compiles (once per :class:`Config`) and launches.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import numpy as np

from ..runtime.arrays import (ArrayInfo, beta_f32, check_scale, describe, empty_output, expect, leading, to_cupy,
                              value_heads)
from ..shapes import CHUNK_TOKENS, HEAD_DIM, states_shape
from ..forward_states.launch import (H200_SM_COUNT, ScanPlan, check_batch, host_advice, on_this_gpu, planned_tables,
                                     scan_kernel)
from .config import BUILD, Config, auto_config, choose_warps

__all__ = ["forward", "plan_forward", "check_forms", "launch_planned", "module", "kernel", "ForwardPlan",
           "ForwardOutputs"]


class ForwardOutputs(NamedTuple):
    """What :func:`forward` returns; an output not asked for is None. q, k, q_rstd, k_rstd: the l2norm
    build's normalised q and k and each row's rstd (FLA's l2norm_fwd's outputs), in training mode."""
    o: Any
    final_state: Any
    states: Any
    Aqk: Any
    Akk: Any
    q: Any = None
    k: Any = None
    q_rstd: Any = None
    k_rstd: Any = None


# ----------------------------------------------------------------------------
# the plan: every check, on the host
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ForwardPlan(ScanPlan):
    """What the forward's launch will do: Kernel S's plan of a scan (the batch, its offsets, the build),
    q's scale and the outputs it writes."""
    scale: float
    o_shape: tuple[int, ...]
    final_shape: tuple[int, ...] | None     # None: not written
    states_shape: tuple[int, ...] | None    # None: not written (inference)
    blocks_shape: tuple[int, ...] | None    # Aqk's and Akk's; None: not written (inference)
    config: Config
    norm_shape: tuple[int, ...] | None = None   # the l2norm build's normalised q and k (q's shape; their rstd
                                                # q's without the last axis); None: not written

HOST_ADVICE = host_advice("forward")


def _device_array(name: str, x: Any) -> ArrayInfo:
    return describe(name, x, HOST_ADVICE)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_forms(config, **forms: bool) -> None:
    """ValueError where ``config`` (a build of the forward or of the products pass) is not the build for the
    inputs' forms the call passes (``token_gate``, ``l2norm``: each a field of the build)."""
    for name, value in forms.items():
        if getattr(config, name) != value:
            raise ValueError(f"config {config.name()} is the build for {name}={getattr(config, name)}, but the call "
                             f"passes {name}={value}: the inputs' form must be the build's")


def plan_forward(q, k, v, g, beta, *, scale: float | None = None, initial_state=None, cu_seqlens=None,
                 output_final_state: bool = False, training: bool = False, token_gate: bool = False,
                 l2norm: bool = False, rstd: tuple | None = None, config: Config | None = None,
                 sm_count: int = H200_SM_COUNT) -> ForwardPlan:
    """Every check of :func:`forward` and the launch it would make; host only (nothing is allocated or
    run on the GPU; a device cu_seqlens is copied to the host). ``config`` None: the auto rule
    (:func:`kernel.forward_states.choose_warps` for ``sm_count`` SMs; the launch passes the GPU's)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.forward.Config or None, got {type(config).__name__}")
    output_final_state = _flag("output_final_state", output_final_state)
    training = _flag("training", training)
    token_gate = _flag("token_gate", token_gate)
    l2norm = _flag("l2norm", l2norm)
    qk_rstd = rstd is not None
    if qk_rstd and (not isinstance(rstd, (tuple, list)) or len(rstd) != 2):
        raise TypeError(f"rstd must be a pair (q_rstd, k_rstd) or None, got {type(rstd).__name__}")
    if qk_rstd and l2norm:
        raise ValueError("rstd and l2norm=True are two ways of normalising q and k: pass rstd (the rows' rstd, "
                         "computed before) or l2norm=True (the kernel forms them), not both")
    if config is not None:
        check_forms(config, token_gate=token_gate, l2norm=l2norm, qk_rstd=qk_rstd)
    scale = check_scale(scale)
    qa = _device_array("q", q)
    B, T, H = leading("q", qa)
    expect("q", qa, (B, T, H, HEAD_DIM), "[B, T, H, K], K = 128", ("bfloat16",))
    arrays = {"q": qa, "k": _device_array("k", k), "v": _device_array("v", v)}
    expect("k", arrays["k"], (B, T, H, HEAD_DIM), "[B, T, H, K], as q", ("bfloat16",))
    HV = value_heads("v", arrays["v"], B, T, H, qk_name="q")   # FLA's GVA where more than q's
    wide = (B, T, HV, HEAD_DIM)
    specs = (("v", v, wide, "[B, T, HV, V], V = 128, B, T as q", ("bfloat16",)),
             ("g", g, wide, "[B, T, HV, K], each token's natural-log gate" if token_gate else
              "[B, T, HV, K], FLA's 64-chunk-local cumsum of the gate / ln 2", ("float32",)),
             ("beta", beta, (B, T, HV), "[B, T, HV]", ("float32", "bfloat16")))
    if qk_rstd:
        for name, x in zip(("q_rstd", "k_rstd"), rstd):
            arrays[name] = _device_array(name, x)
            expect(name, arrays[name], (B, T, H), "[B, T, H], fp32: each row's 1 / sqrt(sum x^2 + 1e-6)",
                   ("float32",))
    cu, offsets = check_batch(arrays, specs, initial_state=initial_state, cu_seqlens=cu_seqlens, B=B, T=T, HV=HV,
                              anchor="q", advice=HOST_ADVICE)
    N = cu.shape[0] - 1
    shape = states_shape(int(offsets[-1]), B, HV, varlen=cu_seqlens is not None) if training else None
    cfg = config if config is not None else auto_config(choose_warps(N * HV, sm_count), token_gate, l2norm, qk_rstd)
    return ForwardPlan(B=B, T=T, H=H, HV=HV, N=N, scale=scale if scale is not None else HEAD_DIM ** -0.5,
                       cu_seqlens=cu, snapshot_offsets=offsets, o_shape=wide,
                       final_shape=(N, HV, HEAD_DIM, HEAD_DIM) if output_final_state else None,
                       states_shape=shape, blocks_shape=(B, T, HV, CHUNK_TOKENS) if training else None,
                       config=cfg, norm_shape=(B, T, H, HEAD_DIM) if l2norm and training else None,
                       torch_out=qa.torch, device=qa.device,
                       beta_bf16=arrays["beta"].dtype == "bfloat16", has_initial_state=initial_state is not None)


# ----------------------------------------------------------------------------
# build and launch
# ----------------------------------------------------------------------------

def module(cfg: Config):
    """The compiled cupy.RawModule of one configuration (cached per process by ptx_lab.gpu)."""
    return BUILD.module(cfg)


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads) of one configuration, cached per process."""
    return scan_kernel(BUILD, module(cfg), cfg, f"the forward's configuration {cfg.name()}")


def forward(q, k, v, g, beta, *, scale: float | None = None, initial_state=None, cu_seqlens=None,
            output_final_state: bool = False, training: bool = False, token_gate: bool = False,
            l2norm: bool = False, rstd: tuple | None = None, config: Config | None = None) -> ForwardOutputs:
    """KDA's forward in one pass: o, and the final state (``output_final_state``), and in ``training``
    mode the states entering every 64-token chunk and Aqk's and Akk's diagonal blocks (what
    kernel.kda_backward reads: its ``states``, ``Aqk`` and ``Akk``).

    q, k: bf16 [B, T, H, 128]; v: bf16 [B, T, HV, 128]; g: fp32 [B, T, HV, 128] (FLA's chunk-local cumsum /
    ln 2, or with ``token_gate`` each token's natural-log gate: the cumsum pass folded into the kernel);
    beta: fp32 or bf16 [B, T, HV]; scale: q's scale (None: 128**-0.5); initial_state: fp32
    [N, HV, 128, 128] or None (zeros). HV = H or a multiple of it (FLA's grouped value heads).
    Varlen: B == 1 and cu_seqlens (N+1 int offsets, 0 first, strictly increasing, T last).
    ``l2norm``: q and k raw, normalised by the kernel, which writes them normalised with their rstd (in
    training); ``rstd``: q and k raw, with each row's rstd (fp32 [B, T, H] each) given.
    ``config``: the build (None: the auto rule for this GPU). Returns :class:`ForwardOutputs`.
    """
    plan = plan_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        output_final_state=output_final_state, training=training, token_gate=token_gate,
                        l2norm=l2norm, rstd=rstd, config=config, sm_count=H200_SM_COUNT)
    _, plan = on_this_gpu(plan, config, functools.partial(auto_config, token_gate=plan.config.token_gate,
                                                          l2norm=plan.config.l2norm, qk_rstd=plan.config.qk_rstd),
                          "kernel.forward")

    q_c = to_cupy("q", q, "bf16")
    k_c = to_cupy("k", k, "bf16")
    v_c = to_cupy("v", v, "bf16")
    g_c = to_cupy("g", g, "f32")
    beta_c = beta_f32(beta)
    h0 = to_cupy("initial_state", initial_state, "f32") if initial_state is not None else None

    def empty(shape, dtype: str):
        """(what the caller gets, its CuPy view) of an uninitialised output, or (None, None)."""
        if shape is None:
            return None, None
        return empty_output(shape, dtype, q.device if plan.torch_out else None)

    o_t, o_c = empty(plan.o_shape, "bf16")
    final_t, final_c = empty(plan.final_shape, "f32")
    states_t, states_c = empty(plan.states_shape, "bf16")
    aqk_t, aqk_c = empty(plan.blocks_shape, "bf16")
    akk_t, akk_c = empty(plan.blocks_shape, "bf16")
    norm = plan.norm_shape
    (qn_t, qn_c), (kn_t, kn_c) = empty(norm, "bf16"), empty(norm, "bf16")
    (qr_t, qr_c), (kr_t, kr_c) = (empty(None if norm is None else norm[:-1], "f32") for _ in range(2))
    given = None if rstd is None else tuple(to_cupy(name, x, "f32") for name, x in zip(("q_rstd", "k_rstd"), rstd))
    launch_planned(plan, q_c, k_c, v_c, g_c, beta_c, h0, o_c, final_c, states_c, aqk_c, akk_c,
                   normed=None if norm is None else (qn_c, kn_c, qr_c, kr_c), rstd=given)
    return ForwardOutputs(o=o_t, final_state=final_t, states=states_t, Aqk=aqk_t, Akk=akk_t, q=qn_t, k=kn_t,
                          q_rstd=qr_t, k_rstd=kr_t)


def launch_planned(plan: ForwardPlan, q, k, v, g, beta, initial_state, o, final_state, states, Aqk, Akk,
                   normed: tuple | None = None, rstd: tuple | None = None) -> None:
    """The forward on checked CuPy arrays (bf16 as uint16 bits; beta fp32) into the outputs the plan
    names (CuPy arrays of its shapes; None where the plan writes none): the launch alone. ``normed``:
    the l2norm build's (q, k, q_rstd, k_rstd) outputs, where the plan writes them; ``rstd``: the qk_rstd
    build's (q_rstd, k_rstd) inputs (the kernel reads them where the l2norm build writes its rstd)."""
    if (rstd is not None) != plan.config.qk_rstd:
        raise ValueError(f"the build {plan.config.name()} {'reads' if plan.config.qk_rstd else 'takes no'} rstd, "
                         f"but rstd is {'missing' if rstd is None else 'given'}")
    if rstd is not None:
        normed = (None, None, *rstd)
    cu_d, offs_d, order = planned_tables(plan)
    fn, smem, threads = kernel(plan.config)
    null = np.uint64(0)
    ptr = lambda x: null if x is None else x   # noqa: E731
    fn((plan.ctas,), (threads,),
       (q, k, v, g, beta, ptr(initial_state), np.float32(plan.scale), o, ptr(final_state), ptr(states), ptr(Aqk),
        ptr(Akk), *(ptr(x) for x in (normed or (None,) * 4)), cu_d, offs_d, order, np.int32(plan.HV),
        np.int32(plan.H)),
       shared_mem=smem)
