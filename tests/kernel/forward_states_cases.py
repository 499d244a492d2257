"""Kernel S's test problems on the host: FLA-layout inputs, the float64 entries they must give,
and the same scan in the kernel's precision.

A case starts from kernel.reference.random_inputs (q, k, v, g, beta per token). The kernel's k
is FLA's stored k: l2-normalised, then rounded to bf16; v is rounded to bf16. FLA's g (the
64-chunk-local cumsum / ln 2) and Akk come from kernel.reference.fla_forward_tensors on exactly
those rounded values, so the float64 reference (kda_forward_reference, qk_l2norm off, on the same
rounded k and v) differs from the kernel only by what the kernel rounds: g to fp32, Akk to bf16,
and its MMA operands (S, Kd, Kr, W, U) and output to bf16.

:func:`emulate` runs the kernel's arithmetic in numpy (fp32 where the kernel keeps fp32, bf16 at
the same points), so the bound of the GPU test is a multiple of an error measured on the CPU.
"""
from __future__ import annotations

import math
from typing import Callable

import ml_dtypes
import numpy as np

from kernel.ds_scan.launch import bf16_bits, bits_to_f32
from kernel.reference import fla_forward_tensors, kda_forward_reference, random_inputs, snapshot_offsets
from kernel.reference.checks import l2norm
from ptx_lab.fragments import two_part

D, TILE, EVERY = 128, 16, 4
RAGGED = [1, 15, 16, 17, 63, 64, 65, 200]


def bf16(x) -> np.ndarray:
    """x rounded to bf16 (nearest even), as float32 values."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def random_batch(B: int, T: int | None, lengths, H: int, seed: int, gate_strength: float, initial_state: bool):
    """kernel.reference.random_inputs of a case (dht: the initial state where asked) and its batch: (inputs,
    cu_seqlens or None, B, T, the sequences' lengths)."""
    inp = random_inputs(B, T, H, D, D, lengths=lengths, seed=seed, gate_strength=gate_strength,
                        with_dht=initial_state)
    cu = inp["cu_seqlens"]
    Bq, Tq = inp["k"].shape[:2]
    lens = np.diff(cu) if cu is not None else np.full(Bq, Tq, dtype=np.int64)
    return inp, cu, Bq, Tq, lens


def state_entries(states: np.ndarray, lens, H: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's state entering every tile ([.., H, K, V], sequence after sequence) kept at every
    EVERY-th tile: the entries [entries, H, K, V] in FLA's packing, and their offsets (int64 [N+1])."""
    tiles = snapshot_offsets(lens, TILE, 1)
    entries = snapshot_offsets(lens, TILE, EVERY)
    flat = states.reshape(-1, H, D, D)
    ref = np.concatenate([flat[tiles[n]:tiles[n + 1]][::EVERY] for n in range(len(lens))])
    assert ref.shape[0] == entries[-1]
    return ref, entries


def make_case(*, B: int = 1, T: int | None = None, lengths=None, H: int = 2, seed: int = 0,
              initial_state: bool = False, gate_strength: float = 1.0, first_tile_only: bool = False,
              beta_bf16: bool = False, group: int = 1) -> dict:
    """Host inputs of forward_states (bf16 as uint16 bits) and the float64 entries they must give.

    first_tile_only: k, v and beta are zero past each sequence's first 16 tokens, so a later entry
    holds the first tile's contribution alone (decayed). beta_bf16: beta rounded to bf16 and passed
    as bf16 bits. group: FLA's grouped value heads, k with H / group heads, value head hv reading
    k's head hv // group (the reference and Akk see k repeated so, "k_repeated").

    Returns dict: k, v (uint16 bits [.., H, 128]), g (fp32 FLA g), beta (fp32 [.., H]), Akk (uint16
    bits [.., H, 64]), initial_state (fp32 [N, H, 128, 128] or None), cu_seqlens (int64 or None),
    lengths, ref (float64 [entries, H, 128, 128], FLA's packing), offsets (entries, int64 [N+1]).
    """
    inp, cu, Bq, Tq, lens = random_batch(B, T, lengths, H, seed, gate_strength, initial_state)
    k = bf16(l2norm(np, inp["k"].astype(np.float64)))
    k = np.repeat(k[:, :, ::group], group, axis=2)        # group > 1: every group's value heads read one k head
    v = bf16(inp["v"])
    beta = bf16(inp["beta"]) if beta_bf16 else inp["beta"].astype(np.float32)
    if first_tile_only:
        late = np.concatenate([np.arange(n) >= TILE for n in lens]).reshape(Bq, Tq)
        k[late], v[late], beta[late] = 0.0, 0.0, 0.0
    F = fla_forward_tensors(inp["q"], k, inp["g"], beta, cu_seqlens=cu, qk_l2norm=False, upper="zero")
    h0 = inp["dht"] if initial_state else None          # 0.1 N(0, 1), fp32 [N, H, K, V]
    _, _, states = kda_forward_reference(inp["q"], k, v, inp["g"], beta, initial_state=h0, cu_seqlens=cu,
                                         qk_l2norm=False, tile=TILE)
    ref, entries = state_entries(states, lens, H)
    return {"k": bf16_bits(np.ascontiguousarray(k[:, :, ::group])), "k_repeated": bf16_bits(k), "v": bf16_bits(v),
            "g": F.g64.astype(np.float32),
            "beta": bf16_bits(beta) if beta_bf16 else beta, "beta_values": beta,
            "Akk": bf16_bits(F.Akk), "initial_state": h0, "cu_seqlens": cu, "lengths": [int(n) for n in lens],
            "ref": ref, "offsets": entries, "B": Bq, "T": Tq, "H": H}


def chunk_tile_gate(g: np.ndarray, h: int, i: int, t0: int, L: int) -> np.ndarray:
    """A tile's real rows of gc as the kernels form them from FLA's g (the 64-chunk-local cumsum, fp32
    [tokens, H, 128]): g less g at the token before the tile, where that token is in the same chunk."""
    base = g[t0 - 1, h] if i % EVERY else np.zeros(D, dtype=np.float32)
    return g[t0:t0 + L, h] - base


def two_parts(x) -> tuple[np.ndarray, np.ndarray]:
    """fp32 x as the two-part operand's values (ptx_lab.fragments.two_part, fragments.cuh's): hi = bf16(x), lo =
    bf16(x - hi), float32 each; hi + lo is exact in fp32 and holds about 16 significant bits of x."""
    hi, lo = two_part(np.asarray(x, dtype=np.float32))
    return bits_to_f32(hi), bits_to_f32(lo)


def scan_tiles(case: dict, g: np.ndarray, step: Callable,
               tile_gate: Callable = chunk_tile_gate) -> tuple[np.ndarray, np.ndarray]:
    """The walk over every sequence, head and tile that Kernel S and the forward share, in numpy: S from
    the initial state (or zeros), bf16 S kept as the entry of every EVERY-th tile, then S = step(S, n, h,
    i, t0, L, gc, gT) for tile i (tokens t0 .. t0 + L of ``g`` [tokens, H, 128]; gc: its chunk-local
    gate, ``tile_gate(g, h, i, t0, L)`` for its real rows, rows >= L = gT, its last real row). Returns the
    entries [entries, H, 128, 128] and the final states [N, H, 128, 128], float32."""
    H, lens = case["H"], case["lengths"]
    bos = np.concatenate([[0], np.cumsum(lens)])
    entries = np.zeros((int(case["offsets"][-1]), H, D, D), dtype=np.float32)
    final = np.zeros((len(lens), H, D, D), dtype=np.float32)
    for n, length in enumerate(lens):
        for h in range(H):
            S = (case["initial_state"][n, h].astype(np.float32) if case["initial_state"] is not None
                 else np.zeros((D, D), dtype=np.float32))
            for i in range(math.ceil(length / TILE)):
                t0, L = bos[n] + TILE * i, min(TILE, length - TILE * i)
                if i % EVERY == 0:
                    entries[case["offsets"][n] + i // EVERY, h] = bf16(S)
                gc = np.empty((TILE, D), dtype=np.float32)
                gc[:L] = tile_gate(g, h, i, t0, L)
                gT = gc[L - 1].copy()
                gc[L:] = gT
                S = step(S, n, h, i, t0, L, gc, gT)
            final[n, h] = S
    return entries, final


def emulate(case: dict) -> np.ndarray:
    """The kernel's scan in numpy, in its precision: float32 [entries, H, 128, 128] (bf16 values)."""
    k = bits_to_f32(case["k_repeated"]).reshape(-1, case["H"], D)
    v = bits_to_f32(case["v"]).reshape(-1, case["H"], D)
    g = case["g"].reshape(-1, case["H"], D)
    beta = case["beta_values"].reshape(-1, case["H"])
    akk = bits_to_f32(case["Akk"]).reshape(-1, case["H"], 4 * TILE)
    f64 = np.float64
    lower = np.tril(np.ones((TILE, TILE), dtype=bool))

    def step(S, n, h, i, t0, L, gc, gT):
        kt = np.zeros((TILE, D), dtype=np.float32)
        vt = np.zeros((TILE, D), dtype=np.float32)
        bt = np.zeros(TILE, dtype=np.float32)
        inv = np.zeros((TILE, TILE), dtype=np.float32)
        kt[:L], vt[:L], bt[:L] = k[t0:t0 + L, h], v[t0:t0 + L, h], beta[t0:t0 + L, h]
        inv[:L] = akk[t0:t0 + L, h, TILE * (i % EVERY):TILE * (i % EVERY + 1)]
        inv = np.where(lower, inv, 0.0).astype(np.float32)
        Kd = bf16(kt * np.exp2(gc))
        Kr = bf16(kt * np.exp2(gT[None, :] - gc))
        P = (Kd.astype(f64) @ bf16(S).astype(f64)).astype(np.float32)
        W = bt[:, None] * (vt - P)
        U = (inv.astype(f64) @ np.add(*two_parts(W)).astype(f64)).astype(np.float32)   # W in two bf16 parts
        return (np.exp2(gT)[:, None] * S + (Kr.T.astype(f64) @ bf16(U).astype(f64))).astype(np.float32)

    return scan_tiles(case, g, step)[0]


def as_torch(x, bf: bool):
    """A case's host array as a torch CUDA tensor: bf16 bits (``bf``) through int16 (torch's uint16 has few
    ops) viewed as torch.bfloat16, anything else as it is."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).cuda().view(torch.bfloat16) if bf \
        else torch.from_numpy(np.ascontiguousarray(x)).cuda()


def rel(out, ref) -> float:
    """||out - ref|| / ||ref|| (Frobenius); 0 where both are zero."""
    num, den = float(np.linalg.norm(out - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def worst_entry(out, case: dict) -> tuple[float, str]:
    """The largest per-entry relative error and where it is: sequence, chunk, head."""
    worst, where = -1.0, ""
    ref = case["ref"]
    for n in range(len(case["lengths"])):
        for c in range(int(case["offsets"][n]), int(case["offsets"][n + 1])):
            for h in range(case["H"]):
                e = rel(out[c, h], ref[c, h])
                if e > worst:
                    a = np.abs(out[c, h] - ref[c, h])
                    kk, vv = np.unravel_index(int(np.argmax(a)), a.shape)
                    worst = e
                    where = (f"sequence {n} (length {case['lengths'][n]}), chunk {c - int(case['offsets'][n])} "
                             f"(entry {c}), head {h}: rel {e:.3e}, max |diff| {float(a.max()):.3e} at [k={kk}, v={vv}] "
                             f"(out {float(out[c, h, kk, vv]):.4e}, ref {float(ref[c, h, kk, vv]):.4e}), "
                             f"|ref| {float(np.linalg.norm(ref[c, h])):.3e}")
    return worst, where
