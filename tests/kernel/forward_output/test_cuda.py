"""kernel/forward_output/cuda on the CPU: one CTA lane by lane, every copy, ldmatrix, mma, stmatrix and store
at the address forward_output.cu computes, through ptx_lab's exact CPU model of the instructions, against the
o pass's numpy arithmetic (tests/kernel/three_pass_model.py.o_pass: qg S + (Aqk_hi + Aqk_lo) v_new); and every
shared-memory access at its fewest wavefronts (ptx_lab.banks), which is what the padded rows are for.

The model's mma adds each k-step's 16 exact products and the accumulator in float64 and rounds once to fp32,
o_pass each product whole in float64: the two round differently in fp32, so o agrees to a bf16 rounding now
and then (the bound is the GPU test's, test_forward_output_gpu.within_rounding); both warp counts run the same
k-steps in the same order for every element (qg S's 8, Aqk_hi v_new's 4, Aqk_lo v_new's 4) and give the same
bits."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kernel.forward_output import SOURCE_PATH, WARPS, Config, all_variants, options
from kernel.forward_products.launch import chunk_table
from ptx_lab import banks, model
from ptx_lab.fragments import x4_lane_offsets

from .test_forward_output_gpu import within_rounding

from ..chain_fragments import bf16, image, mma, pack_a
from ..ptx_build import compile_ptx, ptx_constant, ptx_of
from ..three_pass_model import o_pass, split_bf16

D, R = 128, 64
WIDE, NARROW = D + 8, R + 8                      # forward_output.cu's padded rows (elements)
QG = 0                                           # Shared's tiles, in bytes: qg [64][136] (o's staging tile after
S = QG + 2 * R * WIDE                            # the first product), S [128][136], Aqk's hi and lo parts
AQK = S + 2 * D * WIDE                           # [64][72] each, v_new [64][136]
AQK_LO = AQK + 2 * R * NARROW
VN = AQK_LO + 2 * R * NARROW
SMEM_BYTES = VN + 2 * R * WIDE
LANE = np.arange(32)


def _bits(x) -> np.ndarray:
    return image(x, x.shape[1]).view(np.uint8)


def cta(qg, state, aqk, aqk_lo, vn, *, tok0: int, L: int, warps: int, o: np.ndarray, HV: int = 1,
        hv: int = 0) -> None:
    """kda_forward_output's CTA for one (chunk, value head): writes o's uint16 bits [tokens, HV, 128]."""
    threads, VW = 32 * warps, D * 4 // warps
    NT = VW // 8
    smem = np.zeros(SMEM_BYTES, np.uint8)

    # copy_tile: thread tid's copy j is the tile's 16-byte piece tid + threads j
    for off, x, stride in ((QG, qg, WIDE), (S, state, WIDE), (AQK, aqk, NARROW), (AQK_LO, aqk_lo, NARROW),
                           (VN, vn, WIDE)):
        rows, pieces = x.shape[0], x.shape[1] // 8
        g = _bits(x)
        for j in range(rows * pieces // threads):
            for w in range(warps):
                i = 32 * w + LANE + threads * j
                dst = off + 2 * ((i // pieces) * stride + 8 * (i % pieces))
                assert banks.cp_async_wavefronts(dst, 16) == 4
                smem = model.cp_async(smem, g, dst, 16 * i, 16, cache="cg")

    def product(acc, a_off, a_stride, b_off, ksteps, m0, v0):
        for kk in range(ksteps):
            a_addr = a_off + x4_lane_offsets("rows_first", 2 * a_stride, m0, 16 * kk)
            assert banks.ldmatrix_wavefronts(a_addr, 4) == 4
            a = model.ldmatrix(smem, a_addr, 4, trans=False)
            for np_ in range(NT // 2):
                b_addr = b_off + x4_lane_offsets("rows_first", 2 * WIDE, 16 * kk, v0 + 16 * np_)
                assert banks.ldmatrix_wavefronts(b_addr, 4) == 4
                b = model.ldmatrix(smem, b_addr, 4, trans=True)
                acc[2 * np_] = mma(a, b[:, :2], acc[2 * np_])
                acc[2 * np_ + 1] = mma(a, b[:, 2:], acc[2 * np_ + 1])

    corner = [(16 * (w % 4), VW * (w // 4)) for w in range(warps)]
    accs = [np.zeros((NT, 32, 4), np.float32) for _ in range(warps)]
    for w in range(warps):                                   # O = qg S, then the barrier
        product(accs[w], QG, WIDE, S, D // 16, *corner[w])
    for w in range(warps):                                   # O += Aqk_hi v_new, then Aqk_lo v_new, staged, stored
        m0, v0 = corner[w]
        product(accs[w], AQK, NARROW, VN, R // 16, m0, v0)
        product(accs[w], AQK_LO, NARROW, VN, R // 16, m0, v0)
        for j in range(NT // 2):
            addr = QG + x4_lane_offsets("rows_first", 2 * WIDE, m0, v0 + 16 * j)
            assert banks.stmatrix_wavefronts(addr, 4) == 4
            smem = model.stmatrix(smem, addr, pack_a(accs[w][2 * j], accs[w][2 * j + 1]), trans=False)
        pieces = VW // 8
        tile = smem[QG:S].view(np.uint16).reshape(R, WIDE)
        for j in range(16 * pieces // 32):
            i = LANE + 32 * j
            row, col = m0 + i // pieces, v0 + 8 * (i % pieces)
            active = row < L
            reads = banks.shared_access(QG + 2 * (row * WIDE + col), 16, active=active)
            assert reads.wavefronts == -(-16 * int(active.sum()) // 128)     # 128 bytes a wavefront
            for lane in np.flatnonzero(active):
                o[tok0 + row[lane], hv, col[lane]:col[lane] + 8] = tile[row[lane], col[lane]:col[lane] + 8]


def _case(lengths, HV, seed):
    rng = np.random.default_rng(seed)
    chunks = sum(-(-n // R) for n in lengths)
    qg = bf16(rng.standard_normal((chunks, HV, R, D)) * 0.1)
    states = bf16(rng.standard_normal((chunks, HV, D, D)))
    # whole, not triangular: the kernel takes Aqk as given; its two parts as split_bf16 makes them
    aqk, aqk_lo = split_bf16(rng.standard_normal((chunks, HV, R, R)) * 0.05)
    v_new = bf16(rng.standard_normal((chunks, HV, R, D)))
    return qg, states, aqk, aqk_lo, v_new


def _run(ops, lengths, HV, warps, chunks=None):
    qg, states, aqk, aqk_lo, v_new = ops
    table = chunk_table(np.cumsum([0, *lengths]))
    o = np.full((sum(lengths), HV, D), 0xFFFF, np.uint16)     # a NaN where nothing was written
    for c in range(qg.shape[0]) if chunks is None else chunks:
        for hv in range(HV):
            cta(qg[c, hv], states[c, hv], aqk[c, hv], aqk_lo[c, hv], v_new[c, hv], tok0=int(table[c, 0]),
                L=int(table[c, 1]), warps=warps, o=o, HV=HV, hv=hv)
    return (o.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("warps", WARPS)
def test_a_cta_writes_its_chunks_o_rows(warps):
    # a sequence of 81 tokens: a whole chunk and one of 17 rows, two value heads
    lengths, HV = [81], 2
    ops = _case(lengths, HV, seed=3)
    got = _run(ops, lengths, HV, warps)
    qg, states, aqk, aqk_lo, v_new = ops
    want = o_pass(qg, aqk, aqk_lo, states, v_new, lengths)
    assert not np.isnan(got).any()                         # every row, both heads, all 128 columns
    within_rounding(got, want, ops, lengths)
    # the lo part is read: without it the CTA is the o pass of Aqk in one bf16, elements a bf16 step away
    one = (qg, states, aqk, np.zeros_like(aqk_lo), v_new)
    alone = _run(one, lengths, HV, warps)
    within_rounding(alone, o_pass(qg, aqk, one[3], states, v_new, lengths), one, lengths)
    assert np.mean(alone != got) > 0.1, np.mean(alone != got)   # 0.21 here


def test_both_warp_counts_give_the_same_bits():
    lengths, HV = [17], 1
    ops = _case(lengths, HV, seed=5)
    a, b = (_run(ops, lengths, HV, w) for w in WARPS)
    np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", all_variants(), ids=lambda c: c.name())
def test_the_source_lays_out_the_tiles_modelled_here(tmp_path, cfg):
    # the .cu's own constants (kernel.tools.resources reads them so): Shared's size is the five padded tiles
    # above, which leave room for the launch bounds' two CTAs an SM (228 KB, 1 KB reserved a CTA)
    text = ptx_of(SOURCE_PATH, options(cfg), tmp_path / "o.ptx")
    assert ptx_constant(text, "fo_smem_bytes") == SMEM_BYTES
    assert ptx_constant(text, "fo_threads") == cfg.threads
    assert 2 * (SMEM_BYTES + 1024) <= 228 * 1024


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_build_without_the_knob_stops_and_names_it(tmp_path):
    opts = [o for o in options(Config()) if not o.startswith("-DFO_WARPS=")]
    proc = compile_ptx(SOURCE_PATH, opts, tmp_path / "x.ptx")
    assert proc.returncode != 0
    assert "FO_WARPS is not set: kernel/forward_output/config.py sets every knob" in proc.stderr
