"""The products pass's build: its knobs (:class:`Config`: the form of the gate and of q and k it takes), its
options and ``BUILD``, the description the tools and CI compile it by. The entry file sits in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..forward_states.config import knob_options
from ..runtime import builds

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward_products.cu"
KERNEL_NAME = "kda_forward_products"

__all__ = ["Config", "options", "all_variants", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "KNOB_MACROS"]


@dataclasses.dataclass(frozen=True)
class Config:
    token_gate: bool = False   # g is each token's natural-log gate, which the pass sums over each chunk itself
                               # (kernel.shapes.tile_gate_sums' rule), instead of FLA's 64-chunk cumsum in log2
    l2norm: bool = False       # q and k as the caller has them: the pass l2-normalises them (FLA's l2norm_fwd) and
                               # one CTA a (chunk, query head) writes them normalised with each row's rstd
    lineinfo: bool = False     # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        builds.check_flags(self, "token_gate", "l2norm", "lineinfo")

    def name(self) -> str:
        return "products" + ("-tg" if self.token_gate else "") + ("-l2" if self.l2norm else "")


# Config field -> the device source's macro; the source stops with an #error naming a missing one.
KNOB_MACROS = {"token_gate": "FP_TOKEN_GATE", "l2norm": "FP_L2NORM"}


def options(cfg: Config) -> tuple[str, ...]:
    """-ftz=true as every kernel here (exp2f as one MUFU.EX2), one -D a knob, -lineinfo if asked, the
    source's directory (kernel.forward_states.config.knob_options)."""
    return knob_options(cfg, KNOB_MACROS, SOURCE_DIR)


def all_variants() -> list[Config]:
    """Every build the pass launches: either form of the gate, q and k normalised by the caller or here."""
    return [Config(token_gate=token_gate, l2norm=l2norm) for l2norm in (False, True) for token_gate in (False, True)]


BUILD = builds.KernelBuild(title="the forward's products pass", entry=SOURCE_PATH,
                           headers=("../../forward/cuda/forward_solve.cuh", "../../forward/cuda/forward_l2norm.cuh"),
                           function=KERNEL_NAME, constants="fp", default=Config, options=options,
                           variants=all_variants, label=lambda cfg: cfg.name(),
                           required_sass=lambda cfg: ("HMMA", "LDSM", "LDGSTS"))
