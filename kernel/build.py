"""Kernel A's compile-time configurations: one source, one set of -D options.

The API (`kernel.api`), the offline resource report (`kernel.resources`) and CI
all build `kernel/dstate_scan.cu` through :func:`options`, so what CI checks
(registers, spills, SASS) is exactly what the API launches.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

SOURCE_PATH = Path(__file__).resolve().parent / "dstate_scan.cu"
KERNEL_NAME = "kda_dstate_scan"
D = 128      # K = V
CHUNK = 16   # tokens per tile
VSPLITS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Config:
    vsplit: int = 1          # CTAs per (sequence, head); each owns D / vsplit v columns
    snap_bf16: bool = False  # snapshot dtype bf16 (else fp32)
    snap_every: int = 1      # snapshot every tile (1) or every 4th tile (4: FLA's dh)
    has_dht: bool = False
    l2norm: bool = True
    nstage: int = 4          # input ring depth; loads run nstage - 1 tiles ahead
    g2_split: int = 4        # independent accumulator chains in G2 (dS path: 2 dependent MMAs, not 8)
    producers: int = 0       # producer warps (cp.async + R1); 0 = auto: 4 (at 1 x 16384 x H32
                             # bf16x4 they beat 2 at vsplit 1, 1.57 vs 1.84 ms, and tie 8 at
                             # vsplit 4, 0.87 ms), but 2 at vsplit 1 with fp32 snapshots, where
                             # 4 spill (384 threads cap registers at 168) and measured slower
                             # (4 x 8192 f32x1: 1.95 vs 1.83 ms)
    timing: bool = False     # clock64 phase accounting into kda_timing[] (kernel.profile only)
    lineinfo: bool = False   # -lineinfo, so ncu / compute-sanitizer name source lines

    def __post_init__(self):
        if self.vsplit not in VSPLITS:
            raise ValueError(f"vsplit must be one of {VSPLITS}, got {self.vsplit}")
        if self.snap_every not in (1, 4):
            raise ValueError(f"snapshot_every must be 1 or 4, got {self.snap_every}")
        if self.nstage not in (2, 3, 4):
            raise ValueError(f"nstage must be 2, 3 or 4, got {self.nstage}")
        if self.g2_split not in (1, 2, 4):
            raise ValueError(f"g2_split must be 1, 2 or 4, got {self.g2_split}")
        if self.producers == 0:
            object.__setattr__(self, "producers", 2 if self.vsplit == 1 and not self.snap_bf16 else 4)
        if self.producers not in (2, 4, 8):
            raise ValueError(f"producers must be 2, 4 or 8, got {self.producers}")

    @property
    def threads(self) -> int:
        return (D // self.vsplit // 16 + self.producers) * 32

    def name(self) -> str:
        return (f"vs{self.vsplit}-{'bf16' if self.snap_bf16 else 'f32'}x{self.snap_every}"
                f"{'-dht' if self.has_dht else ''}{'' if self.l2norm else '-nonorm'}"
                f"-st{self.nstage}-g2s{self.g2_split}-p{self.producers}"
                f"{'-timing' if self.timing else ''}{'-lineinfo' if self.lineinfo else ''}")


# -ftz=true: exp2f is then a single MUFU.EX2 (without it, 4 instructions: a
# halving, the MUFU, a compare and a squaring for results below 2^-126), in the
# loop that dominates the producers' instruction count. The price is that fp32
# intermediates under 2^-126 (~1e-38) flush to zero, 1e-38 of the O(1) values
# around them.
FAST_MATH = ("-ftz=true",)


def defines(cfg: Config) -> tuple[str, ...]:
    return (*FAST_MATH, f"-DVSPLIT={cfg.vsplit}", f"-DSNAP_BF16={int(cfg.snap_bf16)}",
            f"-DSNAP_EVERY={cfg.snap_every}", f"-DHAS_DHT={int(cfg.has_dht)}",
            f"-DL2NORM={int(cfg.l2norm)}", f"-DNSTAGE={cfg.nstage}", f"-DG2_SPLIT={cfg.g2_split}",
            f"-DPRODUCERS={cfg.producers}", f"-DKDA_TIMING={int(cfg.timing)}",
            *(("-lineinfo",) if cfg.lineinfo else ()))


def source() -> str:
    return SOURCE_PATH.read_text()


def all_variants() -> list[Config]:
    """Every configuration the API can launch (with the default tuning knobs)."""
    return [Config(vsplit=v, snap_bf16=b, snap_every=e, has_dht=d, l2norm=n)
            for v, b, e, d, n in itertools.product(VSPLITS, (False, True), (1, 4), (False, True), (False, True))]
