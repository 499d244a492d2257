"""One configuration measured: Kernel A and FLA timed on the same inputs, and their precision.

:func:`bench_config` times, in this order, the byte floor (while the GPU is still
empty), Kernel A in each snapshot mode, FLA's calls, and Kernel A's bf16-every-64
beside FLA's dAv+dhu in turn. :func:`precision_config` compares both with the
float64 reference (CuPy) on sampled heads. torch, CuPy and fla are imported
inside the functions.
"""
from __future__ import annotations

import math
import time
from typing import Any

from kernel.shapes import HEAD_DIM, TILE_TOKENS
from kernel.ds_scan.fla import dstate_scan_from_fla   # numpy-only at import, like kernel.ds_scan.launch

from .configs import BF16_EVERY_64, MODES, Config, kernel_a_bytes
from .inputs import build_tiles, cu_for_fla, cu_for_kernel_a, every_k_rows, make_inputs, slice_inputs
from .report import ALTERNATING_A, ALTERNATING_FLA, ALTERNATING_FROM_FLA, error_text, get, log
from .timing import copy_floor_ms, cupy_on_torch_stream, free_memory, kernel_only_ms, time_alternating, time_cuda


def kernel_a_import():
    """(dstate_scan, None) or (None, reason)."""
    try:
        from kernel.ds_scan.launch import dstate_scan
    except Exception as exc:
        return None, f"{exc.__class__.__name__}: {exc}"
    return dstate_scan, None


def fla_import():
    """(fla_adapter module, description) or (None, reason)."""
    from kernel.tools import fla_adapter
    ok, why = fla_adapter.available()
    return (fla_adapter if ok else None), why


def run_kernel_a(dstate_scan, raw: dict, tiles: tuple, *, mode: str, vsplit, scale=None, tuning=None,
                 segments="auto"):
    """One dstate_scan call in snapshot mode `mode` (torch tensors in and out)
    -> (snapshots, dh0)."""
    dtype, every = MODES[mode]
    gc, mqk, inv = tiles
    with cupy_on_torch_stream():
        return dstate_scan(raw["q"], raw["k"], gc, raw["beta"], mqk, inv, raw["do"],
                           scale=scale, dht=raw["dht"], cu_seqlens=raw.get("cu_a"),
                           qk_l2norm=True, snapshot_dtype=dtype, snapshot_every=every,
                           vsplit=vsplit, segments=segments, tuning=tuning)


def run_kernel_a_from_fla(state, raw: dict, *, vsplit, tuning=None, segments="auto"):
    """kernel.ds_scan.fla.dstate_scan_from_fla on FLA's forward tensors as it stored them -> (dh, dh0)."""
    with cupy_on_torch_stream():
        return dstate_scan_from_fla(state.q, state.k, state.gk, state.beta, state.Aqk, state.Akk, raw["do"],
                                    dht=raw["dht"], cu_seqlens=raw.get("cu_a"), scale=state.scale,
                                    vsplit=vsplit, segments=segments, tuning=tuning)


def as_torch(x, bf16_bits: bool = False):
    """A torch view of a torch or CuPy array (DLPack); uint16 bf16 bits -> torch.bfloat16."""
    import torch
    if not isinstance(x, torch.Tensor):
        x = torch.from_dlpack(x)
    if bf16_bits and x.dtype in (torch.uint16, torch.int16):
        x = x.view(torch.bfloat16)
    return x


def resolved_vsplit(vsplit, ctas: int):
    """The split 'auto' picks (kernel.ds_scan.choose_vsplit), for the record."""
    if vsplit != "auto":
        return vsplit
    try:
        import torch
        from kernel.ds_scan.launch import choose_vsplit
        return choose_vsplit(ctas, torch.cuda.get_device_properties(0).multi_processor_count)
    except Exception:
        return "auto"


def resolved_segments(segments, lengths, H: int) -> list[int]:
    """The segment counts of the sequence split (kernel.ds_scan.split) per distinct length, for the record."""
    import torch
    from kernel.ds_scan import split

    counts = split.counts_for(segments, lengths, H, torch.cuda.get_device_properties(0).multi_processor_count)
    return sorted(set(int(c) for c in counts))


def bench_config(cfg: Config, args, dstate_scan, fla, flush) -> dict:
    """Time Kernel A (each snapshot mode) and FLA on one config; returns a result dict."""
    import torch

    H = args.heads
    res: dict[str, Any] = {"config": cfg.name, "B": cfg.B, "T": cfg.T, "H": H, "HEAD_DIM": HEAD_DIM,
                           "N": cfg.N, "tokens": cfg.tokens, "varlen": cfg.varlen,
                           "kernel_a": {}, "fla": {}, "floor": {}, "bytes": {}}
    if cfg.varlen:
        res["lengths"] = list(cfg.lengths)
    for mode in args.modes:
        dt, ev = MODES[mode]
        res["bytes"][mode] = kernel_a_bytes(cfg.lengths, H, snapshot_dtype=dt, snapshot_every=ev)

    # 1. the byte floor, while the GPU is still empty
    free_memory()
    if dstate_scan is not None:
        for mode in args.modes:
            try:
                res["floor"][mode] = copy_floor_ms(res["bytes"][mode]["total"],
                                                   warmup=args.warmup,
                                                   reps=max(3, args.reps // 2), flush=flush)
            except Exception as exc:
                res["floor"][mode] = {"error": error_text(exc)}
                log(f"    floor copy ({mode}) failed: {error_text(exc)}")
                free_memory()

    # 2. raw inputs, shared by both
    t0 = time.perf_counter()
    raw = make_inputs(cfg, H, seed=args.seed, gate_strength=args.gate_strength)
    raw["cu_a"] = cu_for_kernel_a(raw["cu_seqlens"])
    torch.cuda.synchronize()
    res["inputs_s"] = time.perf_counter() - t0
    inputs_bytes = res["bytes"][args.modes[0]]["inputs"]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    res["l2_note"] = (f"inputs {inputs_bytes / 1e9:.2f} GB vs L2 {l2 / 2**20:.0f} MiB: "
                      + ("no need to rotate input sets; " if inputs_bytes > 2 * l2 else
                         "inputs would fit in L2; ")
                      + "L2 flushed (512 MiB memset) before every timed call")

    # 3. Kernel A
    if dstate_scan is not None:
        res["vsplit"] = resolved_vsplit(args.vsplit, cfg.N * H)
        res["segments"] = resolved_segments(args.segments, cfg.lengths, H)
        t0 = time.perf_counter()
        try:
            tiles = build_tiles(raw["q"], raw["k"], raw["g"], raw["beta"], lengths=cfg.lengths)
            torch.cuda.synchronize()
        except Exception as exc:
            tiles = None
            res["kernel_a"]["error"] = f"building gc/mqk/inv: {error_text(exc)}"
            log(f"    {res['kernel_a']['error']}")
            free_memory()
        res["build_tiles_s"] = time.perf_counter() - t0
        for mode in (args.modes if tiles is not None else []):
            try:
                t = time_cuda(lambda: run_kernel_a(dstate_scan, raw, tiles, mode=mode,
                                                   vsplit=args.vsplit, tuning=args.tuning,
                                                   segments=args.segments),
                              warmup=args.warmup, reps=args.reps, flush=flush)
                if args.cupti:
                    t["kernel_only"] = kernel_only_ms(
                        lambda: run_kernel_a(dstate_scan, raw, tiles, mode=mode, vsplit=args.vsplit,
                                             tuning=args.tuning, segments=args.segments),
                        reps=min(args.reps, 5))
                t["GBps"] = res["bytes"][mode]["total"] / (t["median_ms"] * 1e6)
                floor = get(res, "floor", mode, "ms")
                t["vs_floor"] = None if floor is None else t["median_ms"] / floor
                res["kernel_a"][mode] = t
            except Exception as exc:
                res["kernel_a"][mode] = {"error": error_text(exc)}
                log(f"    Kernel A {mode}-mode failed: {error_text(exc)}")
            free_memory()
    else:
        tiles = None

    # 4. FLA
    if fla is not None:
        try:
            t0 = time.perf_counter()
            # FLA's autotune keys leave out B and T: tune for this configuration, not the first one
            res["fla_autotune_reset"] = fla.reset_autotune()
            state = fla.prepare(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"],
                                cu_seqlens=cu_for_fla(raw["cu_seqlens"]))
            calls = fla.callables(state, raw["do"], raw["dht"])
            torch.cuda.synchronize()
            res["fla_prepare_s"] = time.perf_counter() - t0
            for name, fn in calls.items():
                try:
                    res["fla"][name] = time_cuda(fn, warmup=max(1, args.warmup),
                                                 reps=args.reps, flush=flush)
                    if args.cupti:
                        res["fla"][name]["kernel_only"] = kernel_only_ms(fn, reps=min(args.reps, 5))
                except Exception as exc:
                    res["fla"][name] = {"error": error_text(exc)}
                    log(f"    FLA {name} failed: {error_text(exc)}")
                    free_memory()
            # 4b. Kernel A fed straight from FLA's forward tensors (no tile inputs built)
            from_fla = None
            if dstate_scan is not None and BF16_EVERY_64 in args.modes:
                from_fla = lambda: run_kernel_a_from_fla(state, raw, vsplit=args.vsplit, tuning=args.tuning,
                                                         segments=args.segments)
                try:
                    res["kernel_a_from_fla"] = time_cuda(from_fla, warmup=args.warmup, reps=args.reps, flush=flush)
                except Exception as exc:
                    res["kernel_a_from_fla"], from_fla = {"error": error_text(exc)}, None
                    log(f"    Kernel A from FLA's tensors failed: {error_text(exc)}")
                    free_memory()
            # 5. both in turn, under the same power state (time_alternating says why)
            if (not args.no_alternate and tiles is not None and BF16_EVERY_64 in args.modes
                    and "median_ms" in res["kernel_a"].get(BF16_EVERY_64, {})
                    and "median_ms" in res["fla"].get("dAv+dhu", {})):
                try:
                    turn = {ALTERNATING_A: lambda: run_kernel_a(dstate_scan, raw, tiles, mode=BF16_EVERY_64,
                                                                vsplit=args.vsplit, tuning=args.tuning,
                                                                segments=args.segments),
                            ALTERNATING_FLA: calls["dAv+dhu"]}
                    if from_fla is not None:
                        turn[ALTERNATING_FROM_FLA] = from_fla
                    alt = time_alternating(turn, warmup=1, reps=args.reps, flush=flush)
                    res["alternating"] = alt
                    res["ratio_alternating"] = alt[ALTERNATING_A]["median_ms"] / alt[ALTERNATING_FLA]["median_ms"]
                    if from_fla is not None:
                        res["ratio_alternating_from_fla"] = (alt[ALTERNATING_FROM_FLA]["median_ms"]
                                                             / alt[ALTERNATING_FLA]["median_ms"])
                except Exception as exc:
                    res["alternating"] = {"error": error_text(exc)}
                    log(f"    alternating timing failed: {error_text(exc)}")
                    free_memory()
            del state, calls
            res["fla_autotune"] = fla.autotune_choices()   # FLA's block sizes for this shape
        except Exception as exc:
            res["fla"]["error"] = error_text(exc)
            log(f"    FLA failed: {error_text(exc)}")
        free_memory()
    del tiles
    free_memory()

    a = res["kernel_a"].get(BF16_EVERY_64, {}).get("median_ms")
    f = res["fla"].get("dAv+dhu", {}).get("median_ms")
    if a is not None and f is not None:
        res["ratio_a_fla"] = a / f
    raw.clear()
    free_memory()
    return res


# ----------------------------------------------------------------------------
# precision against the float64 reference (sampled heads)
# ----------------------------------------------------------------------------

def rel_fro(x, ref, chunk: int = 1 << 26) -> float:
    """||x - ref||_F / ||ref||_F in float64, in slices (x, ref torch tensors, same numel)."""
    xf, rf = x.reshape(-1), ref.reshape(-1)
    if xf.numel() != rf.numel():
        raise ValueError(f"rel_fro: {tuple(x.shape)} vs {tuple(ref.shape)}")
    num = den = 0.0
    for i in range(0, rf.numel(), chunk):
        r = rf[i:i + chunk].double()
        d = xf[i:i + chunk].double() - r
        num += float((d * d).sum())
        den += float((r * r).sum())
    return math.sqrt(num / den) if den > 0 else float("nan")


def precision_config(cfg: Config, args, dstate_scan, fla) -> dict:
    """Relative Frobenius errors of dh0 and snapshots vs kernel.reference in float64 (CuPy).

    Kernel A and FLA run on the same sampled heads they would see in the full
    run (heads are independent); the reference gets the same raw values
    (bf16 q, k, do; fp32 g, beta, dht) in float64 and builds its own float64
    gc, mqk, inv with prepare_tiles. The bf16 rounding of the exact dh is the
    yardstick for any bf16 snapshot.
    """
    import cupy
    import torch
    from kernel import reference as ref

    out: dict[str, Any] = {}
    raw = make_inputs(cfg, args.heads, seed=args.seed, gate_strength=args.gate_strength)
    sl, lengths = slice_inputs(raw, cfg, args.precision_heads, args.precision_seqs)
    del raw
    free_memory()
    out["heads"], out["sequences"] = args.precision_heads, len(lengths)
    out["tokens"] = int(sum(lengths))

    def to_cp(t):  # torch -> CuPy float64 (CuPy has no bf16: widen in torch first)
        return cupy.from_dlpack(t.double().contiguous())

    to_torch = as_torch
    # the float64 reference
    q64, k64, g64, b64, do64, dht64 = (to_cp(sl[key]) for key in
                                       ("q", "k", "g", "beta", "do", "dht"))
    cu = sl["cu_seqlens"]
    t0 = time.perf_counter()
    gc_r, mqk_r, inv_r = ref.prepare_tiles(q64, k64, g64, b64, qk_l2norm=True, tile=TILE_TOKENS,
                                           cu_seqlens=cu)
    snaps_r, dh0_r = ref.dstate_scan_reference(q64, k64, gc_r, b64, mqk_r, inv_r, do64,
                                               dht=dht64, cu_seqlens=cu, tile=TILE_TOKENS,
                                               qk_l2norm=True, snapshot_every=1)
    cupy.cuda.Device().synchronize()
    out["reference_s"] = time.perf_counter() - t0
    H_s = args.precision_heads
    snaps1 = to_torch(snaps_r).reshape(-1, H_s, HEAD_DIM, HEAD_DIM)                        # every tile
    every_64 = MODES[BF16_EVERY_64][1]
    rows4 = torch.from_numpy(every_k_rows(lengths, every_64)).to(snaps1.device)
    snaps4 = snaps1.index_select(0, rows4)                                   # every 64 tokens
    dh0_t = to_torch(dh0_r)
    out["yardstick"] = {"bf16_of_exact_dh": rel_fro(snaps4.to(torch.bfloat16), snaps4),
                        "fp32_of_exact_dh": rel_fro(snaps1.float(), snaps1)}

    if dstate_scan is not None:
        tiles = build_tiles(sl["q"], sl["k"], sl["g"], sl["beta"], lengths=lengths,
                            out_dtype=torch.float32)
        out["builder_fp32_vs_f64"] = {
            "gc": rel_fro(tiles[0], to_torch(gc_r)), "mqk": rel_fro(tiles[1], to_torch(mqk_r)),
            "inv": rel_fro(tiles[2], to_torch(inv_r))}
        tiles = (tiles[0], tiles[1].to(torch.bfloat16), tiles[2].to(torch.bfloat16))
        # the sampled heads split as the full run's heads are (the auto rule counts all of them),
        # and, where that splits, unsplit too: the split's error beside the single pass's
        counts = resolved_segments(args.segments, cfg.lengths, args.heads)
        seg = max(counts) if len(counts) == 1 else args.segments
        out["segments"] = counts
        runs = {"kernel_a": seg} | ({"kernel_a_unsplit": 1} if seg != 1 else {})
        for key, segments in runs.items():
            out[key] = {}
            for mode in args.modes:
                try:
                    snaps, dh0 = run_kernel_a(dstate_scan, sl, tiles, mode=mode, vsplit=args.vsplit,
                                              tuning=args.tuning, segments=segments)
                    dtype, every = MODES[mode]
                    snaps, dh0 = as_torch(snaps, bf16_bits=dtype == "bfloat16"), as_torch(dh0)
                    refs = snaps4 if every == every_64 else snaps1
                    out[key][mode] = {"dh0": rel_fro(dh0, dh0_t), "snapshots": rel_fro(snaps, refs)}
                    del snaps, dh0
                except Exception as exc:
                    out[key][mode] = {"error": error_text(exc)}
        del tiles
    if fla is not None:
        try:
            state = fla.prepare(sl["q"], sl["k"], sl["v"], sl["g"], sl["beta"],
                                cu_seqlens=cu_for_fla(cu))
            dh, dh0f = fla.dh_dh0(state, sl["do"], sl["dht"])
            out["fla"] = {"dh0": rel_fro(dh0f, dh0_t), "dh": rel_fro(dh, snaps4)}
            del state, dh, dh0f
        except Exception as exc:
            out["fla"] = {"error": error_text(exc)}
    del snaps1, snaps4, snaps_r, dh0_r, gc_r, mqk_r, inv_r
    free_memory()
    return out
