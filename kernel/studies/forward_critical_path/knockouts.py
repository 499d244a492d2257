"""The knockouts: each a small textual patch of a copy of the forward's sources that removes one part of
the per-tile work, and the trees built from them.

A knockout's results are wrong on purpose (a part of the arithmetic is missing): it is built to be
timed, never to be checked. Each patch keeps what the timing needs intact:

* the kernel's parameter list (the working tree's launch code runs it; :func:`build_tree` refuses a
  tree whose list differs, as ``ptx-lab source-ab`` does);
* its synchronisation: every named barrier is still met the same number of times by the same threads
  (the producer barrier's knockout removes it for every producer thread, and no other thread ever
  used it), and no ``__syncwarp`` is left inside a branch some lanes skip;
* its control flow where values could steer it: the pairwise path is chosen from g alone, which no
  knockout touches. (Without the producer barrier the span flags are read unsynchronised: a flag not
  yet written for this tile is that of the tile two before, false on the study's gates, or before a
  warp's first write what the shared memory held, which can send at most a CTA's first two tiles down
  the pairwise path. Forcing the flags false instead lets the compiler drop the pairwise path, and
  the build then spills.)
  A build with product warps (kernel.forward.Config.product_warps) has no producer barrier: there the
  product warps' hand-offs take its place, and that knockout leaves the build as it was.

The values a knockout computes may be garbage, inf or NaN (an Mqk from zeros, a state left to grow):
the arithmetic pipes, MMAs and stores it still runs take the same time for any value.

Every patch's old text must occur exactly once in the file it patches, so that a later edit of the
source makes the study fail loudly (:class:`PatchError`) instead of timing something else.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from kernel.tools import source_ab

KERNEL = "f"   # source_ab's room: the forward
FORWARD = "kernel/forward/cuda/forward.cu"
INTRA = "kernel/forward/cuda/forward_intra.cuh"
R1 = "kernel/forward/cuda/forward_r1.cuh"
GATE = "kernel/forward_states/cuda/forward_states_gate.cuh"   # R1's gate reading, shared with Kernel S (the copy only)


class PatchError(ValueError):
    """A knockout's old text is not in its file exactly once: the source changed under the study."""


@dataclasses.dataclass(frozen=True)
class Edit:
    path: str   # repository-relative, in the copied tree
    old: str    # must occur exactly once
    new: str


@dataclasses.dataclass(frozen=True)
class Knockout:
    name: str                 # the command line's and the JSON's
    part: str                 # the table's: what is knocked out
    edits: tuple[Edit, ...]
    # SASS the build must lose against the intact one at the auto configuration of 8 consumer warps
    # (mnemonic prefix, at least this many fewer): the CPU test's proof that the compiler did not
    # keep the work some other way
    removes: tuple[tuple[str, int], ...]


INV_SOLVE = Knockout(
    "inv-solve", "INV's 16-step forward substitution (INV = I - Lkk instead)",
    (Edit(INTRA, """        float x[TILE_TOKENS];
        kda_solve::unit_lower_column(x, [&](int i, int m) { return sc.lkk[i][m]; }, j);
#pragma unroll
        for (int i = 0; i < TILE_TOKENS; ++i) st.inv[i][j] = f32_to_bf16(x[i]);
""", """        // KNOCKOUT inv-solve: no forward substitution, each entry of INV = I - Lkk on its own
#pragma unroll
        for (int i = 0; i < TILE_TOKENS; ++i)
            st.inv[i][j] = f32_to_bf16(i == j ? 1.f : (j < i ? -sc.lkk[i][j] : 0.f));
"""),),
    removes=(("FFMA", 100),))

AKK_PRODUCT = Knockout(
    "akk-product", "Akk's tile product Ke Kr^T (build_inv's MMAs; Lkk from zeros)",
    (Edit(INTRA, """        tile_product(acc, sc.ke[parity], st, lane);
""", """        // KNOCKOUT akk-product: no Ke Kr^T, Akk's accumulators stay zero
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
"""),),
    removes=(("HMMA", 16), ("LDSM", 16)))

MQK = Knockout(
    "mqk", "Mqk's tile product Qe Kr^T (build_mqk's MMAs; Mqk from zeros and its diagonal)",
    (Edit(INTRA, """        tile_product(acc, sc.qe[parity], st, lane);
""", """        // KNOCKOUT mqk: no Qe Kr^T, Mqk's accumulators stay zero
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
"""),),
    removes=(("HMMA", 16), ("LDSM", 16)))

R1_EXP2 = Knockout(
    "r1-exp2", "R1's exp2f (each exponent copied: no gate weighting, gamma = gT)",
    (Edit(GATE, """make_float4(exp2f(gT[0]), exp2f(gT[1]), exp2f(gT[2]), exp2f(gT[3]))""",
          """make_float4(gT[0], gT[1], gT[2], gT[3]) /* KNOCKOUT r1-exp2 */"""),
     Edit(R1, """            const float start = exp2f(gc[e]), up = exp2f(gc[e] - gT[e]);
""", """            const float start = gc[e], up = gc[e] - gT[e];   // KNOCKOUT r1-exp2: copies, no exp2f
"""),
     Edit(R1, """            kr[e] = kf[e] * exp2f(gT[e] - gc[e]);
""", """            kr[e] = kf[e] * (gT[e] - gc[e]);
""")),
    removes=(("MUFU.EX2", 96),))

PRODUCER_BARRIER = Knockout(
    "producer-barrier", "the producers' named barrier before Mqk and INV",
    (Edit(FORWARD, """                producers_sync();   // every row's R1 (and copies) are in
""", """                // KNOCKOUT producer-barrier: no barrier; Mqk and INV may read rows R1 has not written yet
"""),),
    removes=(("BAR.SYNC", 1),))

CONSUMER_O = Knockout(
    "consumer-o", "the consumers' o: F1 and F2 MMAs and the o store",
    (Edit(FORWARD, """            u32 bq[4];
            const RowCol p = x4_cols_first(0, 16 * ks, xl);
            ldmatrix_x4(bq, smem_addr(&st.qd[p.row][p.col]));
            const u32 bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]};
            mma_m16n8k16_bf16(out[0], a, bq0, out[0]);
            mma_m16n8k16_bf16(out[1], a, bq1, out[1]);
""", """            (void)ks, (void)a;   // KNOCKOUT consumer-o: no F1
"""),
     Edit(FORWARD, """        {
            u32 b[4];
            const RowCol p = x4_cols_first(0, 0, xl);
            ldmatrix_x4(b, smem_addr(&st.mqk[p.row][p.col]));
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_m16n8k16_bf16(out[0], ua, b0, out[0]);
            mma_m16n8k16_bf16(out[1], ua, b1, out[1]);
        }
""", """        // KNOCKOUT consumer-o: no F2
"""),
     Edit(FORWARD, """        {
            u32 a[4];
            acc_to_a(a, out[0], out[1]);
            const RowCol p = x4_cols_first(0, 0, xl);
            stmatrix_x4_trans(smem_addr(&sh.snap[warp][p.row][p.col]), a[0], a[1], a[2], a[3]);
            __syncwarp();
            const int L = min(TILE_TOKENS, len - TILE_TOKENS * i);
            const int row = lane / 2, half = lane % 2;
            if (row < L)
                *reinterpret_cast<uint4*>(o + ((bos + (long long)TILE_TOKENS * i + row) * HV + h) * HEAD_DIM
                                          + vg * VW + vrow + half * 8) =
                    *reinterpret_cast<const uint4*>(&sh.snap[warp][row][half * 8]);
        }
""", """        (void)out;   // KNOCKOUT consumer-o: no o store
""")),
    removes=(("HMMA", 18), ("STSM", 1)))

SNAPSHOT_STORE = Knockout(
    "snapshot-store", "the states' snapshot store (S still staged every 4th tile)",
    (Edit(FORWARD, """        if (snap) {
            kda_walk::store_snapshot(""", """        if (false) {   // KNOCKOUT snapshot-store: the staged S is not stored
            kda_walk::store_snapshot("""),),
    removes=(("STG.E.128", 8),))

BLOCK_STORES = Knockout(
    "block-stores", "the producers' Aqk and Akk block stores",
    (Edit(INTRA, """            if (aqk != nullptr && vg == 0) store_block(aqk, st.mqk, tok0, L, i, HV, h, lane);
""", """            (void)tok0;   // KNOCKOUT block-stores: no Aqk block
"""),
     Edit(INTRA, """            if (akk != nullptr && vg == 0) store_block(akk, st.inv, tok0, L, i, HV, h, lane);
""", """            // KNOCKOUT block-stores: no Akk block
""")),
    removes=(("STG.E.128", 2),))

INTRA_ALL = Knockout(
    "intra", "all of the producers' intra-tile products: Mqk, Akk's product and INV's solve",
    MQK.edits + AKK_PRODUCT.edits + INV_SOLVE.edits,
    removes=(("HMMA", 32), ("LDSM", 32), ("FFMA", 100)))

# The table's order: the producers' path as a tile walks it, then the consumers'.
KNOCKOUTS = (R1_EXP2, PRODUCER_BARRIER, MQK, AKK_PRODUCT, INV_SOLVE, INTRA_ALL, BLOCK_STORES, CONSUMER_O,
             SNAPSHOT_STORE)
BY_NAME = {k.name: k for k in KNOCKOUTS}


def apply(knockout: Knockout, root: Path) -> None:
    """Patch the copied tree under `root` in place, edit by edit; PatchError where an edit's old text is
    not in its file exactly once (counted after the edits before it)."""
    for n, edit in enumerate(knockout.edits):
        path = root / edit.path
        text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            first = edit.old.strip().splitlines()[0]
            raise PatchError(f"knockout {knockout.name}, edit {n}: {edit.path} holds its text {count} times, "
                             f"expected exactly once (first line {first!r}): the source changed under the "
                             f"study; re-read the part and write the patch again")
        path.write_text(text.replace(edit.old, edit.new))


def build_tree(knockout: Knockout, into: Path) -> Path:
    """A copy of the working tree's forward sources (with the headers it includes from elsewhere) under
    `into`, patched by `knockout`; returns its cuda directory, checked to take the working tree's
    kernel parameters (source_ab.check_old)."""
    cuda = source_ab.copy_tree(KERNEL, into)
    apply(knockout, into)
    return source_ab.check_old(cuda, KERNEL)


def select(names: Sequence[str] | None) -> tuple[Knockout, ...]:
    """The knockouts named, in the table's order; all where `names` is None. ValueError names an unknown one."""
    if names is None:
        return KNOCKOUTS
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown knockout(s) {', '.join(unknown)}: expected names from {', '.join(BY_NAME)}")
    return tuple(k for k in KNOCKOUTS if k.name in names)
