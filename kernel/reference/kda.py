"""The whole KDA forward and backward in float64, written tile by tile as the GPU computes them.

What and why
------------
Kernel A (:mod:`kernel.reference.dstate_scan`) is the serial half of KDA's
chunked backward: it walks each sequence backwards and leaves dS, the
gradient w.r.t. the state after every tile. Everything else is fully
parallel over tiles: one tile's per-token gradients need only that tile's
inputs, the forward state entering it (S0) and the dS snapshot leaving it
(dS1). This module states that parallel half, and the forward it depends on,
as per-tile matrix algebra, so that a GPU kernel can be read off it GEMM by
GEMM (``docs/kda_backward.md`` counts their FLOPs and bytes):

* :func:`kda_forward_reference`: o, the final state and the state entering
  every tile, by the chunked (WY) forward.
* :func:`kda_backward_reference`: dq, dk, dv, dg, dbeta, dh0 w.r.t. the raw
  inputs; Kernel A's contract supplies dS1 and dh0, :func:`_tile_backward`
  rebuilds each tile's per-token gradients from (S0, dS1), the gate's
  tile-local cumulative sums and the l2norm backward map them to g, q and k.

No autograd anywhere: the tests check every output against an independent
complex-step derivative of a plain token-by-token forward.

Notation (one tile of C = ``tile`` tokens, rows c = 0..L-1, one head)
--------------------------------------------------------------------
q, k [C, K] (l2-normalised when ``qk_l2norm``), v, do [C, V], beta [C],
gc [C, K] the tile-local cumulative gate in log2 (Kernel A's, from
:func:`prepare_tiles`), gT = gc[L-1] [K], s the scale; Mqk, INV [C, C] as the
forward stores them. Rebuilt on chip (R1) from q, k, gc::

    Qd = s q * 2^gc        Kd = k * 2^gc         (decayed from the tile's start)
    Qe = s q * 2^(gc-gT)   Ke = k * 2^(gc-gT)    (>= 1: relative to the tile's end)
    Kr = k * 2^(gT-gc)                            (<= 1: decayed to the tile's end)
    gamma = 2^gT [K]

so that Mqk = strict_tril(Qe Kr^T) + diag(s q . k) (the diagonal holds no gate)
and the key-key matrix Akk = strict_tril(Ke Kr^T),
Lkk = diag(beta) Akk, INV = (I + Lkk)^-1. Forward of one tile::

    W  = diag(beta) (v - Kd S0)      G6 (Kd S0)
    U  = INV W                       G7          (U: FLA's v_new)
    o  = Qd S0 + Mqk U               F1 + F2
    S1 = diag(gamma) S0 + Kr^T U     G8

Backward of one tile, given S0 and dS1 (GEMM names G1..G17; G1-G5 are
Kernel A's, G4/G5 are needed here only when dS is re-scanned inside a tile
group)::

    dU   = Mqk^T do + Kr dS1             G1 + G2 (Kernel A's dU)
    dW   = INV^T dU                      G3      (Kernel A's dvcorr)
    dv   = beta dW;  dbeta  = rowsum(dW . (v - Kd S0))
    dMqk = strict_tril(do U^T)           G9;  d = rowsum(do . U) (Mqk's diagonal)
    dLkk = -strict_tril(dW U^T)          G10
    dQd  = do S0^T                       G11
    dKd  = -(beta dW) S0^T               G12
    dKr  = U dS1^T + dMqk^T Qe + dLkk^T (beta Ke)        G13 + G15 + G17
    dQe  = dMqk Kr                       G14
    X    = dLkk Kr                       G16;  dKe = beta X;  dbeta += rowsum(Ke . X)
    dgamma = rowsum(S0 . dS1) [K]        (elementwise over the K x V state)

then back to q, k and the gate. With G = gc ln 2 (natural log), a factor
2^(+-G...) scales x and contributes +-x . dx to each g_t it contains:
2^gc holds g_t for t <= c, 2^(gc-gT) = 2^-(g_{c+1} + .. + g_{L-1}) holds
g_t for t > c, gamma holds every g_t of the tile::

    dq  = s 2^gc dQd + s 2^(gc-gT) dQe + s d k
    dk  = 2^gc dKd + 2^(gc-gT) dKe + 2^(gT-gc) dKr + s d q
    from_start[c] = Qd.dQd + Kd.dKd                  [C, K]
    from_end[c]   = Qe.dQe + Ke.dKe - Kr.dKr         [C, K]
    dg[t] = sum_{c >= t} from_start[c] - sum_{c < t} from_end[c] + gamma.dgamma

a reverse cumsum and an exclusive forward cumsum inside the tile (the same
as one reverse cumsum with gT's share put on row L-1, without singling out
the last row of a partial tile). Mqk's diagonal holds no gate: its gradient d
goes to q, k directly, because sent through both gated halves it cancels in
dg and loses digits where dg is small (docs/kda_backward.md has the numbers).

g enters a tile only through its own gc (gT included: the tile's state decay
gamma = 2^gT is a function of the same cumsum), and the earlier tiles' gates
reach this tile only through S0; so the coupling between tiles is carried
entirely by Kernel A's dS and the forward states, and both cumsums stay
inside the tile. Finally dq, dk go through the l2norm backward
dx = r (dy - y (y . dy)), y = x r, r = (x . x + 1e-6)^-1/2.

Range: the factorised Mqk/Akk need 2^(gc-gT) finite; this float64 reference
refuses tiles that decay by more than 2^-MAX_TILE_DECAY_LOG2 in a channel.
(In fp32 the same factors allow 2^-126, and the kernels, under -ftz=true,
factorise a tile up to a span of 110, kernel.shapes.SPAN_LIMIT; clamped gates,
g >= -5, decay a 16-token tile by at most e^-80 = 2^-115.4 and span it by at
most 75 / ln 2 = 108.2.)

Layouts (``..`` = ``B, T`` or ``1, total`` with ``cu_seqlens``)::

    q, k, g : [.., H, K]    v, do : [.., H, V]    beta : [.., H]
    initial_state, dht, dh0, final state : [N, H, K, V]
    states  : [B, n_t, H, K, V] or [1, sum_n n_t(n), H, K, V] (Kernel A's
              snapshot layout at snapshot_every = 1)

Every function is array-module agnostic (numpy in, numpy out; CuPy in, CuPy
out), float64 throughout.
"""
from __future__ import annotations

import numpy as np

from ..shapes import TILE_TOKENS
from .checks import (L2NORM_EPS, check_tiling, expect_rank, expect_shape, gather_tiles,
                     l2norm, real_dtype_arg, sequence_offsets, tiles_of_offsets, array_module)
from .dstate_scan import dstate_scan_reference, prepare_tiles

# 2^(gc - gT) and 2^(gT - gc) stay within 2^+-512: far from float64's overflow
# and from its subnormals, so the factorised products round like direct ones.
MAX_TILE_DECAY_LOG2 = 512.0

__all__ = ["kda_forward_reference", "kda_backward_reference", "MAX_TILE_DECAY_LOG2"]


# ----------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------

def _expect_finite(xp, name: str, x) -> None:
    bad = ~xp.isfinite(x)
    if bool(bad.any()):
        where = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad.reshape(-1))), x.shape))
        raise ValueError(f"{name} must be finite, got {float(x[where])} at index {where}")


def check_kda_inputs(q, k, v, g, beta, *, initial_state, cu_seqlens, tile, do=None, dht=None,
                     with_do: bool = False):
    """Validated shapes (B, T, H, K, V), offsets cu [N+1] and float64 arrays on q's module.

    Public for the references that take the same arguments (the forward's segments)."""
    check_tiling(tile)
    expect_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    if min(B, H, K) < 1:
        raise ValueError(f"q must have B, H, K >= 1, got shape {tuple(q.shape)}")
    expect_shape("k", k, q.shape, "(same as q: [B, T, H, K])")
    expect_shape("g", g, q.shape, "(same as q: [B, T, H, K])")
    expect_rank("v", v, 4, "[B, T, H, V]")
    V = v.shape[3]
    expect_shape("v", v, (B, T, H, V), "([B, T, H, V], B, T, H as q)")
    if V < 1:
        raise ValueError(f"v must have V >= 1, got shape {tuple(v.shape)}")
    expect_shape("beta", beta, (B, T, H), "([B, T, H])")
    if with_do:
        expect_rank("do", do, 4, "[B, T, H, V]")
        expect_shape("do", do, (B, T, H, V), "(same as v: [B, T, H, V])")
    cu = sequence_offsets(B, T, cu_seqlens)
    N = cu.shape[0] - 1
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if with_do:
        named["do"] = do
    for name, x in (("initial_state", initial_state), ("dht", dht)):
        if x is not None:
            expect_rank(name, x, 4, "[N, H, K, V]")
            expect_shape(name, x, (N, H, K, V), "([N, H, K, V], N sequences)")
            named[name] = x

    xp = array_module(q)
    wide = {}
    for name, x in named.items():
        real_dtype_arg(name, x)
        wide[name] = xp.asarray(x, dtype=np.float64)
        _expect_finite(xp, name, wide[name])
    if bool((wide["g"] > 0).any()):
        where = tuple(int(i) for i in np.unravel_index(int(xp.argmax((wide["g"] > 0).reshape(-1))),
                                                       g.shape))
        raise ValueError(f"g must be <= 0 (a natural-log decay), got {float(wide['g'][where])} "
                         f"at index {where}")
    return (B, T, H, K, V), cu, xp, wide


# ----------------------------------------------------------------------------
# tiles as blocks [n_tiles, H, C, ..]
# ----------------------------------------------------------------------------

def tile_blocks(xp, cu, tile: int, dims, wide, *, scale, qk_l2norm: bool, cu_seqlens) -> dict:
    """Every tile's per-token inputs as [n, H, C, ..] blocks, plus the forward's Mqk, INV, gc.

    Rows past a partial tile's end are zero in q, k, v, do, beta, Mqk, INV;
    there gc is set to gT (the gate stops growing), so R1's factors stay finite.
    ``blk["forward"]`` keeps the forward's (gc, Mqk, INV) in token layout.
    """
    B, T, H, K, V = dims
    total = B * T
    gc, mqk, inv = prepare_tiles(wide["q"], wide["k"], wide["g"], wide["beta"], scale=scale,
                                 qk_l2norm=qk_l2norm, tile=tile, cu_seqlens=cu_seqlens)
    qn = wide["q"].reshape(total, H, K)
    kn = wide["k"].reshape(total, H, K)
    if qk_l2norm:
        qn, kn = l2norm(xp, qn), l2norm(xp, kn)
    start, length, seq_tiles = tiles_of_offsets(cu, tile)

    def tiles(x, *tail):
        # [total, H, ..] -> [n, C, H, ..] -> [n, H, C, ..]
        t = gather_tiles(xp, x.reshape((total,) + tail), start, length, tile)
        return xp.moveaxis(t, 2, 1)

    blk = {"q": tiles(qn, H, K), "k": tiles(kn, H, K), "v": tiles(wide["v"], H, V),
           "beta": tiles(wide["beta"], H), "mqk": tiles(mqk, H, tile), "inv": tiles(inv, H, tile)}
    if "do" in wide:
        blk["do"] = tiles(wide["do"], H, V)
    gct = tiles(gc, H, K)                                          # [n, H, C, K]
    n = start.shape[0]
    gT = gct[xp.asarray(np.arange(n)), :, xp.asarray(length - 1)]  # [n, H, K], last real row
    valid = xp.asarray(np.arange(tile)[None, :] < length[:, None])  # [n, C]
    blk["gc"] = xp.where(valid[:, None, :, None], gct, gT[:, :, None, :])
    blk["gT"] = gT
    spread = float(xp.max(-gT)) if n else 0.0
    if spread > MAX_TILE_DECAY_LOG2:
        raise ValueError(f"g: a tile of {tile} tokens decays by 2^-{spread:.1f} in some channel; "
                         f"the factorised tile algebra needs at most 2^-{MAX_TILE_DECAY_LOG2:g} "
                         f"(use a smaller tile)")
    blk["s"] = float(scale) if scale is not None else K ** -0.5
    blk["table"] = (start, length, seq_tiles)
    blk["valid"] = valid
    blk["forward"] = (gc, mqk, inv)
    return blk


def _tokens(xp, x, valid, dims_out):
    """[n, H, C, ..] blocks -> token layout dims_out, keeping the real rows in token order."""
    rows = xp.moveaxis(x, 1, 2)                                    # [n, C, H, ..]
    return rows[valid].reshape(dims_out)


def rebuild(xp, blk) -> dict:
    """R1: the gate-weighted operands of a tile, rebuilt on chip from q, k and gc.

    Returns Qd, Kd, Qe, Ke, Kr [.., C, K], the factors 2^gc, 2^(gc-gT),
    2^(gT-gc) [.., C, K] and gamma = 2^gT [.., K].
    """
    gc, gT = blk["gc"], blk["gT"][..., None, :]
    f_start = xp.exp2(gc)                 # 2^gc       <= 1
    f_up = xp.exp2(gc - gT)               # 2^(gc-gT)  >= 1
    f_down = xp.exp2(gT - gc)             # 2^(gT-gc)  <= 1
    q, k, s = blk["q"], blk["k"], blk["s"]
    return {"Qd": s * q * f_start, "Kd": k * f_start, "Qe": s * q * f_up, "Ke": k * f_up,
            "Kr": k * f_down, "f_start": f_start, "f_up": f_up, "f_down": f_down,
            "gamma": xp.exp2(blk["gT"])}


def _T(xp, x):
    return xp.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------
# one tile, forward and backward (batched over [.., H] blocks)
# ----------------------------------------------------------------------------

def _tile_forward(xp, blk: dict, r: dict, S0):
    """One tile's forward from the state entering it. Shapes per (tile, head):
    S0 [K, V] -> (o [C, V], S1 [K, V], U [C, V]).
    """
    beta = blk["beta"][..., None]                                  # [C, 1]
    Vn = blk["v"] - r["Kd"] @ S0               # G6  v - Kd S0       M=C N=V K=K
    U = blk["inv"] @ (beta * Vn)               # G7  INV (beta Vn)   M=C N=V K=C
    o = r["Qd"] @ S0 + blk["mqk"] @ U          # F1 + F2             M=C N=V K=K, then K=C
    S1 = r["gamma"][..., None] * S0 + _T(xp, r["Kr"]) @ U   # G8 Kr^T U   M=K N=V K=C
    return o, S1, U


def _tile_backward(xp, blk: dict, r: dict, S0, dS1) -> dict:
    """One tile's per-token gradients from S0 (state entering) and dS1 (dL/dS after the tile).

    Shapes per (tile, head): S0, dS1 [K, V]. Returns dq, dk [C, K] (w.r.t.
    the normalised q, k), dv [C, V], dbeta [C] and dg [C, K] (w.r.t. the
    natural-log per-token gate: the tile holds all of g's uses).
    """
    T = lambda x: _T(xp, x)  # noqa: E731
    C = blk["q"].shape[-2]
    beta = blk["beta"][..., None]                                  # [C, 1]
    mqk, inv, do, v = blk["mqk"], blk["inv"], blk["do"], blk["v"]
    Qd, Kd, Qe, Ke, Kr = r["Qd"], r["Kd"], r["Qe"], r["Ke"], r["Kr"]
    strict = xp.asarray(np.tril(np.ones((C, C)), -1))              # j <  c

    # the forward of this tile, rebuilt (U is FLA's v_new)
    Vn = v - Kd @ S0                           # G6  v - Kd S0       M=C N=V K=K  (S0: state)
    U = inv @ (beta * Vn)                      # G7  INV (beta Vn)   M=C N=V K=C  (INV: global)

    # value side: exactly Kernel A's G1-G3
    dU = T(mqk) @ do + Kr @ dS1                # G1 Mqk^T do         M=C N=V K=C  (Mqk, do: global)
    #                                            G2 Kr dS1           M=C N=V K=K  (dS1: snapshot)
    dW = T(inv) @ dU                           # G3 INV^T dU         M=C N=V K=C
    dv = beta * dW
    dbeta = xp.sum(dW * Vn, axis=-1)           # W = diag(beta) Vn

    # the C x C matrices' gradients. Mqk's diagonal s q_c . k_c holds no gate
    # (2^(gc-gT) 2^(gT-gc) = 1): its gradient d goes to q, k directly, so that dg
    # never sums and cancels the diagonal's two gated halves.
    dMqk = strict * (do @ T(U))                # G9  do U^T          M=C N=C K=V  (strictly lower)
    d = xp.sum(do * U, axis=-1)[..., None]     # diag(do U^T)        [C, 1], elementwise
    dLkk = -strict * (dW @ T(U))               # G10 -dW U^T         M=C N=C K=V  (dU . d(INV) W)

    # gradients against the states
    dQd = do @ T(S0)                           # G11 do S0^T         M=C N=K K=V
    dKd = -(beta * dW) @ T(S0)                 # G12 -(beta dW) S0^T M=C N=K K=V  (G11, G12 share S0^T)
    dKr = U @ T(dS1)                           # G13 U dS1^T         M=C N=K K=V
    dgamma = xp.sum(S0 * dS1, axis=-1)         # [K]: S1 = diag(gamma) S0 + ...

    # through Mqk = strict_tril(Qe Kr^T) + diag(s q . k) and Akk = strict_tril(Ke Kr^T),
    # Lkk = diag(beta) Akk
    dQe = dMqk @ Kr                            # G14 dMqk Kr         M=C N=K K=C
    dKr = dKr + T(dMqk) @ Qe                   # G15 dMqk^T Qe       M=C N=K K=C
    X = dLkk @ Kr                              # G16 dLkk Kr         M=C N=K K=C  (G14, G16 share Kr)
    dKe = beta * X
    dbeta = dbeta + xp.sum(Ke * X, axis=-1)    # rowsum(dLkk . Akk) without forming Akk
    dKr = dKr + T(dLkk) @ (beta * Ke)          # G17 dLkk^T (beta Ke) M=C N=K K=C

    # back to q, k (normalised) and the per-token gate: a reverse and an exclusive cumsum
    s = blk["s"]
    q, k = blk["q"], blk["k"]
    dq = s * (r["f_start"] * dQd + r["f_up"] * dQe + d * k)
    dk = r["f_start"] * dKd + r["f_up"] * dKe + r["f_down"] * dKr + s * d * q
    from_start = Qd * dQd + Kd * dKd           # exponent gc:      holds g_t, t <= c
    from_end = Qe * dQe + Ke * dKe - Kr * dKr  # exponent gc - gT: holds g_t, t >  c
    reverse = xp.flip(xp.cumsum(xp.flip(from_start, axis=-2), axis=-2), axis=-2)
    exclusive = xp.concatenate([xp.zeros_like(from_end[..., :1, :]),
                                xp.cumsum(from_end[..., :-1, :], axis=-2)], axis=-2)
    dg = reverse - exclusive + (r["gamma"] * dgamma)[..., None, :]
    return {"dq": dq, "dk": dk, "dv": dv, "dbeta": dbeta, "dg": dg}


def _l2norm_backward(xp, x, dy):
    """dL/dx for y = x / sqrt(x . x + eps), given dL/dy (last axis)."""
    r = 1.0 / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)
    y = x * r
    return r * (dy - y * xp.sum(y * dy, axis=-1, keepdims=True))


# ----------------------------------------------------------------------------
# the forward: tiles in order, the state carried between them
# ----------------------------------------------------------------------------

def forward_scan(xp, blk: dict, r: dict, N: int, H: int, K: int, V: int, S_init):
    """(o blocks [n, H, C, V], final [N, H, K, V], states entering each tile [n, H, K, V])."""
    _, _, seq_tiles = blk["table"]
    first_tile = np.concatenate([[0], np.cumsum(seq_tiles)])
    n = int(first_tile[-1])
    C = blk["q"].shape[-2]
    S = xp.zeros((N, H, K, V), dtype=np.float64) if S_init is None else S_init.copy()
    states = xp.zeros((n, H, K, V), dtype=np.float64)
    o = xp.zeros((n, H, C, V), dtype=np.float64)
    # all sequences at once, aligned at their starts: step i is tile i of each
    for i in range(int(seq_tiles.max())):
        act = np.nonzero(seq_tiles > i)[0]
        tid = xp.asarray(first_tile[act] + i)
        a = xp.asarray(act)
        one = {name: blk[name][tid] for name in ("q", "k", "v", "beta", "mqk", "inv", "gc", "gT")}
        one["s"] = blk["s"]
        states[tid] = S[a]
        o_t, S1, _ = _tile_forward(xp, one, rebuild(xp, one), S[a])
        o[tid] = o_t
        S[a] = S1
    return o, S, states


def _state_layout(states, dims, cu_seqlens):
    """[n, H, K, V] in tile order -> Kernel A's snapshot layout (snapshot_every = 1)."""
    B, _, H, K, V = dims
    return states.reshape(B, -1, H, K, V) if cu_seqlens is None else states[None]


def kda_forward_reference(q, k, v, g, beta, *, scale: float | None = None, initial_state=None,
                          cu_seqlens=None, qk_l2norm: bool = True, tile: int = TILE_TOKENS):
    """KDA's forward by tiles of ``tile`` tokens, in float64.

    q, k, g: [B, T, H, K] (g the natural-log gate, <= 0); v: [B, T, H, V];
    beta: [B, T, H] (after its sigmoid; any finite value is accepted: nothing
    divides by it); initial_state: [N, H, K, V] or None (zeros). With
    ``cu_seqlens`` (N+1 offsets, every length >= 1) the batch is packed:
    B = 1, T = total. q, k are l2-normalised first when ``qk_l2norm``;
    s = scale or K**-0.5. Inputs must be finite and real floating.

    Returns (o, final_state, states), float64 on q's array module:
      o            [B, T, H, V]
      final_state  [N, H, K, V], the state after each sequence's last token
      states       the state entering every tile (tile 0: the initial state):
                   [B, n_t, H, K, V] equal length (n_t = ceil(T / tile)),
                   [1, sum_n n_t(n), H, K, V] varlen, sequence n's tiles from
                   ``snapshot_offsets(lengths, tile, 1)[n]`` on: Kernel A's
                   snapshot layout at snapshot_every = 1, so entry i pairs
                   with snapshot i (dL/dS after the same tile).
    """
    dims, cu, xp, wide = check_kda_inputs(q, k, v, g, beta, initial_state=initial_state,
                                          cu_seqlens=cu_seqlens, tile=tile)
    B, T, H, K, V = dims
    blk = tile_blocks(xp, cu, tile, dims, wide, scale=scale, qk_l2norm=qk_l2norm,
                  cu_seqlens=cu_seqlens)
    o, final, states = forward_scan(xp, blk, rebuild(xp, blk), cu.shape[0] - 1, H, K, V,
                                     wide.get("initial_state"))
    o = _tokens(xp, o, blk["valid"], (B, T, H, V))
    return o, final, _state_layout(states, dims, cu_seqlens)


# ----------------------------------------------------------------------------
# the backward: Kernel A's scan, then every tile in parallel
# ----------------------------------------------------------------------------

def kda_backward_reference(q, k, v, g, beta, do, *, scale: float | None = None,
                           initial_state=None, dht=None, cu_seqlens=None,
                           qk_l2norm: bool = True, tile: int = TILE_TOKENS, with_forward: bool = False) -> dict:
    """The exact gradients of L = sum(o * do) + sum(S_T * dht) w.r.t. KDA's raw inputs.

    Arguments as :func:`kda_forward_reference`, plus do [B, T, H, V] and
    dht [N, H, K, V] or None (zeros).

    Returns a dict of float64 arrays on q's array module:
      dq, dk [B, T, H, K]  w.r.t. the raw q, k (through the l2norm when on)
      dv     [B, T, H, V]
      dg     [B, T, H, K]  w.r.t. the natural-log per-token gate g
      dbeta  [B, T, H]
      dh0    [N, H, K, V]  w.r.t. the initial state; with initial_state None,
                           the gradient at a zero initial state (dS does not
                           depend on the states: the loss is affine in each)
    and with ``with_forward`` the forward's outputs from the same scan (what
    :func:`kda_forward_reference` returns first): o [B, T, H, V] and ht, the
    final state [N, H, K, V].

    How: the forward states entering each tile (:func:`kda_forward_reference`'s
    scan), Kernel A's dS after each tile and dh0
    (:func:`dstate_scan_reference`, snapshot_every = 1), then
    :func:`_tile_backward` on all tiles at once (no tile needs another's
    result; the gate's cumsums stay inside the tile) and the l2norm backward.
    """
    dims, cu, xp, wide = check_kda_inputs(q, k, v, g, beta, initial_state=initial_state,
                                          cu_seqlens=cu_seqlens, tile=tile, do=do, dht=dht,
                                          with_do=True)
    B, T, H, K, V = dims
    N = cu.shape[0] - 1
    blk = tile_blocks(xp, cu, tile, dims, wide, scale=scale, qk_l2norm=qk_l2norm,
                  cu_seqlens=cu_seqlens)
    r = rebuild(xp, blk)

    # the two serial scans: forward states S0 per tile, Kernel A's dS1 per tile
    o, final, S0 = forward_scan(xp, blk, r, N, H, K, V, wide.get("initial_state"))
    gc, mqk, inv = blk["forward"]
    snaps, dh0 = dstate_scan_reference(wide["q"], wide["k"], gc, wide["beta"], mqk, inv,
                                       wide["do"], scale=scale, dht=wide.get("dht"),
                                       cu_seqlens=cu_seqlens, tile=tile, qk_l2norm=qk_l2norm,
                                       snapshot_every=1)
    dS1 = snaps.reshape(-1, H, K, V)                               # [n, H, K, V], tile order

    # every tile at once
    grads = _tile_backward(xp, blk, r, S0, dS1)

    valid = blk["valid"]
    dq = _tokens(xp, grads["dq"], valid, (B * T, H, K))
    dk = _tokens(xp, grads["dk"], valid, (B * T, H, K))
    if qk_l2norm:
        dq = _l2norm_backward(xp, wide["q"].reshape(B * T, H, K), dq)
        dk = _l2norm_backward(xp, wide["k"].reshape(B * T, H, K), dk)
    out = {
        "dq": dq.reshape(B, T, H, K),
        "dk": dk.reshape(B, T, H, K),
        "dv": _tokens(xp, grads["dv"], valid, (B, T, H, V)),
        "dg": _tokens(xp, grads["dg"], valid, (B, T, H, K)),
        "dbeta": _tokens(xp, grads["dbeta"][..., None], valid, (B, T, H)),
        "dh0": dh0,
    }
    if with_forward:
        out.update(o=_tokens(xp, o, valid, (B, T, H, V)), ht=final)
    return out
