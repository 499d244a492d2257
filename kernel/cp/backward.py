"""Context parallelism for the whole KDA backward: one sequence's gradients from the ranks that hold its parts.

What and why
------------
:mod:`kernel.cp` splits Kernel A's dS scan over ranks. The whole backward has a second
chain that crosses the ranks' boundaries: the forward state S, which runs left to right
and which every part needs to recompute its own states. Both chains are affine in their
state (the loss is linear in o and in the final state, and each step is linear in S), so a
part of the sequence is summarised in each direction by one matrix and one offset:

  forward   S leaving the part  = P @ S entering it + Q     P [H, K, K], Q [H, K, V]
  backward  dS leaving the part = M @ dS entering it + d    M [H, K, K], d [H, K, V]
            (dS enters from the right, at the part's end, and leaves at its start)

Rank r holds the contiguous tokens [start_r, stop_r) of one sequence (rank order = token
order, every boundary a tile edge) and:

1. computes its summaries: forward (P, Q) unless it holds the sequence's end, backward
   (M, d) unless it holds its start. Rank 0 knows the state entering it (the initial
   state), so its forward "summary" is the state leaving it; the last rank knows dht, so
   its backward one is the dS leaving it;
2. all-gathers them (float64 [H, K, 2K + 2V] a rank: P, Q, M, d side by side);
3. folds the forward summaries of the ranks before it into the state entering its part,
   and the backward summaries of the ranks after it into the dS entering its part from
   the right (:func:`kernel.reference.fold_forward_summaries` and
   :func:`kernel.reference.fold_summaries`);
4. runs the backward of its own part with those two boundary states.

Step 4's gradients are exact: given the state entering the part and dL/dS at its end, a
part's backward needs nothing else from outside it. Rank r returns dq, dk, dv, dg, dbeta
of its tokens and dS_out, dL/dS at its start; rank 0's dS_out is dh0.

Before the summaries, the ranks exchange a header (token range, shapes, dtypes, options,
the functions used) and every rank checks all of them the same way
(:func:`kernel.cp.exchange.agree`): parts that do not fit make every rank raise
:class:`kernel.cp.exchange.CPInputError` naming the rank at fault; on gloo a rank that never
arrives is named after ``timeout``, and every later collective is bounded by the group's
timeout (:func:`kernel.cp.exchange.init_group`).

Plugging in the work
--------------------
    summaries_fn(part, options) -> {"forward": (P or None, Q) or None,
                                    "backward": (M or None, d) or None}
    backward_fn(part, state_in, dS_in, options) -> {"dq", "dk", "dv", "dg", "dbeta", "dh0"}

``forward`` is None for the last rank (nobody folds it) and (None, S leaving the part) for
rank 0; ``backward`` is None for rank 0 and (None, dS leaving the part) for the last rank.
``state_in`` and ``dS_in`` are float64 [H, K, V] in the part's array module, or None for
zeros. :func:`reference_summaries` and :func:`reference_backward` are the float64 pair
(:func:`kernel.reference.kda_forward_reference` and :func:`kda_backward_reference` on the
part's tokens). A GPU pair is not built yet: its summaries would be Kernel A's summary
build on FLA's forward tensors (:func:`kernel.ds_scan.summaries` with ``fla_inputs``) for the
backward chain and FLA's own forward context parallelism for the forward one, and its
backward :func:`kernel.kda_backward.kda_backward` with ``initial_state`` and ``dht``.
"""
from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..reference import (array_module, fold_forward_summaries, fold_summaries, forward_segment_summary,
                         kda_backward_reference, kda_forward_reference)
from ..shapes import TILE_TOKENS
from . import exchange

__all__ = ["INPUT_NAMES", "GRADIENTS", "BackwardOptions", "BackwardPart", "shard", "reference_summaries",
           "reference_backward", "cp_kda_backward", "cp_kda_backward_serial"]

INPUT_NAMES = ("q", "k", "v", "g", "beta", "do")   # kda_backward_reference's order
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta")      # per token; dh0 is returned as dS_out
WHAT = "context-parallel KDA backward"

Array = Any


@dataclasses.dataclass(frozen=True)
class BackwardOptions:
    """The backward's knobs, the same on every rank (kda_backward_reference's keywords)."""
    tile: int = TILE_TOKENS   # tokens a tile: the kernels' 16, or any divisor of 64 for the reference
    scale: float | None = None
    qk_l2norm: bool = True


@dataclasses.dataclass(frozen=True)
class BackwardPart:
    """Tokens [start, stop) of a sequence of ``length`` tokens, as one rank holds them.

    ``inputs``: q, k, v, g, beta, do (:data:`INPUT_NAMES`), each the part's slice
    [1, stop - start, H, ...] of the sequence's raw inputs (g the natural-log gate, beta
    after its sigmoid). ``initial_state`` [H, K, V] (None: zeros) is read only by the part
    holding the sequence's start, ``dht`` [H, K, V] (None: zeros) only by the one holding
    its end.
    """
    inputs: Mapping[str, Array]
    start: int
    stop: int
    length: int
    initial_state: Array | None = None
    dht: Array | None = None

    @property
    def holds_start(self) -> bool:
        return self.start == 0

    @property
    def holds_end(self) -> bool:
        return self.stop == self.length

    @property
    def sends_forward(self) -> bool:
        """Whether a later rank folds this part's forward summary (all but the end's holder)."""
        return not self.holds_end or self.holds_start

    @property
    def sends_backward(self) -> bool:
        """Whether an earlier rank folds this part's backward summary (all but the start's holder)."""
        return not self.holds_start or self.holds_end

    def args(self) -> tuple:
        return tuple(self.inputs[name] for name in INPUT_NAMES)


SummariesFn = Callable[[BackwardPart, BackwardOptions], dict]
BackwardFn = Callable[[BackwardPart, Array | None, Array | None, BackwardOptions], dict]


def _one_sequence_state(name: str, x):
    """[H, K, V] from [1, H, K, V] or [H, K, V]; None stays None."""
    if x is None or len(x.shape) == 3:
        return x
    if len(x.shape) == 4 and x.shape[0] == 1:
        return x[0]
    raise ValueError(f"inputs['{name}'] must be [1, H, K, V] or [H, K, V] (one sequence), "
                     f"got shape {tuple(x.shape)}")


def shard(inputs: Mapping[str, Array], rank: int, world_size: int, *, tile: int = TILE_TOKENS,
          tokens: tuple[int, int] | None = None) -> BackwardPart:
    """Rank ``rank``'s part of one sequence.

    ``inputs``: q, k, v, g, beta, do of one sequence, [1, T, H, ...], and optionally
    ``initial_state`` and ``dht`` ([1, H, K, V] or [H, K, V]). ``tokens`` None: the
    sequence's tiles split evenly (every rank needs at least one tile); else this rank's
    (start, stop). Whether the ranks' parts fit together is checked on every rank at once
    by :func:`cp_kda_backward`.
    """
    T, start, stop = exchange.token_range(inputs, INPUT_NAMES, "initial_state, dht", rank, world_size, tile, tokens)
    h0 = _one_sequence_state("initial_state", inputs.get("initial_state"))
    dht = _one_sequence_state("dht", inputs.get("dht"))
    sliced = {name: inputs[name][:, int(start):int(stop)] for name in INPUT_NAMES}
    return BackwardPart(inputs=sliced, start=int(start), stop=int(stop), length=int(T),
                        initial_state=h0 if start == 0 else None, dht=dht if stop == T else None)


# ----------------------------------------------------------------------------
# the float64 reference pair
# ----------------------------------------------------------------------------

def _identity_inputs(part: BackwardPart):
    """The part's q, k, g, beta with v and do zero and K columns wide, and the identity
    [1, H, K, K]: run through the backward as its dht, the identity comes out as M."""
    q, k, _, g, beta, _ = part.args()
    xp = array_module(q)
    _, n, H, K = q.shape
    zeros = xp.zeros((1, n, H, K), dtype=np.float64)
    eye = xp.broadcast_to(xp.eye(K, dtype=np.float64), (1, H, K, K))
    return q, k, g, beta, zeros, xp.ascontiguousarray(eye)


def reference_summaries(part: BackwardPart, options: BackwardOptions) -> dict:
    """The part's summaries in float64 on its tokens: (P, Q) by forward_segment_summary (the part as
    one segment: P from the identity with v = 0, Q from a zero state); by kda_backward_reference M from dht = the
    identity with v = do = 0, d from dht = 0. Rank 0's forward entry is the state leaving
    it, the last rank's backward entry the dS leaving it (the module's docstring)."""
    q, k, v, g, beta, do = part.args()
    kw = dict(scale=options.scale, qk_l2norm=options.qk_l2norm, tile=options.tile)
    forward = backward = None
    if part.sends_forward:
        if part.holds_start:
            h0 = None if part.initial_state is None else part.initial_state[None]
            forward = (None, kda_forward_reference(q, k, v, g, beta, initial_state=h0, **kw)[1][0])
        else:
            forward = forward_segment_summary(q, k, v, g, beta, **kw)   # (P, Q): the part is one segment
    if part.sends_backward:
        if part.holds_end:
            dht = None if part.dht is None else part.dht[None]
            backward = (None, kda_backward_reference(q, k, v, g, beta, do, dht=dht, **kw)["dh0"][0])
        else:
            qi, ki, gi, bi, zeros, eye = _identity_inputs(part)
            M = kda_backward_reference(qi, ki, zeros, gi, bi, zeros, dht=eye, **kw)["dh0"][0]
            d = kda_backward_reference(q, k, v, g, beta, do, **kw)["dh0"][0]
            backward = (M, d)
    return {"forward": forward, "backward": backward}


def reference_backward(part: BackwardPart, state_in, dS_in, options: BackwardOptions) -> dict:
    """kda_backward_reference on the part's tokens, from ``state_in`` entering it and ``dS_in``
    at its end ([H, K, V] or None: zeros)."""
    return kda_backward_reference(*part.args(), initial_state=None if state_in is None else state_in[None],
                                  dht=None if dS_in is None else dS_in[None], scale=options.scale,
                                  qk_l2norm=options.qk_l2norm, tile=options.tile)


# ----------------------------------------------------------------------------
# headers: kernel.cp's checks, on this module's inputs
# ----------------------------------------------------------------------------

def _hkv(part: BackwardPart) -> tuple[int, int, int]:
    return part.inputs["q"].shape[2], part.inputs["q"].shape[3], part.inputs["v"].shape[3]


def _local_problems(part: BackwardPart, options: BackwardOptions) -> list[str]:
    """What is wrong with one part on its own (empty: nothing)."""
    problems = exchange.kind_problems(part, options, BackwardPart, BackwardOptions, INPUT_NAMES)
    if problems:
        return problems
    shapes = {name: tuple(getattr(part.inputs[name], "shape", ())) for name in INPUT_NAMES}
    if len(shapes["q"]) != 4 or len(shapes["v"]) != 4:
        return [f"q and v must be [1, n, H, K] and [1, n, H, V], got {shapes['q']} and {shapes['v']}"]
    B, n, H, K = shapes["q"]
    V = shapes["v"][3]
    want = {"q": (B, n, H, K), "k": (B, n, H, K), "v": (B, n, H, V), "g": (B, n, H, K),
            "beta": (B, n, H), "do": (B, n, H, V)}
    problems = [f"{name} has shape {shapes[name]}, expected {want[name]} (from q and v)"
                for name in INPUT_NAMES if shapes[name] != want[name]]
    problems += exchange.range_problems(part, B, n, options.tile)
    if problems:
        return problems
    for name, x, read in (("initial_state", part.initial_state, part.holds_start),
                          ("dht", part.dht, part.holds_end)):
        if read and x is not None and tuple(x.shape) != (H, K, V):
            problems.append(f"{name} must have shape {(H, K, V)} ([H, K, V]), got {tuple(x.shape)}")
    return problems


def _header(part: BackwardPart, options: BackwardOptions, rank: int, summaries_fn, backward_fn) -> dict:
    problems = _local_problems(part, options)
    header = dict(rank=rank, problems=problems,
                  options=dataclasses.astuple(options) if isinstance(options, BackwardOptions) else None,
                  functions=(exchange.name_of(summaries_fn), exchange.name_of(backward_fn)))
    if not problems:
        header.update(start=part.start, stop=part.stop, length=part.length, hkv=_hkv(part),
                      dtypes={name: str(part.inputs[name].dtype) for name in INPUT_NAMES})
    return header


# ----------------------------------------------------------------------------
# the passes
# ----------------------------------------------------------------------------

def _checked_summaries(part: BackwardPart, options: BackwardOptions, summaries_fn) -> dict:
    """summaries_fn's entries with their shapes checked, as float64 in the part's array module."""
    out = summaries_fn(part, options)
    H, K, V = _hkv(part)
    checked = {}
    for chain, needed in (("forward", part.sends_forward), ("backward", part.sends_backward)):
        entry = out.get(chain) if isinstance(out, dict) else None
        if not needed:
            checked[chain] = None
            continue
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"{exchange.name_of(summaries_fn)} returned {chain} = {entry!r:.80}; expected a "
                             f"(matrix or None, offset) pair for tokens {part.start} .. {part.stop - 1}")
        A, b = entry
        known = part.holds_start if chain == "forward" else part.holds_end
        if (A is None) != known:
            raise ValueError(f"{exchange.name_of(summaries_fn)}: the {chain} matrix must be None exactly where the "
                             f"{'initial state' if chain == 'forward' else 'dht'} is known")
        if A is not None:
            exchange.expect_output(summaries_fn, f"the {chain} matrix", A, (H, K, K))
        exchange.expect_output(summaries_fn, f"the {chain} offset", b, (H, K, V))
        checked[chain] = (None if A is None else exchange.as_f64(A, part), exchange.as_f64(b, part))
    return checked


def _run_backward(part: BackwardPart, state_in, dS_in, options: BackwardOptions, backward_fn) -> dict:
    out = backward_fn(part, state_in, dS_in, options)
    H, K, V = _hkv(part)
    n = part.stop - part.start
    shapes = {"dq": (1, n, H, K), "dk": (1, n, H, K), "dv": (1, n, H, V), "dg": (1, n, H, K),
              "dbeta": (1, n, H), "dh0": (1, H, K, V)}
    for name, shape in shapes.items():
        exchange.expect_output(backward_fn, name, out.get(name) if isinstance(out, dict) else None, shape)
    result = {name: out[name] for name in GRADIENTS}
    result["dS_out"] = out["dh0"][0]
    return result


def _folds(forward: Sequence, backward: Sequence) -> tuple[list, list]:
    """(the state entering each part, the dS entering each from the right) from every part's
    summaries, None standing for what the part holds itself (rank 0's state, the last's dS).

    The forward chain folds from the left (kernel.reference.fold_forward_summaries), rank 0's entry
    (None, S leaving it) the known start; the backward chain from the right (fold_summaries)."""
    return fold_forward_summaries(list(forward), None), fold_summaries(list(backward), None)


def _boundaries(part: BackwardPart, rank: int, states: Sequence, dS: Sequence) -> tuple:
    """The part's (state_in, dS_in), float64 in its array module (None: zeros): its own initial
    state or dht where it holds the sequence's start or end, else what the folds gave."""
    state_in = part.initial_state if part.holds_start else states[rank]
    dS_in = part.dht if part.holds_end else dS[rank]
    return exchange.as_f64(state_in, part), exchange.as_f64(dS_in, part)


def cp_kda_backward_serial(parts: Sequence[BackwardPart], options: BackwardOptions = BackwardOptions(), *,
                           summaries_fn: SummariesFn = reference_summaries,
                           backward_fn: BackwardFn = reference_backward) -> list[dict]:
    """Every rank's part in turn, in this process: what :func:`cp_kda_backward` returns on each
    rank. ``parts`` in rank order; the same checks (raising :class:`kernel.cp.exchange.CPInputError`) and
    passes. Returns per part {"dq", "dk", "dv", "dg", "dbeta": its tokens' gradients, "dS_out":
    dL/dS at its start}; part 0's dS_out is dh0."""
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one BackwardPart, got none")
    headers = [_header(p, options, r, summaries_fn, backward_fn) for r, p in enumerate(parts)]
    exchange.raise_if(exchange.check_headers(headers), len(parts), WHAT)
    if len(parts) == 1:
        return [_run_backward(parts[0], *_boundaries(parts[0], 0, [None], [None]), options, backward_fn)]
    summaries = [_checked_summaries(p, options, summaries_fn) for p in parts]
    states, dS = _folds([s["forward"] for s in summaries], [s["backward"] for s in summaries])
    return [_run_backward(p, *_boundaries(p, r, states, dS), options, backward_fn) for r, p in enumerate(parts)]


def cp_kda_backward(part: BackwardPart, options: BackwardOptions = BackwardOptions(), *, group=None,
                    timeout: datetime.timedelta = exchange.DEFAULT_TIMEOUT,
                    summaries_fn: SummariesFn = reference_summaries,
                    backward_fn: BackwardFn = reference_backward, timing: dict | None = None) -> dict:
    """This rank's share of the sequence's backward: {"dq", "dk", "dv", "dg", "dbeta" of its
    tokens, "dS_out": dL/dS at its start (rank 0: dh0)}.

    Call on every rank of ``group`` (default: the world), rank r with the r-th part in token
    order. Raises :class:`kernel.cp.exchange.CPInputError` on every rank when the parts do not fit
    together. ``timing``, a dict, gets this rank's seconds in "summaries_s", "exchange_s" and
    "backward_s", and "exchange_bytes" (what the all_gather leaves on each rank).
    """
    _, dist = exchange.torch_modules()
    if not dist.is_initialized():
        raise RuntimeError("cp_kda_backward needs torch.distributed initialised (kernel.cp.init_group)")
    if not isinstance(timeout, datetime.timedelta):
        raise ValueError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    headers = exchange.agree(_header(part, options, rank, summaries_fn, backward_fn), group, timeout, WHAT)
    if world == 1:
        return _run_backward(part, *_boundaries(part, 0, [None], [None]), options, backward_fn)

    t0 = time.perf_counter()
    mine_summaries = _checked_summaries(part, options, summaries_fn)
    if timing is not None:
        exchange.wait_for_device(part)
        t1 = time.perf_counter()
        timing["summaries_s"] = t1 - t0
    # [P | Q | M | d] side by side; an entry nobody reads travels as zeros
    gathered = exchange.exchange([mine_summaries["forward"], mine_summaries["backward"]], headers[0]["hkv"], group,
                            timing)
    if timing is not None:
        timing["exchange_s"] = time.perf_counter() - t1
    forward = [(None if r == 0 else g[0][0], g[0][1]) for r, g in enumerate(gathered)]
    backward = [(None if r == world - 1 else g[1][0], g[1][1]) for r, g in enumerate(gathered)]
    states, dS = _folds(forward, backward)
    boundaries = _boundaries(part, rank, states, dS)
    t3 = time.perf_counter()
    out = _run_backward(part, *boundaries, options, backward_fn)
    if timing is not None:
        exchange.wait_for_device(part)
        timing["backward_s"] = time.perf_counter() - t3
    return out
