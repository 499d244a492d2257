"""KDA's forward on one configuration, as a training step runs it: ``kernel.chunk_kda``'s against FLA's and cuDNN's.

``ptx-lab bench --forward`` runs :func:`bench_forward_config` once per configuration, each in a process
of its own (:mod:`.backward_run`, as ``--backward`` and ``--layer``). In this order:

1. the raw inputs (:func:`.inputs.make_inputs`: gates in [-5, 0]), as leaves that require a gradient
   (:func:`kernel.tools.fla_kda.chunk_kda_step_inputs`: ``use_qk_l2norm_in_kernel``, safe_gate True with
   FLA's lower bound, the final state asked for): the forward of a training step, which keeps what its
   backward reads (autograd's saved tensors), not an inference forward;
2. the sides, each one's first call alone (FLA compiles and autotunes its Triton kernels there), then
   in turn (:func:`.timing.time_alternating`, the same power state for all):

   * ours: ``kernel.chunk_kda`` with our forward (``kernel.using_forward("ours")``, whatever the
     process's setting): FLA's preprocessing (the l2norm, the gate's 64-chunk cumsum) and
     :func:`kernel.forward.forward` in training mode, through the op's autograd;
   * FLA's: ``fla.ops.kda.chunk_kda`` on the same leaves;
   * cuDNN frontend's ``kimi_delta_attention`` where it is installed, unless ``--no-cudnn``
     (:mod:`kernel.tools.cudnn_kda`: q and k normalised in torch inside the call, the layouts its Hopper
     engine serves); where it cannot be imported its entry says why;
   * ours raw: :func:`kernel.forward.forward` alone (training=True, the final state) on the tensors our
     forward hands it, FLA's preprocessing done once before: ours / raw - 1 is what the preprocessing,
     the op and autograd add;
   * three passes raw: :func:`kernel.three_pass_forward.three_pass_forward` on the same tensors (the same
     outputs in the same layouts): three passes / raw is what the three-pass design saves or costs at the
     configuration, the figure a launch rule between the two is chosen by;

3. each side's peak GPU memory, one call each (:func:`.backward.peak_memory`: torch's
   max_memory_allocated, reset before each side, plus CuPy's pool's growth), the outputs and the
   tensors autograd keeps for the backward included.

FLA's autotune choices are recorded (``fla_autotune``), as ``--backward`` records them. torch, CuPy, fla
and the kernel's modules are imported inside the functions.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from kernel.tools import fla_adapter, fla_kda

from .backward import (first_calls, import_ours, in_turn, median_of, missing_requirement, peak_memories,
                       record_fla_autotune)
from .configs import Config
from .inputs import cu_for_fla, cu_for_kernel_a, make_inputs
from .report import error_text, log
from .timing import cupy_on_torch_stream, free_memory

__all__ = ["missing_requirement", "bench_forward_config", "SIDES", "FWD_OURS", "FWD_FLA", "FWD_CUDNN", "FWD_RAW",
           "FWD_THREE"]

FWD_OURS, FWD_FLA, FWD_CUDNN, FWD_RAW = "kernel_chunk_kda", "fla_chunk_kda", "cudnn_kda", "kernel_forward_raw"
FWD_THREE = "kernel_three_pass_raw"
SIDES = (FWD_OURS, FWD_FLA, FWD_CUDNN, FWD_RAW, FWD_THREE)


def bench_forward_config(cfg: Config, args, flush) -> dict:
    """Time the training forward of ours, FLA's and cuDNN's (and our bare kernel) on one configuration,
    in turn, and each one's peak memory."""
    import torch

    H, t_start, tag = args.heads, time.perf_counter(), cfg.name
    res: dict[str, Any] = {"bench": "forward", "config": cfg.name, "B": cfg.B, "T": cfg.T, "H": H, "N": cfg.N,
                           "tokens": cfg.tokens, "varlen": cfg.varlen, "forward": {}, "peak_memory": {}}
    if cfg.varlen:
        res["lengths"] = list(cfg.lengths)
    res["fla_autotune_reset"] = fla_adapter.reset_autotune()
    raw = make_inputs(cfg, H, seed=args.seed, gate_strength=args.gate_strength)
    del raw["do"]   # the upstream gradient: no backward runs here (the same draws as --backward's otherwise)
    cu_fla = cu_for_fla(raw["cu_seqlens"])
    h0 = torch.zeros_like(raw["dht"])
    calls = _calls(raw, h0, cu_fla, args, res)
    log(f"    {tag}: inputs ready, sides {', '.join(calls)} [{time.perf_counter() - t_start:.0f} s]")
    import kernel

    # our forward whatever the process's setting (kernel.use_forward): the setting is read per call
    with kernel.using_forward("ours"):
        calls = first_calls(calls, res["forward"], t_start, tag)
        in_turn(calls, args, flush, res["forward"])
        log(f"    {tag}: forwards timed [{time.perf_counter() - t_start:.0f} s]")
        peak_memories(calls, res["peak_memory"])
    res["ratio"] = _ratios(res["forward"])
    calls.clear()
    record_fla_autotune(res, tag)
    raw.clear()
    free_memory()
    return res


def _ratios(fwd: dict) -> dict:
    """ours / FLA's, ours / cuDNN's, and ours / raw - 1 (what wraps the kernel), where both were timed."""
    out = {}
    ours = median_of(fwd, FWD_OURS)
    for other, key in ((FWD_FLA, "ours/fla"), (FWD_CUDNN, "ours/cudnn")):
        theirs = median_of(fwd, other)
        if ours and theirs:
            out[key] = ours / theirs
    raw = median_of(fwd, FWD_RAW)
    if ours and raw:
        out["over_raw"] = ours / raw - 1.0
    three = median_of(fwd, FWD_THREE)
    if three and raw:
        out["three/raw"] = three / raw
    return out


def _calls(raw: dict, h0, cu_fla, args, res: dict) -> dict[str, Callable]:
    """The sides as zero-argument calls on the same inputs; one that cannot be set up is recorded in
    res["forward"] with why."""
    inp = fla_kda.chunk_kda_step_inputs(raw, h0=h0, cu_seqlens=cu_fla, safe_gate=True)
    leaves, kwargs = inp["leaves"], inp["kwargs"]

    def forward_of(chunk_kda) -> Callable:
        return lambda: chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                 initial_state=leaves["initial_state"], **kwargs)

    calls: dict[str, Callable] = {}
    ours, why = import_ours("fla_dropin", "chunk_kda")
    if ours is None:
        res["forward"][FWD_OURS] = {"error": why}
    else:
        calls[FWD_OURS] = forward_of(ours)
    if not args.no_fla:
        calls[FWD_FLA] = forward_of(fla_kda.import_fla()["chunk_kda"])
    if args.no_cudnn:
        res["forward"][FWD_CUDNN] = {"skipped": "--no-cudnn"}
    else:
        try:
            from kernel.tools import cudnn_kda

            c = cudnn_kda.step_inputs(raw, h0=h0, cu_seqlens=cu_fla)
            calls[FWD_CUDNN] = lambda c=c: c["forward"](c["leaves"])
        except ImportError as exc:
            res["forward"][FWD_CUDNN] = {"error": str(exc)}
            log(f"    {res['config']}: no cuDNN side: {exc}")
    try:
        calls.update(_raw_calls(raw, h0, cu_fla))
    except Exception as exc:
        for side in (FWD_RAW, FWD_THREE):
            res["forward"][side] = {"error": error_text(exc)}
        log(f"    {res['config']}: our raw forwards could not be set up: {error_text(exc)}")
    return calls


def _raw_calls(raw: dict, h0, cu_fla) -> dict[str, Callable]:
    """:func:`kernel.forward.forward` (FWD_RAW) and :func:`kernel.three_pass_forward.three_pass_forward`
    (FWD_THREE) in training mode on what our op hands its forward: q and k after FLA's l2norm, the gate's
    64-chunk cumsum / ln 2 and beta (already after its sigmoid here), made once by FLA's preprocessing
    (:func:`kernel.tools.fla_kda.forward`, whose kernels are not timed); cu_seqlens on the host, as the op
    passes them (no device-to-host copy in the call)."""
    from kernel.forward import forward
    from kernel.three_pass_forward import three_pass_forward

    f = fla_kda.forward(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"], h0=h0, cu_seqlens=cu_fla,
                        safe_gate=True)
    q, k, v, g, beta, scale = f.q, f.k, f.v, f.g, f.beta.float(), f.scale
    del f
    cu = cu_for_kernel_a(raw["cu_seqlens"])

    def call_of(fn) -> Callable:
        def call():
            with cupy_on_torch_stream():
                return fn(q, k, v, g, beta, scale=scale, initial_state=h0, cu_seqlens=cu, output_final_state=True,
                          training=True)
        return call
    return {FWD_RAW: call_of(forward), FWD_THREE: call_of(three_pass_forward)}
