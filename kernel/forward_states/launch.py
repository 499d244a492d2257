"""Kernel S: KDA's forward state scan on the GPU, the state entering every 64-token chunk.

    states = forward_states(k, v, g, beta, Akk, initial_state=h0, cu_seqlens=cu_seqlens)

What and why
------------
The whole backward needs, for every 64-token chunk, the forward state entering it (FLA's
``h``). When the forward did not keep it, this rebuilds it from the forward's own tensors:
a serial scan over 16-token tiles per sequence and head (kernel/forward_states/cuda/
forward_states.cu). Per tile (rows c < L; rows >= L: gc = gT and k, v, beta zero)::

    gc = g - g[row before the tile]  (nothing to subtract at a 64-chunk's first tile)
    gT = gc[L-1];  Kd = k 2^gc;  Kr = k 2^(gT-gc);  gamma = 2^gT
    INV = Akk's 16 x 16 diagonal block at columns 16 (tile mod 4), lower triangle incl. diagonal
    Vn = v - Kd S;  U = INV (beta Vn);  S <- diag(gamma) S + Kr^T U

The float64 statement is :func:`kernel.reference.kda_forward_reference` (its ``states``
at every 4th tile are this function's entries), up to the kernel's bf16 operands
(S, Kd, Kr, W = beta Vn and U are rounded to bf16 as MMA inputs; S itself is carried in fp32)
and the bf16 rounding of the output.

Tensors (FLA 0.6.0's forward, chunk_size 64; ``..`` = ``B, T`` or ``1, total`` with cu_seqlens)::

    k              bf16 [.., H, 128]    as FLA's forward used it (l2-normalised if it did)
    v              bf16 [.., HV, 128]
    g              fp32 [.., HV, 128]   FLA's g: the 64-chunk-local cumsum of the gate / ln 2
    beta           fp32 or bf16 [.., HV]
    Akk            bf16 [.., HV, 64]    only the diagonal blocks' lower triangles are read
    initial_state  fp32 [N, HV, 128, 128] ([K, V]) or None (zeros)
    -> states      bf16 [B, NT, HV, 128, 128] ([K, V]; varlen [1, sum NT_n, HV, 128, 128],
                   packed by kernel.reference.snapshot_offsets(lengths, 16, 4), FLA's chunk_offsets)

HV = H, or a multiple of it: FLA's grouped value heads (GVA), value head hv reading k at head
hv // (HV / H) (kernel.shapes.qk_head), in place (k is never repeated in memory).

CuPy arrays (bf16 as uint16 bits) or torch CUDA tensors; torch in, torch out (allocated by
torch). The kernel runs on CuPy's current stream (see kernel.ds_scan.launch for pointing it at torch's).
Values are not checked (no scan for NaN, inf or a g that is not a chunk-local cumsum), as in
kernel.ds_scan.launch: a bad value spoils that (sequence, head)'s states only.

:func:`plan_forward_states` does every check on the host (no GPU, no allocation);
:func:`forward_states` plans, compiles (once per :class:`Config`) and launches.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from ..runtime import builds
from ..runtime.arrays import (ArrayInfo, beta_f32, describe, empty_output, expect, leading, require_cupy, require_gpu,
                              to_cupy, value_heads)
from ..shapes import (CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS, TILES_PER_CHUNK, check_cu_seqlens, snapshot_offsets,
                      states_shape)
from .config import BUILD, Config, ScanShape, auto_config, choose_warps

H200_SM_COUNT = 132     # the auto rule's SM count where no GPU is asked (plan_forward_states' and plan_forward's default)
ALIGN = 16              # every tensor is copied by 16-byte cp.async (beta by 4 bytes)

__all__ = ["forward_states", "plan_forward_states", "plan_from_layout", "launch_planned", "device_tables", "module",
           "kernel", "StatesPlan", "ScanPlan", "host_advice", "check_batch", "scan_kernel", "planned_tables",
           "on_this_gpu"]


# ----------------------------------------------------------------------------
# the plan: every check, on the host
# ----------------------------------------------------------------------------


def sequence_bounds(cu_seqlens, B: int, T: int) -> np.ndarray:
    """Host int64 [N+1] token offsets of the sequences: cu_seqlens checked, or B rows of T."""
    if cu_seqlens is not None:
        return check_cu_seqlens(cu_seqlens, B, T)
    return np.arange(B + 1, dtype=np.int64) * T


def check_placement(arrays: dict, anchor: str, device) -> None:
    """Every array on ``anchor``'s GPU (``device``) and 16-byte aligned, as the kernel's cp.async copies
    need; the error names the array."""
    for name, a in arrays.items():
        if a.device is not None and device is not None and a.device != device:
            raise ValueError(f"{name} is on device {a.device}, {anchor} on device {device}: all inputs must be on "
                             f"one GPU")
        if a.ptr % ALIGN:
            raise ValueError(f"{name} starts at address {a.ptr:#x}, not a multiple of {ALIGN} bytes: the kernel "
                             f"copies it by 16-byte cp.async (pass a fresh tensor, e.g. .clone())")


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """What a scan's launch will do (Kernel S's, and the forward's, on the same grid): the batch, its
    offsets (host int64) and the build."""
    B: int
    T: int
    H: int                          # k's heads (and q's, in the forward)
    HV: int                         # the value heads of everything else: H, or a multiple of it (FLA's GVA)
    N: int
    cu_seqlens: np.ndarray          # [N+1]
    snapshot_offsets: np.ndarray    # [N+1], FLA's chunk_offsets
    config: ScanShape
    torch_out: bool
    device: int | None
    beta_bf16: bool
    has_initial_state: bool

    @property
    def ctas(self) -> int:
        return self.N * self.HV * self.config.vgroups


@dataclasses.dataclass(frozen=True)
class StatesPlan(ScanPlan):
    """What Kernel S's launch will do: a scan's plan and the states' shape."""
    states_shape: tuple[int, ...]
    config: Config


def host_advice(function: str) -> str:
    """What a scan's host-array refusal says after "(host memory): " (``{name}``: the array's, filled in by
    kernel.runtime.arrays.describe), ``function`` naming the scan's entry point."""
    return (f"{function} runs on the GPU and takes CuPy arrays or torch CUDA tensors (cupy.asarray({{name}}), "
            "or torch.from_numpy({name}).cuda(); bf16 in CuPy as uint16 bits, kernel.ds_scan.bf16_bits). For a "
            "float64 evaluation on the host use kernel.reference.kda_forward_reference")


HOST_ADVICE = host_advice("forward_states")


def _device_array(name: str, x: Any) -> ArrayInfo:
    return describe(name, x, HOST_ADVICE)


def check_batch(arrays: dict[str, ArrayInfo], specs, *, initial_state, cu_seqlens, B: int, T: int, HV: int,
                anchor: str, advice: str) -> tuple[np.ndarray, np.ndarray]:
    """The checks a scan's plan makes after its ``anchor``'s (q's or k's) and the value heads': each of
    ``specs`` (name, array, shape, layout, dtypes; described with ``advice`` unless in ``arrays``
    already), cu_seqlens, initial_state [N, HV, K, V] and every array's device and alignment
    (:func:`check_placement`). Returns the host int64 token offsets [N+1] and state-entry offsets [N+1]."""
    for name, x, shape, layout, dtypes in specs:
        if name not in arrays:
            arrays[name] = describe(name, x, advice)
        expect(name, arrays[name], shape, layout, dtypes)

    cu = sequence_bounds(cu_seqlens, B, T)
    N = cu.shape[0] - 1
    if initial_state is not None:
        arrays["initial_state"] = describe("initial_state", initial_state, advice)
        expect("initial_state", arrays["initial_state"], (N, HV, HEAD_DIM, HEAD_DIM), "[N, HV, K, V], N sequences",
               ("float32",))

    check_placement(arrays, anchor, arrays[anchor].device)
    return cu, snapshot_offsets(np.diff(cu), TILE_TOKENS, TILES_PER_CHUNK)


def plan_forward_states(k, v, g, beta, Akk, *, initial_state=None, cu_seqlens=None,
                        config: Config | None = None, sm_count: int = H200_SM_COUNT) -> StatesPlan:
    """Every check of :func:`forward_states` and the launch it would make; host only (nothing is
    allocated or run on the GPU; a device cu_seqlens is copied to the host). ``config`` None: the
    auto rule (:func:`choose_warps` for ``sm_count`` SMs; the launch passes the GPU's)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.forward_states.Config or None, got {type(config).__name__}")
    ka = _device_array("k", k)
    B, T, H = leading("k", ka)
    expect("k", ka, (B, T, H, HEAD_DIM), "[B, T, H, K], K = 128", ("bfloat16",))
    arrays = {"k": ka, "v": _device_array("v", v)}
    HV = value_heads("v", arrays["v"], B, T, H, qk_name="k")   # FLA's GVA where more than k's
    wide = (B, T, HV, HEAD_DIM)
    specs = (("v", v, wide, "[B, T, HV, V], V = 128, B, T as k", ("bfloat16",)),
             ("g", g, wide, "[B, T, HV, K], FLA's 64-chunk-local cumsum of the gate / ln 2", ("float32",)),
             ("beta", beta, (B, T, HV), "[B, T, HV]", ("float32", "bfloat16")),
             ("Akk", Akk, (B, T, HV, CHUNK_TOKENS), f"[B, T, HV, {CHUNK_TOKENS}], FLA's chunk_size {CHUNK_TOKENS}",
              ("bfloat16",)))
    cu, offsets = check_batch(arrays, specs, initial_state=initial_state, cu_seqlens=cu_seqlens, B=B, T=T, HV=HV,
                              anchor="k", advice=HOST_ADVICE)
    N = cu.shape[0] - 1
    shape = states_shape(int(offsets[-1]), B, HV, varlen=cu_seqlens is not None)
    cfg = config if config is not None else auto_config(choose_warps(N * HV, sm_count))
    return StatesPlan(B=B, T=T, H=H, HV=HV, N=N, cu_seqlens=cu, snapshot_offsets=offsets, states_shape=shape,
                      config=cfg, torch_out=ka.torch, device=ka.device, beta_bf16=arrays["beta"].dtype == "bfloat16",
                      has_initial_state=initial_state is not None)


# ----------------------------------------------------------------------------
# build and launch
# ----------------------------------------------------------------------------

def module(cfg: Config):
    """The compiled cupy.RawModule of one configuration (cached per process by ptx_lab.gpu)."""
    return BUILD.module(cfg)


def scan_kernel(build: builds.KernelBuild, mod, cfg: ScanShape, label: str):
    """(function, dynamic shared memory, threads) of a scan's compiled module ``mod`` of ``cfg``, its
    threads checked against the Config's (``label`` names the build in the errors)."""
    return builds.kernel_function(build, mod, label=label, threads_expected=cfg.threads,
                                  advice=": use fewer stages (Config.nstage) or fewer warps")


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads) of one configuration, cached per process."""
    return scan_kernel(BUILD, module(cfg), cfg, f"Kernel S configuration {cfg.name()}")


def device_tables(cu_seqlens: np.ndarray):
    """The scan's device tables for host offsets ``cu_seqlens`` (cu, state-entry offsets, CTA order, entries),
    made once per batch layout and cached (the runtime's cache, at one entry every 64 tokens)."""
    return builds.device_tables(cu_seqlens, TILES_PER_CHUNK)


def planned_tables(plan: ScanPlan):
    """(cu, state-entry offsets, CTA order) on the device for a scan's plan (:func:`device_tables`), their
    entries counted as the plan counts them."""
    cu_d, offs_d, order, total = device_tables(plan.cu_seqlens)
    if total != int(plan.snapshot_offsets[-1]):
        raise RuntimeError(f"state entries: the device tables count {total}, the plan {int(plan.snapshot_offsets[-1])}")
    return cu_d, offs_d, order


def on_this_gpu(plan: ScanPlan, config: ScanShape | None, auto_config: Callable[[int], ScanShape], package: str):
    """(cupy, the plan) for a scan's launch: CuPy and a GPU there (the errors name ``package``), and
    where no ``config`` was given, ``auto_config``'s for this GPU's SM count (the plan's is for
    H200_SM_COUNT)."""
    cupy = require_cupy(package)
    require_gpu(package)
    if config is None:
        plan = dataclasses.replace(plan, config=auto_config(choose_warps(plan.N * plan.HV, builds.sm_count())))
    return cupy, plan


def forward_states(k, v, g, beta, Akk, *, initial_state=None, cu_seqlens=None, config: Config | None = None,
                   out=None):
    """Kernel S: the bf16 state entering every 64-token chunk (FLA's h), from FLA's forward tensors.

    k: bf16 [B, T, H, 128]; v: bf16 [B, T, HV, 128]; g: fp32 [B, T, HV, 128] (FLA's chunk-local cumsum /
    ln 2); beta: fp32 or bf16 [B, T, HV]; Akk: bf16 [B, T, HV, 64]; initial_state: fp32 [N, HV, 128, 128]
    or None (zeros). HV = H, or a multiple of it (FLA's grouped value heads: value head hv reads k at
    head hv // (HV / H)).
    Varlen: B == 1 and cu_seqlens (N+1 int offsets, 0 first, strictly increasing, T last).
    Returns bf16 [B, NT, HV, 128, 128] (varlen [1, sum NT_n, HV, 128, 128]), entry c of a sequence = its
    state entering tokens 64c.. ([K, V]). ``config``: the build (None: the auto rule for this GPU).
    ``out``: a C-contiguous CuPy uint16 array of that shape to write into and return, for a caller
    that runs this on another stream than the one its result is used and freed on (kda_backward).
    """
    plan = plan_forward_states(k, v, g, beta, Akk, initial_state=initial_state, cu_seqlens=cu_seqlens,
                               config=config, sm_count=H200_SM_COUNT)
    cupy, plan = on_this_gpu(plan, config, auto_config, "kernel.forward_states")

    k_c = to_cupy("k", k, "bf16")
    v_c = to_cupy("v", v, "bf16")
    g_c = to_cupy("g", g, "f32")
    beta_c = beta_f32(beta)
    akk_c = to_cupy("Akk", Akk, "bf16")
    h0 = to_cupy("initial_state", initial_state, "f32") if initial_state is not None else None
    if out is not None:
        if not isinstance(out, cupy.ndarray) or out.dtype != np.uint16 or tuple(out.shape) != plan.states_shape \
                or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous cupy.ndarray of uint16 (bf16 bits) with shape "
                             f"{plan.states_shape}, got {type(out).__name__} {getattr(out, 'dtype', '')} "
                             f"{tuple(getattr(out, 'shape', ()))}")
        out_t = out
    else:
        out_t, out = empty_output(plan.states_shape, "bf16", k.device if plan.torch_out else None)
    launch_planned(plan, k_c, v_c, g_c, beta_c, akk_c, h0, out)
    return out_t


def plan_from_layout(B: int, T: int, H: int, HV: int, cu_seqlens: np.ndarray, states_shape: tuple[int, ...],
                     config: Config, has_initial_state: bool) -> StatesPlan:
    """The plan of a caller that checked the batch already (kernel.kda_backward: k's heads H, the value
    heads HV, its host int64 ``cu_seqlens`` [N+1] and the states' shape, FLA's h): nothing is checked
    again here."""
    offsets = snapshot_offsets(np.diff(cu_seqlens), TILE_TOKENS, TILES_PER_CHUNK)
    return StatesPlan(B=B, T=T, H=H, HV=HV, N=len(cu_seqlens) - 1, cu_seqlens=cu_seqlens, snapshot_offsets=offsets,
                      states_shape=tuple(states_shape), config=config, torch_out=False, device=None,
                      beta_bf16=False, has_initial_state=has_initial_state)


def launch_planned(plan: StatesPlan, k, v, g, beta, Akk, initial_state, out) -> None:
    """Kernel S on checked CuPy arrays (bf16 as uint16 bits; beta fp32) into ``out``, a CuPy uint16 array
    of plan.states_shape: the launch alone, for callers whose boundary checked the arguments."""
    cu_d, offs_d, order = planned_tables(plan)
    fn, smem, threads = kernel(plan.config)
    null = np.uint64(0)
    fn((plan.ctas,), (threads,),
       (k, v, g, beta, Akk, initial_state if initial_state is not None else null, out, cu_d, offs_d, order,
        np.int32(plan.HV), np.int32(plan.H)),
       shared_mem=smem)
