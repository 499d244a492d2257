"""Seeded inputs for the tests and the benchmarks: one recipe, float32 arrays on any array module."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .checks import (flag_arg, int_arg, is_int, lengths_arg, real_arg)

__all__ = ["random_inputs", "ragged_lengths", "GATE_LOWER_BOUND", "GATE_LOGIT_MEAN", "DO_SCALE", "DHT_SCALE"]


# ----------------------------------------------------------------------------
# seeded inputs for tests and benchmarks
# ----------------------------------------------------------------------------

GATE_LOWER_BOUND = -5.0   # Kimi Linear clamps the per-token log gate at -5
GATE_LOGIT_MEAN = 3.0     # logsigmoid(N(3, 1)): ~ -0.05 a token, a 16-token tile keeps ~ 0.45
DO_SCALE = 0.1
DHT_SCALE = 0.1


def random_inputs(B: int, T: int, H: int, K: int = 128, V: int = 128, *,
                  lengths: Sequence[int] | None = None, seed: int = 0,
                  gate_strength: float = 1.0, with_dht: bool = True, xp=np) -> dict:
    """Seeded, realistic float32 inputs of the KDA backward.

    Without ``lengths``: [B, T, H, ...] and cu_seqlens None. With ``lengths``
    (a list of ints >= 1): a packed batch [1, sum(lengths), H, ...] and
    ``cu_seqlens`` (int64 numpy, N+1); B and T are then ignored.

    q, k ~ N(0, 1) (unit vectors after l2norm); v ~ N(0, 1); do ~ 0.1 N(0, 1);
    g = clip(gate_strength * logsigmoid(N(3, 1)), -5, 0) (natural-log gate;
    gate_strength 0 = no decay, 1 = a 16-token tile decays to ~0.45 typically);
    beta = sigmoid(N(0, 1)); dht ~ 0.1 N(0, 1) [N, H, K, V] or None.

    Returns dict with keys q, k, v, g, beta, do, dht, cu_seqlens; arrays are
    float32 on ``xp`` (numpy or cupy), cu_seqlens stays on the host.

    Refused: B, T (without lengths), H, K, V that are not ints >= 1, lengths
    that are not ints >= 1 (2.7 is refused, not truncated), a negative or
    non-int seed, a gate_strength that is not a finite real >= 0 (NaN would
    make g NaN, a negative one would turn decay into growth), with_dht not a
    bool, xp without ``asarray``. TypeError for a type, ValueError for a value.
    """
    if lengths is not None:
        lens = lengths_arg(lengths)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        for name, x in (("B", B), ("T", T)):
            if x is not None and not is_int(x):
                raise TypeError(f"{name} must be an int or None (ignored with lengths), got {x!r}")
        B, T, N = 1, int(cu[-1]), int(lens.size)
    else:
        B, T = int_arg(B, "B", 1), int_arg(T, "T", 1)
        cu, N = None, B
    H, K, V = int_arg(H, "H", 1), int_arg(K, "K", 1), int_arg(V, "V", 1)
    seed = int_arg(seed, "seed", 0)
    gate_strength = real_arg(gate_strength, "gate_strength", 0.0)
    with_dht = flag_arg(with_dht, "with_dht")
    if not callable(getattr(xp, "asarray", None)):
        raise TypeError(f"xp must be an array module with asarray (numpy or cupy), got {xp!r}")

    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    logit = rng.normal(GATE_LOGIT_MEAN, 1.0, (B, T, H, K))
    logsigmoid = -np.logaddexp(0.0, -logit)
    g = np.clip(gate_strength * logsigmoid, GATE_LOWER_BOUND, 0.0)
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))
    do = DO_SCALE * rng.standard_normal((B, T, H, V))
    dht = DHT_SCALE * rng.standard_normal((N, H, K, V)) if with_dht else None

    def dev(x):
        return None if x is None else xp.asarray(x.astype(f32))

    return {"q": dev(q), "k": dev(k), "v": dev(v), "g": dev(g), "beta": dev(beta),
            "do": dev(do), "dht": dev(dht), "cu_seqlens": cu}


def ragged_lengths(n: int, total: int, seed: int = 0) -> list[int]:
    """n sequence lengths summing to ``total``, in a seeded random order.

    Always contains the edge cases 1, 15, 16, 17; the other n - 4 lengths are
    random (>= 1) and nudged off multiples of 16 where possible, e.g.
    ragged_lengths(64, 262144) for benchmarks. n, total and seed (>= 0) must be
    ints (TypeError otherwise; 64.0 is not a count).
    """
    n, total, seed = int_arg(n, "n"), int_arg(total, "total"), int_arg(seed, "seed", 0)
    edge = [1, 15, 16, 17]
    rest_n, rest_total = n - len(edge), total - sum(edge)
    if rest_n < 0 or rest_total < rest_n or (rest_n == 0 and rest_total != 0):
        raise ValueError(f"ragged_lengths needs n >= 4 and total >= {sum(edge)} + (n - 4) "
                         f"(exactly {sum(edge)} when n == 4), got n={n}, total={total}")
    rng = np.random.default_rng(seed)
    rest = np.ones(rest_n, dtype=np.int64)
    if rest_n:
        weights = rng.uniform(0.2, 1.0, rest_n)
        extra = np.floor(weights / weights.sum() * (rest_total - rest_n)).astype(np.int64)
        extra[: rest_total - rest_n - int(extra.sum())] += 1       # spread the rounding
        rest += extra
        # move one token between neighbours to leave multiples of 16
        for i in range(rest_n - 1):
            if rest[i] % 16 == 0 and rest[i + 1] > 1:
                rest[i] += 1
                rest[i + 1] -= 1
    out = np.concatenate([np.asarray(edge, dtype=np.int64), rest])
    rng.shuffle(out)
    assert int(out.sum()) == total and out.min() >= 1
    return [int(x) for x in out]
