"""Kernel A against its float64 reference, on the GPU.

    ptx-lab check            # every case, a table of relative errors
    ptx-lab check --small    # one small case (for compute-sanitizer)

(also ``python -m kernel.tools.check``.)

Each case draws fresh seeded inputs, rounds q, k, do, Mqk, INV to bf16 and gc to
fp32 exactly as the kernel receives them, and evaluates the contract's scan
(docs/kernel_a.md) in float64 on those same rounded inputs (`kernel.reference`,
CuPy float64). The error measure is ||out - ref||_F / ||ref||_F over all
snapshots and over dh0, plus the worst single snapshot. Outputs are allocated
from a memory pool that was just filled with NaN, so an element the kernel
forgets to write shows up as NaN rather than as a stale right answer.

Bound: the kernel rounds its MMA operands (qd, kd, kr, dS for G2, dU, bdv) to
bf16 (relative 2^-9 each) and accumulates in fp32, so relative errors of a few
1e-3 are expected; a layout or indexing bug gives O(1). We accept < 1e-2 (the
bf16-operand band of STYLE.md) and report the measured values.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

import numpy as np

BOUND = 1e-2


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    B: int = 1
    T: int = 64
    H: int = 2
    lengths: tuple[int, ...] | None = None
    snapshot_dtype: str = "float32"
    snapshot_every: int = 1
    dht: bool = True
    l2norm: bool = True
    vsplit: int | str = "auto"
    segments: int | str = "auto"   # the sequence split (kernel.ds_scan.split); auto leaves these small cases whole
    seed: int = 0
    tuning: tuple = ()       # config.Config knobs (kernel.ds_scan.config) as (name, value) pairs, e.g. (("ksplit", 2),)
    gate_strength: float = 1.0   # reference.random_inputs: 1 = a tile decays to ~0.45; 8 = often to 0
    group: int = 1           # FLA's grouped value heads: q and k get H / group heads, value head hv reading
                             # q's and k's hv // group in place (the reference reads them repeated so)


VARLEN = (1, 15, 16, 17, 1000, 33)

# Together these cover every v-split, every snapshot mode, dht on/off, l2norm
# on/off, equal-length and varlen batches with lengths 1, 15, 16, 17, 1000.
CASES = (
    Case("eq-f32x1-vs1", B=2, T=200, H=3, vsplit=1),
    Case("eq-bf16x4-vs2", B=2, T=200, H=3, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=2, seed=1),
    Case("var-f32x1-vs4-nodht", lengths=VARLEN, H=2, dht=False, vsplit=4, seed=2),
    Case("var-bf16x4-vs8", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=8, seed=3),
    Case("var-f32x4-vs1-nonorm", lengths=VARLEN, H=2, snapshot_every=4, l2norm=False, vsplit=1, seed=4),
    Case("eq-bf16x1-auto-nonorm-nodht", B=1, T=1000, H=2, snapshot_dtype="bfloat16", dht=False, l2norm=False, seed=5),
    Case("eq-f32x1-vs8-T64", B=3, T=64, H=1, vsplit=8, seed=6),
    Case("var-one-token", lengths=(1,), H=1, vsplit=1, seed=7),
    # two consumer warps per v band (each half of k, G2 partial sums exchanged)
    Case("eq-f32x1-vs1-ks2", B=2, T=200, H=3, vsplit=1, seed=9, tuning=(("mt", 1), ("ksplit", 2), ("g2_split", 1))),
    Case("var-bf16x4-vs4-ks2", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=4,
         seed=10, tuning=(("ksplit", 2),)),
    Case("var-f32x4-vs8-ks2-p8-nodht", lengths=VARLEN, H=2, snapshot_every=4, dht=False, vsplit=8, seed=11,
         tuning=(("ksplit", 2), ("producers", 8))),
    # two 16-wide v m-tiles per consumer warp (alone and with the k split)
    Case("eq-bf16x4-vs1-mt2", B=2, T=200, H=3, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1, seed=12,
         tuning=(("mt", 2), ("g2_split", 1))),
    Case("var-f32x1-vs2-mt2-ks2", lengths=VARLEN, H=2, vsplit=2, seed=13, tuning=(("mt", 2), ("ksplit", 2))),
    Case("var-f32x1-vs4-staged", lengths=VARLEN, H=2, vsplit=4, seed=15, tuning=(("snap_store", 2),)),
    # tensor copies (loads and snapshot stores): varlen for partial tiles whose boxes run
    # into the next sequence, every vsplit for every do/snapshot swizzle (32, 64, 128 B)
    Case("var-f32x1-vs1-tma", lengths=VARLEN, H=2, vsplit=1, seed=16, tuning=(("loads", 2), ("snap_store", 3))),
    Case("var-bf16x4-vs1-tma", lengths=VARLEN, H=3, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         seed=17, tuning=(("loads", 2), ("snap_store", 3))),
    Case("var-f32x1-vs2-tma", lengths=VARLEN, H=2, vsplit=2, seed=18, tuning=(("loads", 2), ("snap_store", 3))),
    Case("var-bf16x4-vs4-tma", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=4,
         seed=19, tuning=(("loads", 2), ("snap_store", 3))),
    Case("eq-f32x1-vs4-tma-dht", B=2, T=200, H=3, vsplit=4, dht=True, seed=20, tuning=(("loads", 2), ("snap_store", 3))),
    Case("var-bf16x1-vs8-tma", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", vsplit=8, seed=21,
         tuning=(("loads", 2), ("snap_store", 3))),
    Case("var-f32x1-vs1-tmaload", lengths=VARLEN, H=2, vsplit=1, seed=22, tuning=(("loads", 2),)),
    Case("var-bf16x4-vs1-tmastore", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         seed=23, tuning=(("snap_store", 3),)),
    Case("var-bf16x1-vs4-mt2-nonorm", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", l2norm=False, vsplit=4,
         seed=14, tuning=(("mt", 2),)),
)
# more producer warps than the register file allows beside 32-wide bands: setmaxnreg
# moves registers to the consumers' warpgroup (16 producers: one R1 token per warp)
CASES += (
    Case("var-bf16x4-vs1-p16", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         seed=24, tuning=(("producers", 16),)),
    Case("eq-f32x1-vs1-p8-st3", B=2, T=200, H=3, vsplit=1, seed=25, tuning=(("producers", 8), ("nstage", 3))),
)
# G4 and G5 as warpgroup MMAs (one warpgroup of consumers: vsplit 1 with mt 2, vsplit 2)
CASES += (
    Case("var-bf16x4-vs1-wgmma", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         seed=26, tuning=(("wgmma", 1),)),
    Case("eq-f32x1-vs1-wgmma-dht", B=2, T=200, H=3, vsplit=1, seed=27, tuning=(("wgmma", 1),)),
    Case("var-bf16x1-vs2-wgmma-nonorm", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", l2norm=False, vsplit=2,
         seed=28, tuning=(("wgmma", 1),)),
)
# strong gates (per token down to exp(-5)): a tile decays dS by 2^-9 typically and by 2^-115 at
# most, R1's exp2 of gc and of gT - gc underflow, and each snapshot is dominated by the last tiles
CASES += (
    Case("var-bf16x4-vs1-strong-gates", lengths=VARLEN, H=2, snapshot_dtype="bfloat16", snapshot_every=4,
         vsplit=1, seed=29, gate_strength=8.0),
    Case("eq-f32x4-vs4-strong-gates", B=2, T=200, H=3, snapshot_every=4, vsplit=4, seed=30, gate_strength=4.0),
)
# the sequence split (kernel.ds_scan.split): every sequence cut into up to S segments at 64-token edges,
# scanned in three passes (summaries, fold, scans); lengths 1, 15, 16, 17, 65 stay whole or
# nearly, the long ones split into segments of one, several and partial snapshot groups
SPLIT = (1, 15, 16, 17, 65, 700, 2000)
CASES += (
    Case("split3-f32x1-dht", lengths=SPLIT, H=2, segments=3, seed=31),
    Case("split5-bf16x4-nodht", lengths=(2000, 65, 1000), H=2, snapshot_dtype="bfloat16", snapshot_every=4,
         dht=False, segments=5, seed=32),
    Case("split4-eq-bf16x4-vs2", B=2, T=1000, H=3, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=2,
         segments=4, seed=33),
    Case("split8-f32x4-nonorm-vs4", lengths=(3000, 17), H=2, snapshot_every=4, l2norm=False, vsplit=4,
         segments=8, seed=34),
    Case("split2-f32x1-strong-gates", lengths=(1500, 16), H=2, segments=2, seed=35, gate_strength=8.0),
    # weak and no decay: dS carries across whole segments, so the fold's M and d weigh in
    # (with the default gates a tile decays dS to ~0.45 and a segment's far end hardly matters)
    Case("split5-f32x1-weak-gates", lengths=(3000, 700), H=2, segments=5, seed=36, gate_strength=0.02),
    Case("split3-bf16x4-no-decay", lengths=(2000,), H=2, snapshot_dtype="bfloat16", snapshot_every=4, segments=3,
         seed=37, gate_strength=0.0),
)
# FLA's grouped value heads: q and k read in place at each value head's query / key head, by cp.async
# loads (the FLA layout's only ones) and by tensor copies (their maps of H heads), unsplit and split
CASES += (
    Case("var-f32x1-vs2-gva2", lengths=VARLEN, H=4, vsplit=2, seed=38, group=2),
    Case("eq-bf16x4-vs1-gva4-nonorm", B=2, T=200, H=8, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         l2norm=False, seed=39, group=4),
    Case("var-bf16x4-vs1-tma-gva3", lengths=VARLEN, H=6, snapshot_dtype="bfloat16", snapshot_every=4, vsplit=1,
         seed=40, tuning=(("loads", 2), ("snap_store", 3)), group=3),
    Case("eq-f32x1-vs4-tmaload-gva2-dht", B=2, T=200, H=4, vsplit=4, seed=41, tuning=(("loads", 2),), group=2),
    Case("split3-f32x1-gva2", lengths=SPLIT, H=4, segments=3, seed=42, group=2),
)
SMALL = Case("small", lengths=(1, 17, 40), H=2, vsplit=2, seed=8)


def _poison_pool(shapes_dtypes) -> None:
    import cupy

    bufs = [cupy.full(s, np.nan, dtype=np.float32) if d == np.float32 else cupy.full(s, 0x7FC0, dtype=np.uint16)
            for s, d in shapes_dtypes]
    del bufs   # the blocks go back to CuPy's pool, NaN-filled, and are handed out next


def _rel(out, ref) -> float:
    import cupy

    den = float(cupy.linalg.norm(ref.ravel()))
    num = float(cupy.linalg.norm((out - ref).ravel()))
    return num / den if den > 0 else num


def inputs(case: Case):
    """Kernel inputs (bf16 bits / fp32) and the float64 views of the same values."""
    import cupy

    from kernel.ds_scan.launch import bf16_bits, bits_to_f32
    from kernel.reference import prepare_tiles, random_inputs

    raw = random_inputs(case.B, case.T, case.H, lengths=list(case.lengths) if case.lengths else None,
                        seed=case.seed, with_dht=case.dht, gate_strength=case.gate_strength, xp=cupy)
    cu = raw["cu_seqlens"]
    if not case.l2norm:
        # Without l2norm the kernel takes q, k as given: feed unit-scale rows (norm ~1), as a
        # model that normalises upstream would. Raw N(0, 1) rows of norm ~11 make the delta
        # rule itself diverge (I + Lkk is then far from well conditioned).
        for name in ("q", "k"):
            raw[name] = raw[name] * (raw[name].shape[-1] ** -0.5)
    q_b, k_b, do_b = bf16_bits(raw["q"]), bf16_bits(raw["k"]), bf16_bits(raw["do"])
    # grouped value heads: one q, k head a group (the kernel's), repeated per value head (the reference's)
    q_b, k_b = (cupy.ascontiguousarray(x[:, :, ::case.group]) for x in (q_b, k_b))
    q_r, k_r = (cupy.repeat(bits_to_f32(x), case.group, axis=2) for x in (q_b, k_b))
    gc, mqk, inv = prepare_tiles(q_r, k_r, raw["g"], raw["beta"], qk_l2norm=case.l2norm, cu_seqlens=cu)
    gc32 = gc.astype(np.float32)
    mqk_b, inv_b = bf16_bits(mqk), bf16_bits(inv)
    kern = dict(q=q_b, k=k_b, gc=gc32, beta=raw["beta"], mqk=mqk_b, inv=inv_b, do=do_b,
                dht=raw["dht"], cu_seqlens=cu)
    ref = dict(q=q_r, k=k_r, gc=gc32, beta=raw["beta"], mqk=bits_to_f32(mqk_b), inv=bits_to_f32(inv_b),
               do=bits_to_f32(do_b), dht=raw["dht"], cu_seqlens=cu)
    return kern, ref


def run_case(case: Case, *, repeat_for_determinism: bool = True) -> dict:
    import cupy

    from kernel.ds_scan.launch import bits_to_f32, dstate_scan
    from kernel.reference import dstate_scan_reference

    kern, ref_in = inputs(case)
    opts = dict(qk_l2norm=case.l2norm, snapshot_every=case.snapshot_every)
    ref_snaps, ref_dh0 = dstate_scan_reference(
        ref_in["q"], ref_in["k"], ref_in["gc"], ref_in["beta"], ref_in["mqk"], ref_in["inv"], ref_in["do"],
        dht=ref_in["dht"], cu_seqlens=ref_in["cu_seqlens"], **opts)
    snap_dtype = np.uint16 if case.snapshot_dtype == "bfloat16" else np.float32
    _poison_pool([(ref_snaps.shape, snap_dtype), (ref_dh0.shape, np.float32)])

    def launch():
        s, d = dstate_scan(kern["q"], kern["k"], kern["gc"], kern["beta"], kern["mqk"], kern["inv"], kern["do"],
                           dht=kern["dht"], cu_seqlens=kern["cu_seqlens"], snapshot_dtype=case.snapshot_dtype,
                           vsplit=case.vsplit, segments=case.segments, tuning=dict(case.tuning), **opts)
        cupy.cuda.get_current_stream().synchronize()
        return s, d

    snaps, dh0 = launch()
    if snaps.shape != ref_snaps.shape:
        raise AssertionError(f"{case.name}: snapshots shape {snaps.shape}, reference {ref_snaps.shape}")
    snaps_f = (bits_to_f32(snaps) if snap_dtype == np.uint16 else snaps).astype(np.float64)
    dh0_f = dh0.astype(np.float64)
    per_snap = [_rel(snaps_f[:, i], ref_snaps[:, i]) for i in range(snaps_f.shape[1])]
    result = {
        "case": case.name,
        "nan": bool(cupy.isnan(snaps_f).any() or cupy.isnan(dh0_f).any()),
        "snapshots": _rel(snaps_f, ref_snaps),
        "worst_snapshot": max(per_snap),
        "dh0": _rel(dh0_f, ref_dh0),
        # what rounding the exact answer to the snapshot dtype alone costs: a yardstick
        "rounding_floor": _rel(bits_to_f32(_round_bf16(ref_snaps)).astype(np.float64), ref_snaps)
        if snap_dtype == np.uint16 else 0.0,
    }
    if repeat_for_determinism:
        snaps2, dh02 = launch()
        result["deterministic"] = bool((snaps2 == snaps).all() and (dh02 == dh0).all())
    return result


def _round_bf16(x):
    from kernel.ds_scan.launch import bf16_bits

    return bf16_bits(x.astype(np.float32))


def passed(r: dict) -> bool:
    return (not r["nan"] and r["snapshots"] < BOUND and r["dh0"] < BOUND and r["worst_snapshot"] < BOUND
            and r.get("deterministic", True))


def main(argv: Sequence[str] | None = None, prog: str = "python -m kernel.tools.check") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="one small case (fast; for compute-sanitizer)")
    ap.add_argument("--case", action="append", default=[], metavar="NAME",
                    help="run only the cases whose name contains NAME (repeatable)")
    args = ap.parse_args(argv)
    from ptx_lab.gpu import gpu_reason

    if gpu_reason():
        print(f"{prog} needs a GPU: {gpu_reason()}")
        return 2
    cases = (SMALL,) if args.small else CASES
    if args.case:
        cases = tuple(c for c in CASES + (SMALL,) if any(n in c.name for n in args.case))
        if not cases:
            print(f"no case matches {args.case}; the cases are: {', '.join(c.name for c in CASES + (SMALL,))}")
            return 2
    rows = []
    for c in cases:
        r = run_case(c, repeat_for_determinism=not args.small)
        rows.append(r)
        print(f"{c.name:30s} snapshots {r['snapshots']:.2e} worst {r['worst_snapshot']:.2e} dh0 {r['dh0']:.2e} "
              f"bf16-floor {r['rounding_floor']:.2e} det {r.get('deterministic', '-')} "
              f"{'PASS' if passed(r) else 'FAIL'}", flush=True)
    bad = [r["case"] for r in rows if not passed(r)]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
