"""The whole KDA backward on the GPU, from FLA's forward tensors.

    grads = kda_backward(q, k, v, g, beta, Aqk, Akk, do, dht=dht, initial_state=h0, cu_seqlens=cu)

Three kernels run, all built from ptx_lab's headers:

1. the forward-state scan (:mod:`kernel.forward_states`), the bf16 state entering every
   64-token chunk, unless the caller passes the forward's own (``states``: FLA's ``h``,
   which FLA keeps with ``disable_recompute=True``);
2. Kernel A (:mod:`kernel.ds_scan.launch`, fed FLA's tensors as in :mod:`kernel.ds_scan.fla`), dS after
   every 16-token tile in bf16, and dh0;
3. Kernel B (:mod:`kernel.token_gradients`), dq, dk, dv, dg and dbeta, one CTA per
   64-token chunk and head, carrying the state across the chunk's four tiles in fp32.

The first two are serial scans over each sequence and independent of each other. With
few sequences x heads (B = 1) neither has enough chains to use the GPU's throughput,
and each alone still takes about every SM (one CTA an SM: both use most of its shared
memory). There they run side by side on two streams, each on a grid chosen for half
of the SMs (:func:`plan_scans`). Given the states (our forward's, or FLA's h), Kernel A runs
alone and, at few sequences x heads, cuts each long sequence into segments scanned side by side
(``segments``, :mod:`kernel.ds_scan.split`): the SMs the forward-state scan would have taken.

With :data:`kernel.backward_pipeline.PIPELINE` set (off by default), the batch runs in groups of whole sequences:
each group's Kernel A on a few SMs beside the group before's Kernel B on the rest, the same bits.

The float64 statement of all of it is :func:`kernel.reference.kda_backward_reference`
(on the raw per-token gate and, with ``qk_l2norm``, the raw q and k);
``docs/kda_backward.md`` gives the tile math and counts the bytes.

Arguments are FLA's (fla-core 0.6.0, ``chunk_kda_fwd``, chunk_size 64): q and k as its
forward used them (l2-normalised when ``use_qk_l2norm_in_kernel``: the l2norm backward is
the caller's, as in FLA), its ``g`` (the 64-chunk-local cumsum of the gate / ln 2), beta
after its sigmoid, its ``Aqk`` and ``Akk``. Any gate: a 16-token tile whose gate spans more
than 110 (log2) in some channel (:data:`kernel.shapes.SPAN_LIMIT`: short of fp32's 126, as -ftz=true
flushes the small entries of the factorised Kr) has its G14-G17 formed pairwise in Kernel B,
decided on the device (``docs/kda_backward.md``, "Gates of any size").

FLA's grouped value heads (GVA): q and k have H heads and everything else HV = G H, value head hv
reading q and k at head hv // G (:func:`kernel.shapes.qk_head`). The three kernels read q and k
(and the l2norm's rstd) there, in place; Kernel B's dq and dk come out per value head in fp32 and
are summed over each group after it, as FLA sums them (:func:`group_sum`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from . import backward_pipeline
from .ds_scan import fla, launch as ds_scan, split as ds_scan_split
from .token_gradients import launch as token_gradients
from .runtime import builds
from .runtime.arrays import (bf16_bits, beta_f32, cupy_view, describe, empty_output, expect, require_cupy, require_gpu,
                             to_cupy, torch_stream_for_cupy)
from .shapes import CHUNK_TOKENS, HEAD_DIM, host_offsets

__all__ = ["kda_backward", "plan_kda_backward", "checked_batch", "run", "Batch", "Gate", "plan_scans", "ScanPlan",
           "group_sum", "GRADIENTS", "GATE_GRADIENTS"]

GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
# what :func:`run` returns instead of dg where Kernel B applies the gate activation's backward (``gate``)
GATE_GRADIENTS = ("dg_raw", "dA_log", "ddt_bias")


class Gate(NamedTuple):
    """The gate activation FLA's layer asks the op to apply (kernel.activations.gate), for Kernel B's
    epilogue to apply its backward: g_raw bf16 [B, T, HV, 128]; A_log [HV] or None (the sigmoid form
    only); dt_bias [HV * 128] or [HV, 128], or None; lower_bound None (the softplus form) or L (the
    sigmoid form). A_log and dt_bias in any float dtype (read in fp32)."""
    g_raw: Any
    A_log: Any
    dt_bias: Any
    lower_bound: float | None
# What a host array's refusal says after "(host memory): "
HOST_ADVICE = ("kda_backward runs on the GPU and takes CuPy arrays or torch CUDA tensors. For a float64 "
               "evaluation on the host use kernel.reference.kda_backward_reference (on the raw gate)")


def _forces_split(segments) -> bool:
    """Whether ``segments`` (checked: "auto" or an int >= 1) asks for Kernel A's split outright."""
    return segments != "auto" and segments > 1


def _side_by_side_arg(side_by_side):
    if side_by_side is not None and not isinstance(side_by_side, (bool, np.bool_)):
        raise TypeError(f"side_by_side must be True, False or None (the rule), got {side_by_side!r}")
    return None if side_by_side is None else bool(side_by_side)


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """How the two scans run: side by side on two streams or one after the other, and their grids
    (Kernel A's v-split, the forward-state scan's consumer warps; "auto" / None: their own rules)."""
    side_by_side: bool
    vsplit: int | str
    states_warps: int | None


def plan_scans(pairs: int, sm_count: int, side_by_side: bool | None = None) -> ScanPlan:
    """The two scans' plan for `pairs` = sequences x (value) heads on a GPU of `sm_count` SMs.

    Side by side, each scan takes the grid its own rule picks for half of the SMs; they go side by
    side (None) when those two grids fit on the GPU together. On the H200 that is pairs <= 65:
    1 x 131072 x H32 runs Kernel A at vsplit 2 (64 CTAs) beside the forward-state scan with 4 consumer
    warps (64 CTAs), instead of 128 CTAs each in turn. True or False forces it either way."""
    from .forward_states import choose_warps

    side_by_side = _side_by_side_arg(side_by_side)
    half = max(1, sm_count // 2)
    vsplit, warps = ds_scan.choose_vsplit(pairs, half), choose_warps(pairs, half)
    fits = pairs * vsplit + pairs * (HEAD_DIM // (16 * warps)) <= sm_count   # Kernel A's CTAs + Kernel S's
    if side_by_side is None:
        side_by_side = fits
    if side_by_side:
        return ScanPlan(True, vsplit, warps)
    return ScanPlan(False, "auto", None)


def plan_kda_backward(q, k, v, g, beta, Aqk, Akk, do, *, scale: float | None = None, initial_state=None,
                      dht=None, cu_seqlens=None, states=None) -> fla.FlaLaunch:
    """Every check of :func:`kda_backward` that needs no GPU: kinds, dtypes, shapes, layouts,
    devices and cu_seqlens, each named. Returns Kernel A's launch plan (batch layout included)."""
    plan = fla.plan_fla_launch(q, k, g, beta, Aqk, Akk, do, dht=dht, cu_seqlens=cu_seqlens,
                                     scale=scale, snapshot_dtype="bfloat16", host_advice=HOST_ADVICE)
    B, T, HV, N = plan.B, plan.T, plan.HV, plan.N
    va = describe("v", v, HOST_ADVICE)
    expect("v", va, (B, T, HV, HEAD_DIM), f"[B, T, HV, V], V = {HEAD_DIM}, the value heads of g and do",
           ("bfloat16",))
    named = {"v": va}
    if initial_state is not None:
        named["initial_state"] = describe("initial_state", initial_state, HOST_ADVICE)
        expect("initial_state", named["initial_state"], (N, HV, HEAD_DIM, HEAD_DIM), "[N, HV, K, V]", ("float32",))
    if states is not None:
        n_chunks = int(plan.snapshot_offsets[-1])
        shape = plan.dh_shape
        named["states"] = describe("states", states, HOST_ADVICE)
        expect("states", named["states"], shape,
                          f"[B, NT, HV, K, V]: the state entering each of the {n_chunks} {CHUNK_TOKENS}-token "
                          f"chunks (FLA's h, state_v_first=False)", ("bfloat16",))
    for name, a in named.items():
        if a.device is not None and plan.device is not None and a.device != plan.device:
            raise ValueError(f"{name} is on device {a.device}, q on device {plan.device}: all inputs must be on one GPU")
    return plan


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the launches need of a checked call: its sizes, the host offsets and the forward's scale."""
    B: int
    T: int
    H: int                       # q's and k's heads
    HV: int                      # the value heads of everything else: H, or a multiple of it (FLA's GVA)
    cu_seqlens: np.ndarray       # host int64 [N + 1]
    varlen: bool                 # the caller gave cu_seqlens (else B sequences of T tokens)
    scale: float
    torch_out: bool              # torch tensors in, torch tensors out
    states_shape: tuple          # FLA's h: the bf16 state entering every 64-token chunk

    @property
    def N(self) -> int:
        return len(self.cu_seqlens) - 1


def checked_batch(B: int, T: int, H: int, cu_seqlens=None, *, scale: float, torch_out: bool,
                  HV: int | None = None) -> Batch:
    """The :class:`Batch` of a call whose boundary checked its arguments (q's B, T, H, the value heads HV,
    a multiple of H, or None for H, its cu_seqlens in any form, or None, and its scale, a float): nothing
    is checked here. A device cu_seqlens is copied to the host (N + 1 integers)."""
    HV = H if HV is None else HV
    if cu_seqlens is None:
        cu = np.arange(B + 1, dtype=np.int64) * T
    else:
        cu = host_offsets(cu_seqlens).astype(np.int64)
    return Batch(B, T, H, HV, cu, cu_seqlens is not None, float(scale), bool(torch_out),
                 fla.dh_shape(B, HV, cu, cu_seqlens is not None))


def kda_backward(q, k, v, g, beta, Aqk, Akk, do, *, scale: float | None = None, initial_state=None,
                 dht=None, cu_seqlens=None, states=None, side_by_side: bool | None = None,
                 segments: int | str = "auto", token_gate: bool = False) -> dict:
    """KDA's gradients from FLA's forward tensors, on the GPU.

    q, k: bf16 [B, T, H, 128]; v, do: bf16 [B, T, HV, 128]; g: fp32 [B, T, HV, 128] (FLA's
    g_cumsum); beta: fp32 or bf16 [B, T, HV]; Aqk, Akk: bf16 [B, T, HV, 64]; initial_state, dht:
    fp32 [N, HV, 128, 128] or None; states: FLA's h (bf16 [B, NT, HV, 128, 128], the state entering
    each 64-chunk) or None (recomputed). HV = H, or a multiple of it (FLA's grouped value heads:
    value head hv reads q and k at head hv // (HV / H)). Varlen: B == 1 and cu_seqlens (N + 1
    offsets). CuPy arrays (bf16
    as uint16 bits) or torch CUDA tensors; torch in, torch out, on torch's current stream.
    ``scale``: the forward's (default 128 ** -0.5). ``side_by_side``: run the forward-state scan
    beside Kernel A on a second stream, each on a grid for half the SMs (None: when both fit,
    :func:`plan_scans`; only when the states are recomputed). ``segments``: Kernel A's sequence split
    (:mod:`kernel.ds_scan.split`), used only where Kernel A has the GPU to itself (the states given,
    or the two scans in turn): "auto" splits long sequences where few sequences x heads would leave
    SMs idle; an integer S cuts each sequence into up to S segments and runs the scans in turn (1:
    never split). A split scan is the same algebra rounded in another order: not the unsplit scan's
    bits, but the same bits from call to call. ``token_gate``: g is each token's natural-log gate in place
    of FLA's cumsum (our forward's tensors, :func:`run`'s ``token_gate``); the states must be given.

    Returns {"dq", "dk": fp32 [B, T, H, 128] w.r.t. the q, k given (with GVA summed over the value
    heads that read each); "dv": bf16 [B, T, HV, 128]; "dg": fp32 [B, T, HV, 128] w.r.t. the per-token
    natural-log gate (before FLA's cumsum); "dbeta": fp32 [B, T, HV]; "dh0": fp32 [N, HV, 128, 128]}.
    Two calls give the same bits.
    """
    plan = plan_kda_backward(q, k, v, g, beta, Aqk, Akk, do, scale=scale, initial_state=initial_state,
                             dht=dht, cu_seqlens=cu_seqlens, states=states)
    side_by_side = _side_by_side_arg(side_by_side)
    ds_scan.check_segments(segments)
    if _forces_split(segments) and side_by_side and states is None:
        raise ValueError(f"segments={segments} splits Kernel A's scan, which then needs the GPU to itself: "
                         f"it cannot run side_by_side=True beside the forward-state scan (pass side_by_side=None "
                         f"or False, or segments=1)")
    batch = Batch(plan.B, plan.T, plan.H, plan.HV, plan.cu_seqlens, cu_seqlens is not None, plan.scale,
                  plan.torch_out, plan.dh_shape)
    if not isinstance(token_gate, (bool, np.bool_)):
        raise TypeError(f"token_gate must be True or False, got {token_gate!r}")
    if token_gate and states is None:
        raise ValueError("token_gate needs the states (our forward's): the forward-state scan reads FLA's cumsum")
    return run(batch, q, k, v, g, beta, Aqk, Akk, do, initial_state=initial_state, dht=dht, states=states,
               side_by_side=side_by_side, segments=segments, token_gate=bool(token_gate))


def run(batch: Batch, q, k, v, g, beta, Aqk, Akk, do, *, initial_state=None, dht=None, states=None,
        side_by_side: bool | None = None, rstd: tuple | None = None, dqk_bf16: bool = False,
        gate: Gate | None = None, segments: int | str = "auto", token_gate: bool = False,
        qk_raw: bool = False) -> dict:
    """:func:`kda_backward` on arguments a caller's boundary checked (kernel.chunk_kda's backward), described
    by ``batch`` (:func:`checked_batch`): the launches, and no check of their own beyond the CuPy views'.
    ``rstd``: (q_rstd, k_rstd), fp32 [B, T, H], the forward's l2norm (FLA's l2norm_fwd): q and k are then
    the normalised rows, and dq, dk come out with respect to the raw ones (Kernel B applies the l2norm's
    backward in its epilogue). ``dqk_bf16``: dq and dk come back bf16, rounded once (for a caller whose
    gradients are bf16): in Kernel B, or with GVA after the group sum in fp32. ``gate`` (:class:`Gate`):
    Kernel B applies the gate activation's backward where it forms dg, and the result has, instead of
    "dg", :data:`GATE_GRADIENTS`: dg_raw (bf16, g_raw's), dA_log (fp32 [HV], None without A_log) and
    ddt_bias (fp32 [HV * 128], None without dt_bias), each sum over tokens taken per CTA (a run of
    64-token chunks) in the kernel and then over the runs in a fixed order (two calls on one GPU give the same
    bits; the run length follows the GPU's SM count, so another card may differ in the last bits). ``segments``:
    as :func:`kda_backward`'s (checked by the caller). ``token_gate``: g is each token's natural-log gate
    (fp32 [B, T, HV, 128]) instead of FLA's chunk cumsum, which Kernels A and B sum within each tile
    themselves (kernel.shapes.tile_gate_sums: the cumsum pass folded into its readers); the states must
    then be given (the forward-state scan reads the cumsum), and not with ``gate`` (Kernel B has no build of
    that pair: refused here, before any kernel runs). ``qk_raw``: q and k are the rows before the l2norm and
    ``rstd`` (required) their l2norm's, so that the op needs no normalised copies: Kernel A's l2norm build
    normalises them in its R1 (with its own 1 / sqrt, not ``rstd``), Kernel B's qk_rstd build as bf16(x rstd),
    FLA's l2norm_fwd's rows; dq and dk come out with respect to the raw rows as with ``rstd`` alone. The states
    must be given: the forward-state scan reads normalised k."""
    if not isinstance(qk_raw, (bool, np.bool_)):
        raise TypeError(f"qk_raw must be True or False, got {qk_raw!r}")
    if qk_raw and rstd is None:
        raise ValueError("qk_raw: q and k are the raw rows, and Kernel B needs their l2norm's rstd "
                         "(rstd=(q_rstd, k_rstd)) to normalise them")
    if qk_raw and states is None:
        raise ValueError("qk_raw needs the forward's states: the forward-state scan (Kernel S) reads k normalised "
                         "and has no build on the raw rows")
    if token_gate and gate is not None:
        raise ValueError("token_gate with gate: Kernel B has no build of the gate epilogue on each token's gate")
    require_cupy("kernel.kda_backward")
    require_gpu("kernel.kda_backward")
    if _forces_split(segments) and side_by_side is None:
        side_by_side = False   # a forced split needs the GPU to itself
    scans = (plan_scans(batch.N * batch.HV, builds.sm_count(), side_by_side) if states is None
             else ScanPlan(False, "auto", None))
    # Kernel A splits its sequences only where it has the GPU to itself: beside the forward-state
    # scan (half the SMs each) there are no idle SMs for the segments to fill
    segments = 1 if scans.side_by_side else segments
    if batch.torch_out:
        with torch_stream_for_cupy("kernel.kda_backward"):
            return _run(batch, scans, q, k, v, g, beta, Aqk, Akk, do, initial_state, dht, states, rstd, dqk_bf16,
                        gate, segments, token_gate, bool(qk_raw))
    return _run(batch, scans, q, k, v, g, beta, Aqk, Akk, do, initial_state, dht, states, rstd, dqk_bf16, gate,
                segments, token_gate, bool(qk_raw))


def _empty_bf16(batch: Batch, like):
    """An uninitialised bf16 array of the states' shape, as a CuPy array (uint16 bits); from torch's
    caching allocator when the caller passed torch tensors (the CuPy view keeps the tensor alive)."""
    return empty_output(batch.states_shape, "bf16", like.device if batch.torch_out else None)[1]


def _run(batch: Batch, scans: ScanPlan, q, k, v, g, beta, Aqk, Akk, do, initial_state, dht, states, rstd,
         dqk_bf16: bool, gate: Gate | None, segments: int | str, token_gate: bool = False,
         qk_raw: bool = False) -> dict:
    import cupy

    B, T, H, HV = batch.B, batch.T, batch.H, batch.HV
    c = {name: to_cupy(name, x, want) for name, x, want in (
        ("q", q, "bf16"), ("k", k, "bf16"), ("v", v, "bf16"), ("g", g, "f32"), ("Aqk", Aqk, "bf16"),
        ("Akk", Akk, "bf16"), ("do", do, "bf16"))}
    if batch.torch_out:
        import torch

        if beta.dtype != torch.float32:
            beta = beta.float()   # through torch's allocator (beta_f32 would convert into CuPy's pool)
    beta_c = beta_f32(beta)
    main = cupy.cuda.get_current_stream()
    # the forward-state scan's stream beside Kernel A: the device's side stream (the runtime's, which
    # Kernel A's sequence split also uses; never both in one call: a split runs only without the scan beside it)
    side = builds.side_stream(cupy.cuda.Device().id) if scans.side_by_side else None
    if states is None:
        from .forward_states import auto_config, choose_warps, device_tables, launch_planned, plan_from_layout

        h0 = to_cupy("initial_state", initial_state, "f32") if initial_state is not None else None
        warps = scans.states_warps if scans.states_warps is not None else choose_warps(batch.N * HV, builds.sm_count())
        # the arguments were checked once, at the caller's boundary: the scan takes its plan from that check
        states_plan = plan_from_layout(B, T, H, HV, batch.cu_seqlens, batch.states_shape, auto_config(warps),
                                       has_initial_state=h0 is not None)
        # the states come from the caller's stream, so that they return to its pool when freed, after
        # Kernel B: torch's pool for a torch caller (torch counts and reuses the memory), else CuPy's
        states_c = _empty_bf16(batch, q)
        if side is not None:
            # the scan's cached device tables too are made here, before the fork: the side stream
            # allocates nothing
            device_tables(batch.cu_seqlens)
            side.wait_event(main.record())
            with side:
                launch_planned(states_plan, c["k"], c["v"], c["g"], beta_c, c["Akk"], h0, states_c)
                states_ready = side.record()
        else:
            launch_planned(states_plan, c["k"], c["v"], c["g"], beta_c, c["Akk"], h0, states_c)
    else:
        states_c = to_cupy("states", states, "bf16")
    # Kernel A on the caller's arrays: torch in, torch dS and dh0 out (torch's allocator; a split's
    # scratch too). Split along the sequence only when it runs alone (run() decided ``segments``).
    dht_c = to_cupy("dht", dht, "f32") if dht is not None else None
    checked = ds_scan.ScanInputs((c["q"], c["k"], c["g"], beta_c, c["Aqk"], c["Akk"], c["do"]), dht_c, B, T, H, HV,
                                 batch.cu_seqlens, q.device if batch.torch_out else None)
    # raw q and k: Kernel A's l2norm build normalises them in its R1
    scan_options = dict(scale=batch.scale, varlen=batch.varlen, qk_l2norm=qk_raw, snapshot_dtype="bfloat16",
                        snapshot_every=1, knobs={}, fla_inputs=True, token_gate=token_gate)
    pipeline = backward_pipeline.PIPELINE
    pipelined = pipeline is not None and backward_pipeline.reason_not(
        pipeline, N=batch.N, states_given=states is not None, capturing=main.is_capturing(),
        scan_splits=bool((ds_scan_split.counts_for(segments, np.diff(batch.cu_seqlens), HV, builds.sm_count())
                          > 1).any())) is None
    if pipelined:   # Kernel A's outputs, whole, before the groups write into them
        shapes = ds_scan.output_shapes(B, HV, batch.cu_seqlens, 1, batch.varlen)
        device = q.device if batch.torch_out else None
        ds, ds_c = empty_output(shapes["snapshots"], "bf16", device)
        dh0, dh0_c = empty_output(shapes["dh0"], "f32", device)
    else:
        ds, dh0 = ds_scan.run(checked, vsplit=scans.vsplit, segments=segments, **scan_options)
        ds_c = to_cupy("dS", ds, "bf16")
    if side is not None:
        main.wait_event(states_ready)

    # Kernel B's dq, dk are per value head: with GVA fp32 [B, T, HV, K], summed over each group below
    wide, row = (B, T, HV, HEAD_DIM), (B, T, HV)
    in_kernel_bf16 = dqk_bf16 and HV == H
    if batch.torch_out:
        import torch

        dev = q.device
        dqk = torch.bfloat16 if in_kernel_bf16 else torch.float32
        out_t = {"dq": torch.empty(wide, dtype=dqk, device=dev),
                 "dk": torch.empty(wide, dtype=dqk, device=dev),
                 "dv": torch.empty(wide, dtype=torch.bfloat16, device=dev),
                 "dg": torch.empty(wide, dtype=torch.float32, device=dev),
                 "dbeta": torch.empty(row, dtype=torch.float32, device=dev)}
        out = {name: cupy_view(x) for name, x in out_t.items()}
    else:
        dqk = np.uint16 if in_kernel_bf16 else np.float32
        out = {"dq": cupy.empty(wide, dqk), "dk": cupy.empty(wide, dqk),
               "dv": cupy.empty(wide, np.uint16), "dg": cupy.empty(wide, np.float32),
               "dbeta": cupy.empty(row, np.float32)}
    rstd_c = None if rstd is None else tuple(to_cupy(name, x, "f32") for name, x in zip(("q_rstd", "k_rstd"), rstd))
    runs = token_gradients.run_plan(batch.cu_seqlens, HV)
    gate_out, gate_t = (None, None) if gate is None else _gate_out(batch, gate, q, runs.runs)
    if pipelined:
        vsplit = ds_scan.scan_vsplit(scans.vsplit, batch.N * HV, builds.sm_count())   # the batch's, every group's
        jobs = _group_jobs(pipeline.groups, checked, scan_options, vsplit, c, beta_c, ds_c, dh0_c, states_c, out,
                           rstd_c, gate_out, runs, batch, qk_raw, token_gate)
        backward_pipeline.launch(pipeline, jobs, cupy.cuda.Device().id)
    else:
        token_gradients.launch(c["q"], c["k"], c["v"], c["g"], beta_c, c["Aqk"], c["Akk"], c["do"], ds_c, states_c,
                               cu=batch.cu_seqlens, H=H, HV=HV, scale=batch.scale, out=out, rstd=rstd_c, gate=gate_out,
                               token_gate=token_gate, run_chunks=runs.run_chunks, qk_rstd=qk_raw)
    grads = {**(out_t if batch.torch_out else out), "dh0": dh0}
    if gate is not None:
        del grads["dg"]   # never written: the gate build writes dg_raw instead
        grads.update(_gate_sums(gate_out, gate_t, batch.torch_out))
    if HV != H:
        for name in ("dq", "dk"):
            grads[name] = _rounded(group_sum(grads[name], H), dqk_bf16, batch.torch_out)
    return grads


def _group_jobs(groups: int, checked, scan_options: dict, vsplit: int, c: dict, beta_c, ds_c, dh0_c, states_c,
                out: dict, rstd_c, gate_out, runs, batch: Batch, qk_raw: bool, token_gate: bool) -> list:
    """Each group's (Kernel A, Kernel B) launch for :func:`kernel.backward_pipeline.launch`: views of the batch's
    arrays (whole sequences: rows of a batch of equal lengths, or token ranges of a packed varlen row), Kernel A
    writing its group's dS and dh0, Kernel B reading them and writing its rows of every output and its runs' rows
    of the gate's partial sums. Each kernel takes the batch's choices (Kernel A's vsplit, Kernel B's run length),
    so that it does the work of its group as the batch's launch does: the same bits."""
    H, HV, cu = batch.H, batch.HV, batch.cu_seqlens
    t = token_gradients.tables(cu, runs.run_chunks)
    jobs = []
    for s0, s1 in backward_pipeline.group_bounds(cu, groups):
        if batch.varlen:   # one packed row: the group's tokens, tiles and chunks are ranges of axis 1
            tokens, tiles, chunks = (slice(int(offs[s0]), int(offs[s1])) for offs in (cu, t["tile_offs"],
                                                                                      t["chunk_offs"]))
            rows = lambda x, r: x[0, r].reshape(1, -1, *x.shape[2:])   # noqa: E731  (C-contiguous, fresh strides)
        else:   # sequences first: every range is the group's rows
            tokens = tiles = chunks = slice(s0, s1)
            rows = lambda x, r: x[r]   # noqa: E731
        seqs = slice(s0, s1)
        group_cu = cu[s0:s1 + 1] - cu[s0]
        r0, r1 = np.searchsorted(t["run_chunk0"], [t["chunk_offs"][s0], t["chunk_offs"][s1]])   # its runs
        scan = dataclasses.replace(checked, arrays=tuple(rows(x, tokens) for x in checked.arrays),
                                   dht=None if checked.dht is None else checked.dht[seqs],
                                   B=1 if batch.varlen else s1 - s0, T=batch.T if not batch.varlen
                                   else int(group_cu[-1]), cu=group_cu)
        scan_out = {"snapshots": rows(ds_c, tiles), "dh0": dh0_c[seqs]}
        gate_part = None if gate_out is None else dataclasses.replace(
            gate_out, g_raw=rows(gate_out.g_raw, tokens), dg_raw=rows(gate_out.dg_raw, tokens),
            **{name: None if getattr(gate_out, name) is None else getattr(gate_out, name)[r0:r1]
               for name in ("da_part", "ddt_part")})
        b_inputs = (*(rows(c[name], tokens) for name in ("q", "k", "v", "g")), rows(beta_c, tokens),
                    *(rows(c[name], tokens) for name in ("Aqk", "Akk", "do")), rows(ds_c, tiles),
                    rows(states_c, chunks))
        b_out = {name: rows(x, tokens) for name, x in out.items()}
        b_rstd = None if rstd_c is None else tuple(rows(x, tokens) for x in rstd_c)

        def kernel_a(scan=scan, scan_out=scan_out):
            ds_scan.run(scan, vsplit=vsplit, segments=1, out=scan_out, **scan_options)

        def kernel_b(b_inputs=b_inputs, group_cu=group_cu, b_out=b_out, b_rstd=b_rstd, gate_part=gate_part):
            token_gradients.launch(*b_inputs, cu=group_cu, H=H, HV=HV, scale=batch.scale, out=b_out, rstd=b_rstd,
                                   gate=gate_part, token_gate=token_gate, run_chunks=runs.run_chunks, qk_rstd=qk_raw)

        jobs.append((kernel_a, kernel_b))
    return jobs


def _gate_out(batch: Batch, gate: Gate, like, runs: int):
    """Kernel B's gate epilogue arguments (token_gradients.GateOut), with, for a torch caller, the torch
    tensors behind its outputs ({name: tensor}); A_log and dt_bias go in as fp32. ``runs``: Kernel B's CTAs a
    head (token_gradients.run_plan), a row each of the partial sums."""
    import cupy

    if gate.lower_bound is None and gate.A_log is None:
        raise ValueError("gate: A_log is None with lower_bound None: the softplus form g = -exp(A_log) softplus(x) "
                         "needs A_log (only the sigmoid form, lower_bound = L, takes A_log None)")
    B, T, HV = batch.B, batch.T, batch.HV
    wide = (B, T, HV, HEAD_DIM)
    if batch.torch_out:
        import torch

        dev = like.device
        a_log = None if gate.A_log is None else gate.A_log.float().contiguous().reshape(-1)
        dt_bias = None if gate.dt_bias is None else gate.dt_bias.float().contiguous().reshape(-1)
        t = {"dg_raw": torch.empty(wide, dtype=torch.bfloat16, device=dev),
             "da_part": None if a_log is None else torch.empty((runs, HV), dtype=torch.float32, device=dev),
             "ddt_part": None if dt_bias is None else torch.empty((runs, HV, HEAD_DIM), dtype=torch.float32,
                                                                 device=dev)}
        views = {name: None if x is None else cupy_view(x) for name, x in t.items()}
        inputs = (to_cupy("g_raw", gate.g_raw, "bf16"), None if a_log is None else cupy_view(a_log),
                  None if dt_bias is None else cupy_view(dt_bias))
    else:
        t = None
        a_log, dt_bias = gate.A_log, gate.dt_bias
        views = {"dg_raw": cupy.empty(wide, np.uint16),
                 "da_part": None if a_log is None else cupy.empty((runs, HV), np.float32),
                 "ddt_part": None if dt_bias is None else cupy.empty((runs, HV, HEAD_DIM), np.float32)}
        inputs = (to_cupy("g_raw", gate.g_raw, "bf16"), None if a_log is None else to_cupy("A_log", a_log, "f32").reshape(-1),
                  None if dt_bias is None else to_cupy("dt_bias", dt_bias, "f32").reshape(-1))
    return token_gradients.GateOut(*inputs, gate.lower_bound, views["dg_raw"], views["da_part"],
                                   views["ddt_part"]), t


def _gate_sums(out, t, torch_out: bool) -> dict:
    """dg_raw, and dA_log and ddt_bias: Kernel B's per-run partial sums added over the runs (a reduction
    of each element's terms, no atomics: the same bits every call), fp32."""
    src = t if torch_out else {"dg_raw": out.dg_raw, "da_part": out.da_part, "ddt_part": out.ddt_part}
    da, ddt = src["da_part"], src["ddt_part"]
    return {"dg_raw": src["dg_raw"], "dA_log": None if da is None else da.sum(0),
            "ddt_bias": None if ddt is None else ddt.sum(0).reshape(-1)}


def group_sum(x, H: int):
    """dq or dk per value head, [B, T, HV, K], summed over the value heads that read each query / key
    head: [B, T, H, K], head h the sum of value heads h G .. h G + G - 1 (G = HV / H), which read it
    (kernel.shapes.qk_head), as FLA sums them. numpy, CuPy or torch: a reduction of each element's G
    terms (no atomics), so two calls give the same bits."""
    B, T, HV, K = x.shape
    return x.reshape(B, T, H, HV // H, K).sum(3)


def _rounded(x, bf16: bool, torch_out: bool):
    """x (fp32), or rounded once to bf16 where the caller asked for bf16 gradients (torch.bfloat16, or
    CuPy's uint16 bits)."""
    if not bf16:
        return x
    if torch_out:
        import torch

        return x.to(torch.bfloat16)
    return bf16_bits(x)
