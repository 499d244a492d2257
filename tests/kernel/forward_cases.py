"""The forward's test problems on the host: FLA-convention inputs, the float64 outputs they must give,
and the same forward in the kernel's precision (a numpy model of kernel/forward/cuda/forward.cu).

A case starts from kernel.reference.random_inputs (or a caller's gate). q and k are l2-normalised,
then rounded to bf16; v is rounded to bf16. FLA's g (the 64-chunk-local cumsum / ln 2) and its Aqk and
Akk come from kernel.reference.fla_forward_tensors on exactly those rounded values, and o, the final
state and the states from kda_forward_reference (qk_l2norm off), so the float64 outputs differ from
the kernel only by what the kernel rounds.

:func:`emulate` runs the kernel's arithmetic tile by tile (fp32 where it keeps fp32, bf16 at the same
points, the pairwise Mqk and Akk where a tile spans past SPAN_LIMIT), so the GPU tests' bounds are
multiples of errors measured on the CPU.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from kernel.ds_scan.launch import bf16_bits, bits_to_f32
from kernel.reference import fla_forward_tensors, kda_forward_reference
from kernel.reference.checks import l2norm, l2norm_rstd
from kernel.shapes import SPAN_LIMIT   # a tile whose gc - gT passes it takes the pairwise products
from kernel.shapes import tile_gate_sums

from .forward_states_cases import random_batch, scan_tiles, state_entries, two_parts

D, TILE, EVERY, C64 = 128, 16, 4, 64
RAGGED = [1, 15, 16, 17, 63, 64, 65, 200]
PAST_GATE = -9.0       # a natural-log gate a token: 16 of them decay a channel by 2^-207.7, past fp32's range
EDGE_SPAN = 124.0      # a tile decayed by 2^-124 at its last token: within 2^126, past SPAN_LIMIT
FP32_TINY = np.float32(2.0 ** -126)


def ftz(x) -> np.ndarray:
    """fp32 with subnormals flushed to zero, as the kernel's -ftz=true arithmetic leaves them."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < FP32_TINY, np.float32(0), x).astype(np.float32)


def bf16(x) -> np.ndarray:
    """x rounded to bf16 (nearest even), as float32 values."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def past_range(g: np.ndarray, cu: np.ndarray | None) -> np.ndarray:
    """g with two tiles decaying past fp32's range (kernel.tools.racecheck's recipe): one channel of one
    head in the second sequence's (or row's) third tile, every channel of head 0 in a later sequence's
    sixth tile, where they exist."""
    g = g.copy()
    starts = list(cu[:-1]) if cu is not None else [0]
    ends = list(cu[1:]) if cu is not None else [g.shape[1]]
    row = 0
    picks = [(s, e) for s, e in zip(starts, ends) if e - s > 48]
    if picks:
        s, e = picks[0]
        g[row, s + 32:min(e, s + 48), -1, 3] = PAST_GATE
    late = [(s, e) for s, e in zip(starts, ends) if e - s > 96]
    if late:
        s, e = late[-1]
        g[row, s + 80:s + 96, 0, :] = PAST_GATE
    return g


def edge_range(g: np.ndarray, cu: np.ndarray | None) -> np.ndarray:
    """g where the last token of a sequence's second tile decays every channel of head 0 by 2^-EDGE_SPAN
    and its other tokens not at all: the tile spans 124 < 126 (log2), so R1's factors stay in fp32's
    range, but Kr = k 2^-124 of its first 15 rows falls below 2^-126 for |k| < 1/4, and -ftz=true
    flushes it: the factorised Mqk and Akk would lose the entries among those rows."""
    g = g.copy()
    starts = list(cu[:-1]) if cu is not None else [0]
    ends = list(cu[1:]) if cu is not None else [g.shape[1]]
    s, e = next((s, e) for s, e in zip(starts, ends) if e - s >= 32)
    g[0, s + 16:s + 31, 0, :] = 0.0
    g[0, s + 31, 0, :] = -EDGE_SPAN * math.log(2.0)
    return g


def make_case(*, B: int = 1, T: int | None = None, lengths=None, H: int = 2, group: int = 1, seed: int = 0,
              initial_state: bool = False, gate_strength: float = 1.0, beta_bf16: bool = False,
              out_of_range: bool = False, edge_of_range: bool = False, gate=None,
              scale: float | None = None, raw_qk: bool = False) -> dict:
    """Host inputs of kernel.forward (bf16 as uint16 bits) and the float64 outputs they must give.

    H: value heads; group: FLA's grouped value heads, q and k with H / group heads (value head hv
    reading head hv // group; the references see them repeated so, "q_repeated", "k_repeated").
    out_of_range: two tiles decay past fp32's range (:func:`past_range`). edge_of_range: a tile decays
    by 2^-124 at its last token (:func:`edge_range`). gate: a natural-log gate
    [B, T, H, 128] in place of the recipe's (e.g. the trained-layer gate). beta_bf16: beta rounded to
    bf16 and passed as bf16 bits. raw_qk: q and k also as the l2norm build reads them, not normalised
    ("q_raw", "k_raw": the recipe's rows rounded to bf16), the references on their normalised rows rounded
    to bf16 ("q", "k"; the build's own rounding of them differs in a last bit at most).

    Returns dict: q, k, v (uint16 bits), g (fp32 FLA g), g_token (fp32: each token's natural-log gate, what
    the token-gate build reads), beta, initial_state (fp32 [N, H, 128, 128] or
    None), cu_seqlens, lengths, scale, and the float64 references: o [.., H, 128], final [N, H, 128, 128],
    states [entries, H, 128, 128] (FLA's packing, offsets), Aqk, Akk [.., H, 64] (zero above the diagonal),
    blocks (bool [.., H, 64]: the diagonal blocks' columns of each token's row).
    """
    inp, cu, Bq, Tq, lens = random_batch(B, T, lengths, H, seed, gate_strength, initial_state)
    raw = {name: bf16(inp[name]) for name in ("q", "k")} if raw_qk else {name: inp[name] for name in ("q", "k")}
    q = bf16(l2norm(np, raw["q"].astype(np.float64)))
    k = bf16(l2norm(np, raw["k"].astype(np.float64)))
    q = np.repeat(q[:, :, ::group], group, axis=2)
    k = np.repeat(k[:, :, ::group], group, axis=2)
    v = bf16(inp["v"])
    beta = bf16(inp["beta"]) if beta_bf16 else inp["beta"].astype(np.float32)
    g = np.asarray(gate, dtype=np.float64) if gate is not None else inp["g"].astype(np.float64)
    if out_of_range:
        g = past_range(g, cu)
    if edge_of_range:
        g = edge_range(g, cu)
    s = scale if scale is not None else D ** -0.5
    F = fla_forward_tensors(q, k, g, beta, scale=s, cu_seqlens=cu, qk_l2norm=False, upper="zero")
    h0 = inp["dht"] if initial_state else None          # 0.1 N(0, 1), fp32 [N, H, K, V]
    o, final, states = kda_forward_reference(q, k, v, g, beta, scale=s, initial_state=h0, cu_seqlens=cu,
                                             qk_l2norm=False, tile=TILE)
    ref_states, entries = state_entries(states, lens, H)
    return {"q": bf16_bits(np.ascontiguousarray(q[:, :, ::group])), "k": bf16_bits(np.ascontiguousarray(k[:, :, ::group])),
            "q_repeated": bf16_bits(q), "k_repeated": bf16_bits(k), "v": bf16_bits(v),
            "g": F.g64.astype(np.float32), "g_natural": g, "g_token": g.astype(np.float32),
            "beta": bf16_bits(beta) if beta_bf16 else beta, "beta_values": beta,
            "initial_state": h0, "cu_seqlens": cu, "lengths": [int(n) for n in lens], "scale": s,
            "o": o, "final": final, "states": ref_states, "Aqk": F.Aqk, "Akk": F.Akk,
            "blocks": diagonal_blocks(lens, Bq, Tq, H), "offsets": entries, "B": Bq, "T": Tq, "H": H,
            **({f"{n}_raw": bf16_bits(np.ascontiguousarray(raw[n][:, :, ::group])) for n in ("q", "k")}
               if raw_qk else {})}


def folded_rows(case: dict, group: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The rows the forward's qk_rstd build computes with, from a case made with raw_qk: each raw bf16 row times
    its rstd (1 / sqrt(sum x^2 + 1e-6) in float64, rounded to fp32, as the rstd pass writes it), the product in
    fp32 and not rounded to bf16 (R1 folds the rstd into its fp32 factors), repeated to the value heads."""
    out = []
    for name in ("q_raw", "k_raw"):
        x = bits_to_f32(case[name])
        rstd = l2norm_rstd(np, x.astype(np.float64)).astype(np.float32)
        out.append(np.repeat((x * rstd[..., None]).astype(np.float32), group, axis=2))
    return out[0], out[1]


def exact_row_outputs(case: dict, group: int = 1) -> dict:
    """The float64 references o, final and states of a case made with raw_qk, on its raw rows normalised in
    float64 and not rounded to bf16: what an l2norm build that folds each row's rstd computes toward (the
    case's own references start from the normalised rows rounded to bf16, a rounding such a build never makes)."""
    q, k = (np.repeat(l2norm(np, bits_to_f32(case[f"{n}_raw"]).astype(np.float64)), group, axis=2) for n in "qk")
    v = bits_to_f32(case["v"]).astype(np.float64)
    o, final, states = kda_forward_reference(q, k, v, case["g_natural"], case["beta_values"], scale=case["scale"],
                                             initial_state=case["initial_state"], cu_seqlens=case["cu_seqlens"],
                                             qk_l2norm=False, tile=TILE)
    return {"o": o, "final": final, "states": state_entries(states, case["lengths"], case["H"])[0]}


def diagonal_blocks(lens, B: int, T: int, H: int) -> np.ndarray:
    """bool [B, T, H, 64]: the columns of each token's row in its tile's 16 x 16 diagonal block (the
    columns 16 (tile mod 4) .. + 15, tiles counted from the sequence's start)."""
    pos = np.concatenate([np.arange(n) for n in lens]).reshape(B, T)
    col = np.arange(C64)
    first = TILE * ((pos // TILE) % EVERY)
    mask = (col[None, None, :] >= first[..., None]) & (col[None, None, :] < first[..., None] + TILE)
    return np.broadcast_to(mask[:, :, None, :], (B, T, H, C64)).copy()


# ----------------------------------------------------------------------------
# the kernel's arithmetic, tile by tile
# ----------------------------------------------------------------------------

def _mm(a, b) -> np.ndarray:
    """An mma product: exact products of its (bf16) operands, added in fp32 (here in float64, then fp32)."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def intra_products(q, k, gc, gT, beta, L: int, s: float, *, pairwise: bool | None = None,
                   span_limit: float = SPAN_LIMIT):
    """(Mqk, INV, past) of one tile as the producers build them: fp32, before their bf16 rounding.

    q, k [16, 128] bf16 values (rows >= L zero); gc [16, 128] fp32 (rows >= L = gT); beta [16].
    past: a channel spans past ``span_limit``; ``pairwise`` None takes the kernel's decision, True / False
    forces a path (False on a past tile shows what the factorised products would give). R1's products
    are flushed to zero below 2^-126, as the kernel's -ftz=true leaves them.
    """
    f32 = np.float32
    past = bool(np.any(~(gc - gT[None, :] <= span_limit)))
    use_pairwise = past if pairwise is None else pairwise
    strict = np.tril(np.ones((TILE, TILE), dtype=bool), -1)
    diag = f32(s) * np.sum(q * k, axis=1, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if not use_pairwise:
            up = ftz(np.exp2(gc - gT[None, :]))
            down = ftz(np.exp2(gT[None, :] - gc))
            Qe, Ke, Kr = bf16(ftz(f32(s) * q * up)), bf16(ftz(k * up)), bf16(ftz(k * down))
            a1, a2 = _mm(Qe, Kr.T), _mm(Ke, Kr.T)
        else:
            # entry (i, j < i): sum_d x_i k_j 2^(gc_i - gc_j), in fp32, real rows only
            decay = np.exp2((gc[:, None, :] - gc[None, :, :]).astype(f32))     # [i, j, d]
            real = (np.arange(TILE) < L)[:, None]
            a1 = np.where(real, f32(s) * np.einsum("id,jd,ijd->ij", q, k, decay, dtype=np.float32), 0).astype(f32)
            a2 = np.where(real, np.einsum("id,jd,ijd->ij", k, k, decay, dtype=np.float32), 0).astype(f32)
    mqk = np.where(strict, a1, 0).astype(f32)
    mqk[np.arange(TILE), np.arange(TILE)] = diag
    lkk = np.where(strict, beta[:, None] * a2, 0).astype(f32)
    inv = np.zeros((TILE, TILE), dtype=f32)
    for i in range(TILE):                       # forward substitution, column by column in the lanes
        row = np.eye(TILE, dtype=f32)[i]
        for m in range(i):
            row = (row - lkk[i, m] * inv[m]).astype(f32)
        inv[i] = row
    return mqk, inv, past


def check_normalised(out, case: dict, label: str) -> None:
    """q and k as an l2norm build wrote them (``out``'s q, k, q_rstd, k_rstd: CuPy arrays; ``case`` made with
    raw_qk): the float64 l2norm of the raw rows rounded to bf16, but for a last bit
    where the fp32 sum lands the other side of a rounding boundary; rstd within fp32 rounding of float64's."""
    for name in ("q", "k"):
        raw = bits_to_f32(case[f"{name}_raw"]).astype(np.float64)
        want = bits_to_f32(case[name])                     # bf16 of the float64 l2norm of the raw rows
        got = bits_to_f32(getattr(out, name).get())
        ulp = np.abs(want) * 2.0 ** -7
        off = np.abs(got - want) > 0
        assert np.all(np.abs(got - want) <= ulp + 1e-30), f"{label}: {name} off by more than a bf16 ulp"
        assert off.mean() < 1e-3, f"{label}: {name}: {off.mean():.2e} of its values differ from float64's rounding"
        rstd = l2norm_rstd(np, raw)
        got_rstd = getattr(out, f"{name}_rstd").get()
        assert np.allclose(got_rstd, rstd, rtol=4e-6, atol=0), f"{label}: {name}_rstd"   # fp32 sums of 128


def token_tile_gate(case: dict):
    """scan_tiles' ``tile_gate`` of the token-gate build: each tile's gc summed from its tokens' own gates
    (case["g_token"]) as the kernels sum them (kernel.shapes.tile_gate_sums), restarted at every tile."""
    gate = case["g_token"].reshape(-1, case["H"], D)
    return lambda _g, h, i, t0, L: tile_gate_sums(gate[t0:t0 + L, h])


def emulate(case: dict, *, force_pairwise: bool | None = None, span_limit: float = SPAN_LIMIT,
            token_gate: bool = False, qk_rows: tuple | None = None) -> dict:
    """The kernel's forward in numpy, in its precision: o (bf16 values) [.., H, 128], final (fp32),
    states (bf16 values) [entries, H, 128, 128], Aqk and Akk (bf16 values, zero outside the diagonal
    blocks) [.., H, 64], and the number of tiles that took the pairwise products (``span_limit``: the
    decision's limit, kernel.shapes' by default). ``token_gate``: the build that sums each token's gate
    within the tile (:func:`token_tile_gate`) in place of FLA's chunk cumsum. ``qk_rows``: q and k as the
    kernel uses them, fp32 [.., H, 128] each (value heads' rows), in place of the case's bf16 rows: the
    qk_rstd build's raw rows times their rstd (:func:`folded_rows`)."""
    H = case["H"]
    if qk_rows is not None:
        q, k = (np.asarray(x, dtype=np.float32).reshape(-1, H, D) for x in qk_rows)
    else:
        q = bits_to_f32(case["q_repeated"]).reshape(-1, H, D)
        k = bits_to_f32(case["k_repeated"]).reshape(-1, H, D)
    v = bits_to_f32(case["v"]).reshape(-1, H, D)
    g = case["g"].reshape(-1, H, D)
    beta = case["beta_values"].reshape(-1, H)
    s = np.float32(case["scale"])
    total = int(sum(case["lengths"]))
    o = np.zeros((total, H, D), dtype=np.float32)
    aqk = np.zeros((total, H, C64), dtype=np.float32)
    akk = np.zeros((total, H, C64), dtype=np.float32)
    pairwise_tiles = 0

    def step(S, n, h, i, t0, L, gc, gT):
        nonlocal pairwise_tiles
        qt, kt, vt = (np.zeros((TILE, D), dtype=np.float32) for _ in range(3))
        bt = np.zeros(TILE, dtype=np.float32)
        qt[:L], kt[:L], vt[:L], bt[:L] = q[t0:t0 + L, h], k[t0:t0 + L, h], v[t0:t0 + L, h], beta[t0:t0 + L, h]
        mqk, inv, past = intra_products(qt, kt, gc, gT, bt, L, float(s), pairwise=force_pairwise,
                                        span_limit=span_limit)
        pairwise_tiles += past if force_pairwise is None else force_pairwise
        mqk, inv = bf16(mqk), bf16(inv)
        cols = slice(TILE * (i % EVERY), TILE * (i % EVERY + 1))
        aqk[t0:t0 + L, h, cols] = mqk[:L]
        akk[t0:t0 + L, h, cols] = inv[:L]
        with np.errstate(under="ignore"):
            start = ftz(np.exp2(gc))
            Kd = bf16(ftz(kt * start))
            Kr = bf16(ftz(kt * ftz(np.exp2(gT[None, :] - gc))))
            Qd = bf16(ftz(s * qt * start))
        S0 = bf16(S)
        P = _mm(Kd, S0)
        W = bt[:, None] * (vt - P)
        U = _mm(inv, np.add(*two_parts(W)))   # W in two bf16 parts: hi + lo is exact in fp32
        Ub = bf16(U)
        o[t0:t0 + L, h] = bf16(_mm(Qd, S0) + _mm(mqk, Ub))[:L]
        return (np.exp2(gT).astype(np.float32)[:, None] * S + _mm(Kr.T, Ub)).astype(np.float32)

    tile_gate = {"tile_gate": token_tile_gate(case)} if token_gate else {}
    states, final = scan_tiles(case, g, step, **tile_gate)   # Kernel S's walk over the tiles
    shape = (case["B"], case["T"], H)
    return {"o": o.reshape(*shape, D), "final": final, "states": states, "Aqk": aqk.reshape(*shape, C64),
            "Akk": akk.reshape(*shape, C64), "pairwise_tiles": int(pairwise_tiles)}


def rel(out, ref) -> float:
    """||out - ref|| / ||ref|| (Frobenius); 0 where both are zero."""
    num, den = float(np.linalg.norm(np.asarray(out, dtype=np.float64) - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def worst_rows(out, ref, what: str) -> tuple[float, str]:
    """The largest relative error over the rows of the last axis ([.., n] -> per leading index) and
    where it lies (``what`` names the leading indices)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    lead = ref.shape[:-1]
    num = np.sqrt(np.sum((out - ref) ** 2, axis=-1)).reshape(-1)
    den = np.sqrt(np.sum(ref ** 2, axis=-1)).reshape(-1)
    e = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    at = int(np.argmax(e))
    where = tuple(int(x) for x in np.unravel_index(at, lead))
    return float(e[at]), f"{what} {where}: rel {float(e[at]):.3e}, |ref| {float(den[at]):.3e}"
