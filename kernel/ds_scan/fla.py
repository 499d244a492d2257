"""Kernel A fed straight from FLA's forward tensors: the GPU entry point and its host-side checks.

    dh, dh0 = dstate_scan_from_fla(q, k, g64, beta, Aqk, Akk, do, dht=dht, cu_seqlens=cu_seqlens)

What and why
------------
flash-linear-attention's chunked KDA forward (``chunk_kda_fwd``, fla-core 0.6.0,
chunk_size 64) keeps, for its backward, every tensor Kernel A reads: q and k (as it
stored them: l2-normalised when ``use_qk_l2norm_in_kernel``), its g (the
64-chunk-local cumsum of the gate times 1/ln2, fp32, called ``g64`` here), beta,
``Aqk`` and ``Akk`` (bf16 [.., T, H, 64]). This entry point takes them as they are
and returns what FLA's ``chunk_gated_delta_rule_bwd_dhu`` returns: ``dh`` (bf16, one
state gradient per 64-chunk, [B, NT, H, K, V], or [1, sum of NT per sequence, H, K, V]
packed by FLA's ``chunk_offsets`` for varlen) and ``dh0`` (fp32 [N, H, K, V]; FLA
only makes it when given an initial state, this always does).
Nobody has to build Kernel A's tile-16 gc, Mqk and INV first.

q and k are used as given (Aqk was built from exactly these), so no l2norm is
applied here. ``scale`` must be the forward's (it is inside Aqk; Kernel A needs it
again for q): FLA's default is K**-0.5, the same default as here.

The float64 statement of the mapping, its three identities and their tests are
in :mod:`kernel.reference.fla_layout` (``kernel_a_inputs_from_fla`` is the
blueprint of the device loads described below).

The device side
---------------
The kernel keeps its parameter list; a build option (``config.Config.fla_inputs``,
``-DFLA_INPUTS``) makes it read three of them differently. What it receives, per token
row (``tokens`` = B * T, row strides in elements; every array C-contiguous, as checked
here; :func:`plan_fla_launch` returns this description)::

    q, k       bf16 [tokens, H, 128]   row stride H * 128    unchanged
    do         bf16 [tokens, HV, 128]  row stride HV * 128   unchanged
    beta       fp32 [tokens, HV]       row stride HV         (bf16 is widened on the host first)
    g64        fp32 [tokens, HV, 128]  row stride HV * 128   in place of gc
    Aqk        bf16 [tokens, HV, 64]   row stride HV * 64    in place of Mqk
    Akk        bf16 [tokens, HV, 64]   row stride HV * 64    in place of INV
    dht        fp32 [N, HV, 128, 128] or null
    snapshots  dh: bf16 (or fp32) [NT total, HV, 128, 128], every 4th tile (SNAP_EVERY 4)
    dh0        fp32 [N, HV, 128, 128]
    cu_seqlens, snapshot offsets (= FLA's chunk_offsets), order: as today

HV = H, or with FLA's grouped value heads (GVA) a multiple of it: value head hv reads q and k at
head hv // (HV / H) (kernel.shapes.qk_head), in place: they are never repeated in memory.

For tile n of a sequence (n counted from the sequence's start: FLA's chunks
restart at every sequence start, like Kernel A's tiles), rows tok0 .. tok0 + L - 1:

* Mqk = the 16 x 16 block of Aqk at those rows, columns 16 * (n mod 4) .. + 15, with
  the strictly-upper triangle (column > row) replaced by zero before any MMA: FLA never
  writes it (torch.empty: inf, NaN and values up to 3e38 were seen on the H200). A
  select (or a bitwise AND of the bf16 bits), never a multiplication: 0 * inf is NaN.
* INV = the same block of Akk (FLA stores zeros above the diagonal; the same mask keeps
  that from mattering).
* gc[c] = g64[tok0 + c] - base, base = g64[tok0 - 1] when n mod 4 > 0 (the row before
  the tile, same sequence, same 64-chunk), else 0; gT = gc[L - 1]. One extra 512-byte
  row per tile; the subtraction in fp32 (the blueprint does the same with fp32 g64).
  Rebasing is not optional: exp2(gT) must be the decay across this tile alone, and
  |g64| reaches 64 * 5 / ln 2 ~ 460, where q * exp2(gc) underflows fp32.
* Rows past L (a partial tile): zero, as today. A block row is 32 bytes at a 32-byte
  column offset, so the 16-byte cp.async copies stay aligned; with tensor-copy loads the
  Mqk/INV maps become (tokens, H * 64) with 16 x 16 boxes at column h * 64 + 16 * (n mod 4).

Everything in this module up to the launch runs on the host without a GPU
(:func:`plan_fla_launch`); the launch is :func:`kernel.ds_scan.launch.run` on the inputs the plan
checked, with ``fla_inputs=True`` (kernel/ds_scan/cuda/loads.cuh and r1.cuh hold the loads).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import launch
from ..runtime.arrays import ArrayInfo, check_scale, describe, expect, leading, require_cupy, require_gpu, value_heads
from ..shapes import (CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS, TILES_PER_CHUNK, check_cu_seqlens, snapshot_offsets,
                      states_shape)

FLA_OTHER_CHUNK = 32                       # KDA's only other chunk_size in fla-core 0.6.0
SNAPSHOT_DTYPES = ("bfloat16", "float32")

__all__ = ["dstate_scan_from_fla", "plan_fla_launch", "dh_shape", "FlaLaunch", "Operand",
           "SNAPSHOT_DTYPES"]


# ----------------------------------------------------------------------------
# what an argument is, without touching the GPU
# ----------------------------------------------------------------------------

# What the host-array refusal of dstate_scan_from_fla says after "(host memory): "
HOST_ADVICE = ("dstate_scan_from_fla runs Kernel A on the GPU and takes CuPy arrays or torch CUDA tensors. "
               "For a float64 evaluation on the host use kernel.reference.kernel_a_inputs_from_fla, then "
               "kernel.reference.dstate_scan_reference")


def _refuse_chunk_32(name: str, a: ArrayInfo, B: int, T: int, H: int) -> None:
    # The reference blueprint reads any chunk that is a multiple of 16; the GPU entry's dh
    # layout is FLA's at chunk 64 only, so chunk 32 gets a way round instead.
    if len(a.shape) == 4 and a.shape[:3] == (B, T, H) and a.shape[3] == FLA_OTHER_CHUNK:
        raise ValueError(
            f"{name} has {a.shape[3]} columns a row: FLA ran with chunk_size={a.shape[3]}, and this entry "
            f"point needs chunk_size={CHUNK_TOKENS} (FLA's default): its dh is every {a.shape[3]} tokens, "
            f"Kernel A stores snapshots every tile (16 tokens) or every 4th (64). Run FLA's forward with "
            f"chunk_size={CHUNK_TOKENS}, or build the tiles with kernel.reference.kernel_a_inputs_from_fla("
            f"..., chunk={a.shape[3]}) and call kernel.dstate_scan(..., snapshot_every=1), whose snapshot "
            f"of tile {a.shape[3] // TILE_TOKENS}m+{a.shape[3] // TILE_TOKENS - 1} is FLA's dh of chunk m")


# ----------------------------------------------------------------------------
# the launch plan: everything the kernel will receive, checked on the host
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Operand:
    """One input as the kernel will read it: device address, dtype, and strides in elements."""
    ptr: int
    dtype: str
    shape: tuple[int, ...]
    row_stride: int     # elements from one token's row to the next (dht: from one sequence to the next)
    head_stride: int    # elements from one head to the next within a row


@dataclasses.dataclass(frozen=True)
class FlaLaunch:
    """What the FLA-layout build of Kernel A will receive (module docstring: the device side).

    operands: q, k, g64, beta, Aqk, Akk, do (and dht when given), see :class:`Operand`.
    cu_seqlens int64 [N+1] and snapshot_offsets int64 [N+1] (FLA's chunk_offsets) are on
    the host; the launch copies them to the device. dh_shape / dh0_shape: the outputs.
    """
    B: int
    T: int
    H: int               # q's and k's heads
    HV: int              # the value heads of everything else: H, or a multiple of it (FLA's GVA)
    N: int
    scale: float
    snapshot_dtype: str
    operands: dict
    cu_seqlens: np.ndarray
    snapshot_offsets: np.ndarray
    dh_shape: tuple[int, ...]
    dh0_shape: tuple[int, ...]
    device: int | None
    torch_out: bool
    vsplit: int | str
    tuning: dict

    @property
    def snapshot_every(self) -> int:
        return TILES_PER_CHUNK


def dh_shape(B: int, HV: int, cu: np.ndarray, varlen: bool) -> tuple[int, ...]:
    """The shape of FLA's dh (and of its states h): one [K, V] state per 64-token chunk of every sequence
    of the host int64 ``cu`` [N + 1] and value head, [B, NT, HV, K, V], or [1, sum of NT, HV, K, V]
    packed by FLA's chunk_offsets for ``varlen``."""
    chunks = int(snapshot_offsets(np.diff(cu), TILE_TOKENS, TILES_PER_CHUNK)[-1])
    return states_shape(chunks, B, HV, varlen=varlen)


def plan_fla_launch(q, k, g64, beta, Aqk, Akk, do, *, dht=None, cu_seqlens=None,
                    scale: float | None = None, snapshot_dtype: str = "bfloat16",
                    state_v_first: bool = False, vsplit: int | str = "auto",
                    tuning: dict | None = None, host_advice: str = HOST_ADVICE) -> FlaLaunch:
    """Every check of :func:`dstate_scan_from_fla` and the launch it would make; host only
    (no allocation, nothing on the GPU; a device cu_seqlens is copied to the host).
    ``host_advice``: what a host array's refusal tells the caller to do instead."""
    if snapshot_dtype not in SNAPSHOT_DTYPES:
        raise ValueError(f"snapshot_dtype must be one of {SNAPSHOT_DTYPES}, got {snapshot_dtype!r}")
    if state_v_first:
        raise ValueError(
            "state_v_first=True (FLA's states stored [V, K]) is not covered: Kernel A reads dht as "
            "[N, H, K, V] and stores dh as [.., K, V]. Run FLA with state_v_first=False (its default), "
            "or pass dht.transpose(-1, -2).contiguous() and transpose the returned dh's last two axes")
    scale = check_scale(scale)
    launch.check_vsplit(vsplit)
    knobs = launch.check_tuning(tuning)

    qa = describe("q", q, host_advice)
    B, T, H = leading("q", qa)
    expect("q", qa, (B, T, H, HEAD_DIM), "[B, T, H, K]", ("bfloat16",))
    arrays = {"q": qa, "k": describe("k", k, host_advice)}
    expect("k", arrays["k"], (B, T, H, HEAD_DIM), "same as q: [B, T, H, K]", ("bfloat16",))
    # the gate's heads are the value heads of everything but q and k (FLA's GVA where more than q's)
    arrays["g64"] = describe("g64", g64, host_advice)
    HV = value_heads("g64", arrays["g64"], B, T, H)
    wide = (B, T, HV, HEAD_DIM)
    specs = (("g64", g64, wide, "[B, T, HV, K], FLA's chunk-local cumsum of g / ln 2", ("float32",)),
             ("beta", beta, (B, T, HV), "[B, T, HV]", ("float32", "bfloat16")),
             ("Aqk", Aqk, (B, T, HV, CHUNK_TOKENS), f"[B, T, HV, {CHUNK_TOKENS}]", ("bfloat16",)),
             ("Akk", Akk, (B, T, HV, CHUNK_TOKENS), f"[B, T, HV, {CHUNK_TOKENS}]", ("bfloat16",)),
             ("do", do, wide, f"[B, T, HV, V], V = {HEAD_DIM}", ("bfloat16",)))
    for name, x, shape, layout, dtypes in specs:
        a = arrays[name] if name in arrays else describe(name, x, host_advice)
        if name in ("Aqk", "Akk"):
            _refuse_chunk_32(name, a, B, T, HV)
        expect(name, a, shape, layout, dtypes)
        arrays[name] = a

    cu = check_cu_seqlens(cu_seqlens, B, T) if cu_seqlens is not None \
        else np.arange(B + 1, dtype=np.int64) * T
    N = cu.shape[0] - 1
    if dht is not None:
        arrays["dht"] = describe("dht", dht, host_advice)
        expect("dht", arrays["dht"], (N, HV, HEAD_DIM, HEAD_DIM), "[N, HV, K, V]", ("float32",))

    device = qa.device
    for name, a in arrays.items():
        if a.device is not None and device is not None and a.device != device:
            raise ValueError(f"{name} is on device {a.device}, q on device {device}: all inputs must be on one GPU")

    offsets = snapshot_offsets(np.diff(cu), TILE_TOKENS, TILES_PER_CHUNK)   # = FLA's chunk_offsets

    def operand(name: str) -> Operand:
        a = arrays[name]
        row = int(np.prod(a.shape[2:])) if name != "dht" else HV * HEAD_DIM * HEAD_DIM
        head = int(np.prod(a.shape[3:])) if name != "dht" else HEAD_DIM * HEAD_DIM
        return Operand(ptr=a.ptr, dtype=a.dtype, shape=a.shape, row_stride=row, head_stride=head)

    return FlaLaunch(B=B, T=T, H=H, HV=HV, N=N, scale=float(scale) if scale is not None else HEAD_DIM ** -0.5,
                     snapshot_dtype=snapshot_dtype, operands={n: operand(n) for n in arrays},
                     cu_seqlens=cu, snapshot_offsets=offsets, dh_shape=dh_shape(B, HV, cu, cu_seqlens is not None),
                     dh0_shape=(N, HV, HEAD_DIM, HEAD_DIM),
                     device=device, torch_out=qa.torch, vsplit=vsplit, tuning=knobs)


# ----------------------------------------------------------------------------
# the API
# ----------------------------------------------------------------------------

def dstate_scan_from_fla(q, k, g64, beta, Aqk, Akk, do, *, dht=None, cu_seqlens=None,
                         scale: float | None = None, snapshot_dtype: str = "bfloat16",
                         state_v_first: bool = False, vsplit: int | str = "auto",
                         segments: int | str = "auto", tuning: dict | None = None):
    """Kernel A on FLA's forward tensors (fla-core 0.6.0, chunk_size 64): FLA's dh and dh0.

    q, k: bf16 [B, T, H, 128] as FLA's forward stored them (l2-normalised if it did);
    g64: fp32 [B, T, HV, 128], FLA's g (64-chunk-local cumsum of the gate / ln 2);
    beta: fp32 or bf16 [B, T, HV]; Aqk, Akk: bf16 [B, T, HV, 64]; do: bf16 [B, T, HV, 128];
    dht: fp32 [N, HV, 128, 128] or None. HV = H, or a multiple of it (FLA's grouped value heads:
    value head hv reads q and k at head hv // (HV / H), as FLA maps them).
    Varlen: B == 1 and cu_seqlens (N+1 offsets).
    CuPy arrays (bf16 as uint16 bits) or torch CUDA tensors (then torch tensors come back).
    ``scale``: the forward's (default 128**-0.5, FLA's default).

    Returns (dh, dh0): dh [B, ceil(T/64), HV, 128, 128] (varlen: [1, sum ceil(n/64), HV, 128,
    128], FLA's chunk_offsets) in ``snapshot_dtype`` (bf16 = FLA's), the gradient w.r.t. the
    state after each 64-chunk; dh0 fp32 [N, HV, 128, 128].

    ``segments``: the sequence split, as in :func:`kernel.dstate_scan` (its cuts fall on
    FLA's 64-token chunk edges).

    Refused, with what to do instead: FLA's ``state_v_first``, chunk_size 32; and value heads
    that are not a multiple of q's.
    """
    launch.check_segments(segments)
    plan = plan_fla_launch(q, k, g64, beta, Aqk, Akk, do, dht=dht, cu_seqlens=cu_seqlens, scale=scale,
                           snapshot_dtype=snapshot_dtype, state_v_first=state_v_first, vsplit=vsplit, tuning=tuning)
    # the plan checked every argument: the launch takes its inputs from it without checking them again
    require_cupy(launch.WHAT)
    require_gpu(launch.WHAT)
    inputs = launch.scan_inputs_of(dict(q=q, k=k, g64=g64, beta=beta, Aqk=Aqk, Akk=Akk, do=do), dht,
                                   B=plan.B, T=plan.T, H=plan.H, HV=plan.HV, cu=plan.cu_seqlens)
    # FLA's q and k are used as it stored them (Aqk was built from exactly these): no l2norm here
    return launch.run(inputs, scale=plan.scale, varlen=cu_seqlens is not None, qk_l2norm=False,
                      snapshot_dtype=plan.snapshot_dtype, snapshot_every=plan.snapshot_every, vsplit=plan.vsplit,
                      segments=segments, knobs=plan.tuning, fla_inputs=True)
