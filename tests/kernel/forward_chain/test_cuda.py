"""kernel/forward_chain/cuda on the CPU: one CTA's four chain warps lane by lane, over the steps of a short
sequence, through ptx_lab's exact CPU model of the instructions. The producer's tensor copies land each stage
as the TMA lands its boxes (model.cp_async_bulk_tensor_2d_g2s: w and kg [64 r][64 k] SW128 a k half, u
[64 r][32 v] SW64 at the CTA's v group, decay by a bulk copy, all on the stage's mbarrier); every ldmatrix,
stmatrix and exchange access is at the address forward_chain.cu computes (one function per access below, the
source's index arithmetic transcribed); the tensor stores read the staging tiles through the SW32 box layout
(model.cp_async_bulk_tensor_2d_s2g); and every shared-memory access of a step is at its fewest wavefronts
(ptx_lab.banks).

What comes out is held to two models of the step's arithmetic:

* the step summed in the chain warps' order, each m16n8k16 rounded once to fp32 as model.mma_m16n8k16
  rounds it (_step_in_the_warps_order): states, v_new and S bit for bit;
* tests/kernel/three_pass_model.py.chain_step (each GEMM summed whole in float64, rounded once):
  states bit for bit (both are bf16(S)), v_new and S within the bound that the two summation orders leave
  (_within_the_orders_bound derives it).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kernel.forward_chain import SOURCE_PATH, VGROUPS, Config, all_variants, options
from kernel.runtime.arrays import bf16_bits, bits_to_f32
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM
from ptx_lab import banks, model
from ptx_lab.fragments import acc_to_a_two_parts, x4_lane_row_col
from ptx_lab.tensormap import TensorMap2D

from ..chain_fragments import bf16, mma, pack_a
from ..forward_states_cases import two_parts
from ..ptx_build import ptx_constant, ptx_of
from ..three_pass_model import chain_step


D, R = HEAD_DIM, CHUNK_TOKENS
LANE = np.arange(32)
G, T = LANE // 4, LANE % 4

# forward_chain.cu's constants
CHAIN_WARPS, K_HALF, V_CTA, STAGING = 4, D // 2, 32, 3
HALF_BOX_BYTES = R * K_HALF * 2                   # w's and kg's k-half boxes
U_BOX_BYTES = R * V_CTA * 2
DECAY_BYTES = D * 4
U_SCALE_BYTES = 16
STAGE_TX_BYTES = 4 * HALF_BOX_BYTES + U_BOX_BYTES + DECAY_BYTES + U_SCALE_BYTES
STATE_TILE_BYTES, VNEW_TILE_BYTES = D * 16 * 2, R * 16 * 2


def _up(x: int, align: int) -> int:
    return -(-x // align) * align


# Stage (alignas(1024)): w[2], kg[2], u, decay, u_scale
STAGE_W, STAGE_KG, STAGE_U = 0, 2 * HALF_BOX_BYTES, 4 * HALF_BOX_BYTES
STAGE_DECAY = STAGE_U + U_BOX_BYTES
STAGE_U_SCALE = STAGE_DECAY + DECAY_BYTES
STAGE_BYTES = _up(STAGE_TX_BYTES, 1024)


def shared_layout(nstage: int) -> dict[str, int]:
    """Byte offsets of struct Shared's members and its size: stages[nstage], state_tiles[3][2] and
    vnew_tiles[3][2] (alignas(256)), x_exchange float4 [2][2][2][8][32], the ring's 2 nstage mbarriers."""
    at = {"stages": 0, "state_tiles": _up(nstage * STAGE_BYTES, 256)}
    at["vnew_tiles"] = _up(at["state_tiles"] + STAGING * 2 * STATE_TILE_BYTES, 256)
    at["x_exchange"] = _up(at["vnew_tiles"] + STAGING * 2 * VNEW_TILE_BYTES, 16)
    at["ring"] = at["x_exchange"] + 2 * 2 * 2 * 8 * 32 * 16
    at["size"] = _up(at["ring"] + 2 * nstage * 8, 1024)   # Stage's alignment is Shared's
    return at


# ---------------------------------------------------------------- forward_chain.cu's addresses, one function each

def tma_swizzle(S: int, off):
    """tma.cuh's tma_swizzle<S>."""
    return off ^ ((off >> 3) & ((S // 16 - 1) << 4))


def swizzled(S: int, row, chunk):
    """fc::swizzled<S>(row, chunk)."""
    return tma_swizzle(S, row * S + 16 * chunk)


def st_element(j: int, e: int, mv: int, kh: int, vg: int):
    """(k, v) of st[j][e], as the h0 load and the final_state store index it."""
    v0, k_base = 16 * mv + G, K_HALF * kh
    k, v = k_base + 8 * j + 2 * T + (e & 1), V_CTA * vg + v0 + 8 * (e >> 1)
    return k, v


def state_tile_row(kk: int, kh: int):
    """stmatrix_x4_trans(state_tile + swizzled<32>(k, (lane >> 3) & 1), a[kk])."""
    k_base = K_HALF * kh
    k = k_base + 16 * kk + 8 * ((LANE >> 4) & 1) + (LANE & 7)
    return swizzled(32, k, (LANE >> 3) & 1)


# X4Lane's (row + cols_first_mat_row(), cols_first_mat_col()): ldmatrix.cuh's twin in ptx_lab.fragments
XL_COLS_FIRST = x4_lane_row_col("cols_first")


def w_row(kk: int, np_: int):
    """ldmatrix_x4(stg.w[kh] + swizzled<128>(r, chunk)), X^T's B operand."""
    r = 16 * np_ + XL_COLS_FIRST[:, 0]
    chunk = 2 * kk + XL_COLS_FIRST[:, 1] // 8
    return swizzled(128, r, chunk)


def x_exchange(parity: int, kh: int, mv: int, i: int):
    """mine / partner [32 i]: &sh.x_exchange[s & 1][kh][mv][0][lane] + 32 i, float4s."""
    return 16 * ((((parity * 2 + kh) * 2 + mv) * 8 + i) * 32 + LANE)


def u_row(np_: int, mv: int):
    """ldmatrix_x4_trans(stg.u + swizzled<64>(r, 2 * mv + ((lane >> 3) & 1)))."""
    r = 8 * (2 * np_ + (LANE >> 4)) + (LANE & 7)
    return swizzled(64, r, 2 * mv + ((LANE >> 3) & 1))


def decay_pair(j: int, kh: int):
    """*reinterpret_cast<const float2*>(&stg.decay[k_base + 8 * j + 2 * t]): a byte offset."""
    k_base = K_HALF * kh
    return 4 * (k_base + 8 * j + 2 * T)


def vnew_tile_row(kk: int):
    """stmatrix_x4_trans(vnew_tile + swizzled<32>(r, (lane >> 3) & 1), va[kk])."""
    r = 16 * kk + 8 * ((LANE >> 4) & 1) + (LANE & 7)
    return swizzled(32, r, (LANE >> 3) & 1)


def kg_row(kk: int, np_: int):
    """ldmatrix_x4_trans(stg.kg[kh] + swizzled<128>(r, chunk)), the update's B operand."""
    r = 16 * kk + 8 * ((LANE >> 3) & 1) + (LANE & 7)
    chunk = 2 * np_ + (LANE >> 4)
    return swizzled(128, r, chunk)


# ---------------------------------------------------------------- the CTA

def fewest(access: banks.Access) -> None:
    assert access.wavefronts == access.ideal_wavefronts, access.describe()


def tensor_maps(at: dict[str, int], chunks: int, HV: int) -> dict[str, TensorMap2D]:
    """launch._maps's five maps over a global image (addresses are offsets into it): w, kg (box [64][64],
    SW128), u ([64][32], SW64, fp16 moved as uint16), states ([128][16], SW32) and v_new ([64][16], SW32), each
    tensor [rows, 128]."""
    rows = chunks * HV * R

    def map16(name, nrows, box, swizzle, dtype="bfloat16"):
        return TensorMap2D(at[name], dtype, (nrows, D), D * 2, box=box, swizzle=swizzle)

    return {"w": map16("w", rows, (R, 64), 128), "kg": map16("kg", rows, (R, 64), 128),
            "u": map16("u", rows, (R, 32), 64, "uint16"), "states": map16("states", 2 * rows, (D, 16), 32),
            "v_new": map16("v_new", rows, (R, 16), 32)}


class ChainCta:
    """kda_forward_chain's CTA (pair, vg) over a global image: the producer lane's copies and the four chain
    warps' registers (st, and a, x, un between the two halves of a step)."""

    def __init__(self, gmem, at, maps, *, nstage, HV, n, hv, vg, c0, nsteps):
        self.gmem, self.at, self.maps = gmem, at, maps
        self.nstage, self.HV, self.hv, self.vg, self.c0, self.nsteps = nstage, HV, hv, vg, c0, nsteps
        self.sh = shared_layout(nstage)
        self.smem = np.zeros(self.sh["size"], np.uint8)
        self.full = [model.MBarrier(1) for _ in range(nstage)]   # MbarrierRing<FC_NSTAGE, 1, 128>::full
        self.state_base = (n * HV + hv) * D * D
        self.st = np.zeros((CHAIN_WARPS, 8, 32, 4), np.float32)
        self.kept: list[dict] = [{} for _ in range(CHAIN_WARPS)]

    def stage(self, j: int) -> int:
        return self.sh["stages"] + (j % self.nstage) * STAGE_BYTES

    def produce(self, j: int) -> None:
        """The producer lane's copies of step j into its stage, all completing on the stage's full barrier."""
        st, full = self.stage(j), self.full[j % self.nstage]
        ch = (self.c0 + j) * self.HV + self.hv
        row = ch * R
        full.arrive_expect_tx(STAGE_TX_BYTES)
        for kh in range(2):
            self.smem = model.cp_async_bulk_tensor_2d_g2s(self.smem, self.gmem, st + STAGE_W + kh * HALF_BOX_BYTES,
                                                          self.maps["w"], K_HALF * kh, row, full)
            self.smem = model.cp_async_bulk_tensor_2d_g2s(self.smem, self.gmem, st + STAGE_KG + kh * HALF_BOX_BYTES,
                                                          self.maps["kg"], K_HALF * kh, row, full)
        self.smem = model.cp_async_bulk_tensor_2d_g2s(self.smem, self.gmem, st + STAGE_U, self.maps["u"],
                                                      V_CTA * self.vg, row, full)
        self.smem = model.cp_async_bulk_g2s(self.smem, self.gmem, st + STAGE_DECAY,
                                            self.at["decay"] + ch * DECAY_BYTES, DECAY_BYTES, full)
        self.smem = model.cp_async_bulk_g2s(self.smem, self.gmem, st + STAGE_U_SCALE,
                                            self.at["u_scale"] + ch * U_SCALE_BYTES, U_SCALE_BYTES, full)

    def load_h0(self, h0_flat) -> None:
        for warp in range(CHAIN_WARPS):
            mv, kh = warp & 1, warp >> 1
            for j in range(8):
                for e in range(4):
                    k, v = st_element(j, e, mv, kh, self.vg)
                    self.st[warp, j, :, e] = h0_flat[self.state_base + k * D + v]

    def final_state(self) -> np.ndarray:
        """What the CTA's final_state store writes: S [128 k][128 v], NaN outside its 32 columns."""
        out = np.full(D * D, np.nan, np.float32)
        for warp in range(CHAIN_WARPS):
            mv, kh = warp & 1, warp >> 1
            for j in range(8):
                for e in range(4):
                    k, v = st_element(j, e, mv, kh, self.vg)
                    out[k * D + v] = self.st[warp, j, :, e]
        return out.reshape(D, D)

    def _rw(self, addr, nbytes: int, values=None):
        """Each lane's ld/st.shared of nbytes at addr (float32 values (32, nbytes / 4))."""
        idx = addr[:, None] + np.arange(nbytes)
        if values is None:
            return self.smem[idx].view(np.float32)
        self.smem[idx] = np.ascontiguousarray(values, np.float32).view(np.uint8)

    def until_the_barrier(self, warp: int, s: int) -> None:
        mv, kh = warp & 1, warp >> 1
        st, kept = self.st[warp], self.kept[warp]
        stg = self.stage(s)
        state_tile = self.sh["state_tiles"] + ((s % STAGING) * 2 + mv) * STATE_TILE_BYTES
        a = []
        for kk in range(4):
            a.append(pack_a(st[2 * kk], st[2 * kk + 1]))   # acc_to_a
            addr = state_tile + state_tile_row(kk, kh)
            fewest(banks.stmatrix_access(addr, 4, trans=True))
            self.smem = model.stmatrix(self.smem, addr, a[kk], trans=True)
        x = np.zeros((8, 32, 4), np.float32)
        for kk in range(4):
            for np_ in range(4):
                addr = stg + STAGE_W + kh * HALF_BOX_BYTES + w_row(kk, np_)
                fewest(banks.ldmatrix_access(addr, 4))
                b = model.ldmatrix(self.smem, addr, 4, trans=False)
                x[2 * np_] = mma(a[kk], b[:, :2], x[2 * np_])
                x[2 * np_ + 1] = mma(a[kk], b[:, 2:], x[2 * np_ + 1])
        for i in range(8):   # mine[32 i]
            addr = self.sh["x_exchange"] + x_exchange(s & 1, kh, mv, i)
            fewest(banks.shared_access(addr, 16, store=True))
            self._rw(addr, 16, x[i])
        un = np.zeros((8, 32, 4), np.float32)
        sc = self.smem[stg + STAGE_U_SCALE:stg + STAGE_U_SCALE + 4].view(np.float32)[0]   # stg.u_scale[0], a broadcast
        for np_ in range(4):
            addr = stg + STAGE_U + u_row(np_, mv)
            fewest(banks.ldmatrix_access(addr, 4, trans=True))
            m = model.ldmatrix(self.smem, addr, 4, trans=True)
            for i, (left, right) in enumerate(((0, 1), (2, 3))):   # registers m[2 i], m[2 i + 1]: un[2 np + i]
                un[2 * np_ + i][:, 0], un[2 * np_ + i][:, 1] = (sc * x for x in model.unpack_f16x2(m[:, 2 * i]))
                un[2 * np_ + i][:, 2], un[2 * np_ + i][:, 3] = (sc * x for x in model.unpack_f16x2(m[:, 2 * i + 1]))
        for j in range(8):
            addr = stg + STAGE_DECAY + decay_pair(j, kh)
            fewest(banks.shared_access(addr, 8))
            d = self._rw(addr, 8)
            st[j][:, 0] *= d[:, 0]
            st[j][:, 1] *= d[:, 1]
            st[j][:, 2] *= d[:, 0]
            st[j][:, 3] *= d[:, 1]
        kept.update(x=x, un=un)

    def after_the_barrier(self, warp: int, s: int) -> None:
        mv, kh = warp & 1, warp >> 1
        st, x, un = self.st[warp], self.kept[warp]["x"], self.kept[warp]["un"]
        stg = self.stage(s)
        ch = (self.c0 + s) * self.HV + self.hv
        for i in range(8):   # partner[32 i]: this warp's partial plus its partner's (the same bits either way round)
            addr = self.sh["x_exchange"] + x_exchange(s & 1, kh ^ 1, mv, i)
            fewest(banks.shared_access(addr, 16))
            o = self._rw(addr, 16)
            un[i] -= x[i] + o
        va, vr = zip(*(acc_to_a_two_parts(un[2 * kk], un[2 * kk + 1]) for kk in range(4)))   # bf16(Vn^T), the rest
        if kh == 0:
            vnew_tile = self.sh["vnew_tiles"] + ((s % STAGING) * 2 + mv) * VNEW_TILE_BYTES
            state_tile = self.sh["state_tiles"] + ((s % STAGING) * 2 + mv) * STATE_TILE_BYTES
            for kk in range(4):
                addr = vnew_tile + vnew_tile_row(kk)
                fewest(banks.stmatrix_access(addr, 4, trans=True))
                self.smem = model.stmatrix(self.smem, addr, va[kk], trans=True)
            col = V_CTA * self.vg + 16 * mv   # lane 0's tensor stores
            self.gmem = model.cp_async_bulk_tensor_2d_s2g(self.gmem, self.smem, state_tile, self.maps["states"],
                                                          col, ch * D)
            self.gmem = model.cp_async_bulk_tensor_2d_s2g(self.gmem, self.smem, vnew_tile, self.maps["v_new"],
                                                          col, ch * R)
        for kk in range(4):
            for np_ in range(4):
                addr = stg + STAGE_KG + kh * HALF_BOX_BYTES + kg_row(kk, np_)
                fewest(banks.ldmatrix_access(addr, 4, trans=True))
                b = model.ldmatrix(self.smem, addr, 4, trans=True)
                st[2 * np_] = mma(vr[kk], b[:, :2], st[2 * np_])
                st[2 * np_ + 1] = mma(vr[kk], b[:, 2:], st[2 * np_ + 1])
                st[2 * np_] = mma(va[kk], b[:, :2], st[2 * np_])
                st[2 * np_ + 1] = mma(va[kk], b[:, 2:], st[2 * np_ + 1])

    def step(self, s: int) -> None:
        """Step s: the producer's copies of step s + nstage - 1 (its stage was released by step s - 1), the
        wait on step s's stage, each warp up to the pair's barrier, then each warp on from it."""
        if s == 0:
            for j in range(min(self.nstage - 1, self.nsteps)):
                self.produce(j)
        if s + self.nstage - 1 < self.nsteps:
            self.produce(s + self.nstage - 1)
        self.full[s % self.nstage].wait_parity((s // self.nstage) & 1)   # ring.wait_full(s)
        for warp in range(CHAIN_WARPS):
            self.until_the_barrier(warp, s)
        for warp in range(CHAIN_WARPS):
            self.after_the_barrier(warp, s)


# ---------------------------------------------------------------- the arithmetic

EPS = 2.0 ** -24    # fp32's unit roundoff


def _step_in_the_warps_order(S, w, u, kg, decay):
    """chain_step summed as the chain warps sum it, each 16-deep MMA step rounded once to fp32 (the rounding
    of ptx_lab.model.mma_m16n8k16): X over 16-k steps within each k half, then the two halves' sum,
    v_new = bf16(u - X); S decayed in fp32, then the update's four 16-r steps onto it, each the rest's part of
    u - X first, then v_new's (the two-part operand)."""
    f64 = np.float64
    Sb = bf16(S)
    half = []
    for kh in range(2):
        x = np.zeros((R, S.shape[1]), np.float32)
        for kk in range(4):
            k = slice(K_HALF * kh + 16 * kk, K_HALF * kh + 16 * kk + 16)
            x = (x.astype(f64) + w[:, k].astype(f64) @ Sb[k].astype(f64)).astype(np.float32)
        half.append(x)
    v_new, v_rest = two_parts(u - (half[0] + half[1]))
    S1 = S * decay[:, None]
    for kk in range(4):
        r = slice(16 * kk, 16 * kk + 16)
        for part in (v_rest, v_new):
            S1 = (S1.astype(f64) + kg[r].T.astype(f64) @ part[r].astype(f64)).astype(np.float32)
    return Sb, v_new, S1


def _bf16_spacing(x):
    """The distance between neighbouring bf16 values at |x| (8 significant bits)."""
    return np.exp2(np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -126))) - 7)


def _within_the_orders_bound(S, w, u, kg, decay, v_new, S1) -> tuple[int, float]:
    """v_new and S1 (the CTA's) against chain_step's, elementwise, within what the two summation orders leave.

    With eps = 2^-24 (fp32's unit roundoff) and A = |w| |bf16(S)| (no partial sum of X = w bf16(S) is larger):
    the warps round X 4 times a k half and once more adding the halves, chain_step once, so the two X differ by
    at most 6 eps A; u - X rounds once on each side (eps (|u| + A)), so the two Vn by 8 eps A + 2 eps |u|;
    bf16 rounding is monotone and moves each side by at most half a spacing, so v_new by that plus one bf16
    spacing: an element is equal, or the neighbouring bf16 value where Vn sat that close to a rounding
    boundary. S1 = fl(decay S) + kg^T Vn, Vn read in two bf16 parts whose sum is within half a spacing of the
    rest's bf16 of Vn, on either side, whether or not the two bf16(Vn) agree: the two operands differ by at most
    the two Vn's bound plus that spacing. fl(decay S) is the same product on both sides; the warps round 8
    partial sums, chain_step the product and the sum, at most 10 eps (|fl(decay S)| + |kg|^T |v_new|) in all,
    plus |kg|^T times the operands' difference. Both bounds carry 1% for the second-order terms. Returns (the
    v_new elements that differ, the largest |S1 - S1'| over its bound)."""
    f64 = np.float64
    Sb, v_e, S1_e = chain_step(S, w, u, kg, decay)
    A = np.abs(w).astype(f64) @ np.abs(Sb).astype(f64)
    dv = np.abs(v_new.astype(f64) - v_e)
    d_vn = 1.01 * (8 * EPS * A + 2 * EPS * np.abs(u))
    v_max = np.maximum(np.abs(v_new), np.abs(v_e))
    bound_v = d_vn + _bf16_spacing(v_max)
    assert np.all(dv <= bound_v), f"v_new: {np.max(dv / bound_v):.3g} x the bound"
    kgT = np.abs(kg).astype(f64).T
    P = kgT @ v_max.astype(f64)
    bound_s = 1.01 * (10 * EPS * (np.abs(S * decay[:, None]) + P)) + kgT @ (d_vn + _bf16_spacing(_bf16_spacing(v_max)))
    ds = np.abs(S1.astype(f64) - S1_e)
    assert np.all(ds <= bound_s), f"S: {np.max(ds / bound_s):.3g} x the bound"
    return int(np.count_nonzero(dv)), float(np.max(ds / bound_s))


# ---------------------------------------------------------------- the case

CHUNKS, HV, HV_CTA = 4, 2, 1   # one sequence of 4 chunks, two value heads; the CTA of value head 1


def _case(seed: int):
    """w, kg, u, decay, h0 and u's scale: u as the products pass stores it, fp16 values near 2^10 times
    a power of two a chunk and head near 2^-10 (u itself of order 1)."""
    rng = np.random.default_rng(seed)
    w = bf16(rng.standard_normal((CHUNKS, HV, R, D)) * 0.1)
    kg = bf16(rng.standard_normal((CHUNKS, HV, R, D)) * 0.1)
    u = (rng.standard_normal((CHUNKS, HV, R, D)) * 2.0 ** 10).astype(np.float16).astype(np.float32)
    decay = rng.uniform(0.4, 1.0, (CHUNKS, HV, D)).astype(np.float32)
    h0 = rng.standard_normal((1, HV, D, D)).astype(np.float32)
    u_scale = np.zeros((CHUNKS, HV, 4), np.float32)
    u_scale[..., 0] = np.exp2(rng.integers(-12, -7, (CHUNKS, HV)))
    return w, kg, u, decay, h0, u_scale


def _global_image(w, kg, u, decay, u_scale) -> tuple[np.ndarray, dict[str, int]]:
    """The tensors one after another (each a multiple of 16 bytes); states and v_new all ones bits (NaN) where
    nothing was written."""
    parts = {"w": bf16_bits(w), "kg": bf16_bits(kg), "u": u.astype(np.float16).view(np.uint16),
             "decay": decay.astype(np.float32), "u_scale": u_scale,
             "states": np.full(CHUNKS * HV * D * D, 0xFFFF, np.uint16),
             "v_new": np.full(CHUNKS * HV * R * D, 0xFFFF, np.uint16)}
    at, images, off = {}, [], 0
    for name, x in parts.items():
        b = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        at[name], off = off, off + b.size
        images.append(b)
    return np.concatenate(images), at


def _run_cta(ops, vg: int, nstage: int, each_step) -> ChainCta:
    """The CTA of (sequence 0, value head HV_CTA, vg) over every chunk; each_step(s, cta, S) after step s, S
    the state the CTA held when the step began (as its final_state store would write it)."""
    w, kg, u, decay, h0, u_scale = ops
    gmem, at = _global_image(w, kg, u, decay, u_scale)
    cta = ChainCta(gmem, at, tensor_maps(at, CHUNKS, HV), nstage=nstage, HV=HV, n=0, hv=HV_CTA, vg=vg, c0=0,
                   nsteps=CHUNKS)
    cta.load_h0(h0.reshape(-1))
    for s in range(CHUNKS):
        S_in = cta.final_state()
        cta.step(s)
        each_step(s, cta, S_in)
    return cta


def _step_operands(ops, s: int, vg: int, S_in):
    """chain_step's arguments for step s restricted to the CTA's 32 v columns (columns of S are independent); u
    times its scale, a power of two, exact."""
    w, kg, u, decay, _, u_scale = ops
    cols = slice(V_CTA * vg, V_CTA * vg + V_CTA)
    return S_in[:, cols], w[s, HV_CTA], u[s, HV_CTA][:, cols] * u_scale[s, HV_CTA, 0], kg[s, HV_CTA], decay[s, HV_CTA]


def _outputs(cta: ChainCta, c: int):
    """The CTA's columns of chunk c's states [128 k][32 v] and v_new [64 r][32 v] from the global image, and
    whether every other element of both tensors is as it was before the CTA ran (all ones bits) but for the
    CTA's columns of the chunks it has stepped through."""
    states = cta.gmem[cta.at["states"]:cta.at["v_new"]].view(np.uint16).reshape(CHUNKS, HV, D, D)
    v_new = cta.gmem[cta.at["v_new"]:].view(np.uint16).reshape(CHUNKS, HV, R, D)
    cols = slice(V_CTA * cta.vg, V_CTA * cta.vg + V_CTA)
    untouched = True
    for x in (states, v_new):
        written = np.zeros(x.shape, bool)
        written[:c + 1, HV_CTA, :, cols] = True
        untouched &= bool(np.all(x[~written] == 0xFFFF))
    return states[c, HV_CTA][:, cols], v_new[c, HV_CTA][:, cols], untouched


@pytest.mark.parametrize("vg", range(VGROUPS))
def test_a_ctas_steps_lane_by_lane_are_the_step_summed_in_the_warps_order(vg):
    # each step from the S the CTA holds when it begins: states and v_new as the tensor stores wrote them, S as
    # the final_state store would write it, all three bit for bit; nothing written outside the CTA's columns
    ops = _case(11)

    def check(s, cta, S_in):
        Sb, v_new, S1 = _step_in_the_warps_order(*_step_operands(ops, s, vg, S_in))
        states, vn, untouched = _outputs(cta, s)
        np.testing.assert_array_equal(states, bf16_bits(Sb), err_msg=f"step {s}: states")
        np.testing.assert_array_equal(vn, bf16_bits(v_new), err_msg=f"step {s}: v_new")
        np.testing.assert_array_equal(cta.final_state()[:, V_CTA * vg:V_CTA * vg + V_CTA], S1, err_msg=f"step {s}: S")
        assert untouched, f"step {s}: a store wrote outside the CTA's columns of its chunks"

    cta = _run_cta(ops, vg, Config().nstage, check)
    assert np.isnan(np.delete(cta.final_state(), np.s_[V_CTA * vg:V_CTA * vg + V_CTA], axis=1)).all()


@pytest.mark.parametrize("nstage", [cfg.nstage for cfg in all_variants()])
def test_a_ctas_steps_are_chain_step_within_the_summation_orders_bound(nstage):
    # against tests/kernel/three_pass_model.py.chain_step on the same operands, each step from the S
    # the CTA holds: bf16(S) bit for bit, v_new and S within _within_the_orders_bound. The case (seed 17, v
    # group 0) has v_new elements on the neighbouring bf16 value in two steps, so the bound's v_new spacing
    # and S's term for it are both at work.
    ops, vg, differ = _case(17), 0, []

    def check(s, cta, S_in):
        args = _step_operands(ops, s, vg, S_in)
        states, vn, _ = _outputs(cta, s)
        np.testing.assert_array_equal(states, bf16_bits(chain_step(*args)[0]), err_msg=f"step {s}: states")
        cols = slice(V_CTA * vg, V_CTA * vg + V_CTA)
        differ.append(_within_the_orders_bound(*args, bits_to_f32(vn), cta.final_state()[:, cols])[0])

    _run_cta(ops, vg, nstage, check)
    assert len(differ) == CHUNKS and sum(differ) >= 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("cfg", all_variants(), ids=lambda c: c.name())
def test_the_source_lays_out_the_shared_memory_modelled_here(tmp_path, cfg):
    # the .cu's own constants: Shared's size is shared_layout's (stages, staging tiles, exchange, ring), the
    # threads are the chain warps and the producer, and the grid has VGROUPS CTAs a (sequence, value head)
    text = ptx_of(SOURCE_PATH, options(cfg), tmp_path / "fc.ptx")
    assert ptx_constant(text, "fc_smem_bytes") == shared_layout(cfg.nstage)["size"]
    assert ptx_constant(text, "fc_threads") == 32 * (CHAIN_WARPS + 1)
    assert ptx_constant(text, "fc_vgroups") == VGROUPS == D // V_CTA
