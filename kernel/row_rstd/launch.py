"""The rstd pass: each row's l2norm scale of q and of k, without the normalised copies.

    q_rstd, k_rstd = row_rstd(q, k)

What and why
------------
The op l2-normalises q and k (FLA's ``l2norm_fwd``: y = x / sqrt(sum x^2 + 1e-6) in x's dtype, and
rstd = 1 / sqrt(sum x^2 + 1e-6) in fp32). Our kernels read the raw rows and each row's rstd and normalise on chip,
so of that pass only the rstd is needed: this pass reads q and k and writes the rstd alone, about half the bytes
of a pass that also writes the copies. One launch covers both tensors (kernel/row_rstd/cuda/row_rstd.cu).
torch's ``linalg.vector_norm(x, dtype=float32)`` would do it in one call, but casts x to fp32 first, a copy twice
x's bytes.

Tensors::

    q, k            bf16 [..., 128], the same shape, C-contiguous, 16-byte aligned (16-byte loads)
    -> q_rstd       fp32 q.shape[:-1]   1 / sqrt(sum q^2 + 1e-6) over the last axis
    -> k_rstd       fp32 k.shape[:-1]

The squares are summed in fp32 in a fixed order (the kernel's comment), so two calls give the same bits; the
order is not FLA's, so the rstd agrees with FLA's to fp32 rounding, not bit for bit. A row whose sum of squares
passes fp32's largest number (3.4e38: a row of elements of 1.7e18, or one element of 1.9e19) gets rstd 0, as it
does in FLA's fp32 formula.

torch CUDA tensors in, torch tensors out: allocated by torch's caching allocator, the kernel launched on torch's
current stream. CuPy arrays (bf16 as uint16 bits) in, CuPy arrays out, on CuPy's current stream.
:func:`plan_row_rstd` does every check on the host (no GPU, no allocation); :func:`launch_planned` is the
launch alone, for a caller with CuPy arrays of its own.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..runtime import builds
from ..runtime.arrays import ArrayInfo, describe, empty_output, expect, require_cupy, require_gpu, to_cupy, \
    torch_stream_for_cupy
from ..shapes import HEAD_DIM
from .config import BUILD, Config

__all__ = ["row_rstd", "plan_row_rstd", "RstdPlan", "launch_planned", "kernel", "bytes_moved", "ALIGN"]

ALIGN = 16        # bytes: each lane loads 16 of a row's 256
HOST_ADVICE = ("row_rstd runs on the GPU and takes torch CUDA tensors or CuPy arrays (cupy.asarray({name}); bf16 "
               "in CuPy as uint16 bits, kernel.runtime.arrays.bf16_bits). The same formula in torch is "
               "kernel.fla_dropin.preprocess.l2norm_fwd")


@dataclasses.dataclass(frozen=True)
class RstdPlan:
    shape: tuple[int, ...]    # q's (and k's)
    config: Config
    torch_out: bool
    device: int | None        # q's device, where it says

    @property
    def rows(self) -> int:
        """The rows of each of q and k."""
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.shape[:-1]

    @property
    def bytes_moved(self) -> int:
        return bytes_moved(self.rows)


def bytes_moved(rows: int) -> int:
    """The pass's DRAM bytes at its floor for ``rows`` rows of each of q and k: both read (256 B a row), both rstd
    written (4 B)."""
    return 2 * rows * (2 * HEAD_DIM + 4)


def _check_rows(name: str, a: ArrayInfo) -> None:
    """ValueError / TypeError naming ``name`` unless it is bf16 [..., 128], C-contiguous and 16-byte aligned."""
    if len(a.shape) < 1 or a.shape[-1] != HEAD_DIM:
        raise ValueError(f"{name} must be [..., {HEAD_DIM}] (rows of the head size {HEAD_DIM}), got shape {a.shape}")
    expect(name, a, a.shape, f"[..., {HEAD_DIM}]", ("bfloat16",))   # its dtype and layout, as every kernel's inputs
    if a.ptr % ALIGN:
        raise ValueError(f"{name}'s data must be {ALIGN}-byte aligned (the kernel loads {ALIGN} bytes a lane), its "
                         f"address is {a.ptr % ALIGN} bytes past a multiple of {ALIGN} (a view at an odd offset: "
                         f"call .clone())")


def plan_row_rstd(q, k, *, config: Config | None = None) -> RstdPlan:
    """Every check of a call, on the host: dtypes, shapes, contiguity, alignment, one device and one kind of
    array, the config. No GPU needed, nothing allocated."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.row_rstd.Config or None, got {type(config).__name__}")
    qa, ka = describe("q", q, HOST_ADVICE), describe("k", k, HOST_ADVICE)
    _check_rows("q", qa)
    _check_rows("k", ka)
    if ka.shape != qa.shape:
        raise ValueError(f"k must have q's shape {qa.shape}, got {ka.shape}")
    if qa.device != ka.device or qa.torch != ka.torch:
        raise ValueError(f"q and k must be on one device and both torch tensors or both CuPy arrays, got q: device "
                         f"{qa.device} ({'torch' if qa.torch else 'cupy'}), k: device {ka.device} "
                         f"({'torch' if ka.torch else 'cupy'})")
    return RstdPlan(shape=qa.shape, config=config if config is not None else Config(), torch_out=qa.torch,
                    device=qa.device)


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads) of one configuration, cached per process."""
    return builds.kernel_function(BUILD, BUILD.module(cfg), label=f"the rstd pass {cfg.name()}",
                                  threads_expected=cfg.threads)


def grid(plan: RstdPlan, sms: int) -> int:
    """The CTAs of a launch on ``sms`` SMs: as many as the build keeps resident (8 an SM), fewer where both
    tensors' rows take fewer steps of a CTA (each CTA walks its steps, strided by the grid)."""
    steps = -(-2 * plan.rows // plan.config.rows_per_step)
    return max(1, min(steps, plan.config.ctas_per_sm * sms))


def launch_planned(plan: RstdPlan, q, k, q_rstd, k_rstd) -> None:
    """The rstd pass on checked CuPy arrays (q, k bf16 as uint16 bits; q_rstd, k_rstd float32 of the plan's
    out_shape) on CuPy's current stream: the launch alone. Nothing is launched for no rows."""
    if plan.rows == 0:
        return
    fn, smem, threads = kernel(plan.config)
    fn((grid(plan, builds.sm_count()),), (threads,), (q, k, np.int64(plan.rows), q_rstd, k_rstd), shared_mem=smem)


def row_rstd(q, k, *, config: Config | None = None):
    """(q_rstd, k_rstd): fp32 1 / sqrt(sum x^2 + 1e-6) over each row of q and of k (module docstring)."""
    plan = plan_row_rstd(q, k, config=config)
    cupy = require_cupy("kernel.row_rstd")
    require_gpu("kernel.row_rstd")
    if plan.torch_out:
        import torch

        with torch.cuda.device(q.device), cupy.cuda.Device(plan.device):
            q_rstd, q_rstd_c = empty_output(plan.out_shape, "f32", q.device)
            k_rstd, k_rstd_c = empty_output(plan.out_shape, "f32", q.device)
            with torch_stream_for_cupy("kernel.row_rstd"):
                launch_planned(plan, to_cupy("q", q, "bf16"), to_cupy("k", k, "bf16"), q_rstd_c, k_rstd_c)
        return q_rstd, k_rstd
    with cupy.cuda.Device(plan.device):   # None: the current one
        q_rstd, k_rstd = (empty_output(plan.out_shape, "f32")[0] for _ in range(2))
        launch_planned(plan, to_cupy("q", q, "bf16"), to_cupy("k", k, "bf16"), q_rstd, k_rstd)
    return q_rstd, k_rstd
