"""The trained-layer gate recipe: the gates FLA's KimiDeltaAttention layer makes once it has trained a while.

FLA's layer (fla-core 0.6.0, ``fla.layers.kda``, at its defaults: no ``lower_bound``, ``safe_gate``
off) hands ``chunk_kda`` the raw gate projection and lets the op activate it
(``use_gate_in_kernel=True``), per value head h and channel c:

    g = -exp(A_log[h]) * softplus(f_proj(x) + dt_bias[h, c])          (natural log, unbounded below)

with f_proj = Linear(hidden, 128) then Linear(128, HV * 128), both without bias and at PyTorch's
default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), A = exp(A_log) ~ U(1, 16) per value head, and
dt_bias = softplus^-1(dt) = dt + log(-expm1(-dt)) with dt log-uniform in [1e-3, 1e-1] per value
head and channel, as the layer draws them. The input x is N(0, 1) per token.

At initialisation these gates rarely pass -5. Training grows the projection's weights; the recipe
models that by scaling the projection's output (``projection_scale``, 4 by default), so that some
16-token tiles decay a channel past 2^-126, out of fp32's normal range, which is what our backward's
tile products hold (``kernel.fla_dropin``). tests/kernel/tools/test_trained_layer_gate.py measures
the statistics (hidden 2048, 16 value heads, 8192 tokens) and docs/kda_backward.md quotes them.

Cost: two matmuls per token (hidden x 128, then 128 x HV * 128) and ``hidden`` normal draws, in
blocks of :data:`TOKENS_PER_DRAW` tokens, so memory stays at one block of x beside the outputs. On
a CPU 8192 tokens at hidden 2048 take about a second; for the bench's sizes (up to 262144 tokens)
pass ``device="cuda"`` (the stream then differs from the CPU's: the recipe is the distribution, the
bits are per device).

The recipe is the same for ``ptx-lab kda-precision --recipes trained-layer`` and anything that
times on it; q, k, v and the rest are the callers' own.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from kernel.reference.checks import int_arg, is_int, lengths_arg, real_arg
from kernel.shapes import HEAD_DIM, TILE_TOKENS

__all__ = ["trained_layer_gate", "tile_decays", "gate_statistics", "HIDDEN", "PROJECTION_SCALE",
           "TILE_DECAY_FLOOR", "GATE_FLOOR"]

HIDDEN = 2048               # FLA's KimiDeltaAttention default hidden_size
PROJECTION_SCALE = 4.0      # how much the recipe grows the gate projection's output over its initial one
A_RANGE = (1.0, 16.0)       # exp(A_log) ~ U(1, 16), FLA's init without safe_gate
DT_RANGE = (1e-3, 1e-1)     # dt log-uniform here, FLA's init
DT_CLAMP = 1e-4             # FLA clamps dt below (a no-op for this range, kept to be FLA's line)
TOKENS_PER_DRAW = 4096      # tokens of x drawn and projected at once; fixed, so the stream depends on nothing else

# A 16-token tile's decay of one channel (natural log) at fp32's smallest normal, 2^-126: past it R1's
# factors leave fp32's range. The kernels go pairwise sooner, past a span (the gates of a tile's last 15
# tokens) of kernel.shapes.SPAN_LIMIT = 110, where -ftz=true already flushes Kr's small entries.
TILE_DECAY_FLOOR = -126.0 * math.log(2.0)
# the per-token gate whose 16-token tile reaches that decay (-5.458...; FLA's recommended bound is -5)
GATE_FLOOR = TILE_DECAY_FLOOR / TILE_TOKENS


def _packed(B: Any, T: Any, lengths: Any) -> tuple[int, int, np.ndarray]:
    """(B, T, lengths int64) with a packed [1, sum(lengths)] batch where lengths are given."""
    if lengths is not None:
        lens = lengths_arg(lengths)
        for name, x in (("B", B), ("T", T)):
            if x is not None and not is_int(x):
                raise TypeError(f"{name} must be an int or None (ignored with lengths), got {x!r}")
        return 1, int(lens.sum()), lens.astype(np.int64)
    B, T = int_arg(B, "B", 1), int_arg(T, "T", 1)
    return B, T, np.full(B, T, dtype=np.int64)


def trained_layer_gate(B: int | None, T: int | None, H: int, HV: int, *, lengths: Sequence[int] | None = None,
                       seed: int = 0, projection_scale: float = PROJECTION_SCALE, hidden: int = HIDDEN,
                       dtype: Any = None, device: str = "cpu") -> dict:
    """The recipe's raw layer inputs for B sequences of T tokens, or (``lengths``) one packed batch
    of ragged sequences (B, T then ignored), H query heads and HV value heads (HV a multiple of H, as
    FLA's grouped value attention asks; the gate is per value head).

    Returns torch tensors on ``device``:

    * ``g_raw`` [B, T, HV, 128]: projection_scale * f_proj(x), in ``dtype`` (default bfloat16, what
      a bf16 layer passes the op with ``use_gate_in_kernel=True``);
    * ``A_log`` fp32 [HV], ``dt_bias`` fp32 [HV * 128]: the layer's parameters at their init;
    * ``g`` fp32 [B, T, HV, 128]: the activated gate, :func:`kernel.activations.gate` of exactly
      ``g_raw`` (what the op computes from it, up to its own rounding);

    and ``cu_seqlens``, int64 numpy [N + 1] with ``lengths``, else None.
    """
    import torch

    from kernel.activations import gate

    B, T, lens = _packed(B, T, lengths)
    H, HV, hidden = int_arg(H, "H", 1), int_arg(HV, "HV", 1), int_arg(hidden, "hidden", 1)
    if HV % H:
        raise ValueError(f"HV must be a multiple of H (grouped value heads), got HV={HV}, H={H}")
    seed = int_arg(seed, "seed", 0)
    projection_scale = real_arg(projection_scale, "projection_scale", 0.0)
    dtype = torch.bfloat16 if dtype is None else dtype
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")

    K = HEAD_DIM
    gen = torch.Generator(device=device).manual_seed(seed)
    uniform = lambda shape, lo, hi: torch.empty(shape, device=device).uniform_(lo, hi, generator=gen)  # noqa: E731
    # PyTorch's default Linear init (kaiming_uniform_ with a = sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w_down = uniform((K, hidden), -hidden ** -0.5, hidden ** -0.5)
    w_up = uniform((HV * K, K), -K ** -0.5, K ** -0.5)
    A_log = torch.log(uniform(HV, *A_RANGE))
    lo, hi = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
    dt = torch.exp(torch.rand(HV * K, generator=gen, device=device) * (hi - lo) + lo).clamp(min=DT_CLAMP)
    dt_bias = dt + torch.log(-torch.expm1(-dt))

    tokens = B * T
    g_raw = torch.empty(tokens, HV * K, dtype=dtype, device=device)
    for t0 in range(0, tokens, TOKENS_PER_DRAW):
        n = min(TOKENS_PER_DRAW, tokens - t0)
        x = torch.randn(n, hidden, generator=gen, device=device)
        g_raw[t0:t0 + n] = ((x @ w_down.T) @ w_up.T).mul_(projection_scale)
    g_raw = g_raw.view(B, T, HV, K)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64) if lengths is not None else None
    return {"g_raw": g_raw, "A_log": A_log, "dt_bias": dt_bias, "g": gate(g_raw, A_log, dt_bias),
            "cu_seqlens": cu}


def tile_decays(g, lengths: Sequence[int]):
    """Every 16-token tile's decay per head and channel: the sum of g (natural log) over the tile's
    tokens, float64 torch [tiles, HV, K]. g [B, T, HV, K] holds the sequences of ``lengths`` one after
    another (B equal ones, or one packed batch). A tile is 16 tokens from its sequence's start (the last
    one shorter), as Kernel B walks them; FLA's cumsum restarts every 64 tokens, a multiple of 16, so
    a tile's decay is its own sum either way."""
    import torch

    lens = lengths_arg(lengths)
    rows = g.reshape(-1, *g.shape[-2:])
    if int(lens.sum()) != rows.shape[0]:
        raise ValueError(f"lengths sum to {int(lens.sum())}, g holds {rows.shape[0]} tokens")
    per_seq = -(-lens // TILE_TOKENS)
    first = np.concatenate([[0], np.cumsum(per_seq)[:-1]])
    # each token's tile: its sequence's first tile plus its position over 16
    pos = np.arange(rows.shape[0]) - np.repeat(np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    tile = torch.from_numpy(np.repeat(first, lens) + pos // TILE_TOKENS).to(rows.device)
    out = torch.zeros(int(per_seq.sum()), *rows.shape[1:], dtype=torch.float64, device=rows.device)
    return out.index_add_(0, tile, rows.double())


def gate_statistics(g, lengths: Sequence[int]) -> dict:
    """What the recipe is for, as plain floats: the smallest gate; the fraction of gates below
    :data:`GATE_FLOOR` (each alone would fail a per-token floor); the smallest tile decay; the
    fraction of (tile, head, channel) decays past :data:`TILE_DECAY_FLOOR` and of (tile, head) with
    any channel past it (past fp32's range: Kernel B forms their G14-G17 pairwise, and those of the tiles
    whose span passes kernel.shapes.SPAN_LIMIT short of it)."""
    tiles = tile_decays(g, lengths)
    past = tiles < TILE_DECAY_FLOOR
    return {"min_gate": float(g.min()), "below_gate_floor": float((g < GATE_FLOOR).double().mean()),
            "min_tile": float(tiles.min()), "tile_channels_past": float(past.double().mean()),
            "tile_heads_past": float(past.any(-1).double().mean())}


def main(argv: Sequence[str] | None = None) -> int:
    """The recipe's statistics over several draws of the layer's weights: each seed is one layer."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kernel.tools.trained_layer_gate",
                                 description="the trained-layer gate recipe's statistics over seeds (CPU)")
    ap.add_argument("--T", type=int, default=8192, help="tokens, one sequence (default 8192)")
    ap.add_argument("--heads", type=int, default=16, help="value heads HV (default 16)")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help=f"the layer's hidden size (default {HIDDEN})")
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 2.0, PROJECTION_SCALE],
                    help="projection scales (default 1 2 4)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0 .. N-1, one draw of the weights each (default 1)")
    a = ap.parse_args(argv)
    if min(a.T, a.heads, a.hidden, a.seeds) < 1 or min(a.scales) < 0:
        ap.error("--T, --heads, --hidden and --seeds must be >= 1, --scales >= 0")
    print(f"hidden {a.hidden}, {a.heads} value heads of {HEAD_DIM}, {a.T} tokens, seeds 0..{a.seeds - 1}: "
          "seed 0's value, and the median, min and max over the seeds")
    for scale in a.scales:
        stats = [gate_statistics(trained_layer_gate(1, a.T, 1, a.heads, seed=s, projection_scale=scale,
                                                    hidden=a.hidden)["g"], [a.T]) for s in range(a.seeds)]
        for name in stats[0]:
            v = np.array([s[name] for s in stats])
            nonzero = "" if name.startswith("min") else f"   nonzero in {int((v != 0).sum())} of {v.size}"
            print(f"  {scale:g}x {name:18s} {v[0]:10.3g}   median {np.median(v):10.3g}   min {v.min():10.3g}"
                  f"   max {v.max():10.3g}{nonzero}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
