"""The exchange both context-parallel scans share (kernel.cp.scan: Kernel A's dS scan over ranks;
kernel.cp.backward: the whole backward): the token range of a rank's part, the header checks every
rank runs on every rank's part, the one error every rank raises when the parts do not fit together,
the torch.distributed group, the agreement on the headers and the one all_gather of the summaries.

Functions here take a part as any object with ``inputs`` (a mapping of named arrays) and the token
range ``start``, ``stop``, ``length``: both scans' parts are such objects.
"""
from __future__ import annotations

import datetime
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ..reference import array_module, segment_bounds


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


__all__ = ["DEFAULT_TIMEOUT", "CPInputError", "is_int", "token_range", "kind_problems", "range_problems", "name_of",
           "check_headers", "raise_if", "expect_output", "as_f64", "torch_modules", "init_group", "agree",
           "wait_for_device", "exchange"]

DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)

Array = Any


class CPInputError(ValueError):
    """The ranks' parts do not fit together; every rank of the group raises the same one."""


# ----------------------------------------------------------------------------
# a rank's token range
# ----------------------------------------------------------------------------

def token_range(inputs: Mapping[str, Array], names: Sequence[str], optional: str, rank: int,
                 world_size: int, tile: int, tokens) -> tuple[int, int, int]:
    """(T, start, stop) of rank ``rank``'s part of the one sequence ``inputs`` holds (``names``
    [1, T, ...] each; ``optional`` names what else it may hold, for the error): ``tokens``, or
    the sequence's tiles split evenly when None. Shared by the shards of kernel.cp.scan and
    kernel.cp.backward."""
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0 .. {world_size - 1}, got {rank!r}")
    missing = [name for name in names if name not in inputs]
    if missing:
        raise ValueError(f"inputs must hold {', '.join(names)} (and optionally {optional}); "
                         f"missing {', '.join(missing)}")
    shape = tuple(getattr(inputs["q"], "shape", ()))
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f"inputs['q'] must be one sequence [1, T, H, K], got shape {shape}")
    T = shape[1]
    if tokens is None:
        bounds = segment_bounds(T, tile, world_size)
        if len(bounds) < world_size:
            raise ValueError(f"a sequence of {T} tokens ({-(-T // tile)} tiles of {tile}) cannot "
                             f"give each of {world_size} ranks a tile")
        start, stop = bounds[rank]
    else:
        try:
            start, stop = tokens
        except (TypeError, ValueError):
            raise ValueError(f"tokens must be a (start, stop) pair, got {tokens!r}") from None
        if not (is_int(start) and is_int(stop)) or not 0 <= start < stop <= T:
            raise ValueError(f"tokens must be (start, stop) with 0 <= start < stop <= {T}, got {tokens!r}")
    return T, int(start), int(stop)


# ----------------------------------------------------------------------------
# headers: what every rank checks about every rank
# ----------------------------------------------------------------------------

def kind_problems(part, options, part_type: type, options_type: type, names: Sequence[str]) -> list[str]:
    """The first thing wrong with a part's and its options' kinds, or its inputs' names (empty:
    nothing); the check kernel.cp.scan and kernel.cp.backward start with."""
    for what, x, kind in (("part", part, part_type), ("options", options, options_type)):
        if not isinstance(x, kind):
            return [f"{what} must be a {kind.__module__}.{kind.__name__}, got {type(x).__name__}"]
    missing = [name for name in names if name not in part.inputs]
    return [f"part.inputs lacks {', '.join(missing)}"] if missing else []


def range_problems(part, B: int, n: int, tile: int) -> list[str]:
    """What is wrong with a part's token range [start, stop) of ``length``, given its inputs'
    batch ``B`` and tokens ``n`` (the checks kernel.cp.scan and kernel.cp.backward share)."""
    problems = []
    if B != 1:
        problems.append(f"the part's inputs must be [1, stop - start, ...], got batch {B}")
    if not all(is_int(x) for x in (part.start, part.stop, part.length)) \
            or not 0 <= part.start < part.stop <= part.length:
        problems.append(f"start, stop, length must be integers with 0 <= start < stop <= length, "
                        f"got {part.start!r}, {part.stop!r}, {part.length!r}")
        return problems
    if n != part.stop - part.start:
        problems.append(f"holds tokens {part.start} .. {part.stop - 1} ({part.stop - part.start}) "
                        f"but its inputs have {n}")
    if part.start % tile:
        problems.append(f"starts at token {part.start}, not a tile edge (a multiple of tile = {tile})")
    if part.stop != part.length and part.stop % tile:
        problems.append(f"stops at token {part.stop}, neither a tile edge (a multiple of tile = {tile}) "
                        f"nor the sequence's end ({part.length})")
    return problems


def name_of(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def check_headers(headers: Sequence[dict]) -> list[str]:
    """Every problem with the parts together, each naming its rank; the same on every rank."""
    problems = [f"rank {h['rank']}: {p}" for h in headers for p in h["problems"]]
    if problems:
        return problems
    first = headers[0]
    for h in headers[1:]:
        for key, what in (("length", "sequence length"), ("hkv", "H, K, V"), ("dtypes", "dtypes"),
                          ("options", "options (tile, snapshot_every, scale, qk_l2norm)"),
                          ("functions", "summary_fn, scan_fn")):
            if h[key] != first[key]:
                problems.append(f"rank {h['rank']}: {what} {h[key]}, but rank 0 has {first[key]}")
    if first["start"] != 0:
        problems.append(f"rank 0: starts at token {first['start']}, but the first part must start at 0")
    for prev, h in zip(headers, headers[1:]):
        if h["start"] != prev["stop"]:
            problems.append(f"rank {h['rank']}: starts at token {h['start']}, but rank {prev['rank']} "
                            f"stops at {prev['stop']} (parts must be contiguous, in rank order)")
    last = headers[-1]
    if last["stop"] != last["length"]:
        problems.append(f"rank {last['rank']}: stops at token {last['stop']}, but the last rank must "
                        f"hold the sequence's end ({last['length']})")
    return problems


def raise_if(problems: list[str], world: int, what: str = "context-parallel dstate scan") -> None:
    if problems:
        raise CPInputError(f"{what} over {world} ranks: the parts do not fit "
                           f"together (every rank raises this):\n  " + "\n  ".join(problems))

# ----------------------------------------------------------------------------
# what both scans' passes share
# ----------------------------------------------------------------------------

def expect_output(fn, what: str, x, shape: tuple) -> None:
    got = tuple(getattr(x, "shape", ()))
    if got != shape:
        raise ValueError(f"{name_of(fn)} returned {what} of shape {got}, expected {shape}")


def as_f64(x, part):
    """x as a float64 array of the part's array module (numpy or CuPy), None stays None."""
    if x is None:
        return None
    xp = array_module(part.inputs["q"])
    if not isinstance(x, xp.ndarray) and hasattr(x, "__dlpack__"):     # a torch tensor
        on_host = getattr(getattr(x, "device", None), "type", "cpu") == "cpu"
        # a host tensor (gloo's exchange) reaches CuPy through numpy: CuPy's from_dlpack takes device memory
        x = np.from_dlpack(x.cpu()) if xp is np or on_host else xp.from_dlpack(x)
    return xp.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------
# torch.distributed
# ----------------------------------------------------------------------------

def torch_modules():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise ImportError("kernel.cp's distributed path needs torch: pip install 'ptx-lab[torch]' "
                          "(a CPU build is enough for gloo)") from exc
    return torch, dist


def init_group(backend: str | None = None, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT,
               init_method: str = "env://", rank: int | None = None,
               world_size: int | None = None) -> None:
    """``torch.distributed.init_process_group`` with a bounded ``timeout`` for every collective.

    backend None: "nccl" where CUDA is available (each rank then uses GPU
    LOCAL_RANK, as torchrun sets it), else "gloo". env:// reads MASTER_ADDR,
    MASTER_PORT, RANK and WORLD_SIZE unless ``rank`` / ``world_size`` are given.
    """
    torch, dist = torch_modules()
    if not isinstance(timeout, datetime.timedelta):
        raise ValueError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    kwargs = {} if rank is None else dict(rank=rank)
    if world_size is not None:
        kwargs["world_size"] = world_size
    dist.init_process_group(backend, init_method=init_method, timeout=timeout, **kwargs)


def agree(header: dict, group, timeout: datetime.timedelta, what: str) -> list[dict]:
    """Every rank's header, once every rank has checked them all the same way (raising
    CPInputError on every rank where the parts do not fit together). On gloo a monitored
    barrier first names a rank that never arrives within ``timeout``."""
    _, dist = torch_modules()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if dist.get_backend(group) == "gloo":
        try:
            dist.monitored_barrier(group, timeout=timeout, wait_all_ranks=True)
        except RuntimeError as exc:
            raise RuntimeError(f"{what}, rank {rank} of {world}: not every rank reached it within "
                               f"{timeout}; torch.distributed says: {exc}") from exc
    headers: list = [None] * world
    dist.all_gather_object(headers, header, group=group)
    raise_if(check_headers(headers), world, what)
    return headers


def wait_for_device(part) -> None:
    """Return when the part's GPU work is done (CuPy arrays); numpy has none."""
    xp = array_module(part.inputs["q"])
    if xp is not np:
        xp.cuda.Device().synchronize()


def exchange(summaries: Sequence, hkv: tuple[int, int, int], group, timing: dict | None) -> list[list[tuple]]:
    """One all_gather of this rank's ``summaries``: each an (A [H, K, K] or None, b [H, K, V]) pair,
    or None where the rank has nothing to send (zeros travel), side by side as float64
    [H, K, n (K + V)] on the group's device (NCCL: this rank's GPU; gloo: the host). Returns
    every rank's pairs as views of what arrived, the matrices always present (zeros where sent as
    None). ``timing`` gets "exchange_bytes", what the all_gather leaves on each rank; the GPU's
    copies are waited for before this returns, so a clock read after it includes them."""
    torch, dist = torch_modules()
    H, K, V = hkv
    world = dist.get_world_size(group)
    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
              else torch.device("cpu"))
    mine = torch.zeros((H, K, len(summaries) * (K + V)), dtype=torch.float64, device=device)
    for i, pair in enumerate(summaries):
        if pair is not None:
            a = i * (K + V)
            if pair[0] is not None:
                mine[..., a:a + K] = _as_torch(torch, pair[0], device)
            mine[..., a + K:a + K + V] = _as_torch(torch, pair[1], device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    if timing is not None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timing["exchange_bytes"] = world * mine.numel() * mine.element_size()
    return [[(g[..., i * (K + V):i * (K + V) + K], g[..., i * (K + V) + K:(i + 1) * (K + V)])
             for i in range(len(summaries))] for g in gathered]


def _as_torch(torch, x, device):
    """A numpy / CuPy / torch array as a float64 torch tensor on ``device``."""
    if not isinstance(x, torch.Tensor):
        x = torch.from_dlpack(x) if hasattr(x, "__cuda_array_interface__") else torch.tensor(np.asarray(x))
    return x.to(device=device, dtype=torch.float64)
