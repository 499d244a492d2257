"""kernel.tools.trained_layer_gate: FLA's layer gate at its defaults, its projection's output grown 4x (CPU).

The recipe must be the layer's own draw (FLA's lines of fla/layers/kda.py, run here against the global
generator, give the same bits), and its statistics must be those of the simulation issue 34 quotes
(hidden 2048, 16 value heads of 128, 8192 tokens, one draw of the weights): at 1x the smallest gate
-4.99 and no 16-token tile below -32.5; at 2x 1.7e-4 of the gates below GATE_FLOOR and tiles down to
-50; at 4x 7.8e-3 of the gates below GATE_FLOOR and 5.5e-5 of the (tile, head, channel) decays past
2^-126. Seed 0 is that draw.

Those are one layer's numbers; the weights' draw moves them far more than the tokens' does. Over
seeds 0..23 (``python -m kernel.tools.trained_layer_gate --seeds 24``): the smallest gate at 1x is
-6.24 .. -4.23 (median -5.13; 8 of 24 draws have a gate below GATE_FLOOR already at 1x, none a tile
past 2^-126); at 2x 5.1e-5 .. 3.4e-4 of the gates are below GATE_FLOOR and no tile is past; at 4x
5.2e-3 .. 1.2e-2 of the gates are, and 1.9e-6 .. 1.1e-4 of the tile decays (median 6.2e-5), in
every draw.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the recipe draws with torch")

from kernel.activations import gate  # noqa: E402
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM  # noqa: E402
from kernel.tools import trained_layer_gate as recipe  # noqa: E402

K = HEAD_DIM
HIDDEN, HV, T = 2048, 16, 8192          # the simulation's layer and sequence


def _flas_lines(seed: int, T: int, HV: int, hidden: int, scale: float):
    """FLA 0.6.0's KimiDeltaAttention.__init__ lines for f_proj, A_log and dt_bias (safe_gate off),
    verbatim but for the sizes, on the global generator; then x ~ N(0, 1) and the projection's
    output scaled."""
    torch.manual_seed(seed)
    f_proj = torch.nn.Sequential(torch.nn.Linear(hidden, K, bias=False), torch.nn.Linear(K, HV * K, bias=False))
    A_log = torch.log(torch.empty(HV, dtype=torch.float32).uniform_(1, 16))
    dt = torch.exp(
        torch.rand(HV * K, dtype=torch.float32) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
    ).clamp(min=1e-4)
    inv_dt = dt + torch.log(-torch.expm1(-dt))
    with torch.no_grad():
        raw = scale * f_proj(torch.randn(T, hidden))
    return raw.view(1, T, HV, K), A_log, inv_dt


def test_the_recipe_is_the_layers_own_draw():
    raw, A_log, dt_bias = _flas_lines(seed=3, T=100, HV=2, hidden=HIDDEN, scale=4.0)
    got = recipe.trained_layer_gate(1, 100, 1, 2, seed=3, dtype=torch.float32)
    assert torch.equal(got["A_log"], A_log) and torch.equal(got["dt_bias"], dt_bias)
    torch.testing.assert_close(got["g_raw"], raw, rtol=1e-6, atol=1e-7)
    assert torch.equal(got["g"], gate(got["g_raw"], A_log, dt_bias))


def test_the_scale_multiplies_the_projections_output():
    one = recipe.trained_layer_gate(2, 40, 2, 2, seed=1, projection_scale=1, dtype=torch.float32)
    four = recipe.trained_layer_gate(2, 40, 2, 2, seed=1, dtype=torch.float32)
    assert recipe.PROJECTION_SCALE == 4.0
    assert torch.equal(four["g_raw"], 4 * one["g_raw"])            # a power of two: exact in fp32
    assert torch.equal(four["A_log"], one["A_log"]) and torch.equal(four["dt_bias"], one["dt_bias"])


def test_shapes_dtypes_and_a_packed_batch():
    lengths = [1, 15, 16, 17, 4100]          # more tokens than one block of x (TOKENS_PER_DRAW)
    got = recipe.trained_layer_gate(None, None, 2, 4, lengths=lengths, seed=2, hidden=64)
    assert got["g_raw"].shape == (1, sum(lengths), 4, K) and got["g_raw"].dtype == torch.bfloat16
    assert got["g"].shape == got["g_raw"].shape and got["g"].dtype == torch.float32
    assert got["A_log"].shape == (4,) and got["dt_bias"].shape == (4 * K,)
    assert got["cu_seqlens"].tolist() == [0, 1, 16, 32, 49, 4149] and got["cu_seqlens"].dtype == np.int64
    assert torch.equal(got["g"], gate(got["g_raw"], got["A_log"], got["dt_bias"])) and bool((got["g"] < 0).all())
    # FLA's init ranges: A in [1, 16), dt in [1e-3, 1e-1] (so dt_bias = softplus^-1(dt) in about [-6.9, -2.25])
    A = got["A_log"].exp()
    assert bool(((A >= 1) & (A <= 16)).all())
    dt = torch.nn.functional.softplus(got["dt_bias"].double())
    assert 1e-3 * (1 - 1e-5) <= float(dt.min()) and float(dt.max()) <= 1e-1 * (1 + 1e-5)
    same = recipe.trained_layer_gate(None, None, 2, 4, lengths=lengths, seed=2, hidden=64)
    other = recipe.trained_layer_gate(None, None, 2, 4, lengths=lengths, seed=3, hidden=64)
    assert torch.equal(same["g_raw"], got["g_raw"]) and not torch.equal(other["g_raw"], got["g_raw"])
    assert recipe.trained_layer_gate(2, 8, 1, 1, hidden=8)["cu_seqlens"] is None


def test_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="HV must be a multiple of H"):
        recipe.trained_layer_gate(1, 8, 2, 3)
    with pytest.raises(ValueError, match="projection_scale must be >= 0"):
        recipe.trained_layer_gate(1, 8, 1, 1, projection_scale=-1.0)
    with pytest.raises(TypeError, match="T must be an int"):
        recipe.trained_layer_gate(1, 8.0, 1, 1)
    with pytest.raises(TypeError, match="B must be an int or None"):
        recipe.trained_layer_gate("1", None, 1, 1, lengths=[4])
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
        recipe.trained_layer_gate(1, 8, 1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="lengths sum to 5, g holds 8 tokens"):
        recipe.tile_decays(torch.zeros(1, 8, 1, K), [5])


def _chunk_cumsum_log2(g: torch.Tensor) -> torch.Tensor:
    """FLA's cumsum of one sequence's gate: in log2, restarting every 64 tokens (fp32)."""
    out = torch.empty_like(g)
    for c0 in range(0, g.shape[1], CHUNK_TOKENS):
        out[:, c0:c0 + CHUNK_TOKENS] = torch.cumsum(g[:, c0:c0 + CHUNK_TOKENS] / math.log(2.0), dim=1)
    return out


def _decays_from_the_cumsum(gc: torch.Tensor, n: int) -> torch.Tensor:
    """One sequence's tile decays (natural log) from FLA's 64-token cumsum gc [1, n, HV, K] (log2): each
    16-token tile's last row minus the row before it within its chunk, the way Kernel B rebases gT."""
    out = []
    for start in range(0, n, 16):
        last = min(start + 15, n - 1)
        before = gc[0, start - 1] if start % 64 else torch.zeros_like(gc[0, 0])
        out.append((gc[0, last] - before).double() * math.log(2.0))
    return torch.stack(out)


def test_tile_decays_read_the_tiles_as_kernel_b_rebases_them():
    lengths = [1, 15, 16, 17, 63, 64, 65, 200, 300]
    g = recipe.trained_layer_gate(None, None, 1, 2, lengths=lengths, seed=4, hidden=256, projection_scale=6.0)["g"]
    tiles = recipe.tile_decays(g, lengths)
    assert tiles.shape == (sum(-(-n // 16) for n in lengths), 2, K)
    # the second sequence's only tile: its 15 tokens (rows 1..15)
    torch.testing.assert_close(tiles[1], g[0, 1:16].double().sum(0), rtol=1e-12, atol=0)
    verdicts = []
    cu = np.concatenate([[0], np.cumsum(lengths)])
    per_seq = np.concatenate([[0], np.cumsum([-(-n // 16) for n in lengths])])
    for n, t0, t1, s0, s1 in zip(lengths, cu[:-1], cu[1:], per_seq[:-1], per_seq[1:]):
        past = bool((tiles[s0:s1] < recipe.TILE_DECAY_FLOOR).any())
        rebased = _decays_from_the_cumsum(_chunk_cumsum_log2(g[:, t0:t1]), n)
        torch.testing.assert_close(rebased, tiles[s0:s1], rtol=1e-5, atol=1e-3)   # fp32 cumsums of up to 64
        assert past == bool((rebased < recipe.TILE_DECAY_FLOOR).any()), n
        verdicts.append(past)
    assert any(verdicts) and not all(verdicts), verdicts    # both outcomes, or the comparison says little


@pytest.fixture(scope="module")
def simulation():
    """The statistics at the simulation's size, seed 0, at 1x, 2x and 4x."""
    return {scale: recipe.gate_statistics(
        recipe.trained_layer_gate(1, T, HV, HV, seed=0, projection_scale=scale, hidden=HIDDEN)["g"], [T])
        for scale in (1.0, 2.0, 4.0)}


def _within_counting_noise(got: float, quoted: float, count: int) -> bool:
    """got within 3 binomial sigmas of the quoted fraction of ``count`` samples, or within its last quoted
    digit (the quotes have two significant digits)."""
    digit = 10.0 ** (math.floor(math.log10(quoted)) - 1)
    return abs(got - quoted) <= max(3 * math.sqrt(quoted / count), digit / 2)


def test_seed_0_is_the_simulations_layer(simulation):
    gates, tile_channels = T * HV * K, (T // 16) * HV * K
    one, two, four = simulation[1.0], simulation[2.0], simulation[4.0]
    assert round(one["min_gate"], 2) == -4.99 and round(one["min_tile"], 1) == -32.5, one
    assert one["below_gate_floor"] == 0 and one["tile_channels_past"] == 0, one
    assert _within_counting_noise(two["below_gate_floor"], 1.7e-4, gates), two
    assert round(two["min_tile"]) == -50 and two["tile_channels_past"] == 0, two
    assert _within_counting_noise(four["below_gate_floor"], 7.8e-3, gates), four
    assert _within_counting_noise(four["tile_channels_past"], 5.5e-5, tile_channels), four
    assert four["min_tile"] < recipe.TILE_DECAY_FLOOR < two["min_tile"], (two, four)
    assert -5.46 < recipe.GATE_FLOOR < -5.45
