"""kernel/forward_products/cuda on the CPU: the pass's one ldmatrix use and its store of Aqk, lane by lane
through ptx_lab's exact CPU model of the instructions.

w = bf16(INV) bk and u = bf16(INV) bv, each warp its 16 rows: the A fragments from INV in shared memory, the B
operand from the row-padded bk / bv tiles by ldmatrix .trans at the address forward_products.cu computes (b_row
below, the source's index arithmetic transcribed), the k-steps past the diagonal block skipped, w's bf16 pairs
and u's fp16 pairs (divided by u's scale 2^e, whose e u_exponent finds as the CTA does) written out as the .cu
writes them. Held bit for bit to the product summed in the warps' order (each m16n8k16 rounded once to fp32, as
model.mma_m16n8k16 rounds it), within the summation orders' bound to the study's arithmetic
(tests/kernel/three_pass_model.py: bf16(mm(INV, bk)), fp16(mm(INV, bv) / 2^e)), and every ldmatrix at its
fewest wavefronts (ptx_lab.banks), which is what the rows' 16 bytes of padding are for.

Aqk's store: each warp's rows of the fp32 Aqk staged in INV's bytes go out as two bf16 parts (two_part_bf16x2,
ptx_lab.fragments' model of it), zero right of the diagonal whatever the staging tile holds there, and the hi
part of the warp's diagonal block to FLA's layout for the backward: held bit for bit to the model's split_bf16
of tril(Aqk) (tests/kernel/three_pass_model.py's chunk_operands); the hi part is bf16(Aqk), the one bf16 the
backward's blocks hold.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kernel.forward_products import SOURCE_PATH, all_variants, options
from kernel.runtime.arrays import bf16_bits, bits_to_f32
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS, TILES_PER_CHUNK
from ptx_lab import banks, model
from ptx_lab.fragments import two_part_bf16x2

from ..chain_fragments import mma
from ..ptx_build import ptx_constant, ptx_of
from ..three_pass_model import U_EXP_LIMIT, U_FP16_TOP_EXP, bf16, fp16, fp16_scale, mm, split_bf16, u_bound


D, R = HEAD_DIM, CHUNK_TOKENS
WARPS = TILES_PER_CHUNK
LANE = np.arange(32)
GR, T = LANE // 4, LANE % 4
OP_STRIDE, G_STRIDE, L_STRIDE = D + 8, D + 8, R + 4   # forward_products.cu's row strides (elements)

# struct Shared, in bytes: q, k [64][136] bf16; g [64][136], beta [64] and q's and k's rows' rstd [64] fp32.
# bk [64][136] bf16 takes q's bytes after the products' MMAs; INV [64][68] fp32 takes k's; Lkk [64][68] and the
# inverse's scratch [4][16][17] fp32 take gc's, and then v [64][136] bf16, which becomes bv in place.
Q = 0
K = Q + 2 * R * OP_STRIDE
GT = K + 2 * R * OP_STRIDE
BETA = GT + 4 * R * G_STRIDE
RSTD = BETA + 4 * R                                    # q_rstd, k_rstd [64] fp32 (the l2norm build's)
U_BOUND = RSTD + 4 * 2 * R                             # u_bound_parts [2][4] fp32
SMEM_BYTES = U_BOUND + 4 * 2 * WARPS
BK, INV, LKK, BV = Q, K, GT, GT
PART = LKK + 4 * R * L_STRIDE
assert 4 * R * L_STRIDE == 2 * R * OP_STRIDE and PART + 4 * WARPS * TILE_TOKENS * (TILE_TOKENS + 1) <= BETA
assert 3 * (SMEM_BYTES + 1024) <= 228 * 1024   # three CTAs an SM (1 KB of each CTA's shared memory is the system's)


def b_row(kk: int, np_: int):
    """ldmatrix_x4_trans(&b_tile[r][col]): its byte offset in the tile (X4Lane's row is lane & 7)."""
    r, col = 16 * kk + 8 * ((LANE >> 3) & 1) + (LANE & 7), 16 * np_ + 8 * (LANE >> 4)
    return 2 * (r * OP_STRIDE + col)


def u_exponent(inv, bv) -> int:
    """e of u's scale 2^e, as the CTA finds it: each lane i < 16 of warp I sums |INV| along row 16 I + i in
    column order (fp32), the warps' largest row sum times the largest |bv| (both from 0, passing over NaN),
    the bound's frexp exponent less U_FP16_TOP_EXP, within +-U_EXP_LIMIT; 0 where the bound is 0 or not finite."""
    rows = np.zeros(R, np.float32)
    for c in range(R):
        rows = (rows + np.abs(inv[:, c]).astype(np.float32)).astype(np.float32)
    bound = np.float32(np.fmax.reduce(np.append(rows, np.float32(0)))) \
        * np.float32(np.fmax.reduce(np.append(np.abs(bv).ravel(), np.float32(0))))
    if not (bound > 0 and np.isfinite(bound)):
        return 0
    f = int((np.float32(bound).view(np.uint32) >> 23) & 0xFF) - 126
    return min(max(f - U_FP16_TOP_EXP, -U_EXP_LIMIT), U_EXP_LIMIT)


def products(inv, bk, bv, *, ch: int, chunks_hv: int):
    """The w / u stage of kda_forward_products's CTA for (chunk, value head) ch: INV (fp32 [64][64], sh.inv) and
    bk, bv (bf16 values [64][128]) in their shared tiles; returns the w (bf16) and u (fp16, divided by 2^e,
    e = u_exponent) outputs' bits [chunks_hv * 64, 128], all ones where the CTA wrote nothing."""
    smem = np.zeros(SMEM_BYTES, np.uint8)
    for off, tile in ((BK, bk), (BV, bv)):
        rows = np.zeros((R, OP_STRIDE), np.uint16)
        rows[:, :D] = bf16_bits(tile)
        smem[off:off + rows.nbytes] = rows.view(np.uint8).reshape(-1)
    sh_inv = inv.astype(np.float32)
    u_div = np.float32(2.0 ** -u_exponent(sh_inv, bv))
    outs = [np.full((chunks_hv * R, D), 0xFFFF, np.uint16) for _ in range(2)]
    for warp in range(WARPS):
        r0 = TILE_TOKENS * warp
        ra, rb = r0 + GR, r0 + GR + 8
        a = []
        for kk in range(TILES_PER_CHUNK):
            cc = 16 * kk + 2 * T
            a.append(np.stack([model.pack_bf16x2(sh_inv[ra, cc], sh_inv[ra, cc + 1]),
                               model.pack_bf16x2(sh_inv[rb, cc], sh_inv[rb, cc + 1]),
                               model.pack_bf16x2(sh_inv[ra, cc + 8], sh_inv[ra, cc + 9]),
                               model.pack_bf16x2(sh_inv[rb, cc + 8], sh_inv[rb, cc + 9])], axis=1).astype(np.uint32))
        for which, b_tile in enumerate((BK, BV)):
            out = outs[which]
            for np_ in range(D // 16):
                acc = np.zeros((2, 32, 4), np.float32)
                for kk in range(TILES_PER_CHUNK):
                    if kk > warp:
                        break
                    addr = b_tile + b_row(kk, np_)
                    access = banks.ldmatrix_access(addr, 4, trans=True)
                    assert access.wavefronts == access.ideal_wavefronts == 4, access.describe()
                    b = model.ldmatrix(smem, addr, 4, trans=True)
                    acc[0] = mma(a[kk], b[:, :2], acc[0])
                    acc[1] = mma(a[kk], b[:, 2:], acc[1])
                for n in range(2):
                    col = 16 * np_ + 8 * n + 2 * T
                    for row, e in ((ra, 0), (rb, 2)):
                        pair = (model.pack_bf16x2(acc[n][:, e], acc[n][:, e + 1]) if which == 0 else
                                model.pack_f16x2(acc[n][:, e] * u_div, acc[n][:, e + 1] * u_div)).astype(np.uint32)
                        out[ch * R + row, col] = pair & 0xFFFF
                        out[ch * R + row, col + 1] = pair >> 16
    return outs


def _in_the_warps_order(inv, b):
    """bf16(INV) b as the warps sum it: warp I's rows over the 16-row k-steps 0..I, each rounded once to fp32
    (before its store's rounding)."""
    f64 = np.float64
    ib = bf16(inv)
    out = np.zeros((R, D), np.float32)
    for I in range(WARPS):
        rows = slice(TILE_TOKENS * I, TILE_TOKENS * I + TILE_TOKENS)
        for kk in range(I + 1):
            k = slice(16 * kk, 16 * kk + 16)
            out[rows] = (out[rows].astype(f64) + ib[rows, k].astype(f64) @ b[k].astype(f64)).astype(np.float32)
    return out


def fp16_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def _case(seed: int):
    rng = np.random.default_rng(seed)
    inv = np.tril(rng.standard_normal((R, R)) * 0.3, -1).astype(np.float32) + np.eye(R, dtype=np.float32)
    bk, bv = bf16(rng.standard_normal((R, D)) * 0.2), bf16(rng.standard_normal((R, D)))
    return inv, bk, bv


@pytest.mark.parametrize("v_magnitude", [1.0, 1e-20, 1e20])
def test_w_and_u_lane_by_lane_are_the_product_summed_in_the_warps_order(v_magnitude):
    inv, bk, bv = _case(3)
    bv = bf16(bv * np.float32(v_magnitude))
    ch, chunks_hv = 2, 3
    w, u = products(inv, bk, bv, ch=ch, chunks_hv=chunks_hv)
    u_div = np.float32(2.0 ** -u_exponent(inv, bv))
    want = {"w": bf16_bits(_in_the_warps_order(inv, bk)), "u": fp16_bits(_in_the_warps_order(inv, bv) * u_div)}
    for name, got in (("w", w), ("u", u)):
        np.testing.assert_array_equal(got[ch * R:ch * R + R], want[name], err_msg=name)
        assert np.all(np.delete(got, np.s_[ch * R:ch * R + R], axis=0) == 0xFFFF), f"{name}: rows of another chunk"
    # the scale uses fp16's range from the top, for v of any magnitude
    top = np.abs(u[ch * R:ch * R + R].view(np.float16)).max()
    assert 2.0 ** 6 < top <= 2.0 ** 15, top


def test_u_exponent_is_the_models_scale():
    # the model's fp16_scale(u_bound(..)) (numpy's pairwise sums) and the CTA's column-order sums agree here
    for seed in range(5):
        inv, _, bv = _case(seed)
        assert 2.0 ** u_exponent(inv, bv) == fp16_scale(u_bound(inv, bv))


def test_w_and_u_are_the_studys_product_within_the_summation_orders_bound():
    # warp I rounds I + 1 <= 4 partial sums, mm once (the k-steps it skips are INV's zero blocks, exact in
    # both), each at most A = |bf16(INV)| |b| in size: 5 eps A apart (eps = 2^-24) before the store's rounding
    # (bf16 for w, fp16 of u / 2^e for u: 8 and 11 significant bits), which is monotone and can then put them
    # one spacing apart; 1% for the second-order terms. The model's u is chunk_operands' with u_format
    # "fp16": fp16(mm(bf16(INV), bv) / 2^e). The case (seed 3) has elements on the neighbouring value.
    inv, bk, bv = _case(3)
    w, u = products(inv, bk, bv, ch=0, chunks_hv=1)
    scale = fp16_scale(u_bound(inv, bv))
    differ = 0
    cases = (("w", bits_to_f32(w), bk, bf16(mm(bf16(inv), bk)), 8, -126),   # bits, the smallest normal's exponent
             ("u", u.view(np.float16).astype(np.float32), bv, fp16(mm(bf16(inv), bv) / scale), 11, -14))
    for name, got, b, ref, bits, low in cases:
        A = np.abs(bf16(inv)).astype(np.float64) @ np.abs(b).astype(np.float64) / (scale if name == "u" else 1)
        big = np.maximum(np.abs(got), np.abs(ref))
        spacing = np.exp2(np.floor(np.log2(np.maximum(big, 2.0 ** low))) - (bits - 1))
        bound = 1.01 * 5 * 2.0 ** -24 * A + spacing
        assert np.all(np.abs(got.astype(np.float64) - ref) <= bound), name
        differ += int(np.count_nonzero(got != ref))
    assert differ >= 1


def aqk_stores(staged, *, L: int, ch: int, chunks_hv: int, tok0: int, tokens: int, HV: int, hv: int):
    """The Aqk store of kda_forward_products's CTA for (chunk, value head) ch = c HV + hv: from the fp32 tile
    staged in INV's bytes (staged [64][L_STRIDE], as the warps left it), each warp's 16 rows, lane i's pair of
    columns 2 (i % 32) of row r0 + i / 32, masked to the diagonal and below, split by two_part_bf16x2. Returns the
    bits of aqk and aqk_lo [chunks_hv * 64, 64] and of the blocks [tokens, HV, 64], all ones where unwritten."""
    aqk, aqk_lo = (np.full((chunks_hv * R, R), 0xFFFF, np.uint16) for _ in range(2))
    blocks = np.full((tokens, HV, R), 0xFFFF, np.uint16)
    for warp in range(WARPS):
        r0 = TILE_TOKENS * warp
        for j in range(TILE_TOKENS * (R // 2) // 32):
            i = LANE + 32 * j
            row, col = r0 + i // (R // 2), 2 * (i % (R // 2))
            a0 = np.where(col <= row, staged[row, col], np.float32(0))
            a1 = np.where(col + 1 <= row, staged[row, col + 1], np.float32(0))
            hi, lo = (x[:, 0] for x in two_part_bf16x2(np.stack([a0, a1], axis=1).astype(np.float32)))
            for out, pair in ((aqk, hi), (aqk_lo, lo)):
                out[ch * R + row, col], out[ch * R + row, col + 1] = pair & 0xFFFF, pair >> 16
            own = (row < L) & (col >= r0) & (col < r0 + TILE_TOKENS)
            blocks[tok0 + row[own], hv, col[own]] = hi[own] & 0xFFFF
            blocks[tok0 + row[own], hv, col[own] + 1] = hi[own] >> 16
    return aqk, aqk_lo, blocks


@pytest.mark.parametrize("L", [64, 37])
def test_aqk_goes_out_in_two_parts_and_its_blocks_in_its_hi_part(L):
    # the staging tile as the warps leave it: rows < L their blocks at and below the diagonal block (zeros
    # above the diagonal within it), rows >= L zeros there; right of each warp's diagonal block k's bytes,
    # never written (NaN here). Values across fp32's range, either sign, with zeros and subnormals among them.
    rng = np.random.default_rng(L)
    x = (rng.choice([-1.0, 1.0], (R, R)) * np.exp2(rng.uniform(-135, 20, (R, R)))).astype(np.float32)
    x[rng.random((R, R)) < 0.05] = 0
    block_row, block_col = np.arange(R)[:, None] // TILE_TOKENS, np.arange(R)[None, :] // TILE_TOKENS
    lower = np.tril(np.ones((R, R), dtype=bool)) & (np.arange(R)[:, None] < L)
    staged = np.full((R, L_STRIDE), np.nan, np.float32)
    staged[:, :R] = np.where(block_col <= block_row, np.where(lower, x, 0), np.nan)
    ch, chunks_hv, HV, hv, tok0 = 5, 7, 3, 2, 11
    aqk, aqk_lo, blocks = aqk_stores(staged, L=L, ch=ch, chunks_hv=chunks_hv, tok0=tok0, tokens=tok0 + R + 3,
                                     HV=HV, hv=hv)
    want = np.where(lower, x, 0).astype(np.float32)
    hi, lo = split_bf16(want)
    mine = np.s_[ch * R:ch * R + R]
    np.testing.assert_array_equal(bits_to_f32(aqk[mine]), hi)
    np.testing.assert_array_equal(bits_to_f32(aqk_lo[mine]), lo)
    np.testing.assert_array_equal(aqk[mine], bf16_bits(want))              # the hi part: bf16(Aqk)
    assert np.count_nonzero(lo) > np.count_nonzero(want) // 2 and np.all(lo[hi == 0] == 0)
    for out in (aqk, aqk_lo):
        assert np.all(np.delete(out, mine, axis=0) == 0xFFFF), "rows of another chunk"
    own = (block_col == block_row) & (np.arange(R)[:, None] < L)             # each real row's own block
    np.testing.assert_array_equal(blocks[tok0:tok0 + R, hv][own], aqk[mine][own])
    assert np.all(blocks[tok0:tok0 + R, hv][~own] == 0xFFFF)
    assert np.all(np.delete(blocks, hv, axis=1) == 0xFFFF) and np.all(blocks[:tok0] == 0xFFFF)
    assert np.all(blocks[tok0 + R:] == 0xFFFF)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", all_variants(), ids=lambda cfg: cfg.name())
def test_the_source_lays_out_the_shared_memory_modelled_here(tmp_path, cfg):
    # the token-gate build sums the gate in gc's own rows, the l2norm build keeps each row's rstd beside beta: every
    # build has the same shared memory
    text = ptx_of(SOURCE_PATH, options(cfg), tmp_path / "fp.ptx")
    assert ptx_constant(text, "fp_smem_bytes") == SMEM_BYTES
