"""Fewer serial steps for Kernel A at B = 1: a tile of the scan is an affine map of dS.

Why
---
At B = 1 Kernel A walks 8,192 tiles of 16 tokens one after another, and each
tile's dS path (G2 -> G3 -> G5) is a chain of dependent MMAs: about 1,600
cycles a tile on the H200, 1.45x FLA's dAv+dhu, whose dhu walks 2,048 chunks
of 64 tokens (docs/log/run-e.md, its correction). The tile math of the
contract (docs/kernel_a.md, section 3) is linear in dS:

    dS_out = exp2(gT) * dS + qd^T do - kd^T diag(beta) INV^T (Mqk^T do + kr dS)
           = M dS + B,    M = diag(exp2 gT) - kd^T diag(beta) INV^T kr     [K, K]
                          B = qd^T do - kd^T diag(beta) INV^T Mqk^T do     [K, V]

so G tiles compose into one map (M_g = M_t ... M_t+G-1, and the B's carried
through), built off the serial path, and the serial chain takes one step
(dS <- M_g dS + B_g) per G tiles. With G = 4 that is one step per 64 tokens,
exactly where Kernel A's bf16-every-64 snapshots are.

Composing dense [K, K] products costs K^3 = 2.1 M multiply-adds per tile,
4.7x a whole tile of Kernel A today (0.85 M). But M is a diagonal plus a rank-C
term (D - kd^T X, X = diag(beta) INV^T kr [C, K]), so G tiles compose into a
diagonal plus a rank-C*G term, M_g = D_g - U W with U [K, CG], W [CG, K]:
applying the next tile on the left,

    (D_m - P^T X)(D - U W) = D_m D - [D_m U, P^T] [W ; X D - (X U) W]      (P = kd)

costs two [C, K] x [K, r] products (r <= C*G), and the serial step becomes
dS <- D_g dS - U (W dS) + B_g: two dependent GEMMs of K x CG x V per 64
tokens. The same per-tile update carries B (B <- D_m B - P^T (X B) + B_m).

This module states that in numpy, per sequence and head, to check it before any
kernel is written:

* :func:`tile_maps`: (M, B) of every tile, float64, from the contract's tile
  quantities (the same as :func:`kernel.reference.dstate_scan_reference` uses);
* :func:`composed_scan`: the scan in steps of G tiles, with the snapshot and
  dh0 layout of one head of the reference (snapshot_every = G);
* :func:`emulate`: what a bf16-operand, fp32-accumulator kernel would compute,
  for today's tile-by-tile design and for the composed one, so that the
  precision cost of composing is measured, not guessed.

``python -m kernel.studies.b1_composition.compose --T 8192 --heads 2`` (from a checkout) prints both emulations' errors
against the float64 reference and the MAC counts. CPU only.
"""
from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

from kernel.shapes import TILE_TOKENS
from kernel.reference import prepare_tiles, random_inputs, dstate_scan_reference, l2norm


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 (nearest even) and back to float32: an MMA operand."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def tile_operands(q, k, gc, beta, mqk, inv, do, *, scale: float | None = None, qk_l2norm: bool = True,
                  chunk: int = TILE_TOKENS) -> list[dict]:
    """One sequence and head: q, k, gc [T, K], beta [T], mqk, inv [T, chunk], do [T, V] (numpy).

    Returns the tiles in token order, each a dict of float64 arrays: qd, kd, kr [C, K]
    (R1, docs/kernel_a.md section 2; rows past a partial tile zero), egT [K], beta [C], mqk, inv [C, C], do [C, V].
    """
    T, K = q.shape
    s = float(scale) if scale is not None else K ** -0.5
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if qk_l2norm:
        q, k = l2norm(np, q), l2norm(np, k)
    tiles = []
    for t0 in range(0, T, chunk):
        L = min(chunk, T - t0)

        def rows(x, width):
            out = np.zeros((chunk,) + np.shape(x)[1:], np.float64) if width else np.zeros(chunk, np.float64)
            out[:L] = np.asarray(x, np.float64)[t0:t0 + L]
            return out

        g = rows(gc, 1)
        gT = np.asarray(gc, np.float64)[t0 + L - 1]
        qt, kt = rows(q, 1), rows(k, 1)
        tiles.append({
            "qd": s * qt * np.exp2(g), "kd": kt * np.exp2(g), "kr": kt * np.exp2(gT[None] - g),
            "egT": np.exp2(gT), "beta": rows(beta, 0), "mqk": rows(mqk, 1), "inv": rows(inv, 1),
            "do": rows(do, 1)})
    return tiles


def exact(x: np.ndarray) -> np.ndarray:
    """No rounding: the float64 forms below."""
    return x


# Every form below is written once, with `rnd` marking where a kernel would round an MMA
# operand to bf16: `exact` gives the float64 statement, `bf16` the emulation.

def _tile_map(t: dict, rnd=exact) -> tuple[np.ndarray, np.ndarray]:
    """(M [K, K], B [K, V]) of one tile: dS_out = M dS + B."""
    binv = rnd(t["beta"][:, None] * t["inv"].T)                     # diag(beta) INV^T   [C, C]
    M = np.diag(t["egT"]) - t["kd"].T @ rnd(binv @ t["kr"])
    B = t["qd"].T @ t["do"] - t["kd"].T @ rnd(binv @ rnd(t["mqk"].T @ t["do"]))
    return M, B


def tile_maps(tiles: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(M [n, K, K], B [n, K, V]) of every tile, float64: dS_out = M dS + B."""
    maps = [_tile_map(t) for t in tiles]
    return np.stack([m for m, _ in maps]), np.stack([b for _, b in maps])


def _tile_step(t: dict, dS: np.ndarray, rnd=exact) -> np.ndarray:
    """One tile as today's Kernel A computes it (G1..G5 and the combine)."""
    dU = t["mqk"].T @ t["do"] + t["kr"] @ rnd(dS)                     # G1 + G2
    bdv = rnd(-t["beta"][:, None] * (t["inv"].T @ rnd(dU)))           # G3, G5's operand
    return t["egT"][:, None] * dS + t["qd"].T @ t["do"] + t["kd"].T @ bdv


def _lowrank_group(tiles: list[dict], rnd=exact):
    first = tiles[0]
    K, V, dt = first["kd"].shape[1], first["do"].shape[1], first["kd"].dtype
    D, U, W, B = np.ones(K, dt), np.zeros((K, 0), dt), np.zeros((0, K), dt), np.zeros((K, V), dt)
    for t in tiles:
        P = t["kd"]                                                   # [C, K]
        binv = rnd(t["beta"][:, None] * t["inv"].T)
        X = rnd(binv @ t["kr"])                                       # diag(beta) INV^T kr  [C, K]
        Bt = t["qd"].T @ t["do"] - P.T @ rnd(binv @ rnd(t["mqk"].T @ t["do"]))
        # (D_m - P^T X)(D - U W) = D_m D - [D_m U, P^T] [W ; X D - (X U) W];  B <- M_m B + B_m
        W = np.concatenate([W, rnd(X * D[None, :]) - rnd(X @ rnd(U)) @ rnd(W)])
        B = t["egT"][:, None] * B - P.T @ rnd(X @ rnd(B)) + Bt
        U = np.concatenate([t["egT"][:, None] * U, P.T], axis=1)
        D = t["egT"] * D
    return D, U, W, B


def lowrank_group(tiles: list[dict]):
    """(D [K], U [K, r], W [r, K], B [K, V]) of tiles given in WALK order (first applied first):
    their composed map is dS -> D * dS - U (W dS) + B, r = C * len(tiles). float64."""
    return _lowrank_group(tiles)


def walks(n: int, group: int):
    """The serial steps of a scan of n tiles in groups of `group` (aligned to tile 0, so the
    last group, walked first, may be short): (m, the group's tile indices, first applied
    first), m from the last group down to 0."""
    for m in range(-(-n // group) - 1, -1, -1):
        yield m, range(min(group * m + group, n) - 1, group * m - 1, -1)


def _scan(tiles, tile_map, dS0: np.ndarray, group: int, mode: str, rnd, dtype):
    """The scan of `tiles` (their maps from `tile_map(i)` for mode "dense") in groups of
    `group` tiles, aligned to tile 0 (the last group, walked first, may be short). Returns
    (snapshots [ceil(n / group), K, V], dh0) in float64: snapshot m = dS entering tile
    min(group * m + group - 1, n - 1), as the reference's with snapshot_every = group."""
    n = len(tiles)
    snaps = np.zeros((-(-n // group),) + np.shape(dS0), np.float64)
    dS = np.array(dS0, dtype)
    for m, walk in walks(n, group):
        snaps[m] = dS
        if mode == "tile":
            for i in walk:
                dS = _tile_step(tiles[i], dS, rnd)
        elif mode == "dense":
            Mg, Bg = np.eye(dS.shape[0], dtype=dtype), np.zeros_like(dS)
            for i in walk:
                Mt, Bt = tile_map(i)
                Mg, Bg = rnd(Mt) @ rnd(Mg), rnd(Mt) @ rnd(Bg) + Bt
            dS = rnd(Mg) @ rnd(dS) + Bg                # the one serial step of the group
        else:
            D, U, W, Bg = _lowrank_group([tiles[i] for i in walk], rnd)
            dS = D[:, None] * dS - rnd(U) @ rnd(rnd(W) @ rnd(dS)) + Bg   # two dependent GEMMs
    return snaps, dS.astype(np.float64)


def composed_scan(M: np.ndarray, B: np.ndarray, dS0: np.ndarray, group: int):
    """The scan in steps of `group` tiles of maps (M, B) (:func:`tile_maps`), float64.
    Returns (snapshots [ceil(n / group), K, V], dh0) as the reference's with
    snapshot_every = group: snapshot m = dS entering tile min(group * m + group - 1, n - 1)."""
    return _scan(range(M.shape[0]), lambda i: (M[i], B[i]), dS0, group, "dense", exact, np.float64)


def lowrank_scan(tiles: list[dict], dS0: np.ndarray, group: int):
    """:func:`composed_scan` with every group in the diagonal + low-rank form (float64)."""
    return _scan(tiles, None, dS0, group, "lowrank", exact, np.float64)


EMULATIONS = ("tile", "dense", "lowrank")


def emulate(tiles: list[dict], dS0: np.ndarray, group: int, *, mode: str):
    """bf16 MMA operands, fp32 accumulation and state, as a kernel would; returns (snapshots, dh0).

    mode "tile" is today's Kernel A: R1 operands rounded once, dS rounded as G2's operand,
    dU as G3's, -beta dvcorr as G5's; dS carried in fp32. "dense" builds each tile's (M, B)
    from the same bf16 operands, composes G of them with bf16 operands and fp32
    accumulators, and steps dS <- bf16(M_g) bf16(dS) + B_g. "lowrank" composes in the
    diagonal + low-rank form (:func:`lowrank_group`), every product's operands bf16, and
    steps dS <- D_g dS - bf16(U) bf16(bf16(W) bf16(dS)) + B_g."""
    if mode not in EMULATIONS:
        raise ValueError(f"mode must be one of {EMULATIONS}, got {mode!r}")
    ops = _bf16_operands(tiles)
    return _scan(ops, lambda i: _tile_map(ops[i], bf16), dS0, group, mode, bf16, np.float32)


def _bf16_operands(tiles: list[dict]) -> list[dict]:
    """The tiles as a kernel holds them: MMA operands bf16, the rest float32."""
    return [{name: (bf16(v) if name in ("qd", "kd", "kr", "mqk", "inv", "do") else np.asarray(v, np.float32))
             for name, v in t.items()} for t in tiles]


def lowrank_steps(tiles: list[dict], group: int) -> list[tuple]:
    """The operands of every serial step of :func:`emulate`'s "lowrank" scan, in walk order:
    (D [K], U [K, r], W [r, K], B [K, V]) float32, composed with its bf16 roundings, so that a
    kernel stepping dS <- D * dS - bf16(U) bf16(bf16(W) bf16(dS)) + B from them reproduces
    that emulation (:mod:`.composed_step` does, on the GPU)."""
    ops = _bf16_operands(tiles)
    return [_lowrank_group([ops[i] for i in walk], bf16) for _, walk in walks(len(ops), group)]


def macs_per_tile(K: int = 128, V: int = 128, C: int = TILE_TOKENS, group: int = 4) -> dict:
    """Multiply-adds per tile and head: today's tile (G1..G5); the dense composition's
    off-path work (building M and B, composing) and serial step; the low-rank one's."""
    today = C * C * V + C * K * V + C * C * V + K * C * V + K * C * V          # G1 G2 G3 G4 G5
    build = C * C * K + K * C * K + (C * C * V + C * C * V + K * C * V + K * C * V)   # M, B of a tile
    compose = (K * K * K + K * K * V) * (group - 1) / group                       # fold into M_g, B_g
    serial = K * K * V / group                                                    # dS <- M_g dS + B_g
    r_mean = C * (group + 1) / 2                                                  # rank before a tile, on average
    lowrank = (C * C * K                                      # X = diag(beta) INV^T kr
               + 2 * C * K * r_mean                           # X U, (X U) W
               + C * C * V + C * C * V + K * C * V            # B_m: Mqk^T do, INV^T ., kd^T .
               + K * C * V                                    # qd^T do
               + 2 * C * K * V)                               # B <- D_m B - P^T (X B)
    lowrank_serial = 2 * K * C * group * V / group                                # W dS, U (W dS)
    return {"today": today, "composed_off_path": build + compose, "composed_serial": serial,
            "lowrank_off_path": lowrank, "lowrank_serial": lowrank_serial}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def study_inputs(T: int, heads: int, group: int, seed: int = 0) -> dict:
    """One random sequence of T tokens as a kernel sees it (bf16 where the API takes bf16; the
    reference sees the same values), per head: "tiles" (:func:`tile_operands`), "dS0" (dht,
    float64), and the float64 reference's "snapshots" [n_snap, H, K, V] (snapshot_every =
    group) and "dh0" [H, K, V]."""
    raw = random_inputs(1, T, heads, seed=seed)
    gc, mqk, inv = prepare_tiles(raw["q"], raw["k"], raw["g"], raw["beta"])
    q, k, do = (bf16(raw[name]).astype(np.float64) for name in ("q", "k", "do"))
    mqk, inv = bf16(mqk).astype(np.float64), bf16(inv).astype(np.float64)
    gc = np.asarray(gc, np.float32).astype(np.float64)
    snaps_ref, dh0_ref = dstate_scan_reference(q, k, gc, raw["beta"], mqk, inv, do, dht=raw["dht"],
                                               snapshot_every=group)
    tiles = [tile_operands(q[0, :, h], k[0, :, h], gc[0, :, h], raw["beta"][0, :, h],
                           mqk[0, :, h], inv[0, :, h], do[0, :, h]) for h in range(heads)]
    return {"tiles": tiles, "dS0": [np.asarray(raw["dht"][0, h], np.float64) for h in range(heads)],
            "snapshots": snaps_ref[0], "dh0": dh0_ref[0]}


def study(T: int, heads: int, group: int, seed: int = 0) -> list[dict]:
    """Both emulations against the float64 reference, per head of one random sequence."""
    case = study_inputs(T, heads, group, seed)
    out = []
    for h in range(heads):
        row = {"head": h}
        for mode in EMULATIONS:
            s, d = emulate(case["tiles"][h], case["dS0"][h], group, mode=mode)
            row[mode] = {"dh0": rel(d, case["dh0"][h]), "snapshots": rel(s, case["snapshots"][:, h])}
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel.studies.b1_composition.compose", description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=8192, help="tokens of the one sequence (default 8192)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--group", type=int, default=4, help="tiles per serial step (default 4 = 64 tokens)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.T < 1 or args.heads < 1 or args.group < 1:
        ap.error("--T, --heads and --group must be >= 1")
    print(f"one sequence of T = {args.T}, {args.heads} heads, K = V = 128, steps of {args.group} tiles; "
          "errors: relative Frobenius norm against the float64 reference on the same bf16 inputs",
          flush=True)
    print(f"{'head':>4}  " + "  ".join(f"{m + ' dh0':>12}  {'snapshots':>10}" for m in EMULATIONS))
    for row in study(args.T, args.heads, args.group, args.seed):
        print(f"{row['head']:>4}  " + "  ".join(f"{row[m]['dh0']:12.2e}  {row[m]['snapshots']:10.2e}"
                                               for m in EMULATIONS))
    m = macs_per_tile(group=args.group)
    print(f"multiply-adds per tile and head: today {m['today'] / 1e6:.2f} M (a dependent chain every tile); "
          f"dense composition {m['composed_off_path'] / 1e6:.2f} M off the serial path + "
          f"{m['composed_serial'] / 1e6:.2f} M on it; low-rank composition "
          f"{m['lowrank_off_path'] / 1e6:.2f} M off + {m['lowrank_serial'] / 1e6:.2f} M on it "
          f"(one step of two dependent GEMMs per {args.group} tiles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
