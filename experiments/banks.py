"""
banks: the shared-memory bank conflicts Kernel A's design predicted, modelled and measured
===========================================================================================

What and why
------------
Kernel A's first design was half a fight against bank conflicts, with a
predicted figure for each: R1's token-strided reads of q/k at row stride 128
(32-way), the padded 136 (stuck at 4-way because 16-byte cp.async writes force
a stride that is a multiple of 8), the odd half-stride 130 with 4-byte
cp.async.ca writes (conflict-free); gc's fp32 rows at 128 vs 132;
ldmatrix.trans on plain 256-byte rows ("rows alias to the same banks,
ldmatrix.trans serialises") vs an INTER layout; the transpose-dual dS layout
read both ways; and R1's scalar stores into a swizzled tile (16-way) vs
stmatrix. This experiment puts every one of those access patterns through
``ptx_lab.banks`` (an exact model: 32 banks x 4 bytes, broadcast within a
word, phases of 32 / 16 / 8 lanes for <=4 / 8 / 16-byte accesses, one phase
per ldmatrix matrix) and, on a GPU, through the hardware twice: timed with
clock64 and counted with Nsight Compute.

Idea
----
Each case is one warp-wide instruction with 32 known addresses, built from a
layout preset (``experiments.bank_presets.PRESETS``) and a lane -> cell map, e.g. the
token-strided read

    lane l reads q[token l][feature 6]      # lanes 0-15: tokens 0-15 of one tile,
                                            # lanes 16-31: the same tokens of the next
    bank(l) = (l * stride * 2 / 4 + 3) % 32 -> gcd(stride / 2, 32) lanes per bank

The design counted 32 lanes over 16-token tiles; its three figures (32-way at
128, 4-way at 136, none at 130) hold only if the two half-warps read rows 16
apart, i.e. two consecutive tiles of the buffer, which is what we model. (Had
the halves read features 64 apart in the same 16 rows, stride 130 would be
2-way, contradicting the design's figure.)

The transpose-dual pair is the most instructive case: ldmatrix (B operand,
dS[v][k]) and ldmatrix.trans / stmatrix.trans (accumulator, dS[k][v]) hand in
the *same* 8 rows of 16 bytes per matrix; only the register deal differs. So
"conflict-free both ways" is one property: every 8x8 core matrix is 128
contiguous bytes, which the INTER atom (Swizzle<0,4,3>, no XOR at all) gives
by interleaving, and plain 256-byte rows do not (8 rows on the same 4 banks).

Kernel
------
``ptx_lab/cuda/bank_probes.cu``, one single-warp kernel per instruction::

    addr = smem + offsets[lane]
    t0 = clock64()
    repeat reps:                    # reps_lo, then reps_hi
        UNROLL times: access(addr + u * 128)     # same banks, same conflicts
    t1 = clock64()

Each count (cycles, wavefronts, instructions) is taken at two rep counts and
the difference divided by (reps_hi - reps_lo) * UNROLL: setup and loop tails
cancel. ncu runs this module again as a child
(``python -m experiments.banks --child``) under ``ncu --clock-control none
--csv --metrics ...``; the metric names are in ``NCU_METRICS`` below.

Check
-----
* Always: the model's wavefronts per instruction equal the predicted counts
  in ``CASES`` (32, 4, 1, 16, ...): the figures Kernel A's design assumed
  and closed forms, written down independently of the model.
* clock64 (GPU): cycles per instruction relative to the conflict-free case of
  the same instruction (its baseline). A case the model calls as cheap as its
  baseline must time within ``CLOCK_SAME`` (+25 %) of it; a case the model
  calls >= ``CLOCK_CLEAR_RATIO`` (8) times dearer must time at least
  ``CLOCK_MIN_SLOWDOWN`` (2) times slower. A single warp pays latency as well
  as wavefronts, so clock64 can only order the cases; in-between ratios are
  printed, not judged.
* ncu (GPU with ncu on PATH): wavefronts per instruction and bank conflicts
  per instruction equal the model exactly, and exactly one instruction per
  access was executed. A metric ncu does not have is reported, not failed.
  (The 8-byte case with every lane on the same 8 bytes was uncertain -- do
  the half-warp phases merge? -- until the H200 said 1 wavefront; the model
  and the case now say so and it is judged like the others.)

Numbers
-------
``python -m experiments.banks`` prints the table last: model, predicted
(the design's figure or the closed form), clock64 and ncu per case.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Callable, Sequence

from pathlib import Path

import numpy as np

from ptx_lab import CUDA_INCLUDE_DIR, banks
from ptx_lab.layouts import Layout

from . import _common
from ._common import WARP, Checker
from .bank_presets import PRESETS

NAME = "banks"
SUMMARY = ("bank conflicts of the access patterns Kernel A's design went through: "
           "model vs predicted counts, clock64 and ncu")

BANK_PROBES_CU = CUDA_INCLUDE_DIR / "bank_probes.cu"
REPO_ROOT = Path(__file__).resolve().parents[1]
UNROLL = 32              # accesses per iteration (UNROLL in bank_probes.cu)
SHIFT_BYTES = 128        # instance u runs at +u * SHIFT_BYTES (SHIFT_BYTES in bank_probes.cu)
REPS_LO, REPS_HI = 4, 36  # two rep counts; their difference gives one access's share
CLOCK_TRIALS = 5         # clock64 runs per case, the median is kept
MAX_SMEM = 48 * 1024     # dynamic shared memory without opt-in
CLOCK_SAME = 1.25        # "as cheap as the baseline": within +25 %
CLOCK_CLEAR_RATIO = 8    # "clearly dearer": the model says >= 8x the baseline's wavefronts ...
CLOCK_MIN_SLOWDOWN = 2.0  # ... then it must time >= 2x slower
CHILD_ENV = "PTX_LAB_BANKS_CHILD"

# ----------------------------------------------------------------- ncu metric names
# One row per instruction family: (instructions executed, shared wavefronts, bank conflicts),
# each a tuple of candidates tried in order. Names differ between ncu versions and GPUs
# (sm_90 is not verified here): fix them after `ncu --query-metrics --chip gh100`. Every
# candidate is requested; ncu's unknown names are dropped and reported, n/a values read as
# missing. SASS-level (smsp__sass_*) names come second as fallbacks.
NCU_METRICS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "ld": (("smsp__inst_executed_op_shared_ld.sum",
            "smsp__sass_inst_executed_op_shared_ld.sum"),
           ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
           ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
            "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum")),
    "st": (("smsp__inst_executed_op_shared_st.sum",
            "smsp__sass_inst_executed_op_shared_st.sum"),
           ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
            "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_st.sum"),
           ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
            "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")),
    "ldsm": (("smsp__inst_executed_op_ldsm.sum",
              "smsp__sass_inst_executed_op_ldsm.sum"),
             ("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
              "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"),
             ("smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum")),
    "stsm": (("smsp__inst_executed_op_shared_stsm.sum",
              "smsp__sass_inst_executed_op_shared_stsm.sum"),
             ("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_stsm.sum",
              "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_stsm.sum"),
             ("smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_stsm.sum",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_stsm.sum")),
    "ldgsts": (("smsp__inst_executed_op_ldgsts.sum",
                "smsp__sass_inst_executed_op_ldgsts.sum"),
               ("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum"),
               ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum",
                "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum")),
}
ROLES = ("instructions", "wavefronts", "conflicts")


# ----------------------------------------------------------------- instructions

@dataclasses.dataclass(frozen=True)
class Op:
    """An instruction the probes run: its kernel, its ncu family and its model."""
    kernel: str
    ptx: str
    family: str
    access: Callable[[np.ndarray], banks.Access]   # (32,) byte addresses -> the model
    bytes: int                                     # bytes one lane's address covers


OPS: dict[str, Op] = {
    "ld_u16": Op("bank_ld_u16", "ld.shared.u16", "ld", lambda a: banks.shared_access(a, 2), 2),
    "ld_b32": Op("bank_ld_b32", "ld.shared.b32", "ld", lambda a: banks.shared_access(a, 4), 4),
    "ld_v2": Op("bank_ld_v2", "ld.shared.v2.b32", "ld", lambda a: banks.shared_access(a, 8), 8),
    "ld_v4": Op("bank_ld_v4", "ld.shared.v4.b32", "ld", lambda a: banks.shared_access(a, 16), 16),
    "st_u16": Op("bank_st_u16", "st.shared.u16", "st",
                 lambda a: banks.shared_access(a, 2, store=True), 2),
    "ldsm_x4": Op("bank_ldsm_x4", "ldmatrix.x4", "ldsm", lambda a: banks.ldmatrix_access(a, 4), 16),
    "ldsm_x4_trans": Op("bank_ldsm_x4_trans", "ldmatrix.x4.trans", "ldsm",
                        lambda a: banks.ldmatrix_access(a, 4, trans=True), 16),
    "stsm_x4_trans": Op("bank_stsm_x4_trans", "stmatrix.x4.trans", "stsm",
                        lambda a: banks.stmatrix_access(a, 4, trans=True), 16),
    "cp_ca4": Op("bank_cp_async_ca4", "cp.async.ca 4 B", "ldgsts",
                 lambda a: banks.cp_async_access(a, 4), 4),
    "cp_ca16": Op("bank_cp_async_ca16", "cp.async.ca 16 B", "ldgsts",
                  lambda a: banks.cp_async_access(a, 16), 16),
}


# ----------------------------------------------------------------- the cases

LANE = np.arange(WARP)
MATRIX = LANE // 8           # ldmatrix/stmatrix: lanes 8i..8i+7 give the rows of matrix i
ROW_IN_MATRIX = LANE % 8
FEATURE = 6                  # the feature column R1's token-strided read stands on
OPERAND_K0 = 16              # the 16x16 operand block an ldmatrix.x4 reads starts at feature 16
DS_V0, DS_K0 = 32, 48        # the dS block the transpose-dual cases read
QD_TOKEN, QD_J = 3, 1        # R1's scalar store: token 3, feature 4 * lane + 1


@dataclasses.dataclass(frozen=True)
class Case:
    """One warp-wide access: which instruction, which 32 addresses, what it is predicted to cost."""
    name: str
    op: str
    layout: Layout | None
    cells: tuple[np.ndarray, np.ndarray] | None   # (rows (32,), cols (32,)) in the layout
    addresses_: np.ndarray | None                 # or raw byte addresses
    expected: int                                 # wavefronts per instruction, predicted
    why: str                                      # where `expected` comes from ("design:" the
                                                  # figure Kernel A's design assumed)
    exact: bool = True                            # False: the model's rule is uncertain here

    @property
    def addresses(self) -> np.ndarray:
        if self.addresses_ is not None:
            return self.addresses_.astype(np.int64)
        rows, cols = self.cells
        return self.layout.address(rows, cols)

    def access(self) -> banks.Access:
        return OPS[self.op].access(self.addresses)


def _raw(name, op, addrs, expected, why, exact=True) -> Case:
    return Case(name, op, None, None, np.asarray(addrs, dtype=np.int64), expected, why, exact)


def _cells(name, op, preset, rows, cols, expected, why) -> Case:
    return Case(name, op, PRESETS[preset], (np.asarray(rows), np.asarray(cols)), None, expected, why)


def _build_cases() -> tuple[Case, ...]:
    # ldmatrix.x4 of a 16x16 block, "rows first": matrix m covers rows 8*(m%2).., cols 8*(m//2)..
    op_rows, op_cols = ROW_IN_MATRIX + 8 * (MATRIX % 2), OPERAND_K0 + 8 * (MATRIX // 2)
    # dS as B operand [v][k]: matrices (v0, k0), (v0, k0+8), (v0+8, k0), (v0+8, k0+8)
    ds_v, ds_k = DS_V0 + ROW_IN_MATRIX + 8 * (MATRIX // 2), DS_K0 + 8 * (MATRIX % 2)
    # stmatrix.trans into qd [k][c] (MN_INTER): each memory row = 8 consecutive k at one token
    qd_k, qd_c = 8 * (MATRIX // 2), ROW_IN_MATRIX + 8 * (MATRIX % 2)
    return (
        # -- calibration: the textbook cases
        _raw("lds32_consecutive", "ld_b32", 4 * LANE, 1, "32 consecutive words: one per bank"),
        _raw("lds32_stride_128B", "ld_b32", 128 * LANE, 32, "128 B apart: all 32 words in bank 0"),
        _raw("lds32_broadcast", "ld_b32", 0 * LANE, 1, "one word, broadcast"),
        _raw("lds64_consecutive", "ld_v2", 8 * LANE, 2, "256 B = 2 x 128 B, half-warp phases"),
        _raw("lds128_consecutive", "ld_v4", 16 * LANE, 4, "512 B = 4 x 128 B, quarter-warp phases"),
        _raw("lds64_same_8_bytes", "ld_v2", 0 * LANE, 1,
             "one 8-B word for all lanes: the half-warp phases merge (H200, ncu)"),
        _raw("sts16_consecutive", "st_u16", 2 * LANE, 1, "16 words, two lanes per word"),
        # -- R1's token-strided reads of q/k (bf16) and gc (fp32)
        _cells("qk_stride128_read", "ld_u16", "qk_stride128", LANE, np.full(WARP, FEATURE), 32,
               "design: 32-way; gcd(128/2, 32) = 32"),
        _cells("qk_stride136_read", "ld_u16", "qk_stride136", LANE, np.full(WARP, FEATURE), 4,
               "design: 4-way floor; gcd(136/2, 32) = 4"),
        _cells("qk_stride130_read", "ld_u16", "qk_stride130", LANE, np.full(WARP, FEATURE), 1,
               "design: conflict-free; gcd(130/2, 32) = 1"),
        _cells("gc_stride128_read", "ld_b32", "gc_stride128", LANE, np.full(WARP, FEATURE), 32,
               "32-way like q/k; gcd(128, 32) = 32"),
        _cells("gc_stride132_read", "ld_b32", "gc_stride132", LANE, np.full(WARP, FEATURE), 4,
               "design: -90 % conflicts; gcd(132, 32) = 4"),
        # -- how the rows get there: 16-B copies need stride % 8 == 0; 4-B copies do not
        _cells("qk_stride136_fill_cp16", "cp_ca16", "qk_stride136", LANE // 16, 8 * (LANE % 16), 4,
               "512 B, each quarter-warp 128 contiguous B: the 16-B floor"),
        _cells("qk_stride130_fill_cp4", "cp_ca4", "qk_stride130", np.ones(WARP, int), 2 * LANE, 4,
               "design: 4-B copies, 128 contiguous B, no conflict; but 8 lanes a wavefront (H200, ncu)"),
        # -- ldmatrix.trans of an operand tile [c][k]: plain 256-B rows vs padding vs INTER
        _cells("op_plain256_ldsm_trans", "ldsm_x4_trans", "op_plain256", op_rows, op_cols, 32,
               "design: 256 B = 2 bank rounds, rows alias: 8-way x 4 matrices"),
        _cells("op_pad272_ldsm_trans", "ldsm_x4_trans", "op_pad272", op_rows, op_cols, 4,
               "Kernel A's D + 8: rows 16 B apart mod 128 B"),
        _cells("op_k_inter_ldsm_trans", "ldsm_x4_trans", "op_k_inter", op_rows, op_cols, 4,
               "INTER: each 8x8 core matrix is 128 contiguous B"),
        # -- dS, transpose-dual: one copy, read as B operand and as accumulator
        _cells("ds_b_ldsm", "ldsm_x4", "ds_b", ds_v, ds_k, 4,
               "design: transpose-dual, conflict-free (core matrices)"),
        _cells("ds_c_ldsm_trans", "ldsm_x4_trans", "ds_c", ds_k, ds_v, 4,
               "the same bytes as ds_b_ldsm, dealt transposed"),
        _cells("ds_c_stsm_trans", "stsm_x4_trans", "ds_c", ds_k, ds_v, 4,
               "the accumulator written back the same way"),
        _cells("ds_plain_ldsm", "ldsm_x4", "ds_plain", ds_v, ds_k, 32,
               "plain 256-B rows: 8-way x 4 matrices"),
        _cells("ds_plain_t_ldsm_trans", "ldsm_x4_trans", "ds_plain_t", ds_k, ds_v, 32,
               "plain rows read as the accumulator: 8-way x 4"),
        # -- R1 writing qd into its swizzled (MN_INTER) tile: scalar stores vs stmatrix
        _cells("qd_scalar_sts16", "st_u16", "qd_mn_inter", 4 * LANE + QD_J, np.full(WARP, QD_TOKEN), 16,
               "design: 16-way STS (16 core matrices 128 B apart)"),
        _cells("qd_stsm_trans", "stsm_x4_trans", "qd_mn_inter", qd_k, qd_c, 4,
               "design: STSM writes the swizzled tile conflict-free"),
    )


CASES: tuple[Case, ...] = _build_cases()
CASE_NAMES = tuple(c.name for c in CASES)
assert len(set(CASE_NAMES)) == len(CASES)


def baseline_of(case: Case) -> Case:
    """The conflict-free case of the same instruction: the fewest model wavefronts, first listed."""
    same = [c for c in CASES if c.op == case.op and c.exact]
    return min(same, key=lambda c: c.access().wavefronts)


# ----------------------------------------------------------------- the GPU side

def _smem_bytes(case: Case) -> int:
    span = int(case.addresses.max()) + OPS[case.op].bytes + (UNROLL - 1) * SHIFT_BYTES
    span = -(-span // 16) * 16
    if span > MAX_SMEM:
        raise ValueError(f"case {case.name}: needs {span} B of shared memory, more than {MAX_SMEM}")
    return span


class _Probes:
    """The compiled probes and the device arrays every launch shares."""

    def __init__(self) -> None:
        import cupy

        from ptx_lab.gpu import load_module

        self.cupy = cupy
        self.module = load_module(BANK_PROBES_CU.read_text())
        self.gmem = cupy.zeros(WARP * 16, dtype=cupy.uint8)          # cp.async's source
        self.src = cupy.asarray((16 * LANE).astype(np.uint32))       # coalesced 16-B slots
        self.cycles = cupy.zeros(1, dtype=cupy.uint64)
        self.sink = cupy.zeros(WARP, dtype=cupy.uint32)

    def launch(self, case: Case, reps: int) -> int:
        """Run `case` for `reps` iterations; returns the cycles lane 0 measured."""
        fn = self.module.get_function(OPS[case.op].kernel)
        offsets = self.cupy.asarray(case.addresses.astype(np.uint32))
        fn((1,), (WARP,), (offsets, self.src, self.gmem, np.int32(reps), np.uint32(0),
                           self.cycles, self.sink), shared_mem=_smem_bytes(case))
        self.cupy.cuda.runtime.deviceSynchronize()
        return int(self.cycles.get()[0])


def measure_clock(cases: Sequence[Case] = CASES) -> np.ndarray:
    """float (len(cases),): clock64 cycles per instruction (median of CLOCK_TRIALS)."""
    probes = _Probes()
    out = np.full(len(cases), np.nan)
    per = (REPS_HI - REPS_LO) * UNROLL
    for i, case in enumerate(cases):
        probes.launch(case, REPS_LO)   # warm-up: compile, first touch
        trials = [(probes.launch(case, REPS_HI) - probes.launch(case, REPS_LO)) / per
                  for _ in range(CLOCK_TRIALS)]
        out[i] = float(np.median(trials))
    return out


def run_child() -> int:
    """Under ncu: every case at REPS_LO then REPS_HI, in CASES order, nothing on stdout."""
    probes = _Probes()
    for case in CASES:
        for reps in (REPS_LO, REPS_HI):
            probes.launch(case, reps)
    return 0


def _kernel_name(shown: str) -> str:
    """ncu's "Kernel Name" without any parameter list: "bank_ld_u16(...)" -> "bank_ld_u16"."""
    return shown.split("(")[0].strip()


def _metric_names() -> list[str]:
    return [m for roles in NCU_METRICS.values() for cands in roles for m in cands]


def _pick(values: dict[str, float | None], candidates: Sequence[str]) -> tuple[float | None, str | None]:
    for name in candidates:
        if values.get(name) is not None:
            return values[name], name
    return None, None


def measure_ncu() -> tuple[dict[str, np.ndarray] | None, list[str]]:
    """Run this module as a child under ncu; per case, per instruction: wavefronts, conflicts.

    Returns (arrays or None, notes). Arrays: "instructions" (per access, should be 1),
    "wavefronts", "conflicts" (per instruction), NaN where a metric was missing.
    """
    from ptx_lab import ncu

    if ncu.ncu_path() is None:
        return None, ["ncu: not measured: ncu is not on PATH"]
    # the child imports this package: from the repo root, wherever ncu was started
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, **{CHILD_ENV: "1", "PYTHONPATH": path})
    prof = ncu.profile([sys.executable, "-m", f"experiments.{NAME}", "--child"], _metric_names(),
                       kernel_regex="^bank_", env=env)
    notes = [f"ncu: dropped unknown metric {m}" for m in prof.dropped]
    if prof.error:
        return None, notes + [f"ncu: not measured: {prof.error}"]
    expected = [(c, r) for c in CASES for r in (REPS_LO, REPS_HI)]
    if len(prof.launches) != len(expected):
        return None, notes + [f"ncu: not measured: saw {len(prof.launches)} bank_ launches, "
                              f"expected {len(expected)} (2 per case)"]
    out = {role: np.full(len(CASES), np.nan) for role in ROLES}
    per = (REPS_HI - REPS_LO) * UNROLL
    missing: set[str] = set()
    for i, case in enumerate(CASES):
        lo, hi = prof.launches[2 * i], prof.launches[2 * i + 1]
        if _kernel_name(lo.kernel) != OPS[case.op].kernel or _kernel_name(hi.kernel) != OPS[case.op].kernel:
            return None, notes + [f"ncu: not measured: launch {2 * i} is {lo.kernel!r}, "
                                  f"expected {OPS[case.op].kernel} for {case.name}"]
        roles = dict(zip(ROLES, NCU_METRICS[OPS[case.op].family]))
        got = {}
        for role, cands in roles.items():
            a, name_a = _pick(lo.metrics, cands)
            b, name_b = _pick(hi.metrics, cands)
            if a is None or b is None or name_a != name_b:
                missing.add(f"{OPS[case.op].family} {role} ({' / '.join(cands)})")
                continue
            got[role] = b - a
        if "instructions" in got:
            out["instructions"][i] = got["instructions"] / per
        # without an instruction count, fall back on the SASS: one instruction per access
        inst = got.get("instructions") or float(per)
        for role in ("wavefronts", "conflicts"):
            if role in got:
                out[role][i] = got[role] / inst
    notes += [f"ncu: no value for {m}" for m in sorted(missing)]
    if any("instructions" in m for m in missing):
        notes.append("ncu: where instructions were missing, per-instruction counts assume one "
                     "instruction per access (what the probes' SASS holds)")
    return out, notes


# ----------------------------------------------------------------- observe

def observe(backend: str, *, ncu: bool = True) -> dict[str, Any]:
    """The model's prediction per case and, on the GPU, clock64 and ncu measurements.

    Arrays are indexed like CASES; measurements not made are NaN and `notes`
    says which and why.
    """
    _common.check_backend(backend)
    accesses = [c.access() for c in CASES]
    obs: dict[str, Any] = {
        "model": np.array([a.wavefronts for a in accesses]),
        "model_conflicts": np.array([a.bank_conflicts for a in accesses]),
        "expected": np.array([c.expected for c in CASES]),
        "cycles": np.full(len(CASES), np.nan),
        "ncu_instructions": np.full(len(CASES), np.nan),
        "ncu_wavefronts": np.full(len(CASES), np.nan),
        "ncu_conflicts": np.full(len(CASES), np.nan),
        "notes": [],
    }
    if backend == "model":
        from ptx_lab.gpu import gpu_reason

        reason = gpu_reason()
        why = f"no GPU ({reason})" if reason else "the CPU model was asked for"
        obs["notes"] += [f"clock64: not measured: {why}", f"ncu: not measured: {why}"]
        return obs
    obs["cycles"] = measure_clock()
    if not ncu:
        obs["notes"].append("ncu: not measured: skipped (--no-ncu)")
    elif os.environ.get(CHILD_ENV):
        obs["notes"].append("ncu: not measured: already running under ncu")
    else:
        counts, notes = measure_ncu()
        obs["notes"] += notes
        if counts is not None:
            for role in ROLES:
                obs[f"ncu_{role}"] = counts[role]
    return obs


# ----------------------------------------------------------------- check

def _fail(chk: Checker, line: str | None) -> None:
    chk.checked += 1
    if line:
        chk.failures.append(line)


def clock_verdict(pred_ratio: float, meas_ratio: float) -> bool | None:
    """True/False where the clock64 rule judges, None where it only reports."""
    if pred_ratio == 1:
        return meas_ratio <= CLOCK_SAME
    if pred_ratio >= CLOCK_CLEAR_RATIO:
        return meas_ratio >= CLOCK_MIN_SLOWDOWN
    return None


def check(obs: dict[str, Any]) -> Checker:
    chk = Checker()
    index = {name: i for i, name in enumerate(CASE_NAMES)}
    chk.compare("model vs predicted", obs["model"], obs["expected"],
                lambda i: f"{CASES[i].name} ({CASES[i].why}) wavefronts")
    for i, case in enumerate(CASES):
        base = index[baseline_of(case).name]
        cyc, cyc0 = obs["cycles"][i], obs["cycles"][base]
        if case.exact and not (np.isnan(cyc) or np.isnan(cyc0)):
            pred = obs["model"][i] / obs["model"][base]
            meas = cyc / cyc0
            ok = clock_verdict(pred, meas)
            if ok is not None:
                _fail(chk, None if ok else
                      f"{case.name}: clock64 {cyc:.1f} cycles/inst = x{meas:.2f} of "
                      f"{CASES[base].name}, but the model says x{pred:g}")
        if not case.exact:
            continue
        for role, model_key in (("wavefronts", "model"), ("conflicts", "model_conflicts")):
            got = obs[f"ncu_{role}"][i]
            if not np.isnan(got):
                want = obs[model_key][i]
                _fail(chk, None if round(got, 3) == want else
                      f"{case.name}: ncu {role} per instruction {got:g}, model {want}")
        inst = obs["ncu_instructions"][i]
        if not np.isnan(inst):
            _fail(chk, None if round(inst, 3) == 1 else
                  f"{case.name}: ncu counted {inst:g} instructions per access, expected 1")
    return chk


# ----------------------------------------------------------------- the table

def _fmt(x: float, spec: str = "g") -> str:
    return "-" if np.isnan(x) else format(x, spec)


def table(obs: dict[str, Any]) -> str:
    index = {name: i for i, name in enumerate(CASE_NAMES)}
    head = ("case", "instruction", "model", "predicted", "clock64 cyc/inst", "ncu wf/inst",
            "ncu confl/inst", "verdict")
    rows = []
    for i, case in enumerate(CASES):
        base = index[baseline_of(case).name]
        cyc, cyc0 = obs["cycles"][i], obs["cycles"][base]
        clock = "-" if np.isnan(cyc) else f"{cyc:.1f} (x{cyc / cyc0:.1f})"
        verdicts = []
        if obs["model"][i] != obs["expected"][i]:
            verdicts.append("MODEL != PREDICTED")
        if not np.isnan(cyc):
            ok = clock_verdict(obs["model"][i] / obs["model"][base], cyc / cyc0) if case.exact else None
            verdicts.append({True: "clock ok", False: "CLOCK", None: "clock info"}[ok])
        wf = obs["ncu_wavefronts"][i]
        if not np.isnan(wf):
            same = round(wf, 3) == obs["model"][i] and (
                np.isnan(obs["ncu_conflicts"][i])
                or round(obs["ncu_conflicts"][i], 3) == obs["model_conflicts"][i])
            verdicts.append(("ncu =" if same else "NCU !=") if case.exact else
                             f"ncu info ({'strict' if round(wf, 3) == obs['model'][i] else 'merged'})")
        rows.append((case.name, OPS[case.op].ptx, str(obs["model"][i]), str(obs["expected"][i]), clock,
                     _fmt(wf, ".3g"), _fmt(obs["ncu_conflicts"][i], ".3g"),
                     ", ".join(verdicts) or "model = predicted"))
    widths = [max(len(r[k]) for r in (head, *rows)) for k in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])


@dataclasses.dataclass
class BankResult(_common.Result):
    """A Result that also carries the notes and the table, printed last."""
    notes: list[str] = dataclasses.field(default_factory=list)
    table: str = ""

    def report(self) -> str:
        return "\n".join([super().report(), *("  " + n for n in self.notes), "", self.table])


def run(backend: str, *, ncu: bool = True) -> BankResult:
    obs = observe(backend, ncu=ncu)
    res = check(obs).result(NAME, backend)
    return BankResult(res.name, res.backend, res.failures, res.checked, list(obs["notes"]), table(obs))


# ----------------------------------------------------------------- command line

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{NAME}", description=SUMMARY)
    parser.add_argument("--emulate", action="store_true",
                        help="use the CPU model only, even when a GPU is present")
    parser.add_argument("--no-ncu", action="store_true", help="on the GPU, time with clock64 only")
    parser.add_argument("--child", action="store_true",
                        help="internal: launch every case twice and exit (what ncu profiles)")
    parser.add_argument("--cases", action="store_true",
                        help="print each case's addresses and bank breakdown, then exit")
    parser.add_argument("--ncu-command", action="store_true",
                        help="print the ncu command line this experiment runs, then exit")
    args = parser.parse_args(argv)
    if args.child:
        return run_child()
    if args.ncu_command:
        from ptx_lab import ncu

        print(" ".join([ncu.NCU, *ncu.BASE_OPTIONS, "--metrics", ",".join(_metric_names()),
                        "--kernel-name", "regex:^bank_", "python3", "-m", f"experiments.{NAME}",
                        "--child"]))
        return 0
    if args.cases:
        for case in CASES:
            print(f"== {case.name}: {case.why}\n{case.access().describe()}\n")
        return 0
    result = run(_common.choose_backend(args.emulate), ncu=not args.no_ncu)
    print(result.report())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
