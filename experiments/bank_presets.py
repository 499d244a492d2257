"""The named tile layouts of Kernel A's design, for ``experiments.banks`` and
`ptx-lab show banks:<preset>`.

Each is a :class:`ptx_lab.layouts.Layout` of a tile the design went through: R1's
token-strided q/k and gc rows at several row strides, a 16-token MMA operand tile
(plain, padded, K_INTER), qd as R1 writes it, the transpose-dual dS pair and the
plain layout it replaced, and one pair of each real GMMA swizzle atom for pictures.
This is one kernel's knowledge, not the library's, so it lives with the experiments
that use it; `ptx-lab show` finds it through the ``ptx_lab.layouts`` entry-point group
(pyproject.toml: ``kernel-a = "experiments.bank_presets:PRESETS"``).
"""
from __future__ import annotations

from ptx_lab.layouts import Layout, gmma_k, gmma_mn, row_major

C = 16            # tokens per tile (CHUNK)
D = 128           # key/query features
DV = 128          # value features
BF16, FP32 = 2, 4
TOKENS_READ = 2 * C   # the token-strided read covers two 16-token tiles: one token per lane

_DS_B = gmma_k("INTER", DV, D, name="dS_b: K_INTER over [Dv, D] (B operand dS[v][k])")

PRESETS: dict[str, Layout] = {
    # R1's raw q/k rows [token][feature], bf16: the row stride is the whole story
    "qk_stride128": row_major(TOKENS_READ, D, D, BF16, name="q/k [token][k] bf16, stride 128 (256 B rows)"),
    "qk_stride136": row_major(TOKENS_READ, D, D + 8, BF16, name="q/k bf16, stride 136 (16-B cp.async rows)"),
    "qk_stride130": row_major(TOKENS_READ, D, D + 2, BF16, name="q/k bf16, stride 130 (odd half-stride)"),
    # R1's gc rows, fp32
    "gc_stride128": row_major(TOKENS_READ, D, D, FP32, name="gc [token][k] fp32, stride 128 (512 B rows)"),
    "gc_stride132": row_major(TOKENS_READ, D, D + 4, FP32, name="gc fp32, stride 132"),
    # a 16-token x 128-feature bf16 MMA operand tile read with ldmatrix(.trans)
    "op_plain256": row_major(C, D, D, BF16, name="operand [c][k] bf16, plain 256 B rows"),
    "op_pad272": row_major(C, D, D + 8, BF16, name="operand [c][k] bf16, 272 B rows (Kernel A's D + 8)"),
    "op_k_inter": gmma_k("INTER", C, D, name="operand [c][k] bf16, K_INTER over [C, D]"),
    # qd as R1 writes it: MN_INTER over [D, C] (the design's swizzled qd/kd tile)
    "qd_mn_inter": gmma_mn("INTER", D, C, name="qd [k][c] bf16, MN_INTER over [D, C]"),
    # dS, one copy read both ways (the transpose-dual pair) ...
    "ds_b": _DS_B,
    "ds_c": _DS_B.transpose(name="dS_c: MN_INTER over [D, Dv], atoms row-first (accumulator dS[k][v])"),
    # ... and the plain layout it replaced
    "ds_plain": row_major(DV, D, D, BF16, name="dS[v][k] bf16, plain 256 B rows"),
    "ds_plain_t": row_major(DV, D, D, BF16).transpose(name="dS[k][v] view of plain 256 B rows"),
    # the real swizzles, for pictures
    "k_sw32": gmma_k("SW32", 16, 16, name="K_SW32 atom x2, bf16"),
    "k_sw64": gmma_k("SW64", 16, 32, name="K_SW64 atom x2, bf16"),
    "k_sw128": gmma_k("SW128", 16, 64, name="K_SW128 atom x2, bf16"),
}


__all__ = ["C", "D", "DV", "BF16", "FP32", "TOKENS_READ", "PRESETS"]
