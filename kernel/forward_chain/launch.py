"""The forward chain: the state entering every 64-token chunk and each chunk's v_new, from the chunks'
products, one step of two GEMMs per chunk.

    out = forward_chain(w, u, kg, decay, u_scale, cu_chunks=cu, initial_state=h0, output_final_state=True)
    out.states, out.v_new, out.final_state

What and why
------------
The middle pass of the three-pass forward (docs/kda_forward.md, the design "three passes (64-token
chain)"): the first pass builds every chunk's products at once, across all SMs; this pass walks each
(sequence, value head) chunk by chunk; the third forms o from the states and v_new. Per chunk
(kernel/forward_chain/cuda/forward_chain.cu)::

    states[c] = bf16(S);  v_new[c] = bf16(u_scale[c] u - w bf16(S));  S <- diag(decay) S + kg^T v_new[c]

with S fp32 from ``initial_state`` (or zeros) to ``final_state``. The numpy statement of the same
arithmetic is ``chain`` of tests/kernel/three_pass_model.py (the kernel sums its MMAs in another
order, so the two agree to fp32 rounding, not bit for bit).

Tensors (chunk-major: a sequence's chunks one after another, sequence after sequence; rows of a chunk
past its sequence's end are zero in w, u and kg)::

    w, kg          bf16 [chunks, HV, 64, 128]    w = INV (beta k 2^gc), kg = k 2^(gT - gc)
    u              fp16 [chunks, HV, 64, 128]    INV (beta v) / u_scale (kernel.forward_products writes it so:
                                                 fp16 rounds 8x finer than bf16, and the scale keeps it in range)
    decay          fp32 [chunks, HV, 128]        2^gT, gT the chunk's gate sum (log2)
    u_scale        fp32 [chunks, HV, 4]          a power of two a chunk in element 0 (16 bytes: one bulk copy)
    cu_chunks      host ints [N + 1]             sequence n's chunks are cu_chunks[n] .. cu_chunks[n + 1] - 1
                                                 (None: one sequence of every chunk)
    initial_state  fp32 [N, HV, 128, 128] ([K, V]) or None (zeros)
    -> states      bf16 [chunks, HV, 128, 128]  ([K, V]: our backward's and FLA's h layout)
    -> v_new       bf16 [chunks, HV, 64, 128]
    -> final_state fp32 [N, HV, 128, 128] (output_final_state)

CuPy arrays (bf16 as uint16 bits, fp16 as float16) or torch CUDA tensors; torch in, torch out (allocated
by torch). The kernel runs on CuPy's current stream. :func:`plan_chain` does every check on the host (no GPU, no
allocation); :func:`forward_chain` plans, compiles (once per :class:`Config`) and launches.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import numpy as np

from ptx_lab import tensormap
from ptx_lab.tensormap import TensorMap2D

from ..runtime import builds
from ..runtime.arrays import ArrayInfo, describe, empty_output, expect, require_cupy, require_gpu, to_cupy
from ..shapes import CHUNK_TOKENS, HEAD_DIM, check_chunk_range
from .config import BUILD, Config

__all__ = ["forward_chain", "plan_chain", "ChainPlan", "ChainOutputs", "launch_planned", "allocate", "piece",
           "device_cu_chunks", "kernel", "VGROUPS"]

VGROUPS = 4            # CTAs per (sequence, value head), 32 of the 128 v columns each (checked against the
                       # build's fc_vgroups)
INT32_MAX = 2**31 - 1  # tensor copies address rows with signed 32-bit coordinates
HOST_ADVICE = ("forward_chain runs on the GPU and takes CuPy arrays or torch CUDA tensors (cupy.asarray({name}); bf16 "
               "in CuPy as uint16 bits, kernel.runtime.arrays.bf16_bits). The same arithmetic in numpy is "
               "chain of tests/kernel/three_pass_model.py, in a checkout")


class ChainOutputs(NamedTuple):
    states: Any
    v_new: Any
    final_state: Any   # None unless output_final_state


@dataclasses.dataclass(frozen=True)
class ChainPlan:
    chunks: int
    HV: int
    cu_chunks: np.ndarray          # host int32 [N + 1]
    config: Config
    output_final_state: bool
    has_initial_state: bool
    torch_out: bool

    @property
    def N(self) -> int:
        return len(self.cu_chunks) - 1

    @property
    def ctas(self) -> int:
        return self.N * self.HV * VGROUPS


def _check_cu_chunks(cu_chunks, chunks: int) -> np.ndarray:
    if cu_chunks is None:
        return np.array([0, chunks], dtype=np.int32)
    if not isinstance(cu_chunks, (list, tuple, np.ndarray)):
        raise TypeError(f"cu_chunks must be host integers (a list, tuple or numpy array) [N + 1], got "
                        f"{type(cu_chunks).__name__}: the launch reads them on the host to size the grid")
    cu = np.asarray(cu_chunks)
    if cu.ndim != 1 or cu.shape[0] < 2 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"cu_chunks must be 1-D integers [N + 1], N >= 1, got {cu.dtype} of shape {cu.shape}")
    if cu[0] != 0 or cu[-1] != chunks or np.any(np.diff(cu) < 1):
        raise ValueError(f"cu_chunks must start at 0, end at the chunks of w ({chunks}) and grow by at least one "
                         f"chunk a sequence, got {cu.tolist()}")
    return cu.astype(np.int32)


def plan_chain(w, u, kg, decay, u_scale, *, cu_chunks=None, initial_state=None, output_final_state: bool = True,
               config: Config | None = None) -> ChainPlan:
    """Every check of a call, on the host: shapes, dtypes, contiguity, one device, cu_chunks, the
    config. No GPU needed, nothing allocated."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a kernel.forward_chain.Config or None, got {type(config).__name__}")
    if not isinstance(output_final_state, bool):
        raise TypeError(f"output_final_state must be True or False, got {output_final_state!r}")
    arrays: dict[str, ArrayInfo] = {"w": describe("w", w, HOST_ADVICE)}
    wa = arrays["w"]
    if len(wa.shape) != 4 or wa.shape[2:] != (CHUNK_TOKENS, HEAD_DIM) or min(wa.shape[:2]) < 1:
        raise ValueError(f"w must be [chunks, HV, {CHUNK_TOKENS}, {HEAD_DIM}] with chunks, HV >= 1, "
                         f"got shape {wa.shape}")
    chunks, HV = wa.shape[:2]
    layout = f"[chunks, HV, {CHUNK_TOKENS}, {HEAD_DIM}] as w"
    expect("w", wa, wa.shape, layout, ("bfloat16",))
    for name, x, dtype in (("u", u, "float16"), ("kg", kg, "bfloat16")):
        arrays[name] = describe(name, x, HOST_ADVICE)
        expect(name, arrays[name], wa.shape, layout, (dtype,))
    arrays["decay"] = describe("decay", decay, HOST_ADVICE)
    expect("decay", arrays["decay"], (chunks, HV, HEAD_DIM), "[chunks, HV, 128]", ("float32",))
    arrays["u_scale"] = describe("u_scale", u_scale, HOST_ADVICE)
    expect("u_scale", arrays["u_scale"], (chunks, HV, 4), "[chunks, HV, 4]: u's scale in element 0", ("float32",))
    cu = _check_cu_chunks(cu_chunks, chunks)
    if initial_state is not None:
        arrays["initial_state"] = describe("initial_state", initial_state, HOST_ADVICE)
        expect("initial_state", arrays["initial_state"], (len(cu) - 1, HV, HEAD_DIM, HEAD_DIM),
               "[N, HV, K, V], N sequences", ("float32",))
    devices = {a.device for a in arrays.values()}
    kinds = {a.torch for a in arrays.values()}
    if len(devices) > 1 or len(kinds) > 1:
        got = ", ".join(f"{n}: device {a.device} ({'torch' if a.torch else 'cupy'})" for n, a in arrays.items())
        raise ValueError(f"w, u, kg, decay, u_scale and initial_state must be on one device and all CuPy arrays or "
                         f"all torch tensors, got {got}")
    if chunks * HV * HEAD_DIM > INT32_MAX:
        raise ValueError(f"the tensor copies address rows with 32-bit coordinates: chunks * HV * 128 = "
                         f"{chunks * HV * HEAD_DIM} is more than {INT32_MAX}")
    return ChainPlan(chunks=chunks, HV=HV, cu_chunks=cu, config=config if config is not None else Config(),
                     output_final_state=output_final_state, has_initial_state=initial_state is not None,
                     torch_out=wa.torch)


@functools.lru_cache(maxsize=None)
def kernel(cfg: Config):
    """(function, dynamic shared memory, threads) of one configuration, cached per process."""
    mod = BUILD.module(cfg)
    (vgroups,) = builds.read_int_constants(mod, "fc_vgroups", 1)
    if vgroups != VGROUPS:
        raise RuntimeError(f"the forward chain was built with {vgroups} CTAs a (sequence, value head), the launch "
                           f"plans {VGROUPS}")
    return builds.kernel_function(BUILD, mod, label=f"the forward chain {cfg.name()}",
                                  advice=": use fewer stages (Config.nstage)")


@functools.lru_cache(maxsize=64)
def device_cu_chunks(cu_bytes: bytes):
    """The chunk offsets (host int32 bytes) on the device, copied once per value: a caller that launches on
    another stream makes them here first, on its own."""
    import cupy

    return cupy.asarray(np.frombuffer(cu_bytes, dtype=np.int32))


def _maps(plan: ChainPlan, w, u, kg, states, v_new) -> list[np.ndarray]:
    """The five tensor maps, in the kernel's parameter order: w, kg (boxes [64][64], SW128), u ([64][32],
    SW64), states ([128][16], SW32) and v_new ([64][16], SW32), each tensor seen as [rows, 128]. u's map
    moves fp16 as 16-bit words (uint16): a copy does not look at the values."""
    rows = plan.chunks * plan.HV * CHUNK_TOKENS
    row_bytes = HEAD_DIM * 2

    def map16(x, nrows, box, swizzle, dtype="bfloat16"):
        return tensormap.encode(TensorMap2D(x.data.ptr, dtype, (nrows, HEAD_DIM), row_bytes, box=box,
                                            swizzle=swizzle))

    return [map16(w, rows, (CHUNK_TOKENS, 64), 128), map16(kg, rows, (CHUNK_TOKENS, 64), 128),
            map16(u, rows, (CHUNK_TOKENS, 32), 64, "uint16"), map16(states, 2 * rows, (HEAD_DIM, 16), 32),
            map16(v_new, rows, (CHUNK_TOKENS, 16), 32)]


def piece(plan: ChainPlan, chunks: tuple[int, int]) -> ChainPlan:
    """The plan of chunks c0 .. c1 - 1 of a one-sequence plan, walked on their own from a state given
    (:func:`launch_planned` on the chunk-major arrays' rows c0 .. c1 - 1): a caller walks a long
    sequence in pieces, each from the state the one before left."""
    if plan.N != 1:
        raise ValueError(f"a chain is walked in pieces only for one sequence, the plan has {plan.N}")
    c0, c1 = check_chunk_range(chunks, plan.chunks)
    return dataclasses.replace(plan, chunks=c1 - c0, cu_chunks=np.array([0, c1 - c0], dtype=np.int32),
                               output_final_state=True)


def launch_planned(plan: ChainPlan, w, u, kg, decay, u_scale, initial_state, states, v_new, final_state) -> None:
    """The chain on checked CuPy arrays (bf16 as uint16 bits) into ``states``, ``v_new`` and ``final_state``
    (None unless plan.output_final_state): the launch alone."""
    fn, smem, threads = kernel(plan.config)
    null = np.uint64(0)
    maps = _maps(plan, w, u, kg, states, v_new)
    # the maps come first: CuPy lays parameters out by their numpy alignment (8 bytes), and a map must
    # sit 64-byte aligned in the parameter space, as it does at offsets 0, 128, .. 512
    fn((plan.ctas,), (threads,),
       (*maps, decay, u_scale, device_cu_chunks(plan.cu_chunks.tobytes()), np.int32(plan.HV),
        initial_state if initial_state is not None else null, final_state if final_state is not None else null),
       shared_mem=smem)


def allocate(plan: ChainPlan, device=None) -> tuple[dict, dict]:
    """The chain's outputs for ``plan``, uninitialised: (as returned, as CuPy views), keyed states, v_new and
    final_state (None unless plan.output_final_state). Torch tensors on ``device`` (torch's allocator, on
    torch's current stream) where the plan's operands are torch, else CuPy arrays."""
    shapes = {"states": ((plan.chunks, plan.HV, HEAD_DIM, HEAD_DIM), "bf16"),
              "v_new": ((plan.chunks, plan.HV, CHUNK_TOKENS, HEAD_DIM), "bf16"),
              "final_state": ((plan.N, plan.HV, HEAD_DIM, HEAD_DIM), "f32")}
    out_t, out_c = {}, {}
    for name, (shape, dt) in shapes.items():
        if name == "final_state" and not plan.output_final_state:
            out_t[name] = out_c[name] = None
        else:
            out_t[name], out_c[name] = empty_output(shape, dt, device if plan.torch_out else None)
    return out_t, out_c


def forward_chain(w, u, kg, decay, u_scale, *, cu_chunks=None, initial_state=None, output_final_state: bool = True,
                  config: Config | None = None) -> ChainOutputs:
    """The states entering every chunk, each chunk's v_new and the final state (module docstring)."""
    plan = plan_chain(w, u, kg, decay, u_scale, cu_chunks=cu_chunks, initial_state=initial_state,
                      output_final_state=output_final_state, config=config)
    require_cupy("kernel.forward_chain")
    require_gpu("kernel.forward_chain")
    w_c, kg_c = (to_cupy(n, x, "bf16") for n, x in (("w", w), ("kg", kg)))
    u_c = to_cupy("u", u, "f16")
    decay_c, scale_c = to_cupy("decay", decay, "f32"), to_cupy("u_scale", u_scale, "f32")
    h0 = to_cupy("initial_state", initial_state, "f32") if initial_state is not None else None
    out_t, out_c = allocate(plan, w.device if plan.torch_out else None)
    launch_planned(plan, w_c, u_c, kg_c, decay_c, scale_c, h0, out_c["states"], out_c["v_new"], out_c["final_state"])
    return ChainOutputs(states=out_t["states"], v_new=out_t["v_new"], final_state=out_t["final_state"])
