"""What the bench runs: configurations, Kernel A's snapshot modes, and the bytes it must move.

A configuration is B equal sequences of T tokens (``32x8192``) or a packed batch
of N ragged ones (``varlen64x262144``, lengths from ``kernel.reference.ragged_lengths``).
The byte floor counts what Kernel A reads and writes at least: every input once,
every output once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from kernel.shapes import HEAD_DIM, TILE_TOKENS
from kernel.reference import ragged_lengths, snapshot_offsets
from kernel.shapes import CHUNK_TOKENS

BF16_EVERY_64 = "bf16-every-64"        # bf16 every 64 tokens: FLA's dh layout
FP32_EVERY_TILE = "fp32-every-tile"    # fp32 after every 16-token tile
# Kernel A's snapshot modes: name -> (snapshot_dtype, snapshot_every)
MODES = {
    BF16_EVERY_64: ("bfloat16", CHUNK_TOKENS // TILE_TOKENS),
    FP32_EVERY_TILE: ("float32", 1),
}
# the names earlier runs used, in their JSON files (docs/bench) and on their command lines
RENAMED_MODES = {"fla": BF16_EVERY_64, "seed": FP32_EVERY_TILE}
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

DEFAULT_CONFIGS = ("32x8192", "8x32768", "1x131072", "4x8192", "varlen64x262144")
QUICK_CONFIGS = ("4x8192", "1x32768")
# --backward: the whole backward's configurations, smallest first
BACKWARD_CONFIGS = ("4x8192", "32x8192", "8x32768", "1x131072", "varlen64x262144")


@dataclass
class Config:
    """B equal sequences of T tokens, or (varlen) a packed batch of ragged ones."""
    name: str
    B: int
    T: int
    lengths: list[int]          # per-sequence lengths (N of them)
    varlen: bool

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def N(self) -> int:
        return len(self.lengths)


_BT_RE = re.compile(r"^(\d+)x(\d+)$")
_VAR_RE = re.compile(r"^varlen(?:(\d+)x(\d+))?$")


def parse_config(spec: str, seed: int = 0) -> Config:
    """'BxT' (equal lengths) or 'varlenNxTOTAL' (N ragged lengths summing to TOTAL,
    from ``kernel.reference.ragged_lengths``); plain 'varlen' is varlen64x262144."""
    s = spec.strip().lower()
    m = _BT_RE.match(s)
    if m:
        B, T = int(m.group(1)), int(m.group(2))
        if B < 1 or T < 1:
            raise ValueError(f"config {spec!r}: B and T must be >= 1")
        return Config(name=f"{B}x{T}", B=B, T=T, lengths=[T] * B, varlen=False)
    m = _VAR_RE.match(s)
    if m:
        n = int(m.group(1)) if m.group(1) else 64
        total = int(m.group(2)) if m.group(2) else 262144
        lengths = ragged_lengths(n, total, seed=seed)
        return Config(name=f"varlen{n}x{total}", B=1, T=total, lengths=lengths, varlen=True)
    raise ValueError(f"config {spec!r}: expected 'BxT' (e.g. 32x8192) or 'varlenNxTOTAL' "
                     f"(e.g. varlen64x262144)")


def parse_configs(text: str, seed: int, skipped) -> list[Config]:
    """The comma-separated configurations of --configs; a bad one is reported through
    ``skipped(message)`` and left out, so the others still run."""
    configs = []
    for spec in text.split(","):
        if spec.strip():
            try:
                configs.append(parse_config(spec, seed=seed))
            except ValueError as exc:
                skipped(f"skipping config: {exc}")
    return configs


def n_snapshots(lengths: Sequence[int], snapshot_every: int) -> int:
    """Total snapshots of all sequences (FLA's NT for bf16-every-64)."""
    return int(snapshot_offsets(lengths, TILE_TOKENS, snapshot_every)[-1])


def kernel_a_bytes(lengths: Sequence[int], H: int, *, snapshot_dtype: str, snapshot_every: int,
                   with_dht: bool = True, beta_bytes: int = 4) -> dict[str, int]:
    """Bytes Kernel A reads and writes at least: every input once, every output once.

    inputs : q, k, do bf16 [tok, H, HEAD_DIM]; gc fp32 [tok, H, HEAD_DIM]; beta [tok, H];
             mqk, inv bf16 [tok, H, TILE_TOKENS]; dht fp32 [N, H, HEAD_DIM, HEAD_DIM] (if given)
    outputs: snapshots [n_snap, H, HEAD_DIM, HEAD_DIM] in snapshot_dtype; dh0 fp32 [N, H, HEAD_DIM, HEAD_DIM]
    (cu_seqlens, a few hundred bytes, is left out.)
    """
    tok, N = int(sum(lengths)), len(lengths)
    rows = tok * H
    state = H * HEAD_DIM * HEAD_DIM
    inputs = rows * (3 * HEAD_DIM * 2 + HEAD_DIM * 4 + beta_bytes + 2 * TILE_TOKENS * 2)
    if with_dht:
        inputs += N * state * 4
    snaps = n_snapshots(lengths, snapshot_every) * state * DTYPE_BYTES[snapshot_dtype]
    dh0 = N * state * 4
    return {"inputs": inputs, "snapshots": snaps, "dh0": dh0, "total": inputs + snaps + dh0}
