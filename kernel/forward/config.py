"""The forward's build: its knobs (one frozen :class:`Config`), their -D options, every variant the
launch can pick (the auto rule: :func:`auto_config`, the grid shape from Kernel S's
:func:`kernel.forward_states.choose_warps`) and ``BUILD``, the description the tools and CI compile it
by. The entry file and its headers sit in ``cuda/``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ptx_lab import ring
from ptx_lab.ring import MAX_BARRIER_ID

from ..forward_states.config import (G6_SPLITS, NSTAGES, PRODUCERS, SMEM_OPTIN, WARPS, ScanShape, check_knobs,
                                     choose_warps, knob_options)
from ..runtime import builds
from ..shapes import HEAD_DIM, TILE_TOKENS

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "forward.cu"
KERNEL_NAME = "kda_forward"
MAX_WARPS = 12          # warps + producers + product warps: 384 threads leave 168 registers a thread
MAX_STAGES = 6          # the auto rule's deepest ring: 4 tiles of the chain cover a loaded DRAM latency (Kernel S's)
PRODUCT_WARPS = (0, 2)  # Config.product_warps: none (two producer warps form Mqk and INV), or one warp each

__all__ = ["Config", "options", "header_digest", "source", "all_variants", "choose_warps", "auto_config",
           "smem_bytes", "barrier_ids", "max_stages", "BUILD", "PRODUCT_WARPS", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "KNOB_MACROS", "COMPILER_FLAGS",
           "WARPS", "PRODUCERS", "NSTAGES", "G6_SPLITS", "SMEM_OPTIN"]


def smem_bytes(warps: int, producers: int, nstage: int, mbarrier_ring: bool = False, qk_rstd: bool = False) -> int:
    """Dynamic shared memory per CTA, as the source's Shared lays it out (kf_smem_bytes): the stages,
    the producers' scratch (Qe, Ke by tile parity, the solve's Lkk, the span flags) and the consumers'
    staging tiles; in the checking build (``mbarrier_ring``) its mbarriers after them (the ring's
    2 nstage, R1_DONE's and PRODUCTS_DONE's 2 each and the producers' one, 8 bytes each); in the qk_rstd
    build each stage's 16 rstd of q and of k after those (fp32)."""
    op = TILE_TOKENS * (HEAD_DIM + 8) * 2            # a bf16 [16][136] operand
    blk = TILE_TOKENS * (TILE_TOKENS + 8) * 2        # a bf16 [16][24] block
    stage = (TILE_TOKENS * HEAD_DIM * 4 + 2 * producers * HEAD_DIM * 4 + 2 * TILE_TOKENS * HEAD_DIM * 2 + 3 * op
             + HEAD_DIM * 4 + TILE_TOKENS * 16 * warps * 2 + 2 * blk + 2 * TILE_TOKENS * 4)
    scratch = 4 * op + TILE_TOKENS * (TILE_TOKENS + 1) * 4 + 2 * producers * 4
    scratch = -(-scratch // 16) * 16
    return (nstage * stage + scratch + warps * HEAD_DIM * (16 + 8) * 2 + (8 * (2 * nstage + 5) if mbarrier_ring else 0)
            + (2 * nstage * TILE_TOKENS * 4 if qk_rstd else 0))


def barrier_ids(nstage: int, product_warps: int) -> dict[str, list[int] | int]:
    """The named barriers as forward_layout.cuh numbers them: the ring's FULL(s) and EMPTY(s) (ptx_lab.ring's
    barrier_ids from id 1), then the producers' barrier, then with product warps R1_DONE and PRODUCTS_DONE,
    one per tile parity; "end" is the first id after them (at most 16)."""
    ids = ring.barrier_ids(nstage)
    ids["producers"] = ids["end"]
    end = ids["producers"] + 1
    if product_warps:
        ids["r1_done"], ids["products_done"] = [end, end + 1], [end + 2, end + 3]
        end += 4
    ids["end"] = end
    return ids


def max_stages(product_warps: int) -> int:
    """The deepest ring whose barriers fit ids 1..15 beside the others: 7, and 5 with product warps."""
    return max(n for n in range(1, 8) if barrier_ids(n, product_warps)["end"] <= MAX_BARRIER_ID + 1)


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
    product_warps: int = 0   # 2: Mqk and INV on two warps of their own, a tile behind R1, so that R1 of the next
                             # tile overlaps them (0: two producer warps form them after R1); nstage then <= 5
    mbarrier_ring: bool = False   # the checking build: every hand-off between warps on mbarriers, which
                                  # compute-sanitizer's racecheck follows (not a launch's choice: slower)
    token_gate: bool = False   # g is each token's natural-log gate, which R1 sums within the tile itself
                               # (kernel.shapes.tile_gate_sums), instead of FLA's 64-chunk cumsum in log2
    l2norm: bool = False       # q and k as the caller has them: R1 l2-normalises them (FLA's l2norm_fwd) and one
                               # CTA a (sequence, query head) writes them normalised with each row's rstd
    qk_rstd: bool = False      # q and k as the caller has them, with each row's rstd given (kernel.row_rstd's):
                               # copied with the tile, R1 scales each row by it; no norm is formed here
    timing: bool = False       # the clock accounting of each role's slots of a tile (forward_timing.cuh, for
                               # kernel.tools.profile --kernel f; the same arithmetic)
    lineinfo: bool = False   # -lineinfo, so compute-sanitizer and ncu name source lines (not a knob)

    def __post_init__(self):
        pw = self.product_warps
        builds.check_choice(self, "product_warps", PRODUCT_WARPS)
        builds.check_flags(self, "mbarrier_ring", "token_gate", "l2norm", "qk_rstd", "timing")
        if self.l2norm and self.qk_rstd:
            raise ValueError("Config.l2norm and Config.qk_rstd are two forms of raw q and k: at most one")
        # the barriers before the shared memory (check_knobs), which a ring too deep may also overflow
        if self.nstage in NSTAGES and not isinstance(self.nstage, (bool, np.bool_)) and self.nstage > max_stages(pw):
            raise ValueError(f"Config.nstage must be at most {max_stages(pw)} with {pw} product warps, got "
                             f"{self.nstage}: the ring's 2 nstage named barriers, the producers' one and the "
                             f"product warps' 4 must fit ids 1..{MAX_BARRIER_ID}")
        check_knobs(self, max_warps=MAX_WARPS, registers=168, extra_warps=("product_warps",))

    @property
    def threads(self) -> int:
        return 32 * (self.warps + self.producers + self.product_warps)

    def name(self) -> str:
        return (super().name() + (f"-pw{self.product_warps}" if self.product_warps else "")
                + ("-mb" if self.mbarrier_ring else "") + ("-tg" if self.token_gate else "")
                + ("-l2" if self.l2norm else "") + ("-rs" if self.qk_rstd else "")
                + ("-timing" if self.timing else ""))

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.warps, self.producers, self.nstage, self.mbarrier_ring, self.qk_rstd)


# Config field -> the device source's macro; the source stops with an #error naming a missing one.
KNOB_MACROS = {"warps": "KF_WARPS", "producers": "KF_PRODUCERS", "nstage": "KF_NSTAGE", "g6_split": "KF_G6_SPLIT",
               "product_warps": "KF_PRODUCT_WARPS", "mbarrier_ring": "KF_MBARRIER_RING", "token_gate": "KF_TOKEN_GATE",
               "l2norm": "KF_L2NORM", "qk_rstd": "KF_QK_RSTD", "timing": "KF_TIMING"}
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


def auto_config(warps: int, token_gate: bool = False, l2norm: bool = False, qk_rstd: bool = False) -> Config:
    """The launch's configuration for `warps` consumer warps, the G6 split by 4, and the deepest ring of at
    most MAX_STAGES that fits (and whose barriers fit):
    - beside 1 or 2 consumer warps, 4 producers and 2 product warps: with few consumers R1 and the
      products in series bind the tile, so the products go to warps of their own, and R1 keeps 4 warps
      (at one sequence of 131072 tokens, 16 heads, 1 consumer warp: 1.26 us a tile against 1.62);
    - beside 4, 2 producers and 2 product warps: 4 producers with 2 product warps would make 10 warps,
      which cap a thread at 168 registers (ptxas gives each of the SM's 4 schedulers' 16K to its
      ceil(warps / 4) warps) and spill; with R1 on 2 warps and the products off it the tile is still
      faster than on 4 producers without product warps (4 x 8192, 16 heads: 1.053 against 1.116 ms);
    - beside 8, 2 producers, and 2 product warps where the producers carry more than the plain build's
      work (each token's gate, the l2norm or the rstd fold): on the op's form (each token's gate and each
      row's rstd), 32 x 8192, 32 heads, 11.53 ms against 13.74 without product warps and 11.89 on 4
      producers, the same bits, so there the producers bound the tile. The plain build keeps none: its
      consumers' chain binds it, and with them it spills 4 bytes at the 168 registers 12 warps leave.
    ``token_gate``: the build that reads each token's gate (Config.token_gate); ``l2norm``: the build that
    normalises q and k itself (Config.l2norm); ``qk_rstd``: the build that scales them by rstd it is given
    (Config.qk_rstd)."""
    producers = 4 if warps <= 2 else 2
    product_warps = 2 if warps <= 4 or token_gate or l2norm or qk_rstd else 0
    for nstage in range(min(MAX_STAGES, max_stages(product_warps)), 1, -1):
        if smem_bytes(warps, producers, nstage, qk_rstd=qk_rstd) <= SMEM_OPTIN:
            return Config(warps=warps, producers=producers, nstage=nstage, g6_split=4, product_warps=product_warps,
                          token_gate=token_gate, l2norm=l2norm, qk_rstd=qk_rstd)
    raise AssertionError(f"no ring fits {warps} consumer warps")   # unreachable: 2 stages always fit


def all_variants() -> list[Config]:
    """Every configuration the forward launches (the auto rule picks warps, the rest follows), on either
    form of the gate, with q and k normalised by the caller, by the forward, or by the rstd it is given; and
    the timing build of each plain one (``ptx-lab profile --kernel f``)."""
    forms = (dict(), dict(l2norm=True), dict(qk_rstd=True))
    return ([auto_config(w, token_gate, **form) for form in forms for token_gate in (False, True) for w in WARPS]
            + [dataclasses.replace(auto_config(w), timing=True) for w in WARPS])


# its own headers, the four of Kernel S's it includes (its copies, gate, step of the chain and walk over the
# tiles) and the kernels' lap timer: the digest must follow them all
HEADERS = ("forward_*.cuh", *(f"../../forward_states/cuda/forward_states_{name}.cuh"
                              for name in ("copies", "gate", "chain", "walk")), "../../lap_timer.cuh")

BUILD = builds.KernelBuild(title="the forward (kda_forward)", entry=SOURCE_PATH, headers=HEADERS,
                           function=KERNEL_NAME, constants="kf", default=Config, options=options, variants=all_variants,
                           label=lambda cfg: f"forward-{cfg.name()}",
                           required_sass=lambda cfg: ("HMMA", "LDSM", "LDGSTS", "STSM"))
