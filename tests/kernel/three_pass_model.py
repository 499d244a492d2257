"""The three-pass forward in numpy, in the precision its kernels would keep: fp32 where they would
accumulate, bf16 where they would store or take an MMA operand (Aqk's factorised operands two bf16 each, and Aqk
itself two as the o pass reads it), subnormals flushed as -ftz leaves them.
Each pass's function is the arithmetic its kernel is held to (kernel.forward_products: ``chunk_operands``
and ``operands``; kernel.forward_chain: ``chain_step`` and ``chain``; kernel.forward_output: ``o_pass``),
as tests/kernel/forward_cases.py's ``emulate`` is the one pass's; ``RECIPES`` and ``case_of`` are the
inputs their tests and kernel.studies.three_pass_forward draw.

Per sequence, head and 64-token chunk (rows >= L padded: q = k = v = beta = 0, gc = the last real row):

* **products** (no state): Akk = strict_tril(diag(beta) (k k^T weighted by 2^(gc_i - gc_j))) and Aqk =
  tril(s q k^T weighted the same) over the whole 64 x 64 chunk, by 16 x 16 blocks. A block below the
  diagonal, rows in sub-chunk I, columns in J < I, is factorised about the row before sub-chunk I
  (g_ref): x_i 2^(gc_i - g_ref) and k_j 2^(g_ref - gc_j), both at most 1, so nothing overflows for
  any gate. A diagonal block is factorised about its own last row, as the one pass's tile products
  are, or formed pairwise in fp32 where a channel spans past ``kernel.shapes.SPAN_LIMIT``. Aqk's
  factorised operands go to the MMAs in two bf16 each (:func:`mm_split`, about 16 bits): in one bf16 they
  make 15% of o's error (docs/log/50). Akk's keep one bf16 (:func:`mm`): their rounding is lost among
  INV's and the chain's. Then INV = (I + Akk)^-1 in fp32 (forward substitution on the diagonal blocks, the
  blocks below from them), w = INV (beta k 2^gc) and kg = k 2^(gT - gc) stored bf16, u = INV (beta v)
  stored fp16 divided by a power of two a chunk and head (``u_format``: also bf16 or fp32, the study's
  alternatives);
* **the chain** in 64-token steps: v_new = u - w S, S <- 2^gT S + kg^T v_new (S fp32; bf16 as an
  operand; v_new stored bf16, and read by the update in two bf16 parts), the state entering the chunk
  stored bf16 (``kernel.forward_chain`` is its kernel: :func:`chain` here is its arithmetic, up to the
  order its MMAs sum in);
* **o**: (s q 2^gc) S + Aqk v_new, from the stored state and v_new, stored bf16. Aqk reaches its MMA in two
  bf16 parts (:func:`split_bf16`, the products pass stores both): in one bf16 it makes 13% of o's error on
  gates logsigmoid(N(0, 1)) clipped to [-5, 0].

The inputs and outputs follow ``kernel.forward``'s: q, k, v bf16 values [tokens, H, 128], FLA's g (the
64-chunk-local cumsum, log2) [tokens, H, 128], or with ``token_gate`` each token's natural-log gate, which the
products pass sums over each chunk (kernel.shapes.tile_gate_sums' rule, over the chunk's 64 rows), beta
[tokens, H]; o [tokens, H, 128], the final state [N, H, 128, 128] and the state entering every chunk
[chunks, H, 128, 128].
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from kernel.runtime.arrays import bits_to_f32
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, SPAN_LIMIT, TILE_TOKENS, tile_gate_sums

D, C, BT = HEAD_DIM, TILE_TOKENS, CHUNK_TOKENS
SUB = BT // C                          # sub-chunks (16-token blocks) a chunk
FP32_TINY = np.float32(2.0 ** -126)


def bf16(x) -> np.ndarray:
    """x rounded to bf16 (nearest even), as float32 values."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def ftz(x) -> np.ndarray:
    """fp32 with subnormals flushed to zero."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < FP32_TINY, np.float32(0), x).astype(np.float32)


def fp16(x) -> np.ndarray:
    """x rounded to fp16 (nearest even, subnormals kept), as float32 values."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


# How u leaves the products pass for the chain: "fp16" with a power-of-two scale a chunk and head (the kernels';
# 8 more bits of mantissa than bf16 in the same bytes), "bf16" (the kernels' before log 49), "fp32" (512 B a
# token and head more)
U_FORMATS = ("bf16", "fp16", "fp32")
# fp16's u is scaled so that a bound on its entries is at most 2^15: half fp16's largest finite value (65504),
# which leaves room for bf16(INV)'s rounding up (at most 2^-8 relative) and the MMA's fp32 sums
U_FP16_TOP_EXP = 15
# the scale's exponent stays within +-U_EXP_LIMIT, where 2^e and 2^-e are both normal fp32
U_EXP_LIMIT = 100


def u_bound(inv, bv) -> np.float32:
    """A bound on |u| = |INV bv| entry by entry: INV's largest row sum of magnitudes times bv's largest
    magnitude, in fp32 (INV fp32 [64, 64], bv bf16 values [64, 128]). Each largest starts from 0 and passes
    over a NaN, as the kernel's fmaxf does."""
    rows = np.abs(np.asarray(inv, dtype=np.float32)).sum(axis=1, dtype=np.float32)
    top = lambda x: np.fmax.reduce(np.append(np.ravel(x), np.float32(0)))   # noqa: E731
    return np.float32(top(rows)) * np.float32(top(np.abs(np.asarray(bv, dtype=np.float32))))


def fp16_scale(bound) -> np.float32:
    """2^e with bound / 2^e at most 2^U_FP16_TOP_EXP and more than half that: u / 2^e then uses fp16's whole
    normal range from the top, whatever the magnitude of v. 1 where the bound is zero (a chunk of zeros) or
    not finite (u is then past fp32 already). e stays within +-U_EXP_LIMIT."""
    if not (bound > 0 and np.isfinite(bound)):
        return np.float32(1)
    _, e = np.frexp(np.float32(bound))             # bound = m 2^e, m in [0.5, 1): bound <= 2^e
    return np.float32(2.0 ** int(np.clip(int(e) - U_FP16_TOP_EXP, -U_EXP_LIMIT, U_EXP_LIMIT)))


def mm(a, b) -> np.ndarray:
    """An MMA: exact products of its operands, summed in fp32 (here in float64, then rounded)."""
    return (np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)).astype(np.float32)


def split_bf16(x) -> tuple[np.ndarray, np.ndarray]:
    """fp32 x in two bf16 an element (bf16 values): hi = bf16(x), lo = bf16(x - hi). x - hi is exact in fp32,
    flushed where it is subnormal as -ftz leaves the kernel's subtraction, so for normal x hi + lo is x within
    2^-16 of itself (each rounding keeps 8 significant bits): ptx_lab/cuda/fragments.cuh's two-part operand."""
    x = np.asarray(x, dtype=np.float32)
    hi = bf16(x)
    with np.errstate(invalid="ignore"):   # inf - inf: a NaN lo, as the kernel's subtraction gives
        return hi, bf16(ftz(x - hi))


def mm_split(a, b) -> np.ndarray:
    """An MMA of fp32 operands each in two bf16 (:func:`split_bf16`): hi_a hi_b + hi_a lo_b + lo_a hi_b, three
    MMAs into one fp32 accumulator, summed as :func:`mm` sums (the exact products, rounded once). lo_a lo_b is
    left out: at most 2^-16 of a product, as much as the split leaves out of each operand. About 16 bits an
    operand where mm of bf16 operands reads 8."""
    (ha, la), (hb, lb) = split_bf16(a), split_bf16(b)
    f64 = lambda x: x.astype(np.float64)   # noqa: E731
    return (f64(ha) @ f64(hb) + f64(ha) @ f64(lb) + f64(la) @ f64(hb)).astype(np.float32)


def chunk_products(q, k, gc, beta, L: int, s: float) -> tuple[np.ndarray, np.ndarray, int]:
    """(Aqk, Akk, pairwise blocks) of one chunk in fp32: Aqk lower with its diagonal s q . k, Akk strictly
    lower with beta's rows; q, k [64, 128] bf16 values, gc [64, 128], beta [64]. The factorised blocks' operands
    are formed in fp32; Aqk's go to the MMAs in two bf16 each, Akk's in one (the k 2^(.. - gc_j) both read:
    its hi part)."""
    f32 = np.float32
    aqk = np.zeros((BT, BT), dtype=f32)
    akk = np.zeros((BT, BT), dtype=f32)
    pairwise = 0
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for I in range(SUB):
            rows = slice(C * I, C * (I + 1))
            g_ref = gc[C * I - 1] if I else np.zeros(D, dtype=f32)
            up = ftz(np.exp2(gc[rows] - g_ref[None, :]))                     # <= 1
            Qi, Ki = ftz(f32(s) * q[rows] * up), bf16(ftz(k[rows] * up))
            for J in range(I):                                               # below the diagonal
                cols = slice(C * J, C * (J + 1))
                Kj = ftz(k[cols] * ftz(np.exp2(g_ref[None, :] - gc[cols])))   # <= 1
                aqk[rows, cols] = mm_split(Qi, Kj.T)
                akk[rows, cols] = mm(Ki, bf16(Kj).T)
            gT = gc[C * I + C - 1]                                           # the diagonal block's last row
            g_blk = gc[rows]
            strict = np.tril(np.ones((C, C), dtype=bool), -1)
            if np.all(g_blk - gT[None, :] <= SPAN_LIMIT):
                e_up, e_down = ftz(np.exp2(g_blk - gT[None, :])), ftz(np.exp2(gT[None, :] - g_blk))
                Qe, Ke, Kr = ftz(f32(s) * q[rows] * e_up), bf16(ftz(k[rows] * e_up)), ftz(k[rows] * e_down)
                a1, a2 = mm_split(Qe, Kr.T), mm(Ke, bf16(Kr).T)
            else:
                pairwise += 1
                decay = np.exp2((g_blk[:, None, :] - g_blk[None, :, :]).astype(f32))
                a1 = f32(s) * np.einsum("id,jd,ijd->ij", q[rows], k[rows], decay, dtype=f32)
                a2 = np.einsum("id,jd,ijd->ij", k[rows], k[rows], decay, dtype=f32)
            blk_q = np.where(strict, a1, 0).astype(f32)
            blk_q[np.arange(C), np.arange(C)] = f32(s) * np.sum(q[rows] * k[rows], axis=1, dtype=f32)
            aqk[rows, rows] = blk_q
            akk[rows, rows] = np.where(strict, a2, 0)
    real = (np.arange(BT) < L)[:, None]
    aqk = np.where(real, aqk, 0).astype(f32)
    akk = np.where(real, beta[:, None] * akk, 0).astype(f32)
    return aqk, akk, pairwise


def unit_lower_inverse(lkk: np.ndarray) -> np.ndarray:
    """(I + lkk)^-1 for a strictly lower 64 x 64 lkk, in fp32: forward substitution on each 16 x 16
    diagonal block, then block (I, J < I) = -INV_II sum_{J <= m < I} L_Im INV_mJ."""
    f32 = np.float32
    inv = np.zeros((BT, BT), dtype=f32)
    for I in range(SUB):
        b = slice(C * I, C * (I + 1))
        blk = lkk[b, b]
        d = np.zeros((C, C), dtype=f32)
        for i in range(C):
            row = np.eye(C, dtype=f32)[i]
            for m in range(i):
                row = (row - blk[i, m] * d[m]).astype(f32)
            d[i] = row
        inv[b, b] = d
    for I in range(1, SUB):
        bi = slice(C * I, C * (I + 1))
        for J in range(I - 1, -1, -1):
            bj = slice(C * J, C * (J + 1))
            acc = np.zeros((C, C), dtype=f32)
            for m in range(J, I):
                bm = slice(C * m, C * (m + 1))
                acc = (acc + mm(lkk[bi, bm], inv[bm, bj])).astype(f32)
            inv[bi, bj] = -mm(inv[bi, bi], acc)
    return inv


def chunk_operands(qc, kc, vc, bc, gc, L: int, scale: float, *, u_format: str = "fp16") -> dict:
    """The products pass on one chunk (rows >= L padded as the module docstring says): w, u, kg, qg [64, 128]
    (bf16 values; u as ``u_format`` stores it, :data:`U_FORMATS`), u_scale (the power of two u was stored
    divided by: 1 but in fp16), aqk [64, 64] (fp32, as formed), aqk_hi and aqk_lo (its two bf16 parts as the
    pass stores them, :func:`split_bf16`: hi + lo is aqk within 2^-16 of itself, both zero above the diagonal
    and past L), decay = 2^gT [128] (fp32) and the count of blocks formed pairwise."""
    f32 = np.float32
    if u_format not in U_FORMATS:
        raise ValueError(f"u_format must be one of {U_FORMATS}, got {u_format!r}")
    gT = gc[L - 1]
    aqk, lkk, pairwise = chunk_products(qc, kc, gc, bc, L, scale)
    inv32 = unit_lower_inverse(lkk)
    inv = bf16(inv32)
    u_scale = f32(1)
    with np.errstate(under="ignore"):
        start = ftz(np.exp2(gc))
        w = bf16(mm(inv, bf16(ftz(bc[:, None] * kc * start))))
        bv = bf16(bc[:, None] * vc)
        u = mm(inv, bv)
        if u_format == "fp16":
            u_scale = fp16_scale(u_bound(inv32, bv))
            u = fp16(u / u_scale)
        elif u_format == "bf16":
            u = bf16(u)
        kg = bf16(ftz(kc * ftz(np.exp2(gT[None, :] - gc))))
        qg = bf16(ftz(f32(scale) * qc * start))
    aqk_hi, aqk_lo = split_bf16(aqk)
    return {"w": w, "u": u, "u_scale": u_scale, "kg": kg, "qg": qg, "aqk": aqk, "aqk_hi": aqk_hi, "aqk_lo": aqk_lo,
            "decay": np.exp2(gT).astype(f32), "pairwise": pairwise}


def chain_step(S, w, u, kg, decay) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of the chain: (bf16(S), v_new, the next S) from S (fp32 [K, V]) and the chunk's operands. v_new
    is stored bf16; the update reads it in two bf16 parts (:func:`split_bf16`; hi + lo is exact in fp32)."""
    Sb = bf16(S)
    v_hi, v_lo = split_bf16((u - mm(w, Sb)).astype(np.float32))
    return Sb, v_hi, (decay[:, None] * S + mm(kg.T, v_hi + v_lo)).astype(np.float32)


def chain(w, u, kg, decay, cu_chunks, initial_state=None, u_scale=None) -> dict:
    """The chain over stacked operands (w, u, kg [chunks, H, 64, 128], decay [chunks, H, 128]; sequence n's
    chunks cu_chunks[n] .. cu_chunks[n + 1] - 1; u_scale [chunks, H], u's power-of-two scale where u is
    stored in fp16, else None): states (bf16 values) [chunks, H, 128, 128], v_new (bf16 values)
    [chunks, H, 64, 128] and the final state (fp32) [N, H, 128, 128], as ``kernel.forward_chain``
    computes them."""
    chunks, H = w.shape[:2]
    N = len(cu_chunks) - 1
    states = np.zeros((chunks, H, D, D), dtype=np.float32)
    v_new = np.zeros((chunks, H, BT, D), dtype=np.float32)
    final = np.zeros((N, H, D, D), dtype=np.float32)
    for n in range(N):
        for h in range(H):
            S = (np.asarray(initial_state[n, h], dtype=np.float32) if initial_state is not None
                 else np.zeros((D, D), dtype=np.float32))
            for c in range(int(cu_chunks[n]), int(cu_chunks[n + 1])):
                uc = u[c, h] if u_scale is None else u[c, h] * u_scale[c, h]   # a power of two: exact
                states[c, h], v_new[c, h], S = chain_step(S, w[c, h], uc, kg[c, h], decay[c, h])
            final[n, h] = S
    return {"states": states, "v_new": v_new, "final": final}


def operands(q, k, v, g, beta, lengths, *, scale: float, u_format: str = "fp16", token_gate: bool = False) -> dict:
    """The products pass over a batch (``kernel.forward``'s inputs, module docstring): w, u, kg, qg [chunks,
    H, 64, 128] (u as ``u_format`` stores it), u_scale [chunks, H], aqk (fp32), aqk_hi and aqk_lo (its two bf16
    parts) [chunks, H, 64, 64], decay [chunks, H, 128], cu_chunks [N + 1] (host int64) and the pairwise blocks'
    count. ``token_gate``: g is each token's natural-log gate, summed over each chunk's rows (rows past L add
    zero: their gc is row L - 1's)."""
    f32 = np.float32
    H = q.shape[1]
    bos = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cu_chunks = np.concatenate([[0], np.cumsum([math.ceil(n / BT) for n in lengths])]).astype(np.int64)
    chunks = int(cu_chunks[-1])
    out = {name: np.zeros((chunks, H, BT, D), dtype=f32) for name in ("w", "u", "kg", "qg")}
    for name in ("aqk", "aqk_hi", "aqk_lo"):
        out[name] = np.zeros((chunks, H, BT, BT), dtype=f32)
    out["decay"] = np.zeros((chunks, H, D), dtype=f32)
    out["u_scale"] = np.ones((chunks, H), dtype=f32)
    pairwise = 0
    for n, length in enumerate(lengths):
        for c in range(int(cu_chunks[n + 1] - cu_chunks[n])):
            t0, L = int(bos[n]) + BT * c, min(BT, int(length) - BT * c)
            for h in range(H):
                qc, kc, vc = (np.zeros((BT, D), dtype=f32) for _ in range(3))
                bc = np.zeros(BT, dtype=f32)
                qc[:L], kc[:L], vc[:L], bc[:L] = q[t0:t0 + L, h], k[t0:t0 + L, h], v[t0:t0 + L, h], beta[t0:t0 + L, h]
                if token_gate:
                    terms = np.zeros((BT, D), dtype=f32)
                    terms[:L] = g[t0:t0 + L, h]
                    gc = tile_gate_sums(terms)
                else:
                    gc = np.empty((BT, D), dtype=f32)
                    gc[:L] = g[t0:t0 + L, h]
                    gc[L:] = gc[L - 1]
                ops = chunk_operands(qc, kc, vc, bc, gc, L, scale, u_format=u_format)
                pairwise += ops.pop("pairwise")
                for name, value in ops.items():
                    out[name][int(cu_chunks[n]) + c, h] = value
    out["cu_chunks"], out["pairwise_blocks"] = cu_chunks, int(pairwise)
    return out


def o_pass(qg, aqk_hi, aqk_lo, states, v_new, lengths) -> np.ndarray:
    """o (bf16 values) [tokens, H, 128] = bf16(qg S + (hi + lo) v_new) per chunk, its real rows: Aqk in its two
    bf16 parts (aqk_hi, aqk_lo [chunks, H, 64, 64], :func:`split_bf16`), as the o pass's three products read it
    (qg S, then hi v_new, then lo v_new into one fp32 accumulator). Here each of the two terms is :func:`mm`'s
    (the exact products summed in float64, rounded to fp32; hi + lo is exact in float64), their sum in fp32,
    then bf16. With aqk_lo zero: Aqk in one bf16."""
    H = qg.shape[1]
    o = np.zeros((int(np.sum(lengths)), H, D), dtype=np.float32)
    t0, c = 0, 0
    for length in lengths:
        for start in range(0, int(length), BT):
            L = min(BT, int(length) - start)
            for h in range(H):
                a = np.asarray(aqk_hi[c, h], dtype=np.float64) + np.asarray(aqk_lo[c, h], dtype=np.float64)
                o[t0 + start:t0 + start + L, h] = bf16(mm(qg[c, h], states[c, h]) + mm(a, v_new[c, h]))[:L]
            c += 1
        t0 += int(length)
    return o


def emulate(q, k, v, g, beta, lengths, *, scale: float, initial_state=None, u_format: str = "fp16",
            token_gate: bool = False) -> dict:
    """o (bf16 values) [tokens, H, 128], final (fp32) [N, H, 128, 128], states (bf16 values, the state
    entering every chunk, sequence after sequence) [chunks, H, 128, 128], and the pairwise blocks' count.
    ``u_format``: how the products pass stores u for the chain (:data:`U_FORMATS`; fp32 costs 512 B a token and
    head more, written and read; fp16 the same bytes as bf16, and 16 a chunk and head for its scale, the
    chain's smallest bulk copy). ``token_gate``: g is each token's gate (:func:`operands`)."""
    ops = operands(q, k, v, g, beta, lengths, scale=scale, u_format=u_format, token_gate=token_gate)
    walked = chain(ops["w"], ops["u"], ops["kg"], ops["decay"], ops["cu_chunks"], initial_state, ops["u_scale"])
    o = o_pass(ops["qg"], ops["aqk_hi"], ops["aqk_lo"], walked["states"], walked["v_new"], lengths)
    return {"o": o, "final": walked["final"], "states": walked["states"], "pairwise_blocks": ops["pairwise_blocks"]}


def case_inputs(case: dict, token_gate: bool = False) -> tuple:
    """The positional inputs of :func:`operands` and :func:`emulate` from a forward_cases.make_case case: q, k (as
    every value head reads them), v, the gate (FLA's cumsum, or with ``token_gate`` each token's own), beta and
    the sequences' lengths, per value head."""
    H = case["H"]
    gate = case["g_token"] if token_gate else case["g"]
    return (*(bits_to_f32(case[n]).reshape(-1, H, D) for n in ("q_repeated", "k_repeated", "v")),
            gate.reshape(-1, H, D), case["beta_values"].reshape(-1, H), case["lengths"])


# The recipes the three passes are checked on: forward_cases.make_case's keywords, and the trained layer's gate
RECIPES = {
    "ragged": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200], H=2, seed=4, initial_state=True),
    "long": dict(B=1, T=2048, H=2, seed=6),
    "strong gates": dict(B=2, T=512, H=2, seed=7, gate_strength=3.0),
    "past fp32's range": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200, 300], H=2, seed=5, out_of_range=True),
    "trained-layer gate": dict(lengths=[1, 15, 16, 17, 63, 64, 65, 200, 300, 1000], H=2, seed=5, initial_state=True),
}


def case_of(recipe: str) -> dict:
    """forward_cases.make_case of one recipe; the trained-layer gate drawn from FLA's layer gate grown 4x (torch)."""
    from .forward_cases import make_case

    kw = dict(RECIPES[recipe])
    if recipe == "trained-layer gate":
        from kernel.tools.trained_layer_gate import trained_layer_gate

        kw["gate"] = trained_layer_gate(None, None, kw["H"], kw["H"], lengths=kw["lengths"], seed=3,
                                        hidden=256)["g"].float().numpy()
    return make_case(**kw)
