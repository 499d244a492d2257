"""Context parallelism for Kernel A: one sequence's backward scan split over the ranks of a group.

What and why
------------
Kernel A's scan is one serial chain per sequence. A long sequence can still be
spread over several GPUs: rank r holds the contiguous tokens
[start_r, stop_r) (rank order = token order, every boundary a tile edge) and the
chain is cut there (:mod:`kernel.reference.segments` has the algebra):

1. every rank computes its part's *summary* (M, d): dS entering the part from
   the right maps to dS leaving it as M dS + d. The last rank knows what enters
   it (dht), so it runs its real scan instead and its "summary" is the constant
   dS leaving it; rank 0's summary is never needed and is not computed;
2. the summaries travel by one ``all_gather`` (float64, [H, K, K + V] a rank),
   and each rank folds those of the ranks after it into the dS entering its part;
3. every rank but the last runs its scan from that dS and writes its snapshots.

Rank r returns the snapshots whose tile lies in its part (concatenated in rank
order they are the sequence's, :func:`kernel.reference.segment_snapshots`) and
the dS leaving its part; rank 0's is dh0.

Before any of that the ranks exchange a small header (token range, shapes,
dtypes, options) with ``all_gather_object`` and every rank checks all headers
the same way, so inconsistent parts make *every* rank raise
:class:`CPInputError` naming the offending rank, instead of some ranks waiting
forever. On gloo a ``monitored_barrier`` with ``timeout`` comes first (a rank
that never arrives is named after ``timeout``); every later collective is bounded
by the group's own timeout, which :func:`init_group` sets (NCCL has no monitored
barrier: its bound is that group timeout alone). A rank whose own summary_fn or
scan_fn fails raises there; the others give up when that group timeout expires.

Plugging in a scan
------------------
The per-part work is two functions, so the float64 reference here and the GPU
kernel later run the same exchange:

    summary_fn(part, options) -> (M [H, K, K], d [H, K, V])
    scan_fn(part, dS_in, options) -> (snapshots [1, n, H, K, V], dS_out [H, K, V])

``dS_in`` is float64 in the part's array module (numpy or CuPy) or None for
zeros; ``snapshots`` are the part's share of the sequence's grid (every
``snapshot_every``-th tile counted from the *sequence's* start, as
:func:`kernel.reference.segment_snapshots` says). :func:`reference_summary` and
:func:`reference_scan` are the float64 pair. Summaries may come back in any
float dtype and array type with DLPack (numpy, CuPy, torch); they are exchanged
and folded in float64.

torch is needed only by :func:`cp_dstate_scan` and :func:`init_group`;
:func:`shard` and :func:`cp_dstate_scan_serial` (every part in turn, in one
process: the single-GPU comparison) run without it.
"""
from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from ..reference import array_module, dstate_scan_reference, fold_summaries, segment_snapshots, segment_summary
from ..reference.dstate_scan import check_scan_inputs
from ..shapes import HEAD_DIM, TILE_TOKENS
from .exchange import (DEFAULT_TIMEOUT, Array, agree, as_f64, check_headers, expect_output, is_int, kind_problems,
                       name_of, raise_if, range_problems, token_range, torch_modules, wait_for_device)
from .exchange import exchange as exchange_summaries

__all__ = ["INPUT_NAMES", "ScanOptions", "Part", "shard", "reference_summary", "reference_scan", "kernel_summary",
           "kernel_scan", "header", "cp_dstate_scan", "cp_dstate_scan_serial"]

INPUT_NAMES = ("q", "k", "gc", "beta", "mqk", "inv", "do")   # dstate_scan_reference's order


@dataclasses.dataclass(frozen=True)
class ScanOptions:
    """The scan's knobs, the same on every rank (dstate_scan_reference's keywords)."""
    tile: int = TILE_TOKENS   # tokens a tile: the kernels' 16, or any divisor of 64 for the reference
    snapshot_every: int = 1
    scale: float | None = None
    qk_l2norm: bool = True


@dataclasses.dataclass(frozen=True)
class Part:
    """Tokens [start, stop) of a sequence of ``length`` tokens, as one rank holds them.

    ``inputs``: q, k, gc, beta, mqk, inv, do (:data:`INPUT_NAMES`), each the part's
    slice [1, stop - start, H, ...] of dstate_scan_reference's inputs for the
    sequence. ``dht`` [H, K, V] (or None: zeros) is read only by the part holding
    the sequence's end.
    """
    inputs: Mapping[str, Array]
    start: int
    stop: int
    length: int
    dht: Array | None = None

    @property
    def holds_end(self) -> bool:
        return self.stop == self.length

    def args(self) -> tuple:
        """The inputs in dstate_scan_reference's positional order."""
        return tuple(self.inputs[name] for name in INPUT_NAMES)


SummaryFn = Callable[[Part, ScanOptions], tuple[Array, Array]]
ScanFn = Callable[[Part, Array | None, ScanOptions], tuple[Array, Array]]


# ----------------------------------------------------------------------------
# sharding
# ----------------------------------------------------------------------------

def shard(inputs: Mapping[str, Array], rank: int, world_size: int, *, tile: int = TILE_TOKENS,
          tokens: tuple[int, int] | None = None) -> Part:
    """Rank ``rank``'s part of one sequence.

    ``inputs``: q, k, gc, beta, mqk, inv, do of one sequence, [1, T, H, ...]
    (dstate_scan_reference's layout, B = 1), and optionally ``dht`` [1, H, K, V]
    or [H, K, V]. ``tokens`` None: the sequence's tiles split evenly
    (:func:`kernel.reference.segment_bounds`; every rank needs at least one
    tile); else this rank's (start, stop). Whether the ranks' parts fit
    together is checked by :func:`cp_dstate_scan`, on every rank at once.
    """
    T, start, stop = token_range(inputs, INPUT_NAMES, "dht", rank, world_size, tile, tokens)
    dht = inputs.get("dht")
    if dht is not None and len(dht.shape) == 4:
        if dht.shape[0] != 1:
            raise ValueError(f"inputs['dht'] must be [1, H, K, V] or [H, K, V] (one sequence), "
                             f"got shape {tuple(dht.shape)}")
        dht = dht[0]
    sliced = {name: inputs[name][:, int(start):int(stop)] for name in INPUT_NAMES}
    return Part(inputs=sliced, start=int(start), stop=int(stop), length=int(T),
                dht=dht if stop == T else None)


# ----------------------------------------------------------------------------
# the float64 reference pair
# ----------------------------------------------------------------------------

def reference_summary(part: Part, options: ScanOptions) -> tuple[Array, Array]:
    """The part's (M, d) in float64 (:func:`kernel.reference.segment_summary`)."""
    return segment_summary(*part.args(), tile=options.tile, scale=options.scale,
                           qk_l2norm=options.qk_l2norm)


def reference_scan(part: Part, dS_in: Array | None, options: ScanOptions) -> tuple[Array, Array]:
    """The part's scan from ``dS_in`` in float64: its snapshots on the sequence's grid and dS_out."""
    snaps, out = dstate_scan_reference(*part.args(), dht=None if dS_in is None else dS_in[None],
                                       tile=options.tile, scale=options.scale,
                                       qk_l2norm=options.qk_l2norm, snapshot_every=1)
    tiles, _ = segment_snapshots(part.start, part.stop, part.length, options.tile,
                                 options.snapshot_every)
    xp = array_module(snaps)
    return snaps[:, xp.asarray(tiles)], out[0]


# ----------------------------------------------------------------------------
# the GPU pair: Kernel A (kernel.ds_scan.dstate_scan) on the part's device arrays
# ----------------------------------------------------------------------------

def _kernel_part_checks(part: Part, options: ScanOptions) -> None:
    if options.tile != TILE_TOKENS:
        raise ValueError(f"options.tile must be {TILE_TOKENS} (Kernel A's tile) for the GPU pair, "
                         f"got {options.tile}")
    _, K, V = _hkv(part)
    if (K, V) != (HEAD_DIM, HEAD_DIM):
        raise ValueError(f"the GPU pair needs K = V = {HEAD_DIM} (Kernel A's head dimension), got K = {K}, V = {V}")


def _kernel_a():
    """CuPy and Kernel A's entry point, or the error that names what is missing (CuPy, a GPU)."""
    from ..ds_scan import launch
    from ..runtime.arrays import require_cupy, require_gpu

    cupy = require_cupy("kernel.cp's GPU pair")
    require_gpu("kernel.cp's GPU pair")
    return cupy, launch.dstate_scan


def kernel_summary(part: Part, options: ScanOptions) -> tuple[Array, Array]:
    """The part's (M, d) by Kernel A's summary build (:func:`kernel.ds_scan.summaries`: one launch,
    a CTA pair per head and v part, d from dS = 0 and M from the identity with do = 0, no
    snapshots), fp32 [H, K, K] and [H, K, V], with Kernel A's own rounding (dS a bf16 operand
    at every tile), as its scan has."""
    _kernel_part_checks(part, options)
    from ..ds_scan import launch

    _kernel_a()
    M, d = launch.summaries(*part.args(), scale=options.scale, qk_l2norm=options.qk_l2norm)
    return M[0], d[0]


def kernel_scan(part: Part, dS_in: Array | None, options: ScanOptions) -> tuple[Array, Array]:
    """Kernel A on the part from ``dS_in`` ([H, K, V], None: zeros): fp32 snapshots on the sequence's
    grid, and dS_out. Where the part's own every-``snapshot_every`` grid is not the sequence's (the
    part starts or stops inside a snapshot group), it stores every tile and keeps the sequence's."""
    _kernel_part_checks(part, options)
    cupy, dstate_scan = _kernel_a()
    tile, e = options.tile, options.snapshot_every
    tiles, _ = segment_snapshots(part.start, part.stop, part.length, tile, e)
    n_t = -(-(part.stop - part.start) // tile)
    own = np.minimum(np.arange(e - 1, e * -(-n_t // e), e), n_t - 1)   # the part's tiles at every e
    on_grid = np.array_equal(np.asarray(tiles), own)
    dht = None if dS_in is None else cupy.asarray(dS_in, dtype=np.float32)[None]
    snaps, dh0 = dstate_scan(*part.args(), dht=dht, scale=options.scale, qk_l2norm=options.qk_l2norm,
                             snapshot_dtype="float32", snapshot_every=e if on_grid else 1)
    if not on_grid:
        snaps = snaps[:, cupy.asarray(tiles)]
    return snaps, dh0[0]


# ----------------------------------------------------------------------------
# headers: what every rank checks about every rank
# ----------------------------------------------------------------------------

def _local_problems(part: Part, options: ScanOptions) -> list[str]:
    """What is wrong with one part on its own (empty: nothing)."""
    problems = kind_problems(part, options, Part, ScanOptions, INPUT_NAMES)
    if problems:
        return problems
    try:
        B, T, H, K, V, _ = check_scan_inputs(*part.args(), options.tile, options.snapshot_every, None)
    except ValueError as exc:
        return [str(exc)]
    problems = range_problems(part, B, T, options.tile)
    if problems and not all(is_int(x) for x in (part.start, part.stop, part.length)):
        return problems
    if part.holds_end and part.dht is not None and tuple(part.dht.shape) != (H, K, V):
        problems.append(f"dht must have shape {(H, K, V)} ([H, K, V]), got {tuple(part.dht.shape)}")
    return problems


def header(part: Part, options: ScanOptions, rank: int, summary_fn, scan_fn) -> dict:
    problems = _local_problems(part, options)
    header = dict(rank=rank, problems=problems, options=dataclasses.astuple(options)
                  if isinstance(options, ScanOptions) else None,
                  functions=(name_of(summary_fn), name_of(scan_fn)))
    if not problems:
        q, do = part.inputs["q"], part.inputs["do"]
        header.update(start=part.start, stop=part.stop, length=part.length,
                      hkv=(q.shape[2], q.shape[3], do.shape[3]),
                      dtypes={name: str(part.inputs[name].dtype) for name in INPUT_NAMES})
    return header


# ----------------------------------------------------------------------------
# the passes every rank runs (the exchange between them differs)
# ----------------------------------------------------------------------------

def _hkv(part: Part) -> tuple[int, int, int]:
    return part.inputs["q"].shape[2], part.inputs["q"].shape[3], part.inputs["do"].shape[3]


def _run_scan(part: Part, dS_in, options: ScanOptions, scan_fn):
    """scan_fn's (snapshots, dS_out), their shapes checked: a plugged-in scan must keep the layout."""
    snaps, out = scan_fn(part, dS_in, options)
    H, K, V = _hkv(part)
    tiles, _ = segment_snapshots(part.start, part.stop, part.length, options.tile, options.snapshot_every)
    expect_output(scan_fn, "snapshots", snaps, (1, tiles.size, H, K, V))
    expect_output(scan_fn, "dS_out", out, (H, K, V))
    return snaps, out


def _first_pass(part: Part, options: ScanOptions, summary_fn, scan_fn):
    """(summary or None, result or None): the end part scans, the first part idles, others summarise."""
    if part.holds_end:
        result = _run_scan(part, as_f64(part.dht, part), options, scan_fn)
        return (None, result[1]), result
    if part.start == 0:
        return None, None                    # what leaves the first part is dh0: nobody folds it
    M, d = summary_fn(part, options)
    H, K, V = _hkv(part)
    expect_output(summary_fn, "M", M, (H, K, K))
    expect_output(summary_fn, "d", d, (H, K, V))
    return (M, d), None


def cp_dstate_scan_serial(parts: Sequence[Part], options: ScanOptions = ScanOptions(), *,
                          summary_fn: SummaryFn = reference_summary,
                          scan_fn: ScanFn = reference_scan) -> list[tuple[Array, Array]]:
    """Every rank's part in turn, in this process: what :func:`cp_dstate_scan` returns on each rank.

    ``parts`` in rank order; the same checks (raising :class:`CPInputError`), the
    same passes, the summaries folded in float64 in the parts' array module.
    Returns [(snapshots, dS_out)] per part; part 0's dS_out is dh0.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one Part, got none")
    raise_if(check_headers([header(p, options, r, summary_fn, scan_fn)
                              for r, p in enumerate(parts)]), len(parts))
    first = [_first_pass(p, options, summary_fn, scan_fn) for p in parts]
    summaries = [None if s is None else (as_f64(s[0], p), as_f64(s[1], p)) for (s, _), p in zip(first, parts)]
    incoming = fold_summaries(summaries, None)     # the end part's entry is a constant: dht is in it
    return [result if result is not None else _run_scan(p, incoming[r], options, scan_fn)
            for r, (p, (_, result)) in enumerate(zip(parts, first))]


# ----------------------------------------------------------------------------
# torch.distributed
# ----------------------------------------------------------------------------

def cp_dstate_scan(part: Part, options: ScanOptions = ScanOptions(), *, group=None,
                   timeout: datetime.timedelta = DEFAULT_TIMEOUT,
                   summary_fn: SummaryFn = reference_summary,
                   scan_fn: ScanFn = reference_scan, timing: dict | None = None) -> tuple[Array, Array]:
    """This rank's share of the sequence's scan: (snapshots [1, n, H, K, V], dS_out [H, K, V]).

    Call on every rank of ``group`` (default: the world), rank r with the r-th
    part in token order. Rank 0's dS_out is dh0. Raises :class:`CPInputError` on
    every rank when the parts do not fit together. ``timing``, a dict, gets this
    rank's seconds in each pass ("first_pass_s": its summary or, on the last rank,
    its scan; "exchange_s"; "scan_s") and "exchange_bytes" (what the all_gather
    leaves on each rank), with the GPU's work waited for at each reading.
    """
    _, dist = torch_modules()
    if not dist.is_initialized():
        raise RuntimeError("cp_dstate_scan needs torch.distributed initialised (kernel.cp.init_group)")
    if not isinstance(timeout, datetime.timedelta):
        raise ValueError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    headers = agree(header(part, options, rank, summary_fn, scan_fn), group, timeout,
                     "context-parallel dstate scan")

    t0 = time.perf_counter()
    summary, result = _first_pass(part, options, summary_fn, scan_fn)
    if timing is not None:
        wait_for_device(part)
        t1 = time.perf_counter()
        timing["first_pass_s"] = t1 - t0
    gathered = exchange_summaries([summary], headers[0]["hkv"], group, timing)
    if timing is not None:
        t2 = time.perf_counter()
        timing.update(exchange_s=t2 - t1, scan_s=0.0)
    if result is not None:
        return result
    # the ranks after this one; the last one's entry is the constant dS leaving it
    after = [(None if r == world - 1 else g[0][0], g[0][1]) for r, g in enumerate(gathered) if r > rank]
    incoming = fold_summaries([None] + after, None)[0]
    out = _run_scan(part, as_f64(incoming, part), options, scan_fn)
    if timing is not None:
        wait_for_device(part)
        timing["scan_s"] = time.perf_counter() - t2
    return out
