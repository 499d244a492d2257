"""The forward's build: its knobs (one frozen :class:`Config`), their -D options, every variant the
launch can pick (the auto rule: :func:`auto_config`, the grid shape from Kernel S's
:func:`kernel.forward_states.choose_warps`) and ``BUILD``, the description the tools and CI compile it
by. The entry file and its headers sit in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path


from ..forward_states.config import (G6_SPLITS, NSTAGES, PRODUCERS, SMEM_OPTIN, WARPS, ScanShape, check_knobs,
                                     choose_warps, knob_options)
from ..runtime import builds
from ..shapes import HEAD_DIM, TILE_TOKENS

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward.cu"
KERNEL_NAME = "kda_forward"
MAX_WARPS = 12          # warps + producers: 384 threads leave 168 registers a thread
MAX_STAGES = 6          # the auto rule's deepest ring: 4 tiles of the chain cover a loaded DRAM latency (Kernel S's)

__all__ = ["Config", "options", "header_digest", "source", "all_variants", "choose_warps", "auto_config",
           "smem_bytes", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "KNOB_MACROS", "COMPILER_FLAGS",
           "WARPS", "PRODUCERS", "NSTAGES", "G6_SPLITS", "SMEM_OPTIN"]


def smem_bytes(warps: int, producers: int, nstage: int) -> int:
    """Dynamic shared memory per CTA, as the source's Shared lays it out (kf_smem_bytes): the stages,
    the producers' scratch (Qe, Ke by tile parity, the solve's Lkk, the span flags) and the consumers'
    staging tiles."""
    op = TILE_TOKENS * (HEAD_DIM + 8) * 2            # a bf16 [16][136] operand
    blk = TILE_TOKENS * (TILE_TOKENS + 8) * 2        # a bf16 [16][24] block
    stage = (TILE_TOKENS * HEAD_DIM * 4 + 2 * producers * HEAD_DIM * 4 + 2 * TILE_TOKENS * HEAD_DIM * 2 + 3 * op
             + HEAD_DIM * 4 + TILE_TOKENS * 16 * warps * 2 + 2 * blk + 2 * TILE_TOKENS * 4)
    scratch = 4 * op + TILE_TOKENS * (TILE_TOKENS + 1) * 4 + 2 * producers * 4
    scratch = -(-scratch // 16) * 16
    return nstage * stage + scratch + warps * HEAD_DIM * (16 + 8) * 2


# ----------------------------------------------------------------------------
# the knobs: one frozen Config, its -D options
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config(ScanShape):   # vgroups, threads and name() as Kernel S's Config
    warps: int = 8      # consumer warps per CTA = v rows / 16 a CTA owns (choose_warps, as Kernel S)
    producers: int = 2  # producer warps: loads, R1, Mqk (warp 0) and INV (the last); 2 beside 8 consumers
                        # leave 168 registers a thread without a spill (4 spill there)
    nstage: int = 4     # ring depth: loads run nstage - 1 tiles ahead of R1, which runs one ahead of the chain
    g6_split: int = 4   # independent accumulator pairs of P^T = S^T Kd^T: Kernel S's, so the states are its bits
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        check_knobs(self, max_warps=MAX_WARPS, registers=168)

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.warps, self.producers, self.nstage)


# Config field -> the device source's macro; the source stops with an #error naming a missing one.
KNOB_MACROS = {"warps": "KF_WARPS", "producers": "KF_PRODUCERS", "nstage": "KF_NSTAGE", "g6_split": "KF_G6_SPLIT"}
COMPILER_FLAGS = ("lineinfo",)   # Config fields that are nvcc options, not knobs of the source


def options(cfg: Config) -> tuple[str, ...]:
    """The forward's build options for ``cfg`` (Kernel S's :func:`kernel.forward_states.config.knob_options`)."""
    return knob_options(cfg, KNOB_MACROS, SOURCE_DIR)


def header_digest() -> str:
    """sha256 over the headers the source can include: ptx_lab's, this kernel's own (forward_*.cuh) and the
    Kernel S headers it includes (HEADERS)."""
    return BUILD.header_digest()


def source() -> str:
    """The source with header_digest() as a first-line comment (BUILD.source)."""
    return BUILD.source()


def auto_config(warps: int) -> Config:
    """The launch's configuration for `warps` consumer warps: 4 producers (2 beside 8 consumers, for
    the registers), the G6 split by 4, and the deepest ring of at most MAX_STAGES that fits."""
    producers = 2 if warps == 8 else 4
    for nstage in range(MAX_STAGES, 1, -1):
        if smem_bytes(warps, producers, nstage) <= SMEM_OPTIN:
            return Config(warps=warps, producers=producers, nstage=nstage, g6_split=4)
    raise AssertionError(f"no ring fits {warps} consumer warps")   # unreachable: 2 stages always fit


def all_variants() -> list[Config]:
    """Every configuration the forward launches (the auto rule picks warps, the rest follows)."""
    return [auto_config(w) for w in WARPS]


# its own headers, and the four of Kernel S's it includes (its copies, gate, step of the chain and walk over
# the tiles): the digest must follow them all
HEADERS = ("forward_*.cuh", *(f"../../forward_states/cuda/forward_states_{name}.cuh"
                              for name in ("copies", "gate", "chain", "walk")))

BUILD = builds.KernelBuild(title="the forward (kda_forward)", entry=SOURCE_PATH, headers=HEADERS,
                           function=KERNEL_NAME, constants="kf", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"forward-{cfg.name()}",
                           required_sass=lambda cfg: ("HMMA", "LDSM", "LDGSTS", "STSM"))
