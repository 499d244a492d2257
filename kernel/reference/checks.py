"""Argument checks and layout helpers shared by the float64 references.

Every public function of ``kernel.reference`` checks its arguments with these
(errors name the argument) and lays tiles out with them; none needs CuPy.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..shapes import CHUNK_TOKENS, check_cu_seqlens   # the product's; every check of an offset list is that one

LN2 = math.log(2.0)
L2NORM_EPS = 1e-6  # the same eps as flash-linear-attention's l2norm


# ----------------------------------------------------------------------------
# array module and validation helpers
# ----------------------------------------------------------------------------

def array_module(x: Any):
    """cupy for CuPy arrays, else numpy; never needs CuPy to be installed."""
    try:
        import cupy
    except ImportError:
        return np
    return cupy.get_array_module(x)


def _to_host(x: Any) -> np.ndarray:
    """A numpy copy of a numpy/CuPy array or a sequence."""
    if hasattr(x, "__cuda_array_interface__"):
        import cupy
        return cupy.asnumpy(x)
    return np.asarray(x)


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def int_arg(x: Any, name: str, minimum: int | None = None) -> int:
    """An int (numpy integers too; bool and float refused, never truncated), >= minimum."""
    if not is_int(x):
        raise TypeError(f"{name} must be an int, got {x!r} ({type(x).__name__})")
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {x}")
    return int(x)


def flag_arg(x: Any, name: str) -> bool:
    """True or False (or a numpy bool): "no" or 0.0 is not read for its truthiness."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {x!r} ({type(x).__name__})")
    return bool(x)


def real_arg(x: Any, name: str, minimum: float | None = None) -> float:
    """A finite real number (int or float, numpy's too; not bool), >= minimum."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {x!r} ({type(x).__name__})")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def scale_arg(scale: Any, K: int) -> float:
    """The attention scale: K**-0.5 for None, else a finite real > 0 (0 would zero every
    score, a negative one flip them: neither is an attention scale)."""
    if scale is None:
        return K ** -0.5
    s = real_arg(scale, "scale")
    if s <= 0:
        raise ValueError(f"scale must be > 0 (None for K**-0.5), got {s}")
    return s


def real_dtype_arg(name: str, x: Any, *, bits_ok: bool = False) -> None:
    """x holds real floats (float16/32/64, ml_dtypes bfloat16); with bits_ok also uint16
    bf16 bits. Complex values would lose their imaginary part and strings be parsed as
    numbers by the float64 conversion that follows, both without a word."""
    try:
        dtype = np.dtype(x.dtype)
    except TypeError:
        raise TypeError(f"{name} must be a numpy or CuPy array, got {type(x).__name__} "
                        f"of dtype {x.dtype}") from None
    if dtype.kind == "f" or dtype.name == "bfloat16" or (bits_ok and dtype == np.uint16):
        return
    expect = "float16/32/64 or bfloat16" + (", or uint16 bf16 bits" if bits_ok else "")
    raise ValueError(f"{name} must have a real floating dtype ({expect}), got {dtype}")


def _shown(n: np.ndarray, most: int = 8) -> str:
    """An array's values as given, the first ``most`` of them."""
    head = str(n.reshape(-1)[:most].tolist())
    return head if n.size <= most else f"{head[:-1]}, ...] ({n.size} values)"


def lengths_arg(lengths: Any, name: str = "lengths", allow_empty: bool = False) -> np.ndarray:
    """Host int64 [N] of sequence lengths, every one an integer >= 1."""
    why = f"{name} must hold ints (a length is a token count: never rounded)"
    if isinstance(lengths, (list, tuple)):
        # by element, before numpy would turn [True, 3] into [1, 3] or [4, 3.0] into floats
        for i, v in enumerate(lengths):
            if not is_int(v) and not isinstance(v, (list, tuple)):
                raise TypeError(f"{why}, got {name}[{i}] = {v!r} ({type(v).__name__})")
    n = _to_host(lengths)
    if n.ndim > 1:
        raise ValueError(f"{name} must be a flat list of ints, got shape {n.shape}")
    n = n.reshape(-1)
    if n.size == 0 and not allow_empty:
        raise ValueError(f"{name} must be a non-empty list of ints >= 1, got []")
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"{why}, got an array of {n.dtype}: {_shown(n)}")
    if n.size and n.min() < 1:
        bad = int(np.argmax(n < 1))
        raise ValueError(f"{name} must all be >= 1, got {name}[{bad}] = {int(n[bad])}")
    return n.astype(np.int64)


def first_where(xp, mask) -> tuple[int, ...]:
    """Index of the first True of a boolean array (only on the error path)."""
    flat = int(xp.argmax(mask.reshape(-1).astype(np.int8)))
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def finite_arg(xp, x, name: str):
    """x (float64, as the caller passed it) must hold no NaN or inf: one reduction."""
    if bool(xp.isfinite(x).all()):
        return x
    bad = ~xp.isfinite(x)
    first = first_where(xp, bad)
    raise ValueError(f"{name} holds {int(bad.sum())} non-finite value(s) (NaN or inf), the first "
                     f"{name}{list(first)} = {float(x[first])}: the float64 reference refuses them")


def gate_arg(xp, g, name: str = "g", what: str = "a natural-log decay gate: exp(g) in (0, 1]"):
    """g must be a decay (``what`` says in which log): finite and <= 0, in one reduction."""
    if bool(xp.all((g <= 0) & (g > -xp.inf))):   # NaN fails both comparisons
        return g
    finite_arg(xp, g, name)
    first = first_where(xp, g > 0)
    raise ValueError(f"{name} must be <= 0 ({what}), got "
                     f"{int((g > 0).sum())} positive value(s), the first {name}{list(first)} = "
                     f"{float(g[first])}")


def check_tiling(tile: Any, snapshot_every: Any = 1) -> None:
    # a tile (tokens; the kernels' is TILE_TOKENS) must divide the chunk so that snapshot_every =
    # CHUNK_TOKENS // tile lands exactly on FLA's chunk boundaries (its dh); any snapshot_every >= 1
    # is allowed.
    if not is_int(tile):
        raise TypeError(f"tile must be an int, a positive divisor of {CHUNK_TOKENS}, got {tile!r}")
    if tile < 1 or CHUNK_TOKENS % int(tile) != 0:
        raise ValueError(f"tile must be a positive divisor of {CHUNK_TOKENS} "
                         f"(1, 2, 4, 8, 16, 32, 64), got {tile!r}")
    if not is_int(snapshot_every):
        raise TypeError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")
    if snapshot_every < 1:
        raise ValueError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")


def expect_shape(name: str, x: Any, expected: Sequence[int], what: str) -> None:
    shape = tuple(getattr(x, "shape", ()))
    if shape != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} {what}, got {shape}")


def expect_rank(name: str, x: Any, rank: int, layout: str) -> None:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ValueError(f"{name} must be an array {layout}, got {type(x).__name__}")
    if len(shape) != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(shape)}")


def sequence_offsets(batch: int, seqlen: int, cu_seqlens: Any) -> np.ndarray:
    """Offsets into the flattened token axis [batch * seqlen]; equal length is N = batch."""
    if cu_seqlens is None:
        if seqlen < 1:
            raise ValueError(f"sequence length T must be >= 1, got {seqlen}")
        return np.arange(batch + 1, dtype=np.int64) * seqlen
    return check_cu_seqlens(cu_seqlens, batch, seqlen)


def tiles_of_offsets(cu: np.ndarray, tile: int):
    """Every tile of ``tile`` tokens of every sequence, in token order.

    Returns (start [n_tiles], length [n_tiles], seq_tiles [N]): tile i covers
    tokens start[i] .. start[i] + length[i] - 1 of the flattened token axis.
    """
    lengths = np.diff(cu)
    seq_tiles = -(-lengths // tile)
    starts, lens = [], []
    for bos, n, nt in zip(cu[:-1], lengths, seq_tiles):
        first = bos + tile * np.arange(nt, dtype=np.int64)
        starts.append(first)
        lens.append(np.minimum(tile, bos + n - first))
    return np.concatenate(starts), np.concatenate(lens), seq_tiles


def gather_tiles(xp, x, start: np.ndarray, length: np.ndarray, tile: int):
    """x [total, ...] -> tiles [n, tile, ...], rows past a tile's length zero."""
    c = np.arange(tile)
    idx = np.minimum(start[:, None] + c, x.shape[0] - 1)  # clipped: masked anyway
    mask = c < length[:, None]
    tiles = x[xp.asarray(idx)]
    m = xp.asarray(mask).reshape(mask.shape + (1,) * (tiles.ndim - 2))
    return tiles * m


def l2norm(xp, x):
    return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def l2norm_rstd(xp, x):
    """Each row's l2norm scale over the last axis, 1 / sqrt(sum x^2 + eps): the rstd beside :func:`l2norm`'s rows
    (FLA's l2norm_fwd returns both), in x's precision."""
    return 1.0 / xp.sqrt(xp.sum(x * x, axis=-1) + L2NORM_EPS)
