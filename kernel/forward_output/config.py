"""The o pass's build: its one knob (:class:`Config`: the warps of a CTA), its options, every variant the
launch can pick, and ``BUILD``, the description the tools and CI compile it by. The entry file sits in
``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..ds_scan.config import FAST_MATH
from ..runtime import builds

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward_output.cu"
KERNEL_NAME = "kda_forward_output"
WARPS = (4, 8)     # Config.warps: 4 warps own 16 o rows each and all 128 v columns; 8 split the v columns in two
KNOB_MACROS = {"warps": "FO_WARPS"}
COMPILER_FLAGS = ("lineinfo",)

__all__ = ["Config", "options", "all_variants", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "WARPS",
           "KNOB_MACROS", "COMPILER_FLAGS"]


@dataclasses.dataclass(frozen=True)
class Config:
    warps: int = 4     # a CTA's 86 KB of tiles allow two CTAs an SM either way; 4 warps load each A fragment
                       # (qg's, Aqk's rows) once, 8 put twice the threads on the copies (not yet measured)
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        builds.check_choice(self, "warps", WARPS)
        builds.check_flags(self, "lineinfo")

    @property
    def threads(self) -> int:
        return 32 * int(self.warps)

    def name(self) -> str:
        return f"w{self.warps}"


def options(cfg: Config) -> tuple[str, ...]:
    """-ftz=true as every kernel here, -DFO_WARPS, -lineinfo if asked, and the source's directory."""
    return (*FAST_MATH, f"-DFO_WARPS={int(cfg.warps)}", *(("-lineinfo",) if cfg.lineinfo else ()), f"-I{SOURCE_DIR}")


def all_variants() -> list[Config]:
    """Every configuration the launch can be given."""
    return [Config(warps=w) for w in WARPS]


BUILD = builds.KernelBuild(title="the o pass", entry=SOURCE_PATH, headers=(), function=KERNEL_NAME,
                           constants="fo", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"output-{cfg.name()}",
                           required_sass=lambda cfg: ("HMMA", "LDSM", "STSM", "LDGSTS"))
