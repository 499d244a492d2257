"""The products pass's build: it has no knob (one variant, :class:`Config`), its options and ``BUILD``,
the description the tools and CI compile it by. The entry file sits in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..ds_scan.config import FAST_MATH
from ..runtime import builds

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward_products.cu"
KERNEL_NAME = "kda_forward_products"

__all__ = ["Config", "options", "all_variants", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME"]


@dataclasses.dataclass(frozen=True)
class Config:
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        if not isinstance(self.lineinfo, bool):
            raise ValueError(f"Config.lineinfo must be True or False, got {self.lineinfo!r}")

    def name(self) -> str:
        return "one"


def options(cfg: Config) -> tuple[str, ...]:
    """-ftz=true as every kernel here (exp2f as one MUFU.EX2), -lineinfo if asked, the source's directory."""
    return (*FAST_MATH, *(("-lineinfo",) if cfg.lineinfo else ()), f"-I{SOURCE_DIR}")


def all_variants() -> list[Config]:
    return [Config()]


BUILD = builds.KernelBuild(title="the forward's products pass", entry=SOURCE_PATH,
                           headers=("../../forward/cuda/forward_solve.cuh",), function=KERNEL_NAME,
                           constants="fp", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: "products", required_sass=lambda cfg: ("HMMA", "LDSM", "LDGSTS"))
