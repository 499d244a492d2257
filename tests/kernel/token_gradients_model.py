"""Kernel B (kernel/token_gradients/cuda/token_gradients.cu and its token_gradients_*.cuh) on the CPU,
lane by lane.

One CTA of the kernel (8 warps, one 64-token chunk of one head) is replayed through
:mod:`ptx_lab.model`: every ldmatrix, stmatrix, mma.m16n8k16 and cp.async of the kernel is the
model's, at the address the kernel computes, on a shared-memory image with the kernel's layout;
the scalar code between them (R1, the reductions, the gate's cumsums) is numpy over lanes
or threads, in fp32 where the kernel keeps fp32. The kernel builds with -ftz=true, and the model
flushes where that matters: every exp2f and R1's products (Kd, Kr, Qe, beta Ke), the K phase's and
the pairwise sums' decays, are zero below 2^-126 (:func:`_ftz`), so that R1's Kr = k 2^(gT - gc) of a
small k is lost as on the device. A layout or address mistake in the kernel shows
here as an O(1) error, with no GPU (tests/kernel/token_gradients/test_cuda.py).

The kernel's text (:data:`CU`) is the entry file with each of its ``#include
"token_gradients_*.cuh"`` replaced by that header, in the order the compiler reads them
(:func:`kernel_text`), so that what is read follows the code wherever it moves. Three things are
read from it rather than copied, so that they cannot drift:

* the shared-memory layout: every ``constexpr int NAME = expr;`` line (:data:`LAYOUT`; ROW = 272-byte
  bf16 rows, 32-byte rows for Mqk / INV, PS = 24, GC_ROW = 136), with the build macros it names set to the
  qk_rstd build's (:data:`LAYOUT_MACROS`: the image then has room for its rstd stage; no other offset depends
  on them);
* every fragment load and store: :data:`SITES` holds the kernel's statement verbatim (``a_of``,
  ``a_of_t``, ``b_of``, ``b_of_t``, ``stmatrix_x4_trans``); the emulation evaluates the
  statement's address expression (``nc + SM_KR + at(0, 16 * ks2)``) with the lane parts of
  ``x4_lane_bytes_rows_first`` / ``_cols_first`` (ptx_lab/cuda/ldmatrix.cuh; their model is
  ptx_lab.fragments.x4_lane_offsets), and a statement missing from the kernel is an error that
  names it;
* the reduce step's A-fragment positions (:data:`FRAG_INDEX`, the kernel's ``plain`` / ``trans``).

The rest mirrors the kernel by hand, one method per part; :data:`PARTS` names, for each, the
function or marker of the kernel it mirrors (checked to be there, as SITES are):

    copies_of, load_tile    copies_of, load_tile (token_gradients_loads.cuh)
    CtaModel.__init__       the kernel's prologue: tables, lane parts, the first load_tile
    CtaModel.run, _tile     the tile loop, tile it + 1 prefetched into stage st ^ 1
    CtaModel._r1            rebuild_operands (token_gradients_r1.cuh): Kd, Kr, Qe, beta Ke in bf16,
                            gc in fp32; gamma, gT; the qk_rstd build's normalised q, k written back
    CtaModel._load_state    it == 0: S0^T into the fp32 accumulators (a_to_acc)
    CtaModel._v_phase       v_phase and g9_g10_partials (token_gradients_v_phase.cuh): G6, G7 (beta
                            Vn in two parts), G1 + G2, G3 (dU in two parts), the U / dW / dv stores
                            and U's remainder, the d and rowsum(dW . Vn) partials, the G9 / G10
                            partials (U in two parts)
    CtaModel._g8            next_state (token_gradients_v_phase.cuh): S1^T = gamma S0^T + U^T Kr
    CtaModel._reduce        reduce_partials (token_gradients_reduce.cuh): the fixed-order sums over
                            warps, dMqk / dLkk fragments and those of what their bf16 rounding left
    CtaModel._k_phase       the K phase (the entry file): G11-G13, S0 dS1^T, G14-G17 (twice: the
                            roundings, the remainders), dgamma, dq / dk / dg
    CtaModel._finish        the tile's end (the entry file): dbeta, dv, S1 to shared memory (bf16)

cp.async copies land at once (the model's), which is what the kernel sees after its
cp_async_wait and barrier; the warps run one after another within a phase, which the kernel's
barriers make equivalent.

``swaps`` replaces what one statement does, at the same address: a load's recipe (say ``b_of``
for ``b_of_t``), a store's (``stmatrix_x4`` for ``stmatrix_x4_trans``), or one of the reduce
step's fragment positions (``{"plain": "trans"}``): the test's proof that such mistakes are caught.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from kernel.shapes import RCP_LN2 as _RCP_LN2, SPAN_LIMIT as _SPAN_LIMIT, qk_head
from kernel.token_gradients import SOURCE_PATH, tables
from ptx_lab import fragments, model

# its own headers beside it, and the shapes header two folders up (a comment may follow either)
OWN_INCLUDE = re.compile(r'^#include "(token_gradients_\w+\.cuh|\.\./\.\./shapes\.cuh)"[ \t]*(?://[^\n]*)?$',
                         flags=re.M)


def kernel_text(entry: Path = SOURCE_PATH) -> str:
    """The kernel's own text: `entry` with each ``#include "token_gradients_*.cuh"`` and the
    ``#include "../../shapes.cuh"`` (kernel/shapes.cuh, the shapes every kernel shares) replaced by that
    header's text (its own such includes likewise), each header once, where the compiler first reads
    it. ptx_lab's headers stay out: the replay reads the kernel's statements only."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def one(m: re.Match) -> str:
            name = m.group(1)
            if name in seen:
                return ""
            seen.add(name)
            path = (entry.parent / name).resolve()
            if not path.is_file():
                raise LookupError(f"{entry.name} includes {name}, which is not at {path}")
            return expand(path.read_text())
        return OWN_INCLUDE.sub(one, text)

    return expand(entry.read_text())


CU = kernel_text()
WARP = 32
LANE = np.arange(WARP)
G, T = LANE >> 2, LANE & 3          # the kernel's g = lane >> 2, t = lane & 3


# ----------------------------------------------------------------------------
# the layout, read from the kernel's constexpr lines
# ----------------------------------------------------------------------------

# the build macros a layout line reads, at the build whose shared memory is the largest (the qk_rstd build's
# stage of the rstd rows lies past every other offset)
LAYOUT_MACROS = {"KDB_QK_RSTD": 1}


def _layout(src: str, macros: dict[str, int] = LAYOUT_MACROS) -> dict[str, int]:
    """Every ``constexpr int NAME = expr;`` of the kernel, evaluated in order (integer +, -, * and C's
    integer /), with ``macros`` the values of the build macros they read."""
    out: dict[str, int] = dict(macros)
    for name, expr in re.findall(r"^\s*constexpr int (\w+) = ([^;]+);", src, flags=re.M):
        if not re.fullmatch(r"[\w\s+*/()-]+", expr):
            raise ValueError(f"token_gradients.cu: constexpr {name} = {expr}: not integer arithmetic")
        value = eval(expr.replace("/", "//"), {"__builtins__": {}}, dict(out))   # noqa: S307 (the kernel's own text)
        out[name] = int(value)
    return {name: value for name, value in out.items() if name not in macros}


LAYOUT = _layout(CU)
# the widest span (log2) a channel may have in a tile before the K phase goes pairwise (kernel/shapes.cuh's;
# a test may set another here)
SPAN_LIMIT = np.float32(_SPAN_LIMIT)
FP32_TINY = np.float32(2.0 ** -126)   # fp32's smallest normal: -ftz=true flushes what falls below it
# R1's 1 / ln 2 (the token-gate build's scale of each token's natural-log gate to log2: kernel/shapes.cuh's)
RCP_LN2 = np.float32(_RCP_LN2)
HEAD_DIM, TILE_TOKENS, CHUNK_TOKENS = LAYOUT["HEAD_DIM"], LAYOUT["TILE_TOKENS"], LAYOUT["CHUNK_TOKENS"]
TILES_PER_CHUNK = LAYOUT["TILES_PER_CHUNK"]
WARPS, ROW, STAGE, SMEM_BYTES = LAYOUT["WARPS"], LAYOUT["ROW"], LAYOUT["STAGE"], LAYOUT["SMEM_BYTES"]
PS, GC_ROW = LAYOUT["PS"], LAYOUT["GC_ROW"]
THREADS = WARPS * WARP
# cp.async by part of a warp: the idle lanes' copies go to a scratch area past the kernel's shared
# memory with 0 source bytes (model.cp_async takes all 32 lanes; nothing reads the scratch)
SCRATCH = WARP * 16


# ----------------------------------------------------------------------------
# the fragment loads and stores, the kernel's statements verbatim
# ----------------------------------------------------------------------------

SITES: dict[str, str] = {
    "S0 regs": "a_of_t(x, ncv + SM_S + at(16 * b, 0));",
    "G6 B Kd^T": "b_of_t(b0, b1f, nc + SM_KD + at(0, 16 * ks2));",
    "v^T": "a_of_t(vt, scv + ST_V);",
    "G7 B INV^T": "b_of_t(b0, b1f, sc32 + ST_INV);",
    "G1 A do^T": "a_of_t(dot, scv + ST_DO);",
    "G1 B Mqk": "b_of(b0, b1f, sr32 + ST_MQK);",
    "G2 A dS1^T": "a_of_t(aa, scv + ST_DS + at(16 * ks2, 0));",
    "G2 B Kr^T": "b_of_t(b0, b1f, nc + SM_KR + at(0, 16 * ks2));",
    "G3 B INV": "b_of(b0, b1f, sr32 + ST_INV);",
    "U store": "stmatrix_x4_trans(ncv + SM_U, x[0], x[1], x[2], x[3]);",
    "dW store": "stmatrix_x4_trans(ncv + SM_DW, x[0], x[1], x[2], x[3]);",
    "dv store": "stmatrix_x4_trans(ncv + SM_DV, x[0], x[1], x[2], x[3]);",
    "G9 A do": "a_of(ad, srv + ST_DO);",
    "G10 A dW": "a_of(aw, nrv + SM_DW);",
    "G9 B U^T": "b_of_t(b0, b1f, ncv + SM_U);",
    "U remainder store": "stmatrix_x4_trans(nc32 + SM_URES + 512 * warp, xr[0], xr[1], xr[2], xr[3]);",
    "G9 B U^T remainder": "b_of_t(b0, b1f, nc32 + SM_URES + 512 * warp);",
    "G8 B Kr": "b_of(b0, b1f, nr + SM_KR + at(0, 16 * b));",
    "G11 B S0^T": "b_of_t(bs0, bs1, nck + SM_S + at(0, 16 * ks2));",
    "G13 B dS1^T": "b_of_t(bd0, bd1, sck + ST_DS + at(0, 16 * ks2));",
    "G11 A do": "a_of(ad, sr + ST_DO + at(0, 16 * ks2));",
    "G12 A dW": "a_of(aw, nr + SM_DW + at(0, 16 * ks2));",
    "G13 A U": "a_of(au, nr + SM_U + at(0, 16 * ks2));",
    "dgamma A S0": "a_of(as, nr + SM_S + at(k0, 16 * ks2));",
    "G14 B Kr": "b_of(bk0, bk1, nrk + SM_KR);",
    "G15 B Qe": "b_of(bq0, bq1, nrk + SM_QE);",
    "G17 B beta Ke": "b_of(be0, be1, nrk + SM_BKE);",
    "S1 store": "stmatrix_x4_trans(ncv + SM_S + at(16 * b, 0), x[0], x[1], x[2], x[3]);",
}
RECIPES = ("a_of", "a_of_t", "b_of", "b_of_t")
# what the four recipes are in the kernel (checked verbatim): ldmatrix x4 plain or .trans, B's
# registers 0, 1 the first 8-column n-tile and 2, 3 the second -- as CtaModel.load reads them
RECIPE_DEFS = (
    "__device__ __forceinline__ void a_of(u32 (&a)[4], u32 addr_rows) { ldmatrix_x4(a, addr_rows); }",
    "__device__ __forceinline__ void a_of_t(u32 (&a)[4], u32 addr_cols) { ldmatrix_x4_trans(a, addr_cols); }",
    "ldmatrix_x4_trans(b0[0], b0[1], b1[0], b1[1], addr_rows);",
    "ldmatrix_x4(b0[0], b0[1], b1[0], b1[1], addr_cols);",
)
STORES = ("stmatrix_x4_trans", "stmatrix_x4")   # the second only as a swap: the kernel stores .trans
# the reduce step's element positions in the A fragment of the matrix and of its transpose
# (frag_position's body, and the reduce step's use of it: the transpose's position swaps the arguments)
FRAG_INDEX: dict[str, str] = {
    "position": "return (4 * (i & 7) + ((jj & 7) >> 1)) * 8 + ((i >> 3) + 2 * (jj >> 3)) * 2 + (jj & 1);",
    "plain, trans": "const int plain = frag_position(i, jj), trans = frag_position(jj, i);",
}
# the kernel's function or marker each part of CtaModel mirrors by hand (the module docstring's table)
PARTS: dict[str, str] = {
    "copies_of": "__device__ __forceinline__ Copies copies_of(int tid, long long RS, long long QK_RS) {",
    "load_tile": "__device__ __forceinline__ void load_tile(",
    "CtaModel.__init__": "const Copies cps = copies_of(tid, RS, QK_RS);",
    "CtaModel.run": "for (int it = 0; it < ntile; ++it) {",
    "CtaModel._r1": "__device__ __forceinline__ bool rebuild_operands(",
    "CtaModel._pairwise_row": "__device__ __forceinline__ PairwiseRow pairwise_row(",
    "CtaModel._load_state": "a_to_acc(S[2 * b], S[2 * b + 1], x);",
    "CtaModel._v_phase": "__device__ __forceinline__ void v_phase(",
    "CtaModel._v_phase (G9 / G10)": "__device__ __forceinline__ void g9_g10_partials(",
    "CtaModel._g8": "__device__ __forceinline__ void next_state(",
    "CtaModel._reduce": "__device__ __forceinline__ void reduce_partials(",
    "CtaModel._k_phase": "// ================= K phase: k columns k0..k0+15, tokens as M =================",
    "CtaModel._finish": "__syncthreads();   // the K phase has read S0, dS1, U, dW; the dbeta partials are in",
}


def _split_args(text: str) -> list[str]:
    """Top-level comma split of a call's argument list."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        depth += (ch in "([") - (ch in ")]")
        cur += ch
    return args + [cur.strip()]


@dataclasses.dataclass(frozen=True)
class Site:
    recipe: str   # a_of, a_of_t, b_of, b_of_t or stmatrix_x4_trans
    addr: str     # the address expression, as C (and as Python: + * and at())


WHERE = "token_gradients.cu or its token_gradients_*.cuh"


def _sites(src: str) -> dict[str, Site]:
    code = {line.strip() for line in src.splitlines()}
    out = {}
    for name, stmt in SITES.items():
        if stmt not in code:
            raise LookupError(f"SITES[{name!r}]: the statement {stmt!r} is not in {WHERE}; "
                              f"mirror the kernel's change in tests/kernel/token_gradients_model.py")
        m = re.fullmatch(r"(\w+)\((.*)\);", stmt)
        args = _split_args(m.group(2))
        out[name] = Site(m.group(1), args[0] if m.group(1) == "stmatrix_x4_trans" else args[-1])
    for name, stmt in FRAG_INDEX.items():
        if stmt not in code:
            raise LookupError(f"FRAG_INDEX[{name!r}]: {stmt!r} is not in {WHERE}")
    for stmt in RECIPE_DEFS:
        if stmt not in code:
            raise LookupError(f"RECIPE_DEFS: {stmt!r} is not in {WHERE}")
    for name, marker in PARTS.items():
        if not any(line.startswith(marker) for line in code):
            raise LookupError(f"PARTS[{name!r}]: no line of {WHERE} starts with {marker!r}; find where the "
                              f"part went and name it in tests/kernel/token_gradients_model.py")
    return out


SITE = _sites(CU)


FRAG_ORDERS = ("plain", "trans")


def frag_index(which: str, i: np.ndarray, jj: np.ndarray) -> np.ndarray:
    """The kernel's ``plain`` (frag_position(i, jj)) or ``trans`` (frag_position(jj, i)): the u16 position
    in a [32 lanes][4] u32 fragment."""
    expr = FRAG_INDEX["position"].removeprefix("return").rstrip(";")
    args = {"i": i, "jj": jj} if which == "plain" else {"i": jj, "jj": i}
    return eval(expr, {"__builtins__": {}}, args)   # noqa: S307 (the kernel's own text)


def lane_bytes(order: str, row_bytes: int) -> np.ndarray:
    """The kernel's x4_lane_bytes_rows_first / _cols_first(row_bytes, xl) (ldmatrix.cuh): the lane's
    byte offset in a 16 x 16 block, `order` "rows_first" or "cols_first"."""
    return fragments.x4_lane_offsets(order, row_bytes)


def at(row0, col0):
    """The kernel's at(row0, col0): byte offset of element (row0, col0) of a 272-byte-row tile."""
    return row0 * ROW + col0 * 2


# ----------------------------------------------------------------------------
# the inputs, as the kernel's global arrays
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class Inputs:
    """Kernel B's global arrays (Args in token_gradients_loads.cuh), numpy: bf16 as uint16 bits.

    q, k [tokens, H, 128] bf16; v, do [tokens, HV, 128] bf16 (HV = H, or a multiple of it: FLA's
    grouped value heads); g [tokens, HV, 128] fp32 (FLA's 64-chunk-local log2 cumsum); beta
    [tokens, HV] fp32; aqk, akk [tokens, HV, 64] bf16; ds [tiles, HV, 128, 128] bf16 (dS after every
    tile); states [chunks, HV, 128, 128] bf16 (the state entering every chunk); cu [N + 1] int64
    offsets; scale; q_rstd, k_rstd [tokens, H] fp32 or None (the forward's l2norm: dq and dk then go
    through its backward).
    """
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    aqk: np.ndarray
    akk: np.ndarray
    ds: np.ndarray
    states: np.ndarray
    cu: np.ndarray
    scale: float
    q_rstd: np.ndarray | None = None
    k_rstd: np.ndarray | None = None
    dqk_bf16: bool = False    # dq, dk stored as bf16 (Outputs then hold their bf16 values as fp32)
    # (the qk_rstd build, CtaModel's qk_rstd: q and k the raw rows, q_rstd and k_rstd required)

    def image(self, name: str) -> np.ndarray:
        """The array as a flat byte image (the model's global memory)."""
        return np.ascontiguousarray(getattr(self, name)).reshape(-1).view(np.uint8)


@dataclasses.dataclass
class Copies:
    """The kernel's Copies of every thread (vectors over tid 0..255)."""
    row16: np.ndarray
    col16: np.ndarray
    grow: np.ndarray
    gcol: np.ndarray
    off16: np.ndarray
    offg: np.ndarray
    qk_off16: np.ndarray
    beta_row: np.ndarray
    blk_row: np.ndarray
    blk_half: np.ndarray
    blk_which: np.ndarray


def copies_of(tid: np.ndarray, RS: int, QK_RS: int) -> Copies:
    x = tid - 48
    return Copies(row16=tid >> 4, col16=tid & 15, grow=tid >> 5, gcol=tid & 31,
                  off16=(tid >> 4) * RS + (tid & 15) * 8, offg=(tid >> 5) * RS + (tid & 31) * 4,
                  qk_off16=(tid >> 4) * QK_RS + (tid & 15) * 8,
                  beta_row=tid - 32, blk_row=(x & 31) >> 1, blk_half=x & 1, blk_which=x >> 5)


# ----------------------------------------------------------------------------
# one CTA
# ----------------------------------------------------------------------------

def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _ftz(x) -> np.ndarray:
    """fp32 with subnormals flushed to (signed) zero: what the kernel's -ftz=true exp2f and multiplies
    leave where a result falls below 2^-126."""
    x = _f32(x)
    return np.where(np.abs(x) < FP32_TINY, np.copysign(np.float32(0), x), x).astype(np.float32)


def _bf(bits) -> np.ndarray:
    """bf16 bits (the low 16 of an integer array) as fp32: the kernel's bf16_to_f32()."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def _sum_over_g(x: np.ndarray) -> np.ndarray:
    """The kernel's sum_over_g: xor shuffles 4, 8, 16 (fp32, the same order)."""
    for m in (4, 8, 16):
        x = _f32(x + x[LANE ^ m])
    return x


def _sum_over_t(x: np.ndarray) -> np.ndarray:
    """A row's 4 lanes' sum: xor shuffles 1, 2 (fp32, the kernel's order)."""
    for m in (1, 2):
        x = _f32(x + x[LANE ^ m])
    return x


def _halves(regs: np.ndarray) -> list[np.ndarray]:
    """The kernel's bf16_lo / bf16_hi of registers 0..3, in the order lo0, hi0, lo1, hi1, ..."""
    out = []
    for r in range(regs.shape[1]):
        lo, hi = model.unpack_bf16x2(regs[:, r])
        out += [_f32(lo), _f32(hi)]
    return out


def _pack_a(c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """The kernel's acc_to_a (fragments.cuh): two accumulators -> one A fragment (no lane exchange)."""
    return fragments.acc_to_a(_f32(c0), _f32(c1))


def _pack_a_two_parts(c0: np.ndarray, c1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's acc_to_a_two_parts (fragments.cuh): the A fragment of the bf16 roundings, and
    of what they left."""
    return fragments.acc_to_a_two_parts(_f32(c0), _f32(c1))


def _mma(d: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return model.mma_m16n8k16(a, np.ascontiguousarray(b), _f32(d), "bfloat16")


def _zeros() -> np.ndarray:
    return np.zeros((WARP, 4), np.float32)


@dataclasses.dataclass
class Outputs:
    """What the CTA wrote: the kernel's outputs in their global layouts (never written: NaN), and
    the state it carries after every tile but the last (fp32 accumulators and the bf16 image),
    each as S1 [K, V]."""
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray      # float32 values of the bf16 dv
    dg: np.ndarray
    dbeta: np.ndarray
    S1_fp32: list
    S1_bf16: list
    pairwise: list = dataclasses.field(default_factory=list)   # per tile walked: G14-G17 formed pairwise


# The qk_rstd build's uses of the staged rstd, which CtaModel's ``leave_out`` can each leave out (the proof that
# the tests see each): R1's operands from the normalised q or k rows, the normalised rows R1 writes back to the
# stage (for the K phase, the pairwise path and the l2norm's backward), the rstd factor of the l2norm's backward.
RSTD_USES = ("r1 q", "r1 k", "stage q", "stage k", "epilogue q", "epilogue k")


class CtaModel:
    """One CTA of Kernel B: blockIdx = (run, h), h a value head (q and k read at qk_head's), the run one of
    ``run_chunks`` consecutive chunks of a sequence (kernel.token_gradients.tables' run_chunk0)."""

    def __init__(self, inp: Inputs, run: int, h: int, *, run_chunks: int = 1, swaps: dict[str, str] | None = None,
                 token_gate: bool = False, qk_rstd: bool = False, leave_out: str | None = None):
        """``token_gate``: the KDB_TOKEN_GATE=1 build, inp.g each token's natural-log gate. ``qk_rstd``: the
        KDB_QK_RSTD=1 build, inp.q and inp.k the raw rows and their rstd required; ``leave_out``: one of
        :data:`RSTD_USES`, which that build then does without (the row left raw, the factor 1)."""
        if qk_rstd and (inp.q_rstd is None or inp.k_rstd is None):
            raise ValueError("qk_rstd: the build reads q_rstd and k_rstd")
        if leave_out is not None and (not qk_rstd or leave_out not in RSTD_USES):
            raise ValueError(f"leave_out: one of {RSTD_USES}, with qk_rstd; got {leave_out!r}")
        self.inp = inp
        self.token_gate = token_gate
        self.qk_rstd, self.leave_out = qk_rstd, leave_out
        self.swaps = dict(swaps or {})
        for site, recipe in self.swaps.items():
            kinds = (RECIPES if SITE[site].recipe in RECIPES else STORES) if site in SITE else FRAG_ORDERS
            if (site not in SITE and site not in FRAG_ORDERS) or recipe not in kinds:
                raise ValueError(f"swaps: {site!r} -> {recipe!r}: expected a site of SITES with one of "
                                 f"{RECIPES} (loads) or {STORES} (stores), or 'plain' / 'trans' -> the other")
        tokens, self.HV = inp.v.shape[:2]
        self.H = inp.q.shape[1]
        HV = self.HV
        self.h, self.qh, self.s = h, qk_head(h, HV, self.H), np.float32(inp.scale)
        tab = tables(np.asarray(inp.cu, dtype=np.int64), run_chunks)
        chunk0 = int(tab["run_chunk0"][run])
        n = int(tab["chunk_seq"][chunk0])
        j0 = chunk0 - int(tab["chunk_offs"][n])
        length = int(inp.cu[n + 1] - inp.cu[n])
        self.tok_run = int(inp.cu[n]) + CHUNK_TOKENS * j0
        self.run_len = min(CHUNK_TOKENS * run_chunks, length - CHUNK_TOKENS * j0)
        self.ntile = (self.run_len + TILE_TOKENS - 1) // TILE_TOKENS
        self.snap0 = int(tab["tile_offs"][n]) + TILES_PER_CHUNK * j0
        self.RS, self.QK_RS = HV * HEAD_DIM, self.H * HEAD_DIM
        self.smem = np.zeros(SMEM_BYTES + SCRATCH, np.uint8)
        self.glob = {name: inp.image(name) for name in ("q", "k", "v", "do", "g", "beta", "aqk", "akk", "ds",
                                                        "states") + (("q_rstd", "k_rstd") if qk_rstd else ())}
        self.cps = copies_of(np.arange(THREADS), self.RS, self.QK_RS)
        self.S = np.zeros((WARPS, WARP, 16, 4), np.float32)   # every warp's float S[16][4]
        self.pending: dict = {}   # warp -> the K phase's dq, dk before their stores (_k_out)
        size = tokens * HV * HEAD_DIM
        self.out = Outputs(dq=np.full(size, np.nan, np.float32), dk=np.full(size, np.nan, np.float32),
                           dv=np.full(size, 0xFFFF, np.uint16), dg=np.full(size, np.nan, np.float32),
                           dbeta=np.full(tokens * HV, np.nan, np.float32), S1_fp32=[], S1_bf16=[])
        self.load_tile(0, 0, (self.tok_run * HV + h) * HEAD_DIM, (self.tok_run * self.H + self.qh) * HEAD_DIM,
                       min(TILE_TOKENS, self.run_len), self.snap0, chunk0)

    # ---- shared memory views (the image is replaced by every store the model makes)
    def f32(self, byte_off: int) -> np.ndarray:
        return self.smem[byte_off:SMEM_BYTES].view(np.float32)

    def u16(self, byte_off: int) -> np.ndarray:
        return self.smem[byte_off:SMEM_BYTES].view(np.uint16)

    def u32(self, byte_off: int) -> np.ndarray:
        return self.smem[byte_off:SMEM_BYTES].view(np.uint32)

    # ---- the fragment sites
    def load(self, site: str, env: dict, **loop):
        """A SITES load at the kernel's address: A -> (32, 4); B -> (b0, b1), each (32, 2)."""
        s = SITE[site]
        addr = np.asarray(eval(s.addr, {"__builtins__": {}, "at": at}, {**env, **loop}))   # noqa: S307
        recipe = self.swaps.get(site, s.recipe)
        regs = model.ldmatrix(self.smem, addr.astype(np.int64), 4, trans=recipe in ("a_of_t", "b_of"))
        return regs if recipe.startswith("a_") else (regs[:, 0:2], regs[:, 2:4])

    def store(self, site: str, env: dict, regs: np.ndarray, **loop) -> None:
        s = SITE[site]
        assert s.recipe == "stmatrix_x4_trans", site
        addr = np.asarray(eval(s.addr, {"__builtins__": {}, "at": at}, {**env, **loop}))   # noqa: S307
        trans = self.swaps.get(site, s.recipe) == "stmatrix_x4_trans"
        self.smem = model.stmatrix(self.smem, addr.astype(np.int64), regs, trans=trans)

    # ---- cp.async by a part of a warp
    def cp_async(self, warp: int, active: np.ndarray, dst, src, size: int, nbytes, cache: str,
                 gname: str) -> None:
        """The copies of warp `warp`'s lanes where `active`; dst, src in bytes."""
        sl = slice(32 * warp, 32 * warp + 32)
        act = np.broadcast_to(active, (THREADS,))[sl]
        if not act.any():
            return
        d = np.where(act, np.broadcast_to(dst, (THREADS,))[sl], SMEM_BYTES + 16 * LANE)
        s_ = np.where(act, np.broadcast_to(src, (THREADS,))[sl], 0)
        n = np.where(act, np.broadcast_to(nbytes, (THREADS,))[sl], 0)
        self.smem = model.cp_async(self.smem, self.glob[gname], d.astype(np.int64), s_.astype(np.int64), size,
                                   n.astype(np.int64), cache)

    def load_tile(self, st: int, it: int, row0: int, qk_row0: int, lt: int, snap: int, state_chunk: int = -1) -> None:
        """The kernel's load_tile (every thread's copies, warp by warp): `it` the tile's place in its chunk,
        and with ``state_chunk`` >= 0 that chunk's entry state too."""
        cp, RS, HV, h = self.cps, self.RS, self.HV, self.h
        tid = np.arange(THREADS)
        base = st * STAGE
        L = LAYOUT
        every = np.ones(THREADS, bool)
        ok = cp.row16 < lt
        off = row0 + np.where(ok, cp.off16, cp.col16 * 8)
        qk_off = qk_row0 + np.where(ok, cp.qk_off16, cp.col16 * 8)
        dst = cp.row16 * ROW + cp.col16 * 16
        n16 = np.where(ok, 16, 0)
        copies = []   # (active, dst, src bytes, size, nbytes, cache, tensor)
        for name, at_, o in (("q", "ST_Q", qk_off), ("k", "ST_K", qk_off), ("v", "ST_V", off), ("do", "ST_DO", off)):
            copies.append((every, base + L[at_] + dst, 2 * o, 16, n16, "cg", name))
        for e in range(2):
            r = cp.grow + 8 * e
            okg = r < lt
            offg = row0 + np.where(okg, cp.offg + 8 * e * RS, cp.gcol * 4)
            copies.append((every, base + L["ST_G"] + r * HEAD_DIM * 4 + cp.gcol * 16, 4 * offg, 16,
                           np.where(okg, 16, 0), "cg", "g"))
        okb = it > 0
        copies.append((tid < 32 if not self.token_gate else np.zeros(THREADS, bool), base + L["ST_GB"] + tid * 16,
                       4 * (row0 - (RS if okb else 0) + tid * 4), 16, 16 if okb else 0, "cg", "g"))
        r = cp.beta_row
        okr = r < lt
        copies.append(((tid >= 32) & (tid < 48), base + L["ST_BETA"] + r * 4,
                       4 * (row0 // HEAD_DIM + np.where(okr, r * HV, 0)), 4, np.where(okr, 4, 0), "ca", "beta"))
        r, half = cp.blk_row, cp.blk_half
        okr = r < lt
        nb = 2 * (r + 1) - 16 * half
        nb = np.where(okr, np.clip(nb, 0, 16), 0)
        src = (row0 // HEAD_DIM + np.where(okr, r * HV, 0)) * CHUNK_TOKENS + TILE_TOKENS * it + 8 * half
        blk = (tid >= 48) & (tid < 112)
        for which, name, at_ in ((0, "aqk", "ST_MQK"), (1, "akk", "ST_INV")):
            copies.append((blk & (cp.blk_which == which), base + L[at_] + r * 32 + half * 16, 2 * src, 16, nb,
                           "cg", name))
        if self.qk_rstd:   # threads 112.. 143: q's rstd rows, then k's (4 bytes a token, H * 4 apart)
            which, r = (tid - 112) // TILE_TOKENS, (tid - 112) % TILE_TOKENS
            okr = r < lt
            src = qk_row0 // HEAD_DIM + np.where(okr, r * self.H, 0)
            for w, name in ((0, "q_rstd"), (1, "k_rstd")):
                copies.append(((tid >= 112) & (tid < 112 + 2 * TILE_TOKENS) & (which == w),
                               L["SM_RSTD"] + st * L["RSTD_STAGE"] + (which * TILE_TOKENS + r) * 4, 4 * src, 4,
                               np.where(okr, 4, 0), "ca", name))
        src = (snap * HV + h) * (HEAD_DIM * HEAD_DIM) + cp.row16 * HEAD_DIM + cp.col16 * 8
        dst = base + L["ST_DS"] + cp.row16 * ROW + cp.col16 * 16
        for e in range(8):
            copies.append((every, dst + 16 * e * ROW, 2 * (src + 16 * e * HEAD_DIM), 16, 16, "cg", "ds"))
        if state_chunk >= 0:
            src = (state_chunk * HV + h) * (HEAD_DIM * HEAD_DIM) + cp.row16 * HEAD_DIM + cp.col16 * 8
            dst = L["SM_S"] + cp.row16 * ROW + cp.col16 * 16
            for e in range(8):
                copies.append((every, dst + 16 * e * ROW, 2 * (src + 16 * e * HEAD_DIM), 16, 16, "cg", "states"))
        for warp in range(WARPS):
            for active, d, s_, size, nb_, cache, name in copies:
                self.cp_async(warp, active, d, s_, size, nb_, cache, name)

    # ---- the tile loop
    def run(self, tiles: int | None = None) -> Outputs:
        """Walk the run's tiles (the first `tiles` of them), as the kernel's loop."""
        HV, h, RS = self.HV, self.h, self.RS
        for it in range(self.ntile if tiles is None else min(tiles, self.ntile)):
            st = it & 1
            tok0 = self.tok_run + TILE_TOKENS * it
            row0 = (tok0 * HV + h) * HEAD_DIM
            qk_row0 = (tok0 * self.H + self.qh) * HEAD_DIM
            lt = min(TILE_TOKENS, self.run_len - TILE_TOKENS * it)
            if it + 1 < self.ntile:
                self.load_tile(st ^ 1, (it + 1) % TILES_PER_CHUNK, row0 + TILE_TOKENS * RS,
                               qk_row0 + TILE_TOKENS * self.QK_RS,
                               min(TILE_TOKENS, self.run_len - TILE_TOKENS * (it + 1)), self.snap0 + it + 1)
            self._tile(it, st, tok0, row0, lt)
        return self.out

    def _tile(self, it: int, st: int, tok0: int, row0: int, lt: int) -> None:
        self.st, self.stb = st, st * STAGE
        self._r1(lt)
        self.out.pairwise.append(self.pairwise)
        if it == 0:
            for w in range(WARPS):
                self._load_state(w)
        last = it + 1 >= self.ntile
        self.U = {}
        for w in range(WARPS):
            self._v_phase(w)
            if not last:
                self._g8(w)
        self._reduce()
        for w in range(WARPS):
            self._k_phase(w, row0, lt)
        for w in range(WARPS):   # after the K phase's barrier where the l2norm's row sums meet
            self._k_out(w, tok0, row0, lt)
        self._finish(tok0, row0, lt, last)

    def env(self, warp: int) -> dict:
        """The kernel's lane parts of the addresses (sb = 0: byte offsets in the image) for `warp`."""
        lr, lc = lane_bytes("rows_first", ROW), lane_bytes("cols_first", ROW)
        lr32, lc32 = lane_bytes("rows_first", 32), lane_bytes("cols_first", 32)
        v0 = k0 = 16 * warp
        nr, nc = lr, lc
        sr, sc, sr32, sc32 = self.stb + lr, self.stb + lc, self.stb + lr32, self.stb + lc32
        return dict(LAYOUT, warp=warp, nc32=lc32, nr=nr, nc=nc, ncv=nc + 2 * v0, nrv=nr + 2 * v0, nck=nc + k0 * ROW, nrk=nr + 2 * k0,
                    sr=sr, sc=sc, sr32=sr32, sc32=sc32, scv=sc + 2 * v0, srv=sr + 2 * v0, sck=sc + k0 * ROW,
                    k0=k0, v0=v0)

    def _r1(self, lt: int) -> None:
        """R1, every thread: kk = 2 (tid & 63), rows i0 + 4 e."""
        L, stb, s = LAYOUT, self.stb, self.s
        tid = np.arange(THREADS)
        kk, i0 = 2 * (tid & 63), tid >> 6
        gbs, gs = self.f32(stb + L["ST_GB"]), self.f32(stb + L["ST_G"])
        betas = self.f32(stb + L["ST_BETA"])
        if self.token_gate:   # each thread sums its columns over all 16 rows in order; rows past lt are zeros
            run = [np.zeros(THREADS, np.float32) for _ in range(2)]
            mine = [[np.zeros(THREADS, np.float32) for _ in range(2)] for _ in range(4)]   # at rows i0 + 4 e
            for i in range(TILE_TOKENS):
                for c in range(2):
                    run[c] = _ftz(_f32(run[c] + _ftz(_f32(gs[i * HEAD_DIM + kk + c] * RCP_LN2))))
                    for e in range(4):
                        mine[e][c] = np.where(i0 + 4 * e == i, run[c], mine[e][c])
            gT = run
        else:
            base = [gbs[kk], gbs[kk + 1]]
            last = [gs[(lt - 1) * HEAD_DIM + kk], gs[(lt - 1) * HEAD_DIM + kk + 1]]
            gT = [_f32(last[c] - base[c]) for c in range(2)]
        first = i0 == 0
        gt_s, gamma_s = self.f32(L["SM_GT"]), self.f32(L["SM_GAMMA"])
        for c in range(2):
            gt_s[kk[first] + c] = gT[c][first]
            gamma_s[kk[first] + c] = _ftz(np.exp2(gT[c][first]))
        gcs = self.f32(L["SM_GC"])
        smem32 = self.u32(0)
        past = np.zeros(THREADS, bool)
        for e in range(4):
            i = i0 + 4 * e
            o = i * (ROW // 2) + kk
            if self.token_gate:
                gc = list(mine[e])
            else:
                gc = [np.where(i < lt, _f32(gs[i * HEAD_DIM + kk + c] - base[c]), gT[c]) for c in range(2)]
            qv = model.unpack_bf16x2(self.u32(stb + L["ST_Q"])[o // 2])
            kv = model.unpack_bf16x2(self.u32(stb + L["ST_K"])[o // 2])
            if self.qk_rstd:   # the raw rows normalised, bf16(x rstd), and written back over the pairs read
                qv, kv = self._normalise(i, o, qv, kv)
            be = betas[i]
            kd, kr, qe, bke = [], [], [], []
            for c in range(2):
                past |= ~(np.abs(_f32(gc[c] - gT[c])) <= SPAN_LIMIT)
                # past 126 Qe and beta Ke overflow (the K phase reads them not); under -ftz=true every
                # exp2f and product below 2^-126 is zero, Kr = k 2^(gT - gc) of a small k first
                with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                    fu = _ftz(np.exp2(_f32(gc[c] - gT[c])))
                    kd.append(_ftz(kv[c] * _ftz(np.exp2(gc[c]))))
                    kr.append(_ftz(kv[c] * _ftz(np.exp2(_f32(gT[c] - gc[c])))))
                    qe.append(_ftz(_ftz(s * qv[c]) * fu))
                    bke.append(_ftz(_ftz(be * kv[c]) * fu))
            for at_, val in (("SM_KD", kd), ("SM_KR", kr), ("SM_QE", qe), ("SM_BKE", bke)):
                smem32[(L[at_] + 2 * o) // 4] = model.pack_bf16x2(_f32(val[0]), _f32(val[1]))
            gcs[i * GC_ROW + kk] = gc[0]
            gcs[i * GC_ROW + kk + 1] = gc[1]
        self.pairwise = bool(past.any())   # __syncthreads_or

    def _normalise(self, i: np.ndarray, o: np.ndarray, qv: list, kv: list) -> tuple[list, list]:
        """The qk_rstd build's R1: each thread's pairs (row i, word o // 2 of the q and k tiles) times its row's
        staged rstd, rounded once to bf16 (pack_bf16x2), written back to the stage; returns the values R1 forms
        its operands from. ``leave_out`` takes a use away: the raw row stays in the operands or in the stage."""
        L = LAYOUT
        rstds = self.f32(L["SM_RSTD"] + self.st * L["RSTD_STAGE"])
        stage = {"q": self.u32(self.stb + L["ST_Q"]), "k": self.u32(self.stb + L["ST_K"])}
        out = []
        for which, (name, x) in enumerate((("q", qv), ("k", kv))):
            rstd = rstds[which * TILE_TOKENS + i]
            word = model.pack_bf16x2(_f32(x[0] * rstd), _f32(x[1] * rstd))
            if self.leave_out != f"stage {name}":
                stage[name][o // 2] = word
            out.append(list(x) if self.leave_out == f"r1 {name}" else [_f32(y) for y in model.unpack_bf16x2(word)])
        return out[0], out[1]

    def _load_state(self, w: int) -> None:
        env = self.env(w)
        S = self.S[w]
        for b in range(8):
            x = _halves(self.load("S0 regs", env, b=b))
            S[:, 2 * b] = np.stack(x[0:4], axis=1)
            S[:, 2 * b + 1] = np.stack(x[4:8], axis=1)

    def _v_phase(self, w: int) -> None:
        """V phase of warp w: v rows v0..v0+15, tokens as N (G6, G7, G1 + G2, G3, G9, G10)."""
        L, env, S = LAYOUT, self.env(w), self.S[w]
        betas = self.f32(self.stb + L["ST_BETA"])
        bet = [[betas[2 * T], betas[2 * T + 1]], [betas[8 + 2 * T], betas[9 + 2 * T]]]
        # G6: P^T = S0^T Kd^T, in two accumulator sets by k-step parity
        P = [[_zeros(), _zeros()], [_zeros(), _zeros()]]
        for ks2 in range(8):
            sa = _pack_a(S[:, 2 * ks2], S[:, 2 * ks2 + 1])
            b0, b1 = self.load("G6 B Kd^T", env, ks2=ks2)
            p = P[ks2 & 1]
            p[0], p[1] = _mma(p[0], sa, b0), _mma(p[1], sa, b1)
        vt = _halves(self.load("v^T", env))
        Vn = [np.stack([vt[4 * nt + e] - _f32(P[0][nt][:, e] + P[1][nt][:, e]) for e in range(4)], axis=1)
              for nt in range(2)]
        # G7: U^T = (beta Vn)^T INV^T
        bV = [_f32(np.stack([bet[nt][e & 1] * Vn[nt][:, e] for e in range(4)], axis=1)) for nt in range(2)]
        aa, ar = _pack_a_two_parts(bV[0], bV[1])
        b0, b1 = self.load("G7 B INV^T", env)
        U = [_mma(_zeros(), aa, b0), _mma(_zeros(), aa, b1)]
        U = [_mma(U[0], ar, b0), _mma(U[1], ar, b1)]
        # G1 + G2: dU^T = do^T Mqk + dS1^T Kr^T
        dU0, dU1 = [_zeros(), _zeros()], [_zeros(), _zeros()]
        dot = self.load("G1 A do^T", env)
        b0, b1 = self.load("G1 B Mqk", env)
        dU0 = [_mma(dU0[0], dot, b0), _mma(dU0[1], dot, b1)]
        for ks2 in range(8):
            aa = self.load("G2 A dS1^T", env, ks2=ks2)
            b0, b1 = self.load("G2 B Kr^T", env, ks2=ks2)
            acc = dU1 if ks2 & 1 else dU0
            acc[0], acc[1] = _mma(acc[0], aa, b0), _mma(acc[1], aa, b1)
        dU0 = [_f32(dU0[nt] + dU1[nt]) for nt in range(2)]
        # G3: dW^T = dU^T INV, dU in two bf16 parts
        aa, ar = _pack_a_two_parts(dU0[0], dU0[1])
        b0, b1 = self.load("G3 B INV", env)
        W = [_mma(_zeros(), aa, b0), _mma(_zeros(), aa, b1)]
        W = [_mma(W[0], ar, b0), _mma(W[1], ar, b1)]
        # U, dW, dv = beta dW to shared memory as [token][v]
        hi, lo = _pack_a_two_parts(U[0], U[1])
        self.store("U store", env, hi)
        self.store("U remainder store", env, lo)
        self.store("dW store", env, _pack_a(W[0], W[1]))
        bW = [np.stack([bet[nt][e & 1] * W[nt][:, e] for e in range(4)], axis=1) for nt in range(2)]
        self.store("dv store", env, _pack_a(bW[0], bW[1]))
        # d = rowsum(do . U), rowsum(dW . Vn): this warp's 16 v, column = token
        dol = _halves(dot)
        dpart, b1part = self.f32(L["SM_DPART"]), self.f32(L["SM_B1PART"])
        g0 = G == 0
        for nt in range(2):
            for e in range(2):
                dd = _sum_over_g(_f32(dol[4 * nt + e] * U[nt][:, e]) + _f32(dol[4 * nt + e + 2] * U[nt][:, e + 2]))
                bb = _sum_over_g(_f32(W[nt][:, e] * Vn[nt][:, e]) + _f32(W[nt][:, e + 2] * Vn[nt][:, e + 2]))
                idx = w * TILE_TOKENS + 8 * nt + 2 * T + e
                dpart[idx[g0]] = dd[g0]
                b1part[idx[g0]] = bb[g0]
        # G9 / G10 partials over this warp's v: dMqk = do U^T, dW U^T
        ad = self.load("G9 A do", env)
        aw = self.load("G10 A dW", env)
        b0, b1 = self.load("G9 B U^T", env)
        M = [_mma(_zeros(), ad, b0), _mma(_zeros(), ad, b1)]
        Lk = [_mma(_zeros(), aw, b0), _mma(_zeros(), aw, b1)]
        b0, b1 = self.load("G9 B U^T remainder", env)
        M = [_mma(M[0], ad, b0), _mma(M[1], ad, b1)]
        Lk = [_mma(Lk[0], aw, b0), _mma(Lk[1], aw, b1)]
        part = self.f32(L["SM_PART"])
        pm, pl = w * TILE_TOKENS * PS, (WARPS + w) * TILE_TOKENS * PS
        for nt in range(2):
            jj = 8 * nt + 2 * T
            for base, X in ((pm, M), (pl, Lk)):
                for r in range(2):
                    part[base + (G + 8 * r) * PS + jj] = X[nt][:, 2 * r]
                    part[base + (G + 8 * r) * PS + jj + 1] = X[nt][:, 2 * r + 1]
        self.U[w] = U

    def _g8(self, w: int) -> None:
        """S1^T = gamma S0^T + U^T Kr in warp w's accumulators."""
        env, S = self.env(w), self.S[w]
        gamma_s = self.f32(LAYOUT["SM_GAMMA"])
        ua = _pack_a(self.U[w][0], self.U[w][1])
        for b in range(8):
            b0, b1 = self.load("G8 B Kr", env, b=b)
            for hf in range(2):
                i = 16 * b + 8 * hf + 2 * T
                ga = np.stack([gamma_s[i], gamma_s[i + 1], gamma_s[i], gamma_s[i + 1]], axis=1)
                S[:, 2 * b + hf] = _f32(S[:, 2 * b + hf] * ga)
            S[:, 2 * b] = _mma(S[:, 2 * b], ua, b0)
            S[:, 2 * b + 1] = _mma(S[:, 2 * b + 1], ua, b1)

    def _reduce(self) -> None:
        """Every thread: i = tid >> 4, jj = tid & 15; sums over warps 0..7 in order."""
        L = LAYOUT
        tid = np.arange(THREADS)
        i, jj = tid >> 4, tid & 15
        part = self.f32(L["SM_PART"])
        m = np.zeros(THREADS, np.float32)
        l_ = np.zeros(THREADS, np.float32)
        for w in range(WARPS):
            m = _f32(m + part[w * TILE_TOKENS * PS + i * PS + jj])
            l_ = _f32(l_ + part[(WARPS + w) * TILE_TOKENS * PS + i * PS + jj])
        mv, lv = _f32(np.where(jj < i, m, 0)), _f32(np.where(jj < i, -l_, 0))
        mb = model.pack_bf16x2(mv, 0) & 0xFFFF
        lb = model.pack_bf16x2(lv, 0) & 0xFFFF
        mr = model.pack_bf16x2(_f32(mv - _bf(mb)), 0) & 0xFFFF   # the remainders (exact in fp32)
        lr = model.pack_bf16x2(_f32(lv - _bf(lb)), 0) & 0xFFFF
        plain, trans = (frag_index(self.swaps.get(x, x), i, jj) for x in ("plain", "trans"))
        frag16 = self.u16(L["SM_FRAG"])
        frag16[0 * 256 + plain] = mb
        frag16[1 * 256 + trans] = mb
        frag16[2 * 256 + plain] = lb
        frag16[3 * 256 + trans] = lb
        frag16[4 * 256 + plain] = mr
        frag16[5 * 256 + trans] = mr
        frag16[6 * 256 + plain] = lr
        frag16[7 * 256 + trans] = lr
        dpart, b1part = self.f32(L["SM_DPART"]), self.f32(L["SM_B1PART"])
        d = np.zeros(TILE_TOKENS, np.float32)
        x = np.zeros(TILE_TOKENS, np.float32)
        for w in range(WARPS):
            d = _f32(d + dpart[w * TILE_TOKENS + np.arange(TILE_TOKENS)])
            x = _f32(x + b1part[w * TILE_TOKENS + np.arange(TILE_TOKENS)])
        self.f32(L["SM_DVEC"])[:TILE_TOKENS] = d
        self.f32(L["SM_B1"])[:TILE_TOKENS] = x

    def _k_phase(self, w: int, row0: int, lt: int) -> None:
        """K phase of warp w: k columns k0..k0+15, tokens as M."""
        L, env, s = LAYOUT, self.env(w), self.s
        k0 = 16 * w
        Qd, WS, Kr, Gm = ([_zeros(), _zeros()] for _ in range(4))
        for ks2 in range(8):
            bs = self.load("G11 B S0^T", env, ks2=ks2)
            bd = self.load("G13 B dS1^T", env, ks2=ks2)
            ad = self.load("G11 A do", env, ks2=ks2)
            aw = self.load("G12 A dW", env, ks2=ks2)
            au = self.load("G13 A U", env, ks2=ks2)
            as_ = self.load("dgamma A S0", env, ks2=ks2)
            for nt in range(2):
                Qd[nt] = _mma(Qd[nt], ad, bs[nt])
                WS[nt] = _mma(WS[nt], aw, bs[nt])
                Kr[nt] = _mma(Kr[nt], au, bd[nt])
                Gm[nt] = _mma(Gm[nt], as_, bd[nt])
        # G14-G17 from the dMqk / dLkk fragments in lane order
        frag = self.u32(L["SM_FRAG"]).reshape(-1)[:8 * 32 * 4].reshape(8, 32, 4)
        am, amt, al, alt, rm, rmt, rl, rlt = (np.ascontiguousarray(frag[x]) for x in range(8))
        Qe, X = [_zeros(), _zeros()], [_zeros(), _zeros()]
        if not self.pairwise:
            bk = self.load("G14 B Kr", env)
            bq = self.load("G15 B Qe", env)
            be = self.load("G17 B beta Ke", env)
            Qe = [_mma(_zeros(), am, bk[nt]) for nt in range(2)]
            X = [_mma(_zeros(), al, bk[nt]) for nt in range(2)]
            for nt in range(2):
                Kr[nt] = _mma(Kr[nt], amt, bq[nt])
            for nt in range(2):
                Kr[nt] = _mma(Kr[nt], alt, be[nt])
            for nt in range(2):   # the remainders' fragments, in the kernel's order
                Qe[nt] = _mma(Qe[nt], rm, bk[nt])
            for nt in range(2):
                X[nt] = _mma(X[nt], rl, bk[nt])
            for nt in range(2):
                Kr[nt] = _mma(Kr[nt], rmt, bq[nt])
            for nt in range(2):
                Kr[nt] = _mma(Kr[nt], rlt, be[nt])
        # dgamma of row r of this warp's k: Gm's diagonal, in lane 4 (r mod 8) + (r mod 8) / 2
        odd = (G & 1) == 1
        lo = np.where(odd, Gm[0][:, 1], Gm[0][:, 0])
        hi = np.where(odd, Gm[1][:, 3], Gm[1][:, 2])
        c = LANE & 7
        src = 4 * c + (c >> 1)
        dgc = np.where((LANE & 8) != 0, hi[src], lo[src])
        # back to q, k and the gate
        stb = self.stb
        betas, dvec = self.f32(stb + L["ST_BETA"]), self.f32(L["SM_DVEC"])
        gt_s, gcs, gamma_s = self.f32(L["SM_GT"]), self.f32(L["SM_GC"]), self.f32(L["SM_GAMMA"])
        part = self.f32(L["SM_PART"])
        fsb = w * 2 * TILE_TOKENS * PS
        feb = fsb + TILE_TOKENS * PS
        qs32, ks32 = self.u32(stb + L["ST_Q"]), self.u32(stb + L["ST_K"])
        b2 = [np.zeros(WARP, np.float32), np.zeros(WARP, np.float32)]
        out = {}   # (nt, r) -> (dq pair, dk pair), stored by _k_out
        yq, yk = [np.zeros(WARP, np.float32) for _ in range(2)], [np.zeros(WARP, np.float32) for _ in range(2)]
        for nt in range(2):
            cl = 8 * nt + 2 * T
            kk = k0 + cl
            gT = [gt_s[kk], gt_s[kk + 1]]
            for r in range(2):
                i, x = G + 8 * r, 2 * r
                be_, dd = betas[i], dvec[i]
                gc = [gcs[i * GC_ROW + kk], gcs[i * GC_ROW + kk + 1]]
                qv = model.unpack_bf16x2(qs32[(i * (ROW // 2) + kk) // 2])
                kv = model.unpack_bf16x2(ks32[(i * (ROW // 2) + kk) // 2])
                so = (i * ROW + 2 * kk) // 4   # the pair's word in R1's operand tiles
                kdb, krb, qeb, beb = (model.unpack_bf16x2(self.u32(L[at_])[so])
                                      for at_ in ("SM_KD", "SM_KR", "SM_QE", "SM_BKE"))
                dq2, dk2, fs2, fe2 = [], [], [], []
                for e in range(2):
                    fs = _ftz(np.exp2(gc[e]))
                    fd = _ftz(np.exp2(_f32(gT[e] - gc[e])))
                    dQd, dKd, dKr = Qd[nt][:, x + e], _f32(-be_ * WS[nt][:, x + e]), Kr[nt][:, x + e]
                    fs2.append(_f32(s * qv[e] * fs * dQd + kdb[e] * dKd))
                    if not self.pairwise:
                        fu = _ftz(np.exp2(_f32(gc[e] - gT[e])))
                        dQe, dKe = Qe[nt][:, x + e], _f32(be_ * X[nt][:, x + e])
                        dq2.append(_f32(s * _f32(fs * dQd + fu * dQe + dd * kv[e])))
                        dk2.append(_f32(fs * dKd + fu * dKe + fd * dKr + s * dd * qv[e]))
                        fe2.append(_f32(qeb[e] * dQe + beb[e] * X[nt][:, x + e] - krb[e] * dKr))
                        b2[r] = _f32(b2[r] + kv[e] * fu * X[nt][:, x + e])
                    else:
                        below_m, below_l, above = self._pairwise_row(i, kk + e)
                        dq2.append(_f32(s * _f32(fs * dQd + below_m + dd * kv[e])))
                        dk2.append(_f32(fs * dKd + be_ * below_l + fd * dKr + above + s * dd * qv[e]))
                        fe2.append(_f32(s * qv[e] * below_m + be_ * kv[e] * below_l - krb[e] * dKr
                                        - kv[e] * above))
                        b2[r] = _f32(b2[r] + kv[e] * below_l)
                for e in range(2):
                    part[fsb + i * PS + cl + e] = fs2[e]
                    part[feb + i * PS + cl + e] = fe2[e]
                out[nt, r] = (dq2, dk2)
                yq[r] = _f32(yq[r] + _f32(qv[0] * dq2[0] + qv[1] * dq2[1]))
                yk[r] = _f32(yk[r] + _f32(kv[0] * dk2[0] + kv[1] * dk2[1]))
        self.pending[w] = out
        if self.inp.q_rstd is not None:   # each row's y . dy over this warp's 16 columns, to shared memory
            l2part = self.f32(L["SM_L2PART"])
            for r in range(2):
                for which, y in ((0, yq[r]), (1, yk[r])):
                    x = _sum_over_t(y)
                    t0 = T == 0
                    l2part[((which * WARPS + w) * TILE_TOKENS + G + 8 * r)[t0]] = x[t0]
        b2part = self.f32(L["SM_B2PART"])
        for r in range(2):
            x = b2[r]
            x = _f32(x + x[LANE ^ 1])
            x = _f32(x + x[LANE ^ 2])
            t0 = T == 0
            b2part[(w * TILE_TOKENS + G + 8 * r)[t0]] = x[t0]
        # dg[i] = sum_{c >= i} from_start[c] - sum_{c < i} from_end[c] + gamma dgamma (lanes 0..15)
        ln = np.arange(TILE_TOKENS)
        kk = k0 + ln
        tail = _f32(gamma_s[kk] * dgc[:TILE_TOKENS])
        rev = np.zeros((TILE_TOKENS, TILE_TOKENS), np.float32)
        acc = np.zeros(TILE_TOKENS, np.float32)
        for i in range(TILE_TOKENS - 1, -1, -1):
            acc = _f32(acc + part[fsb + i * PS + ln])
            rev[i] = acc
        ex = np.zeros(TILE_TOKENS, np.float32)
        for i in range(TILE_TOKENS):
            if i < lt:
                self.out.dg[row0 + i * self.RS + kk] = _f32(rev[i] - ex + tail)
            ex = _f32(ex + part[feb + i * PS + ln])

    def _k_out(self, w: int, tok0: int, row0: int, lt: int) -> None:
        """The K phase's dq and dk stores of warp w, through the l2norm's backward where its rstd is given:
        dx = rstd (dy - y (y . dy)), each row's dot the 8 warps' partial sums added in order."""
        L, k0 = LAYOUT, 16 * w
        qs16, ks16 = self.u16(self.stb + L["ST_Q"]), self.u16(self.stb + L["ST_K"])
        l2part = self.f32(L["SM_L2PART"])
        for r in range(2):
            i = G + 8 * r
            ok = i < lt
            scale = None
            if self.inp.q_rstd is not None:
                dots = []
                for which in range(2):
                    d = np.zeros(WARP, np.float32)
                    for ww in range(WARPS):
                        d = _f32(d + l2part[(which * WARPS + ww) * TILE_TOKENS + i])
                    dots.append(d)
                if self.qk_rstd:   # from the stage (zero-filled past the tile, as the plain build's 0)
                    rstds = self.f32(L["SM_RSTD"] + self.st * L["RSTD_STAGE"])
                    rq, rk = rstds[i].astype(np.float32), rstds[TILE_TOKENS + i].astype(np.float32)
                    one = np.ones(WARP, np.float32)
                    rq = one if self.leave_out == "epilogue q" else rq
                    rk = one if self.leave_out == "epilogue k" else rk
                else:
                    tok = np.minimum(tok0 + i, self.inp.q_rstd.shape[0] - 1)   # rows past the tile read nothing
                    rq = np.where(ok, self.inp.q_rstd[tok, self.qh], 0).astype(np.float32)
                    rk = np.where(ok, self.inp.k_rstd[tok, self.qh], 0).astype(np.float32)
                scale = (rq, rk, dots)
            for nt in range(2):
                kk = k0 + 8 * nt + 2 * T
                dq2, dk2 = self.pending[w][nt, r]
                for e in range(2):
                    dq, dk = dq2[e], dk2[e]
                    if scale is not None:
                        rq, rk, (dot_q, dot_k) = scale
                        qv, kv = _bf(qs16[i * (ROW // 2) + kk + e]), _bf(ks16[i * (ROW // 2) + kk + e])
                        dq = _f32(rq * _f32(dq - _f32(qv * dot_q)))
                        dk = _f32(rk * _f32(dk - _f32(kv * dot_k)))
                    if self.inp.dqk_bf16:   # pack_bf16x2: round to nearest even
                        dq, dk = (_bf(model.pack_bf16x2(x, np.float32(0)) & 0xFFFF) for x in (dq, dk))
                    off = row0 + i * self.RS + kk + e
                    self.out.dq[off[ok]] = dq[ok]
                    self.out.dk[off[ok]] = dk[ok]

    def _pairwise_row(self, i: np.ndarray, kk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """pairwise_row (token_gradients_pairwise.cuh) for each lane's row i and column kk: G14's and
        G16's row i with 2^(gc_i - gT) inside, G15 + G17's with 2^(gT - gc_i), each entry's decay
        2^(gc_i - gc_j) formed in fp32."""
        L, stb, s = LAYOUT, self.stb, self.s
        gcs, betas = self.f32(L["SM_GC"]), self.f32(stb + L["ST_BETA"])
        qs16, ks16, frag16 = self.u16(stb + L["ST_Q"]), self.u16(stb + L["ST_K"]), self.u16(L["SM_FRAG"])

        def value(matrix, a, b):   # frag_value: the bf16 fragment plus its remainder's
            p = frag_index("plain", a, b)
            return _f32(_bf(frag16[matrix * 256 + p]) + _bf(frag16[(matrix + 4) * 256 + p]))

        gi = gcs[i * GC_ROW + kk]
        below_m, below_l, above = (np.zeros(WARP, np.float32) for _ in range(3))
        for j in range(TILE_TOKENS):
            jj = np.full(WARP, j)
            qm, km = _f32(s * _bf(qs16[j * (ROW // 2) + kk])), _f32(betas[j] * _bf(ks16[j * (ROW // 2) + kk]))
            lower, upper = j < i, j > i
            with np.errstate(over="ignore", invalid="ignore"):   # the lanes off each sum's triangle, masked
                kj = _ftz(_bf(ks16[j * (ROW // 2) + kk]) * _ftz(np.exp2(_f32(gi - gcs[j * GC_ROW + kk]))))
                f = _ftz(np.exp2(_f32(gcs[j * GC_ROW + kk] - gi)))
                below_m = np.where(lower, _f32(below_m + value(0, i, jj) * kj), below_m)
                below_l = np.where(lower, _f32(below_l + value(2, i, jj) * kj), below_l)
                above = np.where(upper, _f32(above + _f32(value(0, jj, i) * qm + value(2, jj, i) * km) * f), above)
        return below_m, below_l, above

    def _finish(self, tok0: int, row0: int, lt: int, last: bool) -> None:
        L, HV = LAYOUT, self.HV
        b1, b2part = self.f32(L["SM_B1"]), self.f32(L["SM_B2PART"])
        for tid in range(lt):
            x = np.float32(b1[tid])
            for w in range(WARPS):
                x = np.float32(x + b2part[w * TILE_TOKENS + tid])
            self.out.dbeta[(tok0 + tid) * HV + self.h] = x
        dv16 = self.u16(L["SM_DV"])
        for r in range(lt):
            self.out.dv[row0 + r * self.RS + np.arange(HEAD_DIM)] = dv16[r * (ROW // 2) + np.arange(HEAD_DIM)]
        if not last:
            for w in range(WARPS):
                env, S = self.env(w), self.S[w]
                for b in range(8):
                    self.store("S1 store", env, _pack_a(S[:, 2 * b], S[:, 2 * b + 1]), b=b)
            self.out.S1_fp32.append(self.state_matrix())
            img = self.u16(L["SM_S"])[:HEAD_DIM * (ROW // 2)].reshape(HEAD_DIM, ROW // 2)[:, :HEAD_DIM]
            self.out.S1_bf16.append((img.astype(np.uint32) << 16).view(np.float32).astype(np.float64))

    def state_matrix(self) -> np.ndarray:
        """The accumulators S[16][4] of the 8 warps as S [K, V] (warp w: v 16w..16w+15 = rows of S^T)."""
        St = np.zeros((HEAD_DIM, HEAD_DIM))
        for w in range(WARPS):
            for nt in range(16):
                k = 8 * nt + 2 * T
                St[16 * w + G, k] = self.S[w][:, nt, 0]
                St[16 * w + G, k + 1] = self.S[w][:, nt, 1]
                St[16 * w + G + 8, k] = self.S[w][:, nt, 2]
                St[16 * w + G + 8, k + 1] = self.S[w][:, nt, 3]
        return St.T


def dv_values(dv_bits: np.ndarray) -> np.ndarray:
    return (dv_bits.astype(np.uint32) << 16).view(np.float32)
