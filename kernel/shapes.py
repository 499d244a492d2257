"""The shapes every kernel, launcher and reference shares: each named once, here.

Two token units run through the whole backward, and they have one name each:

* a **tile** is ``TILE_TOKENS`` = 16 tokens: the step of every serial scan (one MMA's m) and the
  unit of Kernel A's dS snapshots;
* a **chunk** is ``CHUNK_TOKENS`` = 64 tokens: FLA's ``chunk_size``, the unit of its forward
  tensors (the 64-wide Aqk / Akk rows, the state h entering every chunk) and the tokens of one
  Kernel B CTA.

The device sources take the same constants, under the same names, from ``kernel/shapes.cuh``
(tests/kernel/test_shapes.py holds the two files equal), and the one head mapping, :func:`qk_head`:
FLA's grouped value heads give q and k H heads and everything else HV = G H, value head hv reading
q and k at hv // G. The float64 references take any tile that
divides the chunk, by their ``tile`` keyword; the kernels are built for ``TILE_TOKENS``. Beside the
shapes, one numeric limit the kernels share: ``SPAN_LIMIT``, the widest gate span of a tile whose
products are factorised rather than formed pairwise; and one rule of arithmetic, :func:`tile_gate_sums`:
how a kernel given each token's own gate forms the tile's cumsum, so that every reader gets its bits.

Every sequence is cut into tiles and chunks from its own start, so a varlen batch (``cu_seqlens``)
packs each sequence's snapshots and states one after the other: :func:`snapshot_offsets`.
:func:`check_cu_seqlens` is the one check of a ``cu_seqlens`` argument, for every entry point
and for the float64 references, which import this module (never the other way round); the host copy
it checks is read from a device tensor once per tensor (:func:`host_offsets`).
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

HEAD_DIM = 128        # K = V: the head size every kernel is built for
TILE_TOKENS = 16      # tokens per tile
CHUNK_TOKENS = 64     # tokens per chunk (FLA's chunk_size)
TILES_PER_CHUNK = CHUNK_TOKENS // TILE_TOKENS
SPAN_LIMIT = 110.0    # the widest gate span (log2) of a tile whose products are factorised (why not 126: shapes.cuh)
RCP_LN2 = 1.4426950408889634   # 1 / ln 2: FLA's scale of the natural-log gate to log2 (fp32 in the kernels)
OFFSETS_KEPT = 8      # how many torch cu_seqlens tensors keep their host copy (host_offsets)

__all__ = ["HEAD_DIM", "TILE_TOKENS", "CHUNK_TOKENS", "TILES_PER_CHUNK", "SPAN_LIMIT", "RCP_LN2", "qk_head",
           "tile_gate_sums",
           "snapshot_offsets", "states_shape", "check_cu_seqlens", "host_offsets", "check_chunk_range", "OFFSETS_KEPT"]


def qk_head(hv: int, HV: int, H: int) -> int:
    """The query / key head that value head ``hv`` reads under FLA's grouped value heads (GVA): q and k
    have ``H`` heads, every other per-head array ``HV`` = G H, and value head hv reads q, k at hv // G
    (kernel/shapes.cuh's qk_head; without GVA, HV = H and every head reads its own)."""
    return hv // (HV // H)


def tile_gate_sums(g: np.ndarray) -> np.ndarray:
    """The tile-local inclusive cumsum in log2 units of natural-log gates ``g`` [rows, ...] (one tile's rows
    first), as every kernel forms it from each token's gate (kernel/shapes.cuh's add_token_gate): in fp32,
    each g / ln 2 rounded before it is added, in row order from the first. Rows past a tile's last token
    hold zeros and leave the sum at its last value. The three passes' products pass sums a 64-token chunk's
    rows by the same rule: ``g`` is then the chunk's rows. The kernels build with -ftz=true, which flushes a
    subnormal gate or term (|g| below 2^-126) to zero where this keeps it: the sums differ there by less than
    2^-126, below the last bit of any sum that is not itself that small."""
    terms = (np.asarray(g, dtype=np.float32) * np.float32(RCP_LN2)).astype(np.float32)
    return np.cumsum(terms, axis=0, dtype=np.float32)


def snapshot_offsets(lengths: np.ndarray, tile: int, snapshot_every: int) -> np.ndarray:
    """Start of each sequence's snapshots in the packed snapshot axis, int64 [N+1].

    A sequence of n tokens has ceil(n / tile) tiles and ceil(tiles / snapshot_every) snapshots:
    with tile 16 and snapshot_every 4 these are FLA's ``chunk_offsets``. ``lengths`` are checked
    already (ints >= 1, or none); :func:`kernel.reference.snapshot_offsets` checks a caller's.
    """
    n = np.asarray(lengths, dtype=np.int64).reshape(-1)
    n_tiles = -(-n // tile)
    n_snap = -(-n_tiles // snapshot_every)
    return np.concatenate([[0], np.cumsum(n_snap)]).astype(np.int64)


def states_shape(total: int, B: int, HV: int, *, varlen: bool) -> tuple[int, ...]:
    """The shape of ``total`` [K, V] states (or snapshots) a value head over B sequences: [B, total / B, HV, K, V]
    for equal lengths, or [1, total, HV, K, V] packed in the sequences' order for a varlen batch."""
    return (1, total, HV, HEAD_DIM, HEAD_DIM) if varlen else (B, total // B, HV, HEAD_DIM, HEAD_DIM)


def check_chunk_range(chunks: Any, total: int) -> tuple[int, int]:
    """(c0, c1) of a launch over chunks c0 .. c1 - 1 of ``total`` (None: all of them), refused unless
    0 <= c0 < c1 <= total."""
    c0, c1 = (0, total) if chunks is None else chunks
    if not 0 <= c0 < c1 <= total:
        raise ValueError(f"chunks must be a range (c0, c1) with 0 <= c0 < c1 <= {total}, got {chunks}")
    return c0, c1


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


# id -> (a torch cu_seqlens tensor, its version counter then, its host copy): the last OFFSETS_KEPT read
_offsets_kept: collections.OrderedDict = collections.OrderedDict()


def _read_torch(cu_seqlens: Any) -> np.ndarray:
    """A torch tensor's values on the host, read-only (a device tensor's copy waits for the device)."""
    host = cu_seqlens.detach().cpu().numpy()
    host.setflags(write=False)   # kept and handed to every later call: nobody writes into it
    return host


def _torch_offsets(cu_seqlens: Any) -> np.ndarray:
    """A torch cu_seqlens tensor's host copy, read from the device once per tensor.

    Reading a device tensor's values is a host sync: the host waits until every kernel queued before
    it has run, and the GPU then idles while the host queues the rest of the call. A model's KDA
    layers, and their backward, all take the same offsets tensor for a batch, so one read a batch is
    enough (FLA's own chunk index is cached by the tensor in the same way). The last OFFSETS_KEPT
    tensors are kept, each with a strong reference (so that its id cannot be reused while it is here)
    and its version counter, which every in-place write through torch bumps; a write that bypasses
    torch (a raw kernel on its pointer) is not seen, as in FLA. A tensor made under
    ``torch.inference_mode`` has no version counter, so a write to it could not be seen: its values
    are read at every call (the drop-in's ``cu_seqlens_cpu`` spares the read)."""
    if cu_seqlens.is_inference():
        return _read_torch(cu_seqlens)
    key = id(cu_seqlens)   # unique while kept: the entry holds the tensor
    kept = _offsets_kept.pop(key, None)
    if kept is None or kept[1] != cu_seqlens._version:
        kept = (cu_seqlens, cu_seqlens._version, _read_torch(cu_seqlens))
    _offsets_kept[key] = kept   # the last used at the end, where eviction comes last
    while len(_offsets_kept) > OFFSETS_KEPT:
        _offsets_kept.popitem(last=False)
    return kept[2]


def host_offsets(cu_seqlens: Any) -> np.ndarray:
    """A host numpy copy of a cu_seqlens given as a list, a numpy / CuPy array or a torch tensor
    (a device one is copied to the host: N + 1 integers; a torch tensor's once, then kept, read-only:
    :func:`_torch_offsets`)."""
    if _is_torch(cu_seqlens):
        return _torch_offsets(cu_seqlens)
    if hasattr(cu_seqlens, "__cuda_array_interface__"):
        if not hasattr(cu_seqlens, "get"):
            raise TypeError(f"cu_seqlens must be a list, a numpy array, a CuPy array or a torch tensor, "
                            f"got {type(cu_seqlens).__name__}")
        return cu_seqlens.get()
    if isinstance(cu_seqlens, (list, tuple)):
        for i, v in enumerate(cu_seqlens):   # before numpy turns [0, 2.5] into floats or [0, True] into ints
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"cu_seqlens must hold integers, got cu_seqlens[{i}] = {v!r}")
    return np.asarray(cu_seqlens)


def check_cu_seqlens(cu_seqlens: Any, batch: int, total: int) -> np.ndarray:
    """Validated host int64 offsets [N+1] (0 = cu[0] < cu[1] < ... < cu[N] = total) of a packed batch
    of size 1 whose token axis is ``total`` long."""
    if batch != 1:
        raise ValueError(f"cu_seqlens needs a packed batch of size 1 ([1, total, H, ...]), "
                         f"got batch {batch}")
    cu = host_offsets(cu_seqlens)
    if cu.ndim != 1:
        raise ValueError(f"cu_seqlens must be 1-D (N+1 offsets), got shape {cu.shape}")
    if cu.dtype.kind not in "iu":
        raise ValueError(f"cu_seqlens must have an integer dtype, got {cu.dtype}")
    if cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold at least 2 offsets (one sequence), "
                         f"got {cu.shape[0]}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    steps = np.diff(cu)
    if np.any(steps < 1):
        bad = int(np.argmax(steps < 1))
        raise ValueError(f"cu_seqlens must be strictly increasing (every sequence length >= 1), "
                         f"got cu_seqlens[{bad}]={int(cu[bad])} >= "
                         f"cu_seqlens[{bad + 1}]={int(cu[bad + 1])}")
    if cu[-1] != total:
        raise ValueError(f"cu_seqlens must end at the total length {total}, got {int(cu[-1])}")
    return cu
