"""FLA's KDA layer on one configuration: forward + backward through autograd, FLA's path against ours.

``ptx-lab bench --layer`` runs :func:`bench_layer_config` once per configuration, each in a process
of its own (as ``--backward`` does). The layer is ``fla.layers.kda.KimiDeltaAttention`` at its
defaults (flash-linear-attention 0.6.0): hidden 2048, 16 heads of 128 (``--heads``, ``--hidden``),
the short convolutions, the gate and beta activations in the op, ``state_v_first``, an unbounded
gate. Its weights are bf16, as a bf16 training run holds them. One step is what a training loop
runs: the layer on x [B, T, hidden] (a varlen configuration packs its sequences into [1, total,
hidden] with ``cu_seqlens``), then the gradients of every parameter and of x for an upstream
gradient dout:

* FLA's path: the layer as it is;
* ours: the same layer object with ``kernel.patch_fla()``'s route in place of FLA's
  ``chunk_kda``, which is exactly what the switch puts there: ``kernel.chunk_kda``, our backward and
  the forward ``--our-forward`` names (ours by default, FLA's with ``fla``), applied with
  ``kernel.using_forward`` around the whole measurement and recorded as ``our_forward``.

The route is taken from ``kernel.patch_fla()`` once and then swapped into the layer's module per
call (one attribute), so that the timing holds no patching. The two steps are timed in turn
(:func:`.timing.time_alternating`) after each one's first call alone (FLA compiles its Triton
kernels there), then each one's peak memory as torch counts it. x, dout ~ N(0, 1), seeded.

Then the op's backward alone, with the layer's own settings: the ``chunk_kda`` call the layer makes
on x is recorded (its tensors kept as leaves that require a gradient, as in training), each side's
op runs its forward once, and three calls are timed in turn:

* FLA's backward: ``torch.autograd.grad`` of FLA's ``chunk_kda`` output (the graph kept);
* ours: the same through the route (``torch.ops.ptx_lab.chunk_kda_bwd``: our kernels, the
  l2norm epilogue, FLA's fused gate backward, the beta sigmoid's backward, the casts);
* ours bare: ``kernel.kda_backward.run`` with the arguments the op's backward handed it (recorded
  in one call), so that ours / bare - 1 is what the autograd wrapper costs.

FLA's autotune choices in the process are recorded last (``fla_autotune``), as the other modes record them.
torch, fla and the kernel's modules are imported inside the functions.
"""
from __future__ import annotations

import importlib
import time
from typing import Any, Callable

from .backward import first_calls, in_turn, median_of, peak_memories, record_fla_autotune, retained_backwards
from .configs import Config
from .report import error_text, log

LAYER_FLA, LAYER_OURS = "layer_fla", "layer_ours"
SIDES = (LAYER_FLA, LAYER_OURS)
OP_FLA, OP_OURS, OP_BARE = "op_backward_fla", "op_backward_ours", "op_backward_ours_bare"
HIDDEN = 2048           # FLA's KimiDeltaAttention default hidden_size
LAYER_HEADS = 16        # and its num_heads (of head_dim 128)
TIME_TARGET = 0.65      # issue 34: the layer's forward + backward at most this fraction of FLA's
BACKWARD_TARGET = 0.45  # ... the op's backward through autograd, the layer's settings, at most this of FLA's
WRAPPER_TARGET = 0.03   # ... and what autograd and the casts add to our bare backward at most this of it


def missing_requirement() -> str | None:
    """Why the layer bench cannot run here, or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        importlib.import_module("fla.layers.kda")   # what is measured; it imports transformers
    except ImportError as exc:
        return (f"fla.layers.kda cannot be imported ({exc}): it needs flash-linear-attention 0.6.0 and "
                f"transformers beside fla-core")
    return None


def layer_and_inputs(cfg: Config, heads: int, hidden: int, seed: int):
    import numpy as np
    import torch
    from fla.layers.kda import KimiDeltaAttention

    torch.manual_seed(seed)
    layer = KimiDeltaAttention(hidden_size=hidden, num_heads=heads, head_dim=128, mode="chunk")
    layer = layer.to(device="cuda", dtype=torch.bfloat16).train()
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    kw: dict[str, Any] = {}
    if cfg.varlen:
        shape = (1, cfg.tokens, hidden)
        kw["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(cfg.lengths)]), dtype=torch.long,
                                        device="cuda")
    else:
        shape = (cfg.B, cfg.T, hidden)
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dout = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    return layer, x, dout, kw


def routes():
    """(FLA's chunk_kda, the route kernel.patch_fla() puts in its place, the layer's module)."""
    import fla.layers.kda as layer_module

    import kernel

    original = layer_module.chunk_kda
    with kernel.patched_fla():
        routed = layer_module.chunk_kda
    if routed is original:
        raise RuntimeError("kernel.patched_fla() did not replace fla.layers.kda.chunk_kda")
    return original, routed, layer_module


def layer_step(layer, x, dout, kw: dict, op, layer_module, original) -> Callable:
    """One training step of ``layer`` on x with ``op`` as its chunk_kda: the forward, then the gradients of x
    and of every parameter for dout; the layer's module gets ``original`` back after it."""
    import torch

    params = [p for p in layer.parameters() if p.requires_grad]

    def call():
        layer_module.chunk_kda = op
        try:
            out = layer(x, **kw)[0]
            return torch.autograd.grad(out, [x, *params], dout)
        finally:
            layer_module.chunk_kda = original
    return call


def bench_layer_config(cfg: Config, args, flush) -> dict:
    """Time FLA's layer step against ours on one configuration, and each one's peak memory; ours with the
    forward ``args.our_forward`` names."""
    import kernel

    with kernel.using_forward(args.our_forward):
        res = _bench_layer_config(cfg, args, flush)
    record_fla_autotune(res, cfg.name)   # FLA's block sizes, as the other modes record them
    return res


def _bench_layer_config(cfg: Config, args, flush) -> dict:
    heads, hidden = args.heads, args.hidden
    t_start, tag = time.perf_counter(), cfg.name
    res: dict[str, Any] = {"bench": "layer", "config": cfg.name, "B": cfg.B, "T": cfg.T, "N": cfg.N,
                           "tokens": cfg.tokens, "varlen": cfg.varlen, "heads": heads, "hidden": hidden,
                           "layer": {}, "peak_memory": {}, "our_forward": args.our_forward}
    layer, x, dout, kw = layer_and_inputs(cfg, heads, hidden, args.seed)
    params = [p for p in layer.parameters() if p.requires_grad]
    original, routed, layer_module = routes()
    calls = {side: layer_step(layer, x, dout, kw, op, layer_module, original)
             for side, op in ((LAYER_FLA, original), (LAYER_OURS, routed))}
    log(f"    {tag}: layer ready (hidden {hidden}, {heads} heads of 128, {sum(p.numel() for p in params):,} "
        f"parameters) [{time.perf_counter() - t_start:.0f} s]")
    calls = first_calls(calls, res["layer"], t_start, tag)
    in_turn(calls, args, flush, res["layer"])
    a, b = median_of(res["layer"], LAYER_OURS), median_of(res["layer"], LAYER_FLA)
    if a and b:
        res["ratio"] = a / b
    peak_memories(calls, res["peak_memory"])
    log(f"    {tag}: layer timed [{time.perf_counter() - t_start:.0f} s]")
    calls.clear()

    res["op_backward"] = {}
    try:
        op_calls = op_backward_calls(layers_call(layer, x, kw, layer_module, original), original, routed,
                                      args.seed, res["op_backward"])
    except Exception as exc:
        res["op_backward"] = {name: {"error": error_text(exc)} for name in (OP_FLA, OP_OURS, OP_BARE)}
        log(f"    {tag}: the op's backward alone could not be set up: {error_text(exc)}")
        return res
    op_calls = first_calls(op_calls, res["op_backward"], t_start, tag)
    in_turn(op_calls, args, flush, res["op_backward"])
    ours, fla, bare = (median_of(res["op_backward"], n) for n in (OP_OURS, OP_FLA, OP_BARE))
    if ours and fla:
        res["backward_ratio"] = ours / fla
    if ours and bare:
        res["wrapper"] = ours / bare - 1.0
    log(f"    {tag}: the op's backward timed [{time.perf_counter() - t_start:.0f} s]")
    op_calls.clear()
    return res


def layers_call(layer, x, kw: dict, layer_module, original) -> dict:
    """The keyword arguments of the layer's chunk_kda call on x, each tensor a fresh leaf; the
    floating ones require a gradient, as in training (the layer's q, k, v, gate and beta come from
    its projections, A_log and dt_bias are its parameters)."""
    import torch

    seen: dict = {}

    def recorder(*positional, **call):
        if positional:
            raise RuntimeError("the layer passed chunk_kda positional arguments: this bench records keywords")
        seen.update(call)
        return original(**call)

    layer_module.chunk_kda = recorder
    try:
        with torch.no_grad():
            layer(x, **kw)
    finally:
        layer_module.chunk_kda = original
    if not seen:
        raise RuntimeError("the layer never called fla.layers.kda.chunk_kda")
    return {name: (t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t)
            for name, t in seen.items()}


def op_backward_calls(call: dict, original, routed, seed: int, out: dict) -> dict[str, Callable]:
    """FLA's op's backward, ours and our bare backward (kernel.kda_backward.run on the arguments the
    op hands it, recorded in one call), each a zero-argument call (:func:`.backward.retained_backwards`:
    the forwards run here, once; one that raises is recorded in ``out``)."""
    import torch

    import kernel.kda_backward as kda_backward

    leaves = [t for t in call.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    # the upstream gradient of o, which has v's shape and q's dtype: the same for both sides
    gen = torch.Generator(device=call["v"].device).manual_seed(seed + 2)
    do = torch.randn(call["v"].shape, generator=gen, device=call["v"].device, dtype=call["q"].dtype)
    calls = retained_backwards({OP_FLA: (lambda: original(**call)[0], leaves),
                                OP_OURS: (lambda: routed(**call)[0], leaves)}, do, out)
    if OP_OURS not in calls:
        return calls
    args, kwargs = recorded_backward(calls[OP_OURS])
    run = kda_backward.run
    calls[OP_BARE] = lambda: run(*args, **kwargs)
    return calls


def recorded_backward(call: Callable) -> tuple[tuple, dict]:
    """The arguments ``call`` (our op's backward) hands ``kernel.kda_backward.run``, recorded in one call."""
    import kernel.kda_backward as kda_backward

    handed: dict = {}
    real_run = kda_backward.run

    def recording_run(*a, **k):
        handed["args"], handed["kwargs"] = a, k
        return real_run(*a, **k)

    kda_backward.run = recording_run
    try:
        call()
    finally:
        kda_backward.run = real_run
    if not handed:
        raise RuntimeError("the route's backward did not run kernel.kda_backward.run")
    return handed["args"], handed["kwargs"]
