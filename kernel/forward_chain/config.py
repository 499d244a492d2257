"""The forward chain's build: its one knob (:class:`Config`: the ring's depth), its options, every
variant the launch can pick, and ``BUILD``, the description the tools and CI compile it by. The entry
file sits in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..ds_scan.config import FAST_MATH
from ..runtime import builds

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward_chain.cu"
KERNEL_NAME = "kda_forward_chain"
NSTAGES = (2, 3, 4)     # Config.nstage: ring stages of 38 KB (w, kg, u and the decay of one chunk)
KNOB_MACROS = {"nstage": "FC_NSTAGE"}
COMPILER_FLAGS = ("lineinfo",)

__all__ = ["Config", "options", "all_variants", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "NSTAGES",
           "KNOB_MACROS", "COMPILER_FLAGS"]


@dataclasses.dataclass(frozen=True)
class Config:
    nstage: int = 3    # the producer's copies run nstage - 1 steps ahead of the chain: at about 1 us a
                       # step, 2 steps cover a loaded DRAM latency with room to spare
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        builds.check_choice(self, "nstage", NSTAGES)
        builds.check_flags(self, "lineinfo")

    def name(self) -> str:
        return f"st{self.nstage}"


def options(cfg: Config) -> tuple[str, ...]:
    """-ftz=true as every kernel here, -DFC_NSTAGE, -lineinfo if asked, and the source's directory."""
    return (*FAST_MATH, f"-DFC_NSTAGE={int(cfg.nstage)}", *(("-lineinfo",) if cfg.lineinfo else ()), f"-I{SOURCE_DIR}")


def all_variants() -> list[Config]:
    """Every configuration the launch can be given."""
    return [Config(nstage=n) for n in NSTAGES]


BUILD = builds.KernelBuild(title="the forward chain", entry=SOURCE_PATH, headers=(), function=KERNEL_NAME,
                           constants="fc", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"chain-{cfg.name()}",
                           required_sass=lambda cfg: ("HMMA", "LDSM", "STSM", "UTMALDG", "UTMASTG"))
