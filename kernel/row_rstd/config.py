"""The rstd pass's build: its one knob (:class:`Config`: the rows in flight a thread), its options, every
variant the launch can pick, and ``BUILD``, the description the tools and CI compile it by. The entry file
sits in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..forward_states.config import knob_options
from ..runtime import builds

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "row_rstd.cu"
KERNEL_NAME = "kda_row_rstd"
WARPS = 8                  # a CTA's warps (row_rstd.cu's RR_THREADS / 32): 16 rows a step, one a half-warp
DEPTHS = (1, 2, 4, 8)      # Config.depth: each thread's rows in flight
THREADS_PER_SM = 2048      # an H100's / H200's resident threads, the grid's 8 CTAs of 256 an SM
KNOB_MACROS = {"depth": "RR_DEPTH"}
COMPILER_FLAGS = ("lineinfo",)

__all__ = ["Config", "options", "all_variants", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "WARPS",
           "DEPTHS", "KNOB_MACROS", "COMPILER_FLAGS"]


@dataclasses.dataclass(frozen=True)
class Config:
    depth: int = 4           # rows a thread has in flight, one 16-byte load each: at 8 CTAs an SM, 4 put 128 KB of
                             # loads in flight an SM, past what the DRAM's bandwidth times its latency asks for
                             # (about 36 KB an SM at 4.8 TB/s, 132 SMs and ~1 us), within 32 registers
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        builds.check_choice(self, "depth", DEPTHS)
        builds.check_flags(self, "lineinfo")

    @property
    def threads(self) -> int:
        return 32 * WARPS

    @property
    def ctas_per_sm(self) -> int:
        """The CTAs an SM the build's launch bounds ask for, and so the grid's: every thread an SM can hold,
        but for depth 8, whose 8 loads of 4 registers each leave too few of 32 (row_rstd.cu's RR_MIN_CTAS)."""
        return THREADS_PER_SM // self.threads // (2 if self.depth == 8 else 1)

    @property
    def rows_per_step(self) -> int:
        """The rows a CTA reads in one step of its loop: a row a half-warp, ``depth`` of them."""
        return 2 * WARPS * int(self.depth)

    def name(self) -> str:
        return f"d{self.depth}"


def options(cfg: Config) -> tuple[str, ...]:
    """-ftz=true as every kernel here, -DRR_DEPTH, -lineinfo if asked, and the source's directory
    (kernel.forward_states.config.knob_options). Not -use_fast_math: the division and the square root stay
    correctly rounded (-prec-div, -prec-sqrt)."""
    return knob_options(cfg, KNOB_MACROS, SOURCE_DIR)


def all_variants() -> list[Config]:
    """Every configuration the launch can be given."""
    return [Config(depth=d) for d in DEPTHS]


BUILD = builds.KernelBuild(title="the rstd pass", entry=SOURCE_PATH, headers=(), function=KERNEL_NAME,
                           constants="rr", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"row-rstd-{cfg.name()}",
                           required_sass=lambda cfg: ("LDG",))
