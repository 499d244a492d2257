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
LOADS_CP_ASYNC, LOADS_TMA = 1, 2                  # Config.loads (the kernel's LOADS)
SNAP_DIRECT, SNAP_STAGED, SNAP_TMA = 1, 2, 3      # Config.snap_store (the kernel's SNAP_STORE)


@dataclasses.dataclass(frozen=True)
class Config:
    vsplit: int = 1          # CTAs per (sequence, head); each owns D / vsplit v columns
    snap_bf16: bool = False  # snapshot dtype bf16 (else fp32)
    snap_every: int = 1      # snapshot every tile (1) or every 4th tile (4: FLA's dh)
    has_dht: bool = False
    l2norm: bool = True
    nstage: int = 0          # input ring depth; loads run nstage - 1 tiles ahead. 0 = auto: 4,
                             # or 3 where 4 would leave too few named barriers (vsplit 1, ksplit 2)
    # The knobs below default to 0 = auto, by the rules in __post_init__ (each one
    # measured on the H200; BENCHMARKS.md, optimisation log).
    g2_split: int = 0        # independent accumulator chains in G2 (dS path: 2 dependent MMAs, not 8)
    producers: int = 0       # producer warps (cp.async + R1)
    mt: int = 0              # 16-wide v m-tiles per consumer warp (2: each kr/qd/kd fragment
                             # feeds two MMAs, half the consumers' shared-memory reads)
    ksplit: int = 0          # consumer warps per v band (2: each holds half of the k columns;
                             # their G2 partial sums meet in shared memory)
    loads: int = 0           # tile inputs by cp.async (1) or by tensor copies (2: one
                             # instruction per tensor and tile, host-built tensor maps)
    snap_store: int = 0      # snapshots straight from the accumulators (1, fp32 only), through
                             # a staging tile with 16-byte stores (2), or one tensor store (3)
    wgmma: int = -1          # G4 and G5 as warpgroup MMAs (1) or mma.sync (0); -1 = auto. Needs
                             # 4 consumer warps holding all 128 k (vsplit 1 and 2, ksplit 1)
    timing: bool = False     # clock64 phase accounting into kda_timing[] (kernel.profile only)
    lineinfo: bool = False   # -lineinfo, so ncu / compute-sanitizer name source lines

    def __post_init__(self):
        if self.vsplit not in VSPLITS:
            raise ValueError(f"vsplit must be one of {VSPLITS}, got {self.vsplit}")
        if self.snap_every not in (1, 4):
            raise ValueError(f"snapshot_every must be 1 or 4, got {self.snap_every}")
        auto = lambda name, value: getattr(self, name) == 0 and object.__setattr__(self, name, value)
        # vsplit 1 (large batches): shared memory bound (ncu: L1 76% busy at 1 x 16384), and
        # mt 2 halves the consumers' ldmatrix traffic: 32 x 8192 bf16x4 6.30 -> 5.37 ms,
        # f32x1 14.09 -> 13.03 ms (the 16 KB more registers per warp fit: 256 threads).
        auto("mt", 2 if self.vsplit == 1 else 1)
        # vsplit 4 (B = 1): latency bound, and two warps per band with 8 producers cut a
        # tile's chain: 1 x 131072 bf16x4 7.83 -> 7.18 ms, while the snapshots still went out
        # as 16-byte stores. With the tensor store (bf16), one warp per band and 8 producers
        # is ahead: 6.903 -> 6.678 and 6.907 -> 6.679 ms in two calls (BENCHMARKS.md, log 17);
        # fp32 snapshots keep the two warps (not re-measured).
        auto("ksplit", 2 if self.vsplit == 4 and not self.snap_bf16 else 1)
        auto("g2_split", 4 if self.mt == 1 else 2)     # mt 2: 2 x 2 chains (5.37 ms; 5.52 with 1, 5.49 with 4)
        # 4 producers beat 2 at vsplit 1 (1 x 16384 bf16x4: 1.57 vs 1.84 ms); 8 at vsplit 4
        # (with ksplit 2 above; with ksplit 1 and the tensor store, 6.68 vs 7.28 ms with 4).
        # With fp32 snapshots at vsplit 1 the consumers' stores set the pace, and 2 are
        # enough: 32 x 8192 f32x1 12.95 ms with 2, 13.28 with 4.
        # bf16 at vsplit 1: 8, with setmaxnreg moving registers to the consumers' warpgroup
        # (the kernel's REGSPLIT): 32 x 8192 bf16x4 4.850 -> 4.532 ms (0.934x; 16: 0.997x).
        auto("producers", 8 if self.vsplit == 4 or (self.vsplit == 1 and self.snap_bf16)
             else 2 if self.vsplit == 1 else 4)
        # tensor-copy loads measured slower (32 x 8192 bf16x4 with the tensor store 4.77 -> 5.59 ms;
        # 1 x 131072 7.31 -> 8.91): BENCHMARKS.md, log 14
        auto("loads", LOADS_CP_ASYNC)
        # bf16 (fla mode): one tensor store per warp and snapshot, off the SM's memory queue:
        # 32 x 8192 5.85 -> 4.77 ms, 8 x 32768 5.82 -> 4.74, 1 x 131072 (vsplit 4) 7.31 -> 6.85.
        # fp32 through the staging tile at vsplit 1 (32 x 8192 f32x1: 13.10 ms, 14.05 direct,
        # 13.89 tensor store), straight from the accumulators where latency counts (1 x 131072
        # f32x1 vsplit 4: 8.09 ms direct, 9.56 staged, 8.12 tensor store). One run each,
        # 2026-11-30 (BENCHMARKS.md, log 14); vsplit 2 and 8 follow the rule untimed.
        auto("snap_store", SNAP_TMA if self.snap_bf16 else SNAP_STAGED if self.vsplit == 1 else SNAP_DIRECT)
        if self.loads not in (LOADS_CP_ASYNC, LOADS_TMA):
            raise ValueError(f"loads must be {LOADS_CP_ASYNC} (cp.async) or {LOADS_TMA} (tensor copies), got {self.loads}")
        if self.snap_store not in (SNAP_DIRECT, SNAP_STAGED, SNAP_TMA):
            raise ValueError(f"snap_store must be {SNAP_DIRECT} (direct), {SNAP_STAGED} (staged) or "
                             f"{SNAP_TMA} (tensor store), got {self.snap_store}")
        if self.snap_store == SNAP_DIRECT and self.snap_bf16:
            raise ValueError("snap_store 1 (direct 4-byte stores) is fp32 only; bf16 snapshots go through "
                             "the staging tile (2) or a tensor store (3)")
        if self.ksplit not in (1, 2):
            raise ValueError(f"ksplit must be 1 or 2, got {self.ksplit}")
        if self.mt not in (1, 2) or (D // self.vsplit) % (16 * self.mt):
            raise ValueError(f"mt must be 1 or 2 with D / vsplit = {D // self.vsplit} a multiple of 16 * mt, "
                             f"got mt {self.mt}")
        wgmma_fits = self.consumers == 4 and self.ksplit == 1
        # G4 and G5 as wgmma wherever the consumers are one warpgroup: with G4 issued beside G5
        # and the snapshots' late tensor store, 32 x 8192 fla 0.96x, 4 x 8192 0.95x (BENCHMARKS.md,
        # log 20); the kernel compiles it out of a plain sm_90 build
        if self.wgmma == -1:
            object.__setattr__(self, "wgmma", int(wgmma_fits))
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

    @property
    def bands(self) -> int:
        """v bands per CTA: D / vsplit columns, 16 * mt each."""
        return D // self.vsplit // (16 * self.mt)

    @property
    def consumers(self) -> int:
        return self.bands * self.ksplit

    @property
    def threads(self) -> int:
        return (self.consumers + self.producers) * 32

    def name(self) -> str:
        return (f"vs{self.vsplit}-{'bf16' if self.snap_bf16 else 'f32'}x{self.snap_every}"
                f"{'-dht' if self.has_dht else ''}{'' if self.l2norm else '-nonorm'}"
                f"-st{self.nstage}-g2s{self.g2_split}-p{self.producers}"
                f"{'-tmaload' if self.loads == LOADS_TMA else ''}"
                f"{ {SNAP_DIRECT: '-direct', SNAP_STAGED: '', SNAP_TMA: '-tmastore'}[self.snap_store] }"
                f"{f'-mt{self.mt}' if self.mt != 1 else ''}{f'-ks{self.ksplit}' if self.ksplit != 1 else ''}"
                f"{'-wgmma' if self.wgmma else ''}{'-timing' if self.timing else ''}{'-lineinfo' if self.lineinfo else ''}")


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
            f"-DPRODUCERS={cfg.producers}", f"-DMT={cfg.mt}", f"-DLOADS={cfg.loads}", f"-DSNAP_STORE={cfg.snap_store}", f"-DKSPLIT={cfg.ksplit}", f"-DWGMMA={cfg.wgmma}", f"-DKDA_TIMING={int(cfg.timing)}",
            *(("-lineinfo",) if cfg.lineinfo else ()))


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
            raise SystemExit(f"--tune: unknown knob {key!r} (build.Config has {', '.join(sorted(names))})")
        try:
            out[key] = int(value)
        except ValueError:
            raise SystemExit(f"--tune: {key} takes an integer, got {value!r}") from None
    return out


def source() -> str:
    return SOURCE_PATH.read_text()


def all_variants() -> list[Config]:
    """Every configuration the API can launch (with the default tuning knobs)."""
    return [Config(vsplit=v, snap_bf16=b, snap_every=e, has_dht=d, l2norm=n)
            for v, b, e, d, n in itertools.product(VSPLITS, (False, True), (1, 4), (False, True), (False, True))]
