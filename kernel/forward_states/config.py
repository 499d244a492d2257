"""Kernel S's build: its knobs (one frozen :class:`Config`), their -D options, every variant the
launch can pick (the auto rule: :func:`choose_warps`, :func:`auto_config`) and ``BUILD``, the
description the tools and CI compile it by. The entry file and its headers sit in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..ds_scan.config import FAST_MATH
from ..runtime import builds
from ..shapes import HEAD_DIM, TILE_TOKENS

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward_states.cu"
KERNEL_NAME = "kda_forward_states"
WARPS = (1, 2, 4, 8)    # Config.warps: consumer warps, 16 v rows of S^T each, 128 / (16 warps) CTAs per (sequence, head)
PRODUCERS = (1, 2, 4, 8)   # Config.producers: 16 / producers tile rows loaded and rebuilt by each producer warp
NSTAGES = (2, 3, 4, 5, 6, 7)   # FULL and EMPTY per stage: 2 nstage of the 15 named barriers
G6_SPLITS = (1, 2, 4)
MAX_WARPS = 12          # warps + producers: 384 threads leave 168 registers a thread (ptxas: 0 spills)
SMEM_OPTIN = 232448     # H100 / H200: dynamic shared memory a CTA may opt in to (227 KB)

__all__ = ["Config", "ScanShape", "options", "knob_options", "header_digest", "source", "all_variants",
           "choose_warps", "auto_config", "check_knobs", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "KNOB_MACROS", "COMPILER_FLAGS"]


# ----------------------------------------------------------------------------
# the knobs: one frozen Config, its -D options
# ----------------------------------------------------------------------------

class ScanShape:
    """What a scan's Config derives from its knobs (warps, producers, nstage, g6_split): Kernel S's, and
    the forward's, which has the same knobs. The base of both frozen dataclasses, which hold the fields."""

    @property
    def vgroups(self) -> int:
        """CTAs per (sequence, head): each owns 16 * warps of the 128 v rows."""
        return HEAD_DIM // (16 * self.warps)

    @property
    def threads(self) -> int:
        return 32 * (self.warps + self.producers)

    def name(self) -> str:
        return f"w{self.warps}-p{self.producers}-st{self.nstage}-g{self.g6_split}"


@dataclasses.dataclass(frozen=True)
class Config(ScanShape):
    warps: int = 8      # consumer warps per CTA = v rows / 16 a CTA owns; fewer where few (sequence, head)
                        # pairs would leave SMs idle (choose_warps)
    producers: int = 4  # producer warps per CTA: loads and R1 (Kd, Kr, gamma); 4 puts one on every SM
                        # sub-partition, so R1's 2 exp2 an element spread over all four MUFU units
    nstage: int = 6     # ring depth; loads run nstage - 1 tiles ahead of R1, which runs one ahead of
                        # the consumers: nstage - 2 tiles of the chain hide a tile's global-memory latency
    g6_split: int = 4   # independent accumulator pairs of P^T = S^T Kd^T (8 / g6_split dependent MMAs)
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        check_knobs(self, max_warps=MAX_WARPS, registers=160)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA, as the source's Shared lays it out (fs_smem_bytes)."""
        stage = (TILE_TOKENS * HEAD_DIM * 4 + 2 * self.producers * HEAD_DIM * 4 + TILE_TOKENS * HEAD_DIM * 2 + 2 * TILE_TOKENS * (HEAD_DIM + 8) * 2 + HEAD_DIM * 4
                 + TILE_TOKENS * 16 * self.warps * 2 + TILE_TOKENS * (TILE_TOKENS + 8) * 2 + TILE_TOKENS * 4)
        return self.nstage * stage + self.warps * HEAD_DIM * (16 + 8) * 2


# Config field -> the device source's macro; the source stops with an #error naming a missing one.
def check_knobs(cfg, *, max_warps: int, registers: int, extra_warps: tuple[str, ...] = ()) -> None:
    """The knob checks of a scan's Config (Kernel S's, and the forward's, which has the same knobs):
    each value among its allowed ones, every warp of the CTA (cfg.threads: the consumers, the producers
    and any warps of ``extra_warps``, Config fields the caller checked) within ``max_warps`` (``registers``:
    what a consumer thread needs, for the message), the shared memory within the SM's opt-in limit."""
    for name, allowed in (("warps", WARPS), ("producers", PRODUCERS), ("nstage", NSTAGES), ("g6_split", G6_SPLITS)):
        builds.check_choice(cfg, name, allowed)
    builds.check_flags(cfg, "lineinfo")
    if cfg.threads // 32 > max_warps:
        parts = ["warps", "producers", *(f for f in extra_warps if getattr(cfg, f))]
        raise ValueError(f"{' + '.join(f'Config.{f}' for f in parts)} must be at most {max_warps}, got "
                         f"{' + '.join(str(getattr(cfg, f)) for f in parts)}: a consumer thread needs ~{registers} "
                         f"registers and the SM has 64K")
    if cfg.smem_bytes > SMEM_OPTIN:
        raise ValueError(f"Config {cfg.name()} needs {cfg.smem_bytes} B of shared memory per CTA, more than "
                         f"the {SMEM_OPTIN} B an H100 / H200 CTA may have: use fewer stages (Config.nstage)")


KNOB_MACROS = {"warps": "FS_WARPS", "producers": "FS_PRODUCERS", "nstage": "FS_NSTAGE", "g6_split": "FS_G6_SPLIT"}
COMPILER_FLAGS = ("lineinfo",)   # Config fields that are nvcc options, not knobs of the source


def knob_options(cfg: ScanShape, knob_macros: dict[str, str], source_dir: Path) -> tuple[str, ...]:
    """What every build of a scan passes: -ftz=true (exp2f as one MUFU.EX2, kernel.ds_scan.config.FAST_MATH),
    one -D per knob (``knob_macros``: Config field -> the source's macro), -lineinfo if asked, and the
    source's directory (NVRTC compiles the text and has no file to look beside)."""
    return (*FAST_MATH, *(f"-D{macro}={int(getattr(cfg, field))}" for field, macro in knob_macros.items()),
            *(("-lineinfo",) if cfg.lineinfo else ()), f"-I{source_dir}")


def options(cfg: Config) -> tuple[str, ...]:
    """Kernel S's build options for ``cfg`` (:func:`knob_options`)."""
    return knob_options(cfg, KNOB_MACROS, SOURCE_DIR)


def header_digest() -> str:
    """sha256 over the headers the source can include: ptx_lab's and this kernel's own
    (forward_states_*.cuh), names and contents (BUILD.header_digest)."""
    return BUILD.header_digest()


def source() -> str:
    """The source with header_digest() as a first-line comment (BUILD.source)."""
    return BUILD.source()


def all_variants() -> list[Config]:
    """Every configuration forward_states launches (the auto rule picks warps, the rest follows)."""
    return [auto_config(w) for w in WARPS]


def choose_warps(pairs: int, sm_count: int) -> int:
    """Most consumer warps per CTA (fewest CTAs, each rebuilding Kd and Kr once for more v rows) whose
    grid of pairs * 128 / (16 warps) CTAs still covers ~90% of the SMs; pairs = sequences x heads."""
    for w in sorted(WARPS, reverse=True):
        if pairs * (HEAD_DIM // (16 * w)) >= 0.9 * sm_count:
            return w
    return min(WARPS)


def auto_config(warps: int) -> Config:
    """The launch's configuration for `warps` consumer warps: 4 producers, the G6 split by 4, and the
    deepest ring (at most 6 stages: 4 tiles of the chain, ~1.2 us, cover a loaded DRAM latency) that
    fits the SM's shared memory."""
    for nstage in (6, 5, 4, 3, 2):
        cfg = Config(warps=warps, producers=4, nstage=nstage, g6_split=4)
        if cfg.smem_bytes <= SMEM_OPTIN:
            return cfg
    raise AssertionError(f"no ring fits {warps} consumer warps")   # unreachable: 2 stages always fit



BUILD = builds.KernelBuild(title="Kernel S (the forward-state scan)", entry=SOURCE_PATH, headers="forward_states_*.cuh",
                           function=KERNEL_NAME, constants="fs", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"states-{cfg.name()}",
                           required_sass=lambda cfg: ("HMMA", "LDSM", "LDGSTS", "STSM"))
