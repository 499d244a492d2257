"""Kernel A's compile-time configurations: one source, one set of -D options.

Every knob of the kernel is a field of :class:`Config`, and this module is the only
place that gives one a value: its default, its auto rule (in ``__post_init__``, each
one measured on the H200; the figures are in docs/tuning-rules.md) and its checks.
:func:`defines` passes every knob to the device source, which derives its constants
from them and stops with an ``#error`` where one is missing. The API (`kernel.ds_scan.launch`),
the offline resource report (`ptx-lab resources`) and CI all build
``kernel/ds_scan/cuda/dstate_scan.cu`` with :func:`options`, so what CI checks
(registers, spills, SASS) is exactly what the API launches.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from ..runtime.builds import KernelBuild
from ..shapes import HEAD_DIM, TILE_TOKENS

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
SOURCE_PATH = SOURCE_DIR / "dstate_scan.cu"   # the entry file; its headers sit beside it
KERNEL_NAME = "kda_dstate_scan"
VSPLITS = (1, 2, 4, 8)
LOADS_CP_ASYNC, LOADS_TMA = 1, 2                  # Config.loads (the kernel's LOADS)
SNAP_DIRECT, SNAP_STAGED, SNAP_TMA = 1, 2, 3      # Config.snap_store (the kernel's SNAP_STORE)
REGS_PER_SM = 65536                               # the register file a CTA's launch divides


def _c_div(a: int, b: int) -> int:
    """a / b as C's integer division (truncates toward zero), as the device source computes it."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


@dataclasses.dataclass(frozen=True)
class Config:
    # What the API's arguments choose (all_variants() is every combination of them).
    vsplit: int = 1          # CTAs per (sequence, head); each owns D / vsplit v columns
    snap_bf16: bool = False  # snapshot dtype bf16 (else fp32)
    snap_every: int = 1      # snapshot every tile (1) or every 4th tile (4: FLA's dh)
    has_dht: bool = False    # initial dS from dht (else zeros)
    l2norm: bool = True      # l2-normalise q and k rows in R1 (the step that rebuilds qd/kd/kr on chip)
    fla_inputs: bool = False # gc, mqk, inv are FLA's forward tensors as stored: its 64-chunk-local g and
                             # the 64-wide Aqk / Akk, whose 16 x 16 diagonal blocks are read in place
                             # (lower triangle only) and whose gate is rebased per tile on chip
    token_gate: bool = False # with fla_inputs: gc holds each token's natural-log gate instead of FLA's cumsum,
                             # and R1 sums it over the tile (kernel.shapes.tile_gate_sums) after a producers'
                             # barrier
    summary: bool = False    # pass 1 of the sequence split (kernel.ds_scan.split): no snapshots; the grid's y
                             # index is the CTA's role, 0 = the segment's scan from dS = 0 (its d, out
                             # to dh0), 1 = its scan of the identity with do = 0 (its M, out over the
                             # snapshots pointer)
    # Tuning knobs. 0 (or -1 where 0 means off) = auto, by the rules in __post_init__.
    nstage: int = 0          # input ring depth; loads run nstage - 1 tiles ahead. Auto: 4, or 3 where
                             # 4 would leave too few named barriers (FULL and EMPTY per stage, and with
                             # ksplit 2 one per band: 15 besides __syncthreads)
    g2_split: int = 0        # independent accumulator chains in G2 (dS path: 2 dependent MMAs, not 8)
    producers: int = 0       # producer warps (cp.async + R1); fewer leave the consumers more registers
    mt: int = 0              # 16-wide v m-tiles per consumer warp (2: each kr/qd/kd fragment
                             # feeds two MMAs, half the consumers' shared-memory reads)
    ksplit: int = 0          # consumer warps per v band (2: each holds half of the k columns;
                             # their G2 partial sums meet in shared memory, a named barrier per band)
    loads: int = 0           # tile inputs by cp.async, 16 bytes a lane (1), or by tensor copies (2: one
                             # instruction per tensor and tile on an mbarrier per stage, host-built
                             # tensor maps, do and Mqk/INV swizzled)
    snap_store: int = 0      # snapshots straight from the accumulators (1, fp32 only), through
                             # a staging tile with 16-byte stores (2), or one tensor store per warp (3)
    wgmma: int = -1          # G4 and G5 as warpgroup MMAs (1) or mma.sync (0); -1 = auto. Needs
                             # 4 consumer warps holding all 128 k (vsplit 1 and 2, ksplit 1); the
                             # kernel runs mma.sync where the target has no wgmma (a plain sm_90 build)
    g4_with_g5: bool = True  # wgmma: G4 is issued beside G5, after G3, not before G3
    snap_late_issue: bool = True   # snap_store 3: the staging tile is written at the tile's start, its
                             # proxy fence and tensor store issued at the tile's end (not right after)
    gt_shared: int = -1      # cp.async loads: a tile's gT (gc of its last token) read from the gc rows the
                             # last producer warp loads for R1, not copied by every producer warp; -1 = auto
    spread_extra: int = -1   # the copies only the consumers read that fit one warp (Mqk, INV, beta) and
                             # the egT row go to producer warps 1-4, not all to warp 0; -1 = auto
    r1_lanes: int = 0        # lanes per token in R1: 32, or 16 (two tokens per warp-wide pass, 4
                             # butterfly levels per norm instead of 5, 16-byte stores); 0 = auto
    regsplit: int = -1       # setmaxnreg (sm_90a): the consumers' warpgroup raises its registers to
                             # consumer_regs, the producers' give theirs back; -1 = auto
    consumer_regs: int = 240 # registers a consumer thread takes with regsplit (setmaxnreg: 24..256, steps of 8)
    timing: bool = False     # clock64 phase accounting into kda_timing[] (kernel.profile only)
    lineinfo: bool = False   # -lineinfo, so ncu / compute-sanitizer name source lines

    def __post_init__(self):
        if self.vsplit not in VSPLITS:
            raise ValueError(f"vsplit must be one of {VSPLITS}, got {self.vsplit}")
        if self.snap_every not in (1, 4):
            raise ValueError(f"snapshot_every must be 1 or 4, got {self.snap_every}")
        if self.summary and (self.has_dht or not self.snap_bf16 or self.snap_every != 4):
            raise ValueError("summary builds start from 0 or the identity (has_dht False) and store no "
                             "snapshots (snap_bf16 True, snap_every 4: the cheapest mode's shared memory)")
        auto = lambda name, value, unset=0: getattr(self, name) == unset and object.__setattr__(self, name, value)
        # vsplit 1 is shared-memory bound: mt 2 halves the consumers' ldmatrix traffic (log 11)
        auto("mt", 2 if self.vsplit == 1 else 1)
        # B = 1 (vsplit 4) is latency bound: two warps per band cut a tile's chain (log 10); with
        # the bf16 tensor store one warp per band is ahead again (log 17)
        auto("ksplit", 2 if self.vsplit == 4 and not self.snap_bf16 else 1)
        auto("g2_split", 4 if self.mt == 1 else 2)     # mt 2: 2 x 2 chains (log 11)
        # the producers set the pace at vsplit 4 and with bf16 snapshots at vsplit 1 (there beside
        # regsplit); fp32 snapshots at vsplit 1 are paced by the consumers' stores (logs 6, 17, 18)
        auto("producers", 8 if self.vsplit == 4 or (self.vsplit == 1 and self.snap_bf16)
             else 2 if self.vsplit == 1 else 4)
        auto("loads", LOADS_CP_ASYNC)                 # tensor-copy loads measured slower (log 15)
        # bf16: one tensor store per warp, off the SM's memory queue (log 14); fp32 staged where
        # throughput counts (vsplit 1), straight from the accumulators where latency does (log 16)
        auto("snap_store", SNAP_TMA if self.snap_bf16 else SNAP_STAGED if self.vsplit == 1 else SNAP_DIRECT)
        if self.loads not in (LOADS_CP_ASYNC, LOADS_TMA):
            raise ValueError(f"loads must be {LOADS_CP_ASYNC} (cp.async) or {LOADS_TMA} (tensor copies), got {self.loads}")
        if self.summary and self.loads != LOADS_CP_ASYNC:
            raise ValueError("summary needs loads 1 (cp.async): its M zero-fills do, which tensor copies cannot")
        if self.token_gate and not self.fla_inputs:
            raise ValueError("token_gate needs fla_inputs: it is FLA's tensors with each token's gate in place of "
                             "the gate's chunk cumsum")
        if self.fla_inputs and self.loads != LOADS_CP_ASYNC:
            raise ValueError("fla_inputs needs loads 1 (cp.async): its lower-triangle block copies are "
                             "cp.async zero-fills, which tensor copies have no form of")
        if self.snap_store not in (SNAP_DIRECT, SNAP_STAGED, SNAP_TMA):
            raise ValueError(f"snap_store must be {SNAP_DIRECT} (direct), {SNAP_STAGED} (staged) or "
                             f"{SNAP_TMA} (tensor store), got {self.snap_store}")
        if self.snap_store == SNAP_DIRECT and self.snap_bf16:
            raise ValueError("snap_store 1 (direct 4-byte stores) is fp32 only; bf16 snapshots go through "
                             "the staging tile (2) or a tensor store (3)")
        if self.ksplit not in (1, 2):
            raise ValueError(f"ksplit must be 1 or 2, got {self.ksplit}")
        if self.mt not in (1, 2) or (HEAD_DIM // self.vsplit) % (16 * self.mt):
            raise ValueError(f"mt must be 1 or 2 with 128 / vsplit = {HEAD_DIM // self.vsplit} a multiple of 16 * mt, "
                             f"got mt {self.mt}")
        wgmma_fits = self.consumers == 4 and self.ksplit == 1
        # G4 and G5 as wgmma wherever the consumers are one warpgroup (log 20)
        auto("wgmma", int(wgmma_fits), unset=-1)
        if self.wgmma not in (0, 1):
            raise ValueError(f"wgmma must be -1 (auto), 0 or 1, got {self.wgmma}")
        if self.wgmma and not wgmma_fits:
            raise ValueError(f"wgmma 1 needs the consumers to be one warpgroup holding all 128 k: 4 consumer warps "
                             f"with ksplit 1; vsplit {self.vsplit}, mt {self.mt}, ksplit {self.ksplit} has "
                             f"{self.consumers} consumer warps")
        pair_bars = self.bands if self.ksplit == 2 else 0
        auto("nstage", 4 if 2 * 4 + pair_bars <= 15 else 3)
        if self.nstage not in (2, 3, 4):
            raise ValueError(f"nstage must be 2, 3 or 4, got {self.nstage}")
        if self.g2_split not in (1, 2, 4):
            raise ValueError(f"g2_split must be 1, 2 or 4, got {self.g2_split}")
        if self.producers not in (2, 4, 8, 16):
            raise ValueError(f"producers must be 2, 4, 8 or 16, got {self.producers}")
        if 2 * self.nstage + pair_bars > 15:
            raise ValueError(f"nstage {self.nstage} with vsplit {self.vsplit} and ksplit {self.ksplit} needs "
                             f"{2 * self.nstage + pair_bars} named barriers, the SM has 15 besides __syncthreads")
        for name in ("g4_with_g5", "snap_late_issue"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"{name} must be 0 or 1 (False or True), got {getattr(self, name)!r}")
        if not self.g4_with_g5 and not self.wgmma:
            raise ValueError("g4_with_g5 0 places G4's warpgroup MMA; this configuration runs G4 and G5 "
                             "on mma.sync (wgmma 0)")
        if not self.snap_late_issue and self.snap_store != SNAP_TMA:
            raise ValueError(f"snap_late_issue 0 places the snapshot's tensor store; this configuration has "
                             f"snap_store {self.snap_store}, not {SNAP_TMA} (tensor store)")
        # the rest depend on the producers, the loads and the ring, resolved above
        auto("gt_shared", self._auto_gt_shared(), unset=-1)
        if self.gt_shared not in (0, 1):
            raise ValueError(f"gt_shared must be -1 (auto), 0 or 1, got {self.gt_shared}")
        if self.gt_shared and self.token_gate:
            raise ValueError("gt_shared 1 shares a copy of gT, which token_gate does not make (R1 sums it)")
        if self.gt_shared and not self._gt_shared_fits:
            raise ValueError(f"gt_shared 1 needs cp.async loads (loads {LOADS_CP_ASYNC}) and nstage 3 or more "
                             f"(the gc rows land two tiles ahead); got loads {self.loads}, nstage {self.nstage}")
        auto("spread_extra", self._auto_spread_extra(), unset=-1)
        if self.spread_extra not in (0, 1):
            raise ValueError(f"spread_extra must be -1 (auto), 0 or 1, got {self.spread_extra}")
        auto("r1_lanes", self._auto_r1_lanes())
        if self.r1_lanes not in (16, 32):
            raise ValueError(f"r1_lanes must be 0 (auto), 16 or 32, got {self.r1_lanes}")
        if self.r1_lanes == 16 and self.tokens_per_producer % 2:
            raise ValueError(f"r1_lanes 16 needs an even number of tokens per producer warp; {self.producers} "
                             f"producers have {self.tokens_per_producer} each")
        if not (24 <= self.consumer_regs <= 256 and self.consumer_regs % 8 == 0):
            raise ValueError(f"consumer_regs must be a multiple of 8 in 24..256 (setmaxnreg), got {self.consumer_regs}")
        auto("regsplit", self._auto_regsplit(), unset=-1)
        if self.regsplit not in (0, 1):
            raise ValueError(f"regsplit must be -1 (auto), 0 or 1, got {self.regsplit}")
        if self.regsplit and not self._regsplit_fits:
            raise ValueError(f"regsplit 1 moves registers between whole warpgroups and must leave the producers "
                             f"56 or more: {self.consumers} consumer and {self.producers} producer warps with "
                             f"consumer_regs {self.consumer_regs} leave them {self.producer_regs}")

    # Auto rules that name() also asks: a knob's name suffix appears where it differs from its rule.
    @property
    def _gt_shared_fits(self) -> bool:
        return self.loads == LOADS_CP_ASYNC and self.nstage >= 3

    def _auto_gt_shared(self) -> int:
        # bf16 snapshots at vsplit 1: 7 of 8 gT copies gone; at B = 1 the owner's wait delays the
        # barrier every producer passes (log 22)
        # (token_gate sums gT in R1: no copy to share)
        return int(self.vsplit == 1 and self.snap_bf16 and self._gt_shared_fits and not self.token_gate)

    def _auto_spread_extra(self) -> int:
        # vsplit 1 with bf16 snapshots: warp 0 issued 9 copies a tile to the others' 6; at B = 1 the
        # copies landed on a warp that was already the busiest (log 23)
        return int(self.vsplit == 1 and self.snap_bf16)

    def _auto_r1_lanes(self) -> int:
        # 16 at vsplit 1 with bf16 snapshots (where the producers pace the tile), 32 elsewhere (logs 20, 23);
        # 32 with token_gate, where each lane sums its columns over all 16 rows (at 16, 8 columns a lane: twice
        # the adds, and the regsplit producer spills)
        return (16 if self.vsplit == 1 and self.snap_bf16 and self.tokens_per_producer % 2 == 0 and not self.token_gate
                else 32)

    @property
    def _regsplit_fits(self) -> bool:
        return self.consumers % 4 == 0 and self.producers % 4 == 0 and self.producer_regs >= 56

    def _auto_regsplit(self) -> int:
        # on wherever it is possible (whole warpgroups on both sides) and needed (the consumers'
        # 32-wide bands want more than the launch gives): 8 or 16 producers beside 4 consumer warps
        # (log 18)
        return int(self._regsplit_fits and self.launch_regs < self.consumer_regs)

    @property
    def bands(self) -> int:
        """v bands per CTA: D / vsplit columns, 16 * mt each."""
        return HEAD_DIM // self.vsplit // (16 * self.mt)

    @property
    def consumers(self) -> int:
        return self.bands * self.ksplit

    @property
    def threads(self) -> int:
        return (self.consumers + self.producers) * 32

    @property
    def tokens_per_producer(self) -> int:
        """R1 rows per producer warp."""
        return TILE_TOKENS // self.producers

    @property
    def launch_regs(self) -> int:
        """Registers a thread gets at launch (__launch_bounds__(threads, 1)): the register file over
        the threads, in steps of 8, at most 255."""
        return min(255, REGS_PER_SM // self.threads // 8 * 8)

    @property
    def producer_regs(self) -> int:
        """What regsplit leaves a producer thread: the CTA's launch pool less the consumers'
        consumer_regs, over the producer threads, in steps of 8, at most 248."""
        pool = self.launch_regs * self.threads - self.consumer_regs * self.consumers * 32
        return min(248, _c_div(_c_div(pool, self.producers * 32), 8) * 8)

    def name(self) -> str:
        return (f"vs{self.vsplit}-{'bf16' if self.snap_bf16 else 'f32'}x{self.snap_every}"
                f"{'-dht' if self.has_dht else ''}{'' if self.l2norm else '-nonorm'}{'-fla' if self.fla_inputs else ''}"
                f"{'-tg' if self.token_gate else ''}{'-summary' if self.summary else ''}"
                f"-st{self.nstage}-g2s{self.g2_split}-p{self.producers}"
                f"{'-tmaload' if self.loads == LOADS_TMA else ''}"
                f"{ {SNAP_DIRECT: '-direct', SNAP_STAGED: '', SNAP_TMA: '-tmastore'}[self.snap_store] }"
                f"{f'-mt{self.mt}' if self.mt != 1 else ''}{f'-ks{self.ksplit}' if self.ksplit != 1 else ''}"
                f"{'-wgmma' if self.wgmma else ''}"
                f"{'' if self.g4_with_g5 else '-g4early'}{'' if self.snap_late_issue else '-snapearly'}"
                f"{f'-gtsh{self.gt_shared}' if self.gt_shared != self._auto_gt_shared() else ''}"
                f"{f'-spread{self.spread_extra}' if self.spread_extra != self._auto_spread_extra() else ''}"
                f"{f'-r1l{self.r1_lanes}' if self.r1_lanes != self._auto_r1_lanes() else ''}"
                f"{f'-regsplit{self.regsplit}' if self.regsplit != self._auto_regsplit() else ''}"
                f"{f'-creg{self.consumer_regs}' if self.consumer_regs != 240 else ''}"
                f"{'-timing' if self.timing else ''}{'-lineinfo' if self.lineinfo else ''}")


# -ftz=true: exp2f is then a single MUFU.EX2 (without it, 4 instructions: a
# halving, the MUFU, a compare and a squaring for results below 2^-126), in the
# loop that dominates the producers' instruction count. The price is that fp32
# intermediates under 2^-126 (~1e-38) flush to zero, 1e-38 of the O(1) values
# around them.
FAST_MATH = ("-ftz=true",)

# Config field -> the device source's macro. Every knob goes through; the device source
# has no defaults (tests/kernel/ds_scan/test_config.py checks both directions).
KNOB_MACROS: dict[str, str] = {
    "vsplit": "VSPLIT", "snap_bf16": "SNAP_BF16", "snap_every": "SNAP_EVERY", "has_dht": "HAS_DHT",
    "l2norm": "L2NORM", "fla_inputs": "FLA_INPUTS", "token_gate": "TOKEN_GATE", "nstage": "NSTAGE",
    "g2_split": "G2_SPLIT", "producers": "PRODUCERS", "mt": "MT",
    "ksplit": "KSPLIT", "loads": "LOADS", "snap_store": "SNAP_STORE", "wgmma": "WGMMA",
    "g4_with_g5": "G4_WITH_G5", "snap_late_issue": "SNAP_LATE_ISSUE", "gt_shared": "GT_SHARED",
    "spread_extra": "SPREAD_EXTRA", "r1_lanes": "R1_LANES", "regsplit": "REGSPLIT",
    "consumer_regs": "CONSUMER_REGS", "timing": "KDA_TIMING", "summary": "SUMMARY",
}
COMPILER_FLAGS = ("lineinfo",)   # Config fields that are nvcc options, not knobs of the source


def defines(cfg: Config) -> tuple[str, ...]:
    """-ftz=true and one -D per knob (int values: bools as 0 / 1), then -lineinfo if asked."""
    return (*FAST_MATH, *(f"-D{macro}={int(getattr(cfg, field))}" for field, macro in KNOB_MACROS.items()),
            *(("-lineinfo",) if cfg.lineinfo else ()))


def options(cfg: Config) -> tuple[str, ...]:
    """What every build of the kernel passes: defines(cfg) and the directory of its headers
    (nvcc finds them beside the entry file on its own; NVRTC, compiling the text, does not)."""
    return (*defines(cfg), f"-I{SOURCE_DIR}")


def parse_knobs(items) -> dict:
    """["nstage=3", "ksplit=2"] -> {"nstage": 3, "ksplit": 2} (the --tune arguments of
    kernel.bench and kernel.profile); names are checked by Config."""
    names = {f.name for f in dataclasses.fields(Config)}
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--tune takes key=value pairs, got {item!r}")
        if key not in names:
            raise SystemExit(f"--tune: unknown knob {key!r} (config.Config has {', '.join(sorted(names))})")
        try:
            out[key] = int(value)
        except ValueError:
            raise SystemExit(f"--tune: {key} takes an integer, got {value!r}") from None
    return out


def header_digest() -> str:
    """sha256 over the kernel's headers and ptx_lab's (names and contents): BUILD.header_digest."""
    return BUILD.header_digest()


def source() -> str:
    """The entry file's text, with header_digest() as a first-line comment (BUILD.source)."""
    return BUILD.source()


def summary_config(vsplit: int, l2norm: bool, fla_inputs: bool, token_gate: bool = False) -> Config:
    """The sequence split's pass-1 build (kernel.ds_scan.split) for these inputs: snapshot settings fixed,
    since it stores none."""
    return Config(vsplit=vsplit, snap_bf16=True, snap_every=4, has_dht=False, l2norm=l2norm,
                  fla_inputs=fla_inputs, token_gate=token_gate, summary=True)


def all_variants() -> list[Config]:
    """Every configuration the API can launch (with the default tuning knobs): kernel.dstate_scan's
    64, kernel.ds_scan.fla's 16 (FLA's tensors: snapshots every 64 tokens, q and k as FLA stored
    them, so no l2norm), then kernel.kda_backward's 8 (FLA's tensors, bf16 dS after every tile)
    and the same 8 on each token's gate (token_gate), then the sequence split's summary builds
    (kernel.ds_scan.split): 8 for dstate_scan, 4 for FLA's tensors, 4 for them on each token's gate;
    last, the backward's 16 and their 8 summary builds on the raw q and k (l2norm: kernel.kda_backward.run's
    ``qk_raw``, where R1 normalises the rows no pass wrote normalised)."""
    tiles = [Config(vsplit=v, snap_bf16=b, snap_every=e, has_dht=d, l2norm=n)
             for v, b, e, d, n in itertools.product(VSPLITS, (False, True), (1, 4), (False, True), (False, True))]
    fla = [Config(vsplit=v, snap_bf16=b, snap_every=4, has_dht=d, l2norm=False, fla_inputs=True)
           for v, b, d in itertools.product(VSPLITS, (False, True), (False, True))]
    def backward_of(l2norm: bool) -> list[Config]:
        return [Config(vsplit=v, snap_bf16=True, snap_every=1, has_dht=d, l2norm=l2norm, fla_inputs=True,
                       token_gate=t) for t, v, d in itertools.product((False, True), VSPLITS, (False, True))]

    backward = backward_of(False)
    summaries = [summary_config(v, n, False) for v, n in itertools.product(VSPLITS, (False, True))]
    summaries += [summary_config(v, False, True, t) for t, v in itertools.product((False, True), VSPLITS)]
    raw_qk = backward_of(True)
    raw_qk += [summary_config(v, True, True, t) for t, v in itertools.product((False, True), VSPLITS)]
    return tiles + fla + backward + summaries + raw_qk


def required_sass(cfg: Config) -> tuple[str, ...]:
    """What a variant's SASS must hold: HMMA (every GEMM is mma.sync), LDSM (operands by ldmatrix),
    LDGSTS (cp.async prefetch), STSM where bf16 snapshots are staged by stmatrix (not in a summary
    build, which stores none) and HGMMA where G4/G5 are warpgroup MMAs."""
    return (("HMMA", "LDSM", "LDGSTS") + (("STSM",) if cfg.snap_bf16 and not cfg.summary else ())
            + (("HGMMA",) if cfg.wgmma else ()))


BUILD = KernelBuild(title="Kernel A (the dS scan)", entry=SOURCE_PATH, headers="*.cuh", function=KERNEL_NAME,
                    constants="kda", default=Config, options=options, variants=all_variants, label=lambda cfg: cfg.name(),
                    required_sass=required_sass)
