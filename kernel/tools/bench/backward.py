"""The whole KDA backward on one configuration: ours (``kernel.kda_backward``) against FLA's ``chunk_kda_bwd``.

``ptx-lab bench --backward`` runs :func:`bench_backward_config` once per configuration, each in a
process of its own (:mod:`.backward_run`). In this order:

1. the raw inputs (:func:`.inputs.make_inputs`: gates in [-5, 0], the bound FLA's safe_gate asks
   for, with lower_bound -5) and FLA's forward, once (:func:`kernel.tools.fla_kda.forward`,
   safe_gate True): the l2-normalised q, k, g_cumsum, Aqk and Akk that both backwards read;
2. each backward's first call alone (FLA compiles and autotunes its Triton kernels there, for
   minutes on a new shape), then the three called in turn (:func:`.timing.time_alternating`, the
   same power state for all): ours (forward-state scan, Kernel A, Kernel B and every cast it
   runs), FLA's chunk_kda_bwd with safe_gate True and with safe_gate False, both recomputing
   w, u and h (FLA's default, disable_recompute False). FLA's safe_gate False backward reads the
   safe_gate True forward's tensors: which of FLA's intra-chunk kernels built Aqk and Akk does not
   change the backward's work;
3. each backward's peak GPU memory, once (:func:`peak_memory`);
4. our pieces beside our whole backward, in turn: ``kernel.forward_states.forward_states`` and
   Kernel A (``kernel.ds_scan.launch.launch`` on FLA's tensors, bf16 dS after every tile); the rest (Kernel B
   and the casts) is the total minus those two;
5. the training step: FLA's ``chunk_kda`` forward and backward through autograd against
   ``kernel.chunk_kda`` (our backward, and the forward ``--our-forward`` names, applied with
   ``kernel.using_forward``: ours by default, FLA's with ``fla``; recorded as ``our_forward``) and
   cuDNN frontend's ``kimi_delta_attention``
   (:mod:`kernel.tools.cudnn_kda`: q and k normalised in torch, its Hopper engine's conditions;
   where it is installed, unless ``--no-cudnn``), in turn; then each one's backward alone through
   autograd (the forward run once, its graph kept), in turn: what a user's backward costs.

With ``--gates trained-layer`` the gates are FLA's layer gate grown (unbounded below, some 16-token
tiles decaying a channel past 2^-126): FLA's forward, its backward and the step then run with
safe_gate False and no lower bound, and FLA's safe_gate True backward, which asks for gates in
[-5, 0], is left out. The bench times; it does not check gradients (``ptx-lab kda-precision`` does).

torch, CuPy, fla and the kernel's modules are imported inside the functions.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import time
from typing import Any, Callable

from kernel.tools import fla_adapter, fla_kda
from kernel.tools.floors import RECOMMENDED, byte_floor_ms, count

from .configs import Config
from .inputs import cu_for_fla, cu_for_kernel_a, make_inputs
from .report import error_text, log
from .timing import cupy_on_torch_stream, free_memory, time_alternating

OURS = "ours"
FLA_SAFE = "fla_safe_gate_true"
FLA_UNSAFE = "fla_safe_gate_false"
BACKWARDS = (OURS, FLA_SAFE, FLA_UNSAFE)
FORWARD_STATES, KERNEL_A = "forward_states", "kernel_a"
# where the rule runs the two scans side by side: ours with them in turn, and each on its halved grid
OURS_IN_TURN, FORWARD_STATES_HALF, KERNEL_A_HALF = "ours_scans_in_turn", "forward_states_half", "kernel_a_half"
STEP_FLA, STEP_OURS, STEP_CUDNN = "fla_chunk_kda", "kernel_chunk_kda", "cudnn_kda"
STEP_PIPELINED = "kernel_chunk_kda_pipelined"   # kernel.chunk_kda, its backward pipelined (--backward-pipeline)
STEPS = (STEP_FLA, STEP_OURS, STEP_PIPELINED, STEP_CUDNN)


def missing_requirement() -> str | None:
    """None when the backward (or forward) bench can run here, else one line naming what is missing:
    torch, then fla-core (and triton), then CuPy, then a CUDA device."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    try:
        fla_kda.import_fla()
    except ImportError as exc:
        return f"fla-core cannot be imported ({exc.__class__.__name__}: {exc})"
    except Exception as exc:  # fla's import-time hardware probes can raise anything
        return f"importing fla-core failed ({exc.__class__.__name__}: {exc})"
    try:
        importlib.import_module("cupy")
    except ImportError as exc:
        return f"CuPy is not installed ({exc}): our kernels launch through it"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def import_ours(module: str, name: str) -> tuple[Callable | None, str | None]:
    """(kernel.<module>.<name>, None), or (None, why): 'is missing' when the module or the name is not
    there (another engineer may still be writing it), 'cannot be imported' when importing it raised."""
    full = f"kernel.{module}"
    try:
        return getattr(importlib.import_module(full), name), None
    except ModuleNotFoundError as exc:
        if exc.name == full:
            return None, f"{full}.{name} is missing ({error_text(exc)})"
        return None, f"{full}.{name} cannot be imported ({error_text(exc)})"
    except AttributeError as exc:
        return None, f"{full}.{name} is missing ({error_text(exc)})"
    except Exception as exc:
        return None, f"{full}.{name} cannot be imported ({error_text(exc)})"


def our_forward_setting(name: str):
    """``kernel.using_forward(name)``: the forward kernel.chunk_kda runs in the block (``--our-forward``);
    a context that changes nothing where kernel.fla_dropin cannot be imported (its side then records why)."""
    import contextlib

    using, _ = import_ours("fla_dropin", "using_forward")
    return contextlib.nullcontext() if using is None else using(name)


def floor_entry(lengths, heads: int) -> dict:
    """The recommended design's byte floor (kernel.tools.floors) for these sequence lengths."""
    return {"design": RECOMMENDED.name, "ms": byte_floor_ms(lengths, heads=heads),
            "gbytes": count(RECOMMENDED, lengths, heads=heads).total_bytes / 1e9}


def peak_memory(fn: Callable[[], Any]) -> dict:
    """GPU memory one call of `fn` takes at its peak, above what was allocated before it: torch's
    allocator (max_memory_allocated after reset_peak_memory_stats) plus what CuPy's pool grew by
    (emptied first, so its growth is what the call held at once). Outputs count: they are the
    gradients the call returns."""
    import torch

    free_memory()
    pool = sys.modules["cupy"].get_default_memory_pool() if "cupy" in sys.modules else None
    before = torch.cuda.memory_allocated()
    pool_before = pool.total_bytes() if pool is not None else 0
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    grew = (pool.total_bytes() - pool_before) if pool is not None else 0
    del out
    free_memory()
    return {"torch_bytes": int(peak), "cupy_pool_bytes": int(grew), "bytes": int(peak + grew)}


def peak_memories(calls: dict[str, Callable], out: dict) -> None:
    """:func:`peak_memory` of one call of each, into out[name]; a call that raises is recorded there."""
    for name, fn in calls.items():
        try:
            out[name] = peak_memory(fn)
        except Exception as exc:
            out[name] = {"error": error_text(exc)}
            free_memory()


def first_calls(calls: dict[str, Callable], res_part: dict, t_start: float, tag: str) -> dict[str, Callable]:
    """Each call once, alone (compiles and autotunes); those that fail are recorded and dropped."""
    ok = {}
    for name, fn in calls.items():
        t0 = time.perf_counter()
        try:
            out = fn()
            del out
            import torch
            torch.cuda.synchronize()
            ok[name] = fn
            res_part.setdefault(name, {})["first_call_s"] = time.perf_counter() - t0
            log(f"    {tag}: {name} first call {time.perf_counter() - t0:.1f} s "
                f"[{time.perf_counter() - t_start:.0f} s]")
        except Exception as exc:
            res_part[name] = {"error": error_text(exc)}
            log(f"    {tag}: {name} failed: {error_text(exc)}")
            free_memory()
    return ok


def _ours_call(kda_backward, f: fla_kda.FlaForward, do, dht, cu_host, res: dict) -> tuple[Callable, Any]:
    """Our whole backward on FLA's forward tensors as one zero-argument call, and the cu_seqlens it takes:
    on the host (no device-to-host copy inside the timed call) unless kda_backward refuses it there."""
    def call(cu, **kw):
        with cupy_on_torch_stream():
            return kda_backward(f.q, f.k, f.v, f.g, f.beta, f.Aqk, f.Akk, do, scale=f.scale,
                                initial_state=f.h0, dht=dht, cu_seqlens=cu, **kw)

    cu = cu_host
    try:
        out = call(cu_host)             # the first call: builds the kernels
        res["ours_cu_seqlens"] = None if cu_host is None else "host int64"
    except (TypeError, ValueError) as exc:
        if cu_host is None:
            raise
        cu = f.cu_seqlens
        res["ours_cu_seqlens"] = f"torch int64 on the GPU (host refused: {error_text(exc)})"
        out = call(cu)
    if isinstance(out, dict) and isinstance(out.get("timing"), dict):   # a timing hook, if kda_backward has one
        res["kda_backward_timing"] = out["timing"]
    del out
    return (lambda **kw: call(cu, **kw)), cu


def in_turn(calls: dict[str, Callable], args, flush, out: dict) -> None:
    if not calls:
        return
    try:
        out.update({n: {**out.get(n, {}), **t} for n, t in
                    time_alternating(calls, warmup=args.warmup, reps=args.reps, flush=flush).items()})
    except Exception as exc:
        for n in calls:
            out[n] = {**out.get(n, {}), "error": error_text(exc)}
        log(f"    timing in turn failed: {error_text(exc)}")
        free_memory()


def median_of(d: dict, name: str):
    return d.get(name, {}).get("median_ms")


def _time_backwards(f: fla_kda.FlaForward, raw: dict, cu_host, args, flush, res: dict, t_start: float,
                    tag: str) -> None:
    """Steps 2 to 4: the three backwards (first calls, in turn, peak memory) and our pieces."""
    do, dht = raw["do"], raw["dht"]
    # 2. the three backwards: first calls alone, then in turn
    calls: dict[str, Callable] = {}
    cu_ours = cu_host
    kda_backward, why = import_ours("kda_backward", "kda_backward")
    if kda_backward is None:
        res["backward"][OURS] = {"error": why}
    else:
        try:
            calls[OURS], cu_ours = _ours_call(kda_backward, f, do, dht, cu_host, res)
        except Exception as exc:
            res["backward"][OURS] = {"error": error_text(exc)}
    if not args.no_fla:
        if f.safe_gate:   # FLA's safe_gate asks for gates in [-5, 0]: clamped gates only
            calls[FLA_SAFE] = lambda: fla_kda.backward(f, do, dht, safe_gate=True)
        calls[FLA_UNSAFE] = lambda: fla_kda.backward(f, do, dht, safe_gate=False)
    calls = first_calls(calls, res["backward"], t_start, tag)
    in_turn(calls, args, flush, res["backward"])
    for name in (FLA_SAFE, FLA_UNSAFE):
        if median_of(res["backward"], OURS) and median_of(res["backward"], name):
            res.setdefault("ratio", {})[f"{OURS}/{name}"] = median_of(res["backward"], OURS) / median_of(res["backward"], name)
    log(f"    {tag}: backwards timed [{time.perf_counter() - t_start:.0f} s]")

    # 3. peak memory, one call each
    peak_memories(calls, res["peak_memory"])

    # 4. our pieces beside our whole backward: each scan alone on its full-GPU grid, and where the
    #    rule runs them side by side also each on its halved grid and the whole backward in turn
    if OURS in calls:
        from kernel.ds_scan.launch import launch
        from kernel.runtime.builds import sm_count as _sm_count
        from kernel.kda_backward import plan_scans

        scans = plan_scans(res["N"] * res["H"], _sm_count())
        res["scans"] = dataclasses.asdict(scans)
        pieces = {OURS: calls[OURS]}
        if scans.side_by_side:
            pieces[OURS_IN_TURN] = lambda: calls[OURS](side_by_side=False)
        forward_states, why_fs = import_ours("forward_states", "forward_states")
        if forward_states is None:
            res["pieces"][FORWARD_STATES] = {"error": why_fs}
        else:
            from kernel.forward_states import auto_config

            def fs_call(config=None):
                with cupy_on_torch_stream():
                    return forward_states(f.k, f.v, f.g, f.beta, f.Akk, initial_state=f.h0, cu_seqlens=cu_ours,
                                          config=config)
            pieces[FORWARD_STATES] = fs_call
            if scans.side_by_side:
                pieces[FORWARD_STATES_HALF] = lambda: fs_call(auto_config(scans.states_warps))

        def ka_call(vsplit="auto"):
            with cupy_on_torch_stream():
                return launch(f.q, f.k, f.g, f.beta, f.Aqk, f.Akk, do, scale=f.scale, dht=dht, cu_seqlens=cu_host,
                              qk_l2norm=False, snapshot_dtype="bfloat16", snapshot_every=1, fla_inputs=True,
                              vsplit=vsplit)
        pieces[KERNEL_A] = ka_call
        if scans.side_by_side:
            pieces[KERNEL_A_HALF] = lambda: ka_call(scans.vsplit)
        pieces = first_calls(pieces, res["pieces"], t_start, tag)
        in_turn(pieces, args, flush, res["pieces"])
        total, fs, ka = (median_of(res["pieces"], n) for n in (OURS, FORWARD_STATES, KERNEL_A))
        total_in_turn = median_of(res["pieces"], OURS_IN_TURN) if scans.side_by_side else total
        if total and ka is not None:
            res["pieces"]["kernel_a_share"] = ka / total
            if fs is not None and total_in_turn:
                res["pieces"]["rest_ms"] = total_in_turn - fs - ka   # Kernel B and the casts: the in-turn total's rest
        log(f"    {tag}: our pieces timed [{time.perf_counter() - t_start:.0f} s]")
    calls.clear()


def bench_backward_config(cfg: Config, args, flush) -> dict:
    """Time ours and FLA's whole backward, their pieces, memory and the training step on one config."""
    import torch

    H, t_start, tag = args.heads, time.perf_counter(), cfg.name
    res: dict[str, Any] = {"bench": "backward", "config": cfg.name, "B": cfg.B, "T": cfg.T, "H": H,
                           "N": cfg.N, "tokens": cfg.tokens, "varlen": cfg.varlen,
                           "floor": floor_entry(cfg.lengths, H), "backward": {}, "peak_memory": {},
                           "pieces": {}, "step": {}, "step_peak_memory": {},
                           "autograd_backward": {}}
    if cfg.varlen:
        res["lengths"] = list(cfg.lengths)
    res["fla_autotune_reset"] = fla_adapter.reset_autotune()

    clamped = args.gates == "clamped"
    raw = make_inputs(cfg, H, seed=args.seed, gate_strength=args.gate_strength, gates=args.gates,
                      projection_scale=args.projection_scale)
    res["gates"] = args.gates
    if not clamped:
        from kernel.tools.trained_layer_gate import gate_statistics

        res["gate_statistics"] = gate_statistics(raw["g"], cfg.lengths)
        log(f"    {tag}: {args.gates} gates: " + ", ".join(f"{k} {v:.3g}" for k, v in res["gate_statistics"].items()))
    cu_fla, cu_host = cu_for_fla(raw["cu_seqlens"]), cu_for_kernel_a(raw["cu_seqlens"])
    h0 = torch.zeros_like(raw["dht"])
    if args.step_only:
        res["step_only"] = True
    else:
        t0 = time.perf_counter()
        f = fla_kda.forward(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"], h0=h0, cu_seqlens=cu_fla,
                            safe_gate=clamped, lower_bound=fla_kda.GATE_LOWER_BOUND if clamped else None)
        torch.cuda.synchronize()
        res["fla_forward_s"] = time.perf_counter() - t0
        log(f"    {tag}: inputs and FLA's forward ready [{time.perf_counter() - t_start:.0f} s]")
        _time_backwards(f, raw, cu_host, args, flush, res, t_start, tag)
        del f
        free_memory()

    # 5. the training step, forward + backward, kernel.chunk_kda on the forward --our-forward names
    if not args.no_step:
        res["our_forward"] = args.our_forward
        res["raw_rows"] = not args.qk_copies   # kernel.chunk_kda's raw-row path, or its copies path (--qk-copies)
        with our_forward_setting(args.our_forward):
            _step(raw, h0, cu_fla, args, flush, res, t_start, tag)
    record_fla_autotune(res, tag)
    raw.clear()
    free_memory()
    return res


def clamped_step_inputs(cfg: Config, heads: int, seed: int = 0) -> tuple[dict, dict]:
    """(the raw inputs, fla_kda.chunk_kda_step_inputs) of this bench's training step at the default recipe
    (gates in [-5, 0], FLA's safe_gate, a zero initial state), for the studies that time or profile that step
    outside the bench."""
    import torch

    raw = make_inputs(cfg, heads, seed=seed, gate_strength=1.0)
    return raw, fla_kda.chunk_kda_step_inputs(raw, h0=torch.zeros_like(raw["dht"]),
                                              cu_seqlens=cu_for_fla(raw["cu_seqlens"]), safe_gate=True)


def record_fla_autotune(res: dict, tag: str) -> None:
    """FLA's autotune choices in this process into ``res["fla_autotune"]`` (its kernels' block sizes for
    the shape), and a line naming the kernels."""
    res["fla_autotune"] = fla_adapter.autotune_choices()
    log(f"    {tag}: FLA's autotuners chose for {len(res['fla_autotune'])} kernels: "
        + ", ".join(sorted(res["fla_autotune"])) + " (the JSON's 'fla_autotune' has their block sizes)")


def _step(raw: dict, h0, cu_fla, args, flush, res: dict, t_start: float, tag: str) -> None:
    """FLA's chunk_kda, kernel.chunk_kda and cuDNN's op, forward + backward through autograd, in turn;
    then each one's backward alone through autograd, in turn."""
    import torch

    inp = fla_kda.chunk_kda_step_inputs(raw, h0=h0, cu_seqlens=cu_fla, safe_gate=args.gates == "clamped")
    leaves = inp["leaves"]
    order = list(leaves.values())
    upstream = (raw["do"], raw["dht"])
    forward_of = lambda chunk_kda: fla_kda.step_forward(chunk_kda, inp)   # noqa: E731

    sides: dict[str, tuple[Callable, list]] = {}   # name -> (its forward: () -> (o, ht), the leaves it reads)
    if not args.no_fla:
        sides[STEP_FLA] = (forward_of(fla_kda.import_fla()["chunk_kda"]), order)
    ours, why = import_ours("fla_dropin", "chunk_kda")
    if ours is None:
        res["step"][STEP_OURS] = {"error": why}
    else:
        sides[STEP_OURS] = (forward_of(ours), order)
    if not args.no_cudnn:
        try:
            from kernel.tools import cudnn_kda

            c = cudnn_kda.step_inputs(raw, h0=h0, cu_seqlens=cu_fla)
            sides[STEP_CUDNN] = (lambda c=c: c["forward"](c["leaves"]), list(c["leaves"].values()))
        except ImportError as exc:
            res["step"][STEP_CUDNN] = {"error": str(exc)}
            log(f"    {tag}: no cuDNN side: {exc}")
    steps = {name: (lambda fwd=fwd, xs=xs: torch.autograd.grad(fwd(), xs, upstream))
             for name, (fwd, xs) in sides.items()}
    pipeline = getattr(args, "backward_pipeline", None)
    if pipeline is not None and STEP_OURS in steps:
        res["step"]["pipeline"] = dataclasses.asdict(pipeline)
        steps[STEP_PIPELINED] = lambda step=steps[STEP_OURS]: _pipelined(pipeline, step)
    steps = first_calls(steps, res["step"], t_start, tag)
    if STEP_PIPELINED in steps:
        res["step"]["pipelined_same_bits"] = _same_bits(steps[STEP_OURS](), steps[STEP_PIPELINED]())
        log(f"    {tag}: the pipelined step's gradients "
            + ("are" if res["step"]["pipelined_same_bits"] else "are NOT") + " the plain step's bits")
    in_turn(steps, args, flush, res["step"])
    a, b = median_of(res["step"], STEP_OURS), median_of(res["step"], STEP_FLA)
    if a and b:
        res["step"]["ratio"] = a / b
    piped = median_of(res["step"], STEP_PIPELINED)
    if piped and b:
        res["step"]["ratio_pipelined"] = piped / b
        log(f"    {tag}: step ours {a:.3f} ms, pipelined {piped:.3f} ms ({piped / a:.3f}x), FLA {b:.3f} ms")
    c_ms = median_of(res["step"], STEP_CUDNN)
    if a and c_ms:
        res["step"]["ratio_cudnn"] = a / c_ms
    # the step's peak memory above its inputs, as torch counts it: the forward's saved tensors and the gradients
    peak_memories({n: steps[n] for n in (STEP_FLA, STEP_OURS) if n in steps}, res["step_peak_memory"])
    steps.clear()
    log(f"    {tag}: training step timed [{time.perf_counter() - t_start:.0f} s]")
    _autograd_backwards({n: sides[n] for n in sides if "error" not in res["step"].get(n, {})}, upstream, args,
                        flush, res, t_start, tag)
    sides.clear()
    leaves.clear()
    order.clear()
    free_memory()


def _same_bits(xs, ys) -> bool:
    """Whether two calls' gradients are equal bit for bit (the pipeline promises the plain backward's bits)."""
    import torch

    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def _pipelined(pipeline, step: Callable):
    """``step`` with its backward pipelined (kernel.backward_pipeline.using_pipeline) while it runs."""
    from kernel.backward_pipeline import using_pipeline

    with using_pipeline(pipeline):
        return step()


def retained_backwards(sides: dict, upstream, out: dict) -> dict[str, Callable]:
    """For each side (name -> (forward, the inputs to differentiate)): its forward run here, once, and a
    zero-argument call of ``torch.autograd.grad`` of its outputs with ``upstream``, the graph kept, so
    that the backward alone can be called again and timed. A forward that raises is recorded in
    out[name] and has no call."""
    import torch

    calls = {}
    for name, (forward, xs) in sides.items():
        try:
            outputs = forward()
        except Exception as exc:
            out[name] = {"error": error_text(exc)}
            free_memory()
            continue
        calls[name] = lambda outputs=outputs, xs=xs: torch.autograd.grad(outputs, xs, upstream, retain_graph=True)
    return calls


def _autograd_backwards(sides: dict, upstream: tuple, args, flush, res: dict, t_start: float, tag: str) -> None:
    """Each side's backward alone through autograd: its forward once (the graph kept), then
    ``torch.autograd.grad`` with retain_graph, the sides in turn; ratios ours / FLA's and ours / cuDNN's."""
    out = res["autograd_backward"]
    calls = first_calls(retained_backwards(sides, upstream, out), out, t_start, tag)
    in_turn(calls, args, flush, out)
    ours = median_of(out, STEP_OURS)
    for other, key in ((STEP_FLA, "ratio"), (STEP_CUDNN, "ratio_cudnn")):
        theirs = median_of(out, other)
        if ours and theirs:
            out[key] = ours / theirs
    bare = median_of(res.get("backward", {}), OURS)   # kernel.kda_backward alone, timed earlier in this process
    if ours and bare:
        out["over_bare"] = ours / bare - 1.0
    log(f"    {tag}: the backwards alone through autograd timed [{time.perf_counter() - t_start:.0f} s]")
    calls.clear()
    free_memory()
