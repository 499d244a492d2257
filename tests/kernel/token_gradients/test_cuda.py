"""Kernel B's tile, lane by lane, on the CPU: tests/kernel/token_gradients_model.py replays one CTA
of token_gradients.cu through ptx_lab.model (its ldmatrix / stmatrix / mma / cp.async at the
.cu's addresses, on an image of the .cu's shared memory) and is checked here against the float64
tile algebra, kernel.reference.kda's _tile_forward / _tile_backward, fed the kernel's own inputs
(bf16 q, k, v, do, Mqk, INV, S0, dS1; fp32 g and beta).

What is left between the two is what the kernel rounds on chip: its MMA operands (Kd, Kr, Qe,
beta Ke, beta Vn, dU, U, dW) to bf16, dMqk and dLkk to two bf16 parts, and its sums to fp32. A wrong fragment order,
a missing .trans or a wrong address gives O(1) errors instead (the last test shows one).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from kernel.ds_scan.launch import bf16_bits, bits_to_f32
from kernel.reference import dstate_scan_reference, fla_forward_tensors
from kernel.reference.checks import l2norm, l2norm_rstd
from kernel.reference.fla_layout import kernel_a_inputs_from_fla
from kernel.reference.kda import rebuild, _tile_backward, _tile_forward
from kernel.runtime.builds import SHAPES_HEADER
from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, SPAN_LIMIT, TILE_TOKENS, TILES_PER_CHUNK
from kernel.tools.kda_precision import recipe_inputs

from .. import token_gradients_model as kb

H, HEAD = 2, 1    # two heads, the CTA of head 1: every head stride is exercised
GRADS = ("dq", "dk", "dv", "dg", "dbeta")


def _rb(x) -> np.ndarray:
    """x rounded to bf16, as float64 values."""
    return bits_to_f32(bf16_bits(np.asarray(x, dtype=np.float32))).astype(np.float64)


def _recipe(recipe: str, T: int, seed: int) -> dict:
    return recipe_inputs(recipe, 1, T, H, HEAD_DIM, HEAD_DIM, [T], seed)


def _inside_a_long_sequence(recipe: str, context: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(S0, dS after the chunk) of a chunk with `context` tokens of the same recipe before it and after
    it: the state the forward reaches over the tokens before, and the gradient the tokens after send
    back (what Kernel S and Kernel A hand Kernel B in the middle of a long sequence)."""
    from kernel.reference import kda_forward_reference

    before, after = _recipe(recipe, context, seed + 1000), _recipe(recipe, context, seed + 2000)
    _, h0, _ = kda_forward_reference(*(before[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta")))
    F = fla_forward_tensors(*(after[n].astype(np.float64) for n in ("q", "k", "g", "beta")))
    gc, mqk, inv = kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64)
    _, dS = dstate_scan_reference(after["q"], after["k"], gc, after["beta"], mqk, inv, after["do"],
                                  dht=after["dht"])
    return h0, dS


def make_case(T: int, seed: int, recipe: str = "random_inputs", context: int = 0, wide=None,
              with_l2norm: bool = False, raw_norms: tuple | None = None) -> dict:
    """One sequence of T tokens (a 64-token chunk, or a run of several), H heads: the kernel's inputs and the
    float64 tile algebra's per tile (its tile 0 starts from the bf16 S0, every later tile from the tile
    before's S1; the states entering later chunks are those S1 rounded to bf16, as the forward keeps them).
    recipe: kernel.reference.random_inputs, or "unit" (kernel.tools.kda_precision's: q, k, v, do
    ~ N(0, 1), gates logsigmoid(N(0, 1)) clamped to [-5, 0]). With `context`, the chunk's entry
    state and the dS entering it from the right are those of a chunk in the middle of a sequence
    (:func:`_inside_a_long_sequence`); without, a small random state and the recipe's dht. `wide`
    edits the gates (natural log, [1, T, H, K]) in place first. ``with_l2norm``: the kernel also gets the
    forward's rstd of q and k (1 / sqrt(|x|^2 + 1e-6) of the raw rows, fp32, as FLA's l2norm_fwd), and
    the reference's dq, dk go through the l2norm's backward in float64, r (dy - y (y . dy)), y the
    normalised rows the kernel reads. "g_natural": each token's gate (natural log, fp32 [tokens, H, K]), what
    Kernel B's token-gate build reads in place of inputs.g. ``raw_norms`` (implies ``with_l2norm``): q's and k's
    raw rows get these norms in turn by token (k's one token later) and are rounded to bf16; the rstd is theirs,
    in fp32, and the normalised rows every build and the reference read are bf16(x rstd), FLA's l2norm_fwd's on
    those rows. "raw": those raw rows (bf16 bits, [tokens, H, K]), what the qk_rstd build reads as q and k."""
    raw = _recipe(recipe, T, seed)
    if wide is not None:
        wide(raw["g"])
    cu = raw["cu_seqlens"]
    q, k = _rb(l2norm(np, raw["q"].astype(np.float64))), _rb(l2norm(np, raw["k"].astype(np.float64)))
    raw_rows, raw_rstd = {}, {}
    if raw_norms is not None:
        with_l2norm = True
        for j, n in enumerate(("q", "k")):
            norms = np.asarray(raw_norms, np.float64)[(np.arange(T) + j) % len(raw_norms)]
            x = _rb(l2norm(np, raw[n].astype(np.float64)) * norms[None, :, None, None])       # [1, T, H, K]
            raw_rstd[n] = l2norm_rstd(np, x).astype(np.float32)                                 # [1, T, H]
            raw_rows[n] = bf16_bits(x[0].astype(np.float32))
            y = bits_to_f32(bf16_bits(x.astype(np.float32) * raw_rstd[n][..., None])).astype(np.float64)
            q, k = (y, k) if n == "q" else (q, y)
    v, do = _rb(raw["v"]), _rb(raw["do"])
    g, beta = raw["g"].astype(np.float64), raw["beta"].astype(np.float64)
    h0 = 0.1 * np.random.default_rng(seed + 1).standard_normal((1, H, HEAD_DIM, HEAD_DIM))
    if context:
        h0, raw["dht"] = _inside_a_long_sequence(recipe, context, seed)
    F = fla_forward_tensors(q, k, g, beta, cu_seqlens=cu, qk_l2norm=False)       # Aqk's upper: garbage
    aqk, akk, g64 = bf16_bits(F.Aqk.astype(np.float32)), bf16_bits(F.Akk.astype(np.float32)), F.g64.astype(np.float32)
    # what the kernel computes from them: gc (the fp32 rebase), Mqk and INV (masked bf16 blocks)
    gc, mqk, inv = (x.astype(np.float64) for x in kernel_a_inputs_from_fla(
        bits_to_f32(aqk), bits_to_f32(akk), g64, cu_seqlens=cu))
    snaps, _ = dstate_scan_reference(q, k, gc, beta, mqk, inv, do, dht=raw["dht"], cu_seqlens=cu,
                                     qk_l2norm=False, snapshot_every=1)
    ds = bf16_bits(snaps[0].astype(np.float32))                                # [tiles, H, K, V]
    n_chunks = -(-T // CHUNK_TOKENS)
    states = np.zeros((n_chunks, H, HEAD_DIM, HEAD_DIM), np.uint16)            # [chunks, H, K, V]
    states[0] = bf16_bits(h0[0].astype(np.float32))
    s = HEAD_DIM ** -0.5
    rstd = {}
    if with_l2norm:
        for n in ("q", "k"):
            x = raw[n][0].astype(np.float64)
            rstd[n] = l2norm_rstd(np, x)                                            # [tokens, H]
            if raw_norms is not None:
                rstd[n] = raw_rstd[n][0].astype(np.float64)
    inp = kb.Inputs(q=bf16_bits(q[0].astype(np.float32)), k=bf16_bits(k[0].astype(np.float32)),
                    v=bf16_bits(v[0].astype(np.float32)), do=bf16_bits(do[0].astype(np.float32)),
                    g=g64[0], beta=beta[0].astype(np.float32), aqk=aqk[0], akk=akk[0], ds=ds, states=states,
                    cu=cu, scale=s, q_rstd=rstd["q"].astype(np.float32) if with_l2norm else None,
                    k_rstd=rstd["k"].astype(np.float32) if with_l2norm else None)

    ref, S0 = [], bits_to_f32(states[0, HEAD]).astype(np.float64)
    for t in range(-(-T // TILE_TOKENS)):
        rows = np.arange(TILE_TOKENS * t, min(T, TILE_TOKENS * t + TILE_TOKENS))
        L = rows.size

        def tile(x):
            out = np.zeros((TILE_TOKENS,) + x.shape[3:])
            out[:L] = x[0, rows, HEAD]
            return out

        gct = tile(gc)
        gct[L:] = gct[L - 1]                                   # rows past the end: gT (as the kernel)
        blk = {"q": tile(q), "k": tile(k), "v": tile(v), "do": tile(do), "beta": tile(beta[..., None])[:, 0],
               "mqk": tile(mqk), "inv": tile(inv), "gc": gct, "gT": gct[L - 1], "s": s}
        r = rebuild(np, blk)
        dS1 = bits_to_f32(ds[t, HEAD]).astype(np.float64)
        grads = _tile_backward(np, blk, r, S0, dS1)
        _, S1, _ = _tile_forward(np, blk, r, S0)
        if with_l2norm:   # dx = r (dy - y (y . dy)) for the rows of head HEAD
            for n, y in (("dq", blk["q"]), ("dk", blk["k"])):
                dy, r = grads[n], np.zeros(TILE_TOKENS)
                r[:L] = rstd[n[1]][rows, HEAD]
                grads[n] = r[:, None] * (dy - y * np.sum(y * dy, axis=-1, keepdims=True))
        ref.append({"rows": rows, "S1": S1, **{n: grads[n][:L] for n in GRADS}})
        S0 = S1
        if (t + 1) % TILES_PER_CHUNK == 0 and (t + 1) // TILES_PER_CHUNK < n_chunks:   # the next chunk's entry
            states[(t + 1) // TILES_PER_CHUNK, HEAD] = bf16_bits(S1.astype(np.float32))
    return {"inputs": inp, "ref": ref, "g_natural": g[0].astype(np.float32), "raw": raw_rows}


def _rel(out, ref) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def emulate(case: dict, *, tiles: int | None = None, swaps: dict | None = None, token_gate: bool = False,
            run: int = 0, run_chunks: int = 1, qk_rstd: bool = False, leave_out: str | None = None):
    """The lane model's gradients of the case (with ``token_gate``, its KDB_TOKEN_GATE=1 build on each
    token's natural-log gate, case["g_natural"]; with ``qk_rstd``, its KDB_QK_RSTD=1 build on the raw rows,
    case["raw"], leaving out ``leave_out`` of kb.RSTD_USES): the CTA of run ``run`` of ``run_chunks`` chunks."""
    inp = dataclasses.replace(case["inputs"], g=case["g_natural"]) if token_gate else case["inputs"]
    if qk_rstd:
        inp = dataclasses.replace(inp, q=case["raw"]["q"], k=case["raw"]["k"])
    out = kb.CtaModel(inp, run=run, h=HEAD, run_chunks=run_chunks, swaps=swaps, token_gate=token_gate,
                      qk_rstd=qk_rstd, leave_out=leave_out).run(tiles)
    got = {"dq": out.dq.reshape(-1, H, HEAD_DIM), "dk": out.dk.reshape(-1, H, HEAD_DIM),
           "dg": out.dg.reshape(-1, H, HEAD_DIM),
           "dv": kb.dv_values(out.dv).reshape(-1, H, HEAD_DIM), "dbeta": out.dbeta.reshape(-1, H)}
    return out, got


def errors(case: dict, out, got, tiles: int) -> dict:
    """Relative Frobenius errors per gradient (over the tiles walked) and per carried state."""
    errs = {}
    for n in GRADS:
        e = np.concatenate([got[n][ref["rows"], HEAD].reshape(-1) for ref in case["ref"][:tiles]])
        r = np.concatenate([ref[n].reshape(-1) for ref in case["ref"][:tiles]])
        errs[n] = _rel(e, r)
    for t, (s32, s16) in enumerate(zip(out.S1_fp32, out.S1_bf16)):
        errs[f"S1[{t}] fp32"] = _rel(s32, case["ref"][t]["S1"])
        errs[f"S1[{t}] bf16"] = _rel(s16, case["ref"][t]["S1"])
    return errs


# Measured (seeds 0-3, T = 5, 16, 21, 32, 64): relative Frobenius errors 0.7e-3 .. 4.1e-3 for every
# gradient and carried state; the largest element error 0.27e-2 .. 4.9e-2 of the output's rms.
BOUND = 1.2e-2          # ~3x the largest Frobenius error measured
ELEMENT_BOUND = 0.15    # ~3x the largest element error measured (one wrong element shows)


@pytest.fixture(scope="module")
def full_case():
    return make_case(32, seed=0)      # two full tiles: tile 0 walked with tile 1 next (G8 runs)


@pytest.fixture(scope="module")
def partial_case():
    return make_case(21, seed=0)      # tile 0 full, tile 1 of L = 5 from the carried state


def _check(case, out, got, tiles):
    errs = errors(case, out, got, tiles)
    print("  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
    assert all(e < BOUND for e in errs.values()), errs
    for n in GRADS:
        for ref in case["ref"][:tiles]:
            e, r = got[n][ref["rows"], HEAD], ref[n]
            worst = float(np.max(np.abs(e - r)) / np.sqrt(np.mean(r * r)))
            assert worst < ELEMENT_BOUND, (n, ref["rows"][0], worst)
    # what the CTA must not touch: the other head, and the tokens of tiles it did not walk
    walked = np.concatenate([ref["rows"] for ref in case["ref"][:tiles]])
    rest = np.setdiff1d(np.arange(got["dq"].shape[0]), walked)
    for n in GRADS:
        assert np.isnan(got[n][:, 1 - HEAD]).all(), f"{n}: head {1 - HEAD} written"
        assert np.isnan(got[n][rest]).all(), f"{n}: tokens {rest} written"
    return errs


def test_the_layout_is_the_cus():
    L = kb.LAYOUT
    assert (L["ROW"], L["PS"], L["GC_ROW"], L["THREADS"]) == (272, 24, 136, 256)
    assert L["SMEM_BYTES"] == 230_656                      # ptx-lab resources' count of the qk_rstd build
    assert kb._layout(kb.CU, {"KDB_QK_RSTD": 0})["SMEM_BYTES"] == 230_400   # ... and of the others
    assert L["ST_MQK"] + TILE_TOKENS * 32 == L["ST_INV"]              # 32-byte rows for the 16 x 16 blocks
    missing = kb.CU.replace(kb.SITES["G2 B Kr^T"], "b_of(b0, b1f, nc + SM_KR + at(0, 16 * ks2));")
    with pytest.raises(LookupError, match=r"SITES\['G2 B Kr\^T'\].*not in token_gradients.cu"):
        kb._sites(missing)


def test_the_kernel_text_is_the_entry_file_with_its_headers(tmp_path):
    # what the replay reads follows the kernel's code into token_gradients_*.cuh and the shapes header,
    # in include order
    assert '#include "token_gradients_' not in kb.CU and '#include "../../shapes.cuh"' not in kb.CU
    headers = sorted(kb.SOURCE_PATH.parent.glob("token_gradients_*.cuh")) + [SHAPES_HEADER]
    assert all(kb.CU.count(h.read_text().splitlines()[0]) == 1 for h in headers)   # each once
    assert (kb.HEAD_DIM, kb.TILE_TOKENS, kb.CHUNK_TOKENS) == (HEAD_DIM, TILE_TOKENS, CHUNK_TOKENS)
    moved = kb.CU.replace("__device__ __forceinline__ void reduce_partials(", "__device__ __forceinline__ void reduce(")
    with pytest.raises(LookupError, match=r"PARTS\['CtaModel._reduce'\]: no line of token_gradients.cu"):
        kb._sites(moved)
    entry = tmp_path / "token_gradients.cu"
    entry.write_text('#include "token_gradients_gone.cuh"\n')
    with pytest.raises(LookupError, match="includes token_gradients_gone.cuh, which is not at"):
        kb.kernel_text(entry)


def test_a_full_tile_matches_the_float64_tile_algebra(full_case):
    t0 = time.perf_counter()
    out, got = emulate(full_case, tiles=1)
    print(f"one tile, 8 warps: {time.perf_counter() - t0:.2f} s")
    assert len(out.S1_fp32) == 1
    _check(full_case, out, got, 1)


def test_a_partial_tile_after_the_carried_state_matches(partial_case):
    out, got = emulate(partial_case)
    assert len(out.S1_fp32) == 1                            # no S1 after the chunk's last tile
    _check(partial_case, out, got, 2)


@pytest.fixture(scope="module")
def two_chunk_case():
    return make_case(100, seed=3)     # a whole chunk, then one of 36 tokens (tiles of 16, 16 and 4)


def _poisoned_states(case: dict, chunk: int) -> dict:
    """The case with chunk `chunk`'s entry state all NaN: a CTA that reads it shows it."""
    states = case["inputs"].states.copy()
    states[chunk] = 0x7FC0                                        # bf16 NaN
    return {**case, "inputs": dataclasses.replace(case["inputs"], states=states)}


def test_a_run_of_two_chunks_carries_the_state_across_their_boundary(two_chunk_case):
    """run_chunks 2: one CTA walks all 7 tiles, the second chunk's from the state it carried in fp32 (that
    chunk's stored state is never read: NaN there changes nothing), every gradient and carried state within
    the bound of float64; with one chunk a run, the second CTA starts from the stored bf16 state (NaN shows)."""
    case = two_chunk_case
    poisoned = _poisoned_states(case, 1)
    out, got = emulate(poisoned, run_chunks=2)
    assert len(out.S1_fp32) == 6                                  # after every tile but the run's last
    _check(case, out, got, 7)
    second = case["ref"][4:]   # one chunk a run: the second chunk's CTA, from the bf16 state the forward kept
    out1, got1 = emulate(case, run=1, run_chunks=1)
    assert len(out1.S1_fp32) == 2
    for n in GRADS:
        e = np.concatenate([got1[n][r["rows"], HEAD].reshape(-1) for r in second])
        assert _rel(e, np.concatenate([r[n].reshape(-1) for r in second])) < BOUND, n
    _, nan = emulate(poisoned, run=1, run_chunks=1)
    assert np.isnan(nan["dq"][second[0]["rows"], HEAD]).all()
    # the two runs agree where they share a start: chunk 0's CTA at one chunk a run is the run's first 4 tiles
    _, first = emulate(case, run=0, run_chunks=1)
    rows = np.arange(64)
    for n in GRADS:
        assert np.array_equal(first[n][rows, HEAD], got[n][rows, HEAD]), n


def test_the_l2norms_backward_in_the_epilogue_matches_float64():
    # a chunk of two full tiles and a partial one, q and k through the forward's l2norm; its backward
    # runs after the 8 warps' row sums meet
    case = make_case(45, seed=2, with_l2norm=True)
    out, got = emulate(case)
    _check(case, out, got, 3)
    plain = make_case(45, seed=2)              # without the rstd: the normalised rows' gradients
    assert not np.allclose(emulate(plain)[1]["dq"][:45, HEAD], got["dq"][:45, HEAD], rtol=1e-2)


def test_bf16_gradients_are_the_fp32_ones_rounded_once():
    import dataclasses

    case = make_case(21, seed=4, with_l2norm=True)
    _, f32 = emulate(case)
    _, b16 = emulate({**case, "inputs": dataclasses.replace(case["inputs"], dqk_bf16=True)})
    for n in ("dq", "dk"):
        want = bits_to_f32(bf16_bits(f32[n][:21, HEAD]))
        assert np.array_equal(b16[n][:21, HEAD], want), n
        assert not np.array_equal(b16[n][:21, HEAD], f32[n][:21, HEAD]), n   # the rounding happened
    for n in ("dv", "dg", "dbeta"):
        assert np.array_equal(b16[n], f32[n], equal_nan=True), n


def test_grouped_value_heads_read_q_k_and_rstd_at_their_query_head():
    # FLA's GVA with one query / key head for the two value heads: value head HEAD's CTA reads q, k and
    # their rstd at head qk_head(HEAD, 2, 1) = 0, in place (one head's rows apart). Given there the rows
    # head HEAD had without GVA, it writes what that CTA wrote, bit for bit
    import dataclasses

    case = make_case(21, seed=5, with_l2norm=True)
    inp = case["inputs"]
    one = lambda x: np.ascontiguousarray(x[:, HEAD:HEAD + 1])   # noqa: E731  [tokens, 1, ..]
    gva = dataclasses.replace(inp, q=one(inp.q), k=one(inp.k), q_rstd=one(inp.q_rstd), k_rstd=one(inp.k_rstd))
    _, mha = emulate(case)
    _, got = emulate({**case, "inputs": gva})
    for n in GRADS:
        assert np.array_equal(got[n], mha[n], equal_nan=True), n   # head 1 - HEAD unwritten (NaN) in both


def _wide_tile(g):
    """Tile 1 (tokens 16-31) of head HEAD decays channel 5 by 2^-208 (gates -9, ln) and channel 77 by
    2^-144 at one token (-100), past fp32's normal range; tiles 0 and 2 keep the recipe's gates."""
    g[0, 16:32, HEAD, 5] = -9.0
    g[0, 20, HEAD, 77] = -100.0


@pytest.fixture(scope="module")
def wide_case():
    return make_case(48, seed=0, wide=_wide_tile)


def test_a_tile_past_fp32s_range_is_exact_through_the_pairwise_path(wide_case):
    out, got = emulate(wide_case)
    assert out.pairwise == [False, True, False]
    errs = _check(wide_case, out, got, 3)
    assert all(np.isfinite(list(errs.values())))


def test_a_partial_tile_past_the_range_is_exact_too():
    # the chunk's last tile holds 13 tokens; its rows past the end (gc = gT, zero q and k) stay out of
    # the pairwise sums, and a gate of -300 at one token (2^-433, within the float64 reference's 2^-512)
    # puts every channel past the range at once
    def wide(g):
        g[0, 34, HEAD, :] = -300.0
        g[0, 36:45, HEAD, 9] = -30.0

    case = make_case(45, seed=1, wide=wide)
    out, got = emulate(case)
    assert out.pairwise == [False, False, True]
    errs = _check(case, out, got, 3)
    assert all(np.isfinite(list(errs.values())))


def test_the_factorised_products_fail_on_that_tile(wide_case, monkeypatch):
    # the same tile with no span limit takes R1's factors past fp32's range: the reason for the path
    monkeypatch.setattr(kb, "SPAN_LIMIT", np.float32(np.inf))
    with np.errstate(all="ignore"):
        out, got = emulate(wide_case)
    assert out.pairwise == [False, False, False]
    tile1 = wide_case["ref"][1]["rows"]
    assert not all(np.isfinite(got[n][tile1, HEAD]).all() and _rel(got[n][tile1, HEAD], wide_case["ref"][1][n]) < BOUND
                   for n in GRADS)


EDGE_SPAN, EDGE_CHANNEL = 124.0, 5
# a tile spanning 120 (log2) in every channel of head HEAD: past kernel.shapes.SPAN_LIMIT (110), within
# fp32's 126. At 126 it would run the factorised G14-G17 with Kr = k 2^-120 flushed for |k| < 2^-6: the
# lane model puts tile 1's dq 3.0e-2 and dg 2.4e-2 from float64 there, past BOUND
WIDE_SPAN = 120.0


def edge_tile(span: float = EDGE_SPAN, channels=EDGE_CHANNEL):
    """Gates (natural log, edited in place) under which tile 1 (tokens 16-31) of head HEAD spans `span`
    (log2) in `channels`: no decay over tokens 17-30, 2^-span at token 31. Within fp32's range (Qe <=
    2^124 stays finite), but Kr = k 2^-span of the rows before the last falls below 2^-126 for |k| <
    2^(span - 126), and -ftz=true flushes it."""
    def wide(g):
        g[0, 17:31, HEAD, channels] = 0.0
        g[0, 31, HEAD, channels] = -span * math.log(2.0)
    return wide


def test_a_tile_within_fp32s_range_but_past_the_span_limit_takes_the_pairwise_products(monkeypatch):
    # At fp32's limit of 126 the factorised G14-G17 pair the flushed Kr (every |k| of channel 5 in
    # tile 1 is below 1/4) with 2^124 Qe: dq, dk and dg of that channel lose the tile's own terms.
    # At kernel.shapes.SPAN_LIMIT the tile goes pairwise and matches float64.
    assert SPAN_LIMIT == 110.0 and kb.SPAN_LIMIT == np.float32(SPAN_LIMIT)
    case = make_case(48, seed=0, wide=edge_tile())
    k = kb._bf(case["inputs"].k[17:31, HEAD, EDGE_CHANNEL])
    assert np.all(np.abs(k) < 2.0 ** (EDGE_SPAN - 126))                      # every Kr of the channel flushed
    tile1 = case["ref"][1]

    def channel_errors(got) -> dict:
        return {n: _rel(got[n][tile1["rows"], HEAD, EDGE_CHANNEL], tile1[n][:, EDGE_CHANNEL]) for n in ("dq", "dk", "dg")}

    out, got = emulate(case)
    assert out.pairwise == [False, True, False]
    _check(case, out, got, 3)
    assert all(e < BOUND for e in channel_errors(got).values()), channel_errors(got)

    monkeypatch.setattr(kb, "SPAN_LIMIT", np.float32(126.0))
    out, got = emulate(case)
    assert out.pairwise == [False, False, False]
    assert all(e > 0.5 for e in channel_errors(got).values()), channel_errors(got)
    assert _rel(got["dq"][tile1["rows"], HEAD], tile1["dq"]) > BOUND

    # the loss is the flush's: with subnormals kept, the same factorised products hold
    monkeypatch.setattr(kb, "_ftz", kb._f32)
    out, got = emulate(case)
    assert out.pairwise == [False, False, False]
    assert all(e < BOUND for e in channel_errors(got).values()), channel_errors(got)


# Four 64-token chunks of the unit recipe, walked whole, each in the middle of a sequence (512 tokens
# of the recipe before and after it: the entry state and the dS from the right a long sequence has).
# dg's error over them was 5.82e-3 when the gate's products paired the gradients with the fp32
# operands and 3.32e-3 with the bf16 values the MMAs read (the .cu's K phase says why); on the H200
# the whole backward's dg went from 6.29e-3 to 4.03e-3 against float64 (unit recipe, 1x8192).
UNIT_DG_BOUND = 4.5e-3


def _unit_errors_inside_a_sequence(names, swaps: dict | None = None) -> dict:
    """Relative Frobenius errors of `names` over UNIT_DG_BOUND's four chunks, each inside a sequence."""
    num, den = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    for seed in range(4):
        case = make_case(64, seed, recipe="unit", context=512)
        _, got = emulate(case, tiles=4, swaps=swaps)
        for n in names:
            e = np.concatenate([got[n][ref["rows"], HEAD].reshape(-1) for ref in case["ref"]])
            r = np.concatenate([ref[n].reshape(-1) for ref in case["ref"]])
            num[n], den[n] = num[n] + float(np.sum((e - r) ** 2)), den[n] + float(np.sum(r * r))
    errs = {n: (num[n] / den[n]) ** 0.5 for n in names}
    print("unit recipe, 4 chunks inside 1,088-token sequences" + (f", swapped {swaps}" if swaps else "") + ": "
          + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()))
    return errs


def test_the_gate_products_use_the_operands_the_mmas_read():
    assert _unit_errors_inside_a_sequence(["dg"])["dg"] < UNIT_DG_BOUND


# The same chunks: dq and dk were 2.09e-3 and 2.11e-3 with beta Vn in one bf16 part (G7's operand),
# 1.26e-3 and 1.26e-3 in two.
UNIT_DQ_DK_BOUND = 1.7e-3


def test_beta_vn_reaches_g7_in_two_parts():
    errs = _unit_errors_inside_a_sequence(["dq", "dk"])
    assert all(e < UNIT_DQ_DK_BOUND for e in errs.values())


# The same chunks: dv and dbeta were 2.35e-3 and 1.65e-3 with dU in one bf16 part (G3's operand),
# 1.64e-3 and 1.97e-4 in two.
UNIT_DV_BOUND, UNIT_DBETA_BOUND = 2.0e-3, 6e-4


def test_du_reaches_g3_in_two_parts():
    errs = _unit_errors_inside_a_sequence(["dv", "dbeta"])
    assert errs["dv"] < UNIT_DV_BOUND and errs["dbeta"] < UNIT_DBETA_BOUND, errs


# The same chunks: dq, dk and dg were 1.26e-3, 1.25e-3 and 2.88e-3 with U in one bf16 part as G9's and
# G10's operand, 0.90e-3, 0.89e-3 and 2.36e-3 in two.
UNIT_TWO_PART_U_BOUNDS = {"dq": 1.1e-3, "dk": 1.1e-3, "dg": 2.6e-3}
# What U's rounding left is a 2^-9 correction: stored or read the wrong way it cannot move an output
# past BOUND, but it makes dq and dk worse than one part (1.47e-3 and 1.46e-3), so these bounds
# catch it. Its two statements are tested here, not by test_one_wrong_recipe_is_caught.
REMAINDER_SITES = ("U remainder store", "G9 B U^T remainder")

OTHER = {"a_of": "a_of_t", "a_of_t": "a_of", "b_of": "b_of_t", "b_of_t": "b_of",
         "stmatrix_x4_trans": "stmatrix_x4"}
SWAPS = [(site, OTHER[s.recipe]) for site, s in kb.SITE.items() if site not in REMAINDER_SITES] \
    + [("plain", "trans"), ("trans", "plain")]


@pytest.mark.parametrize("site, recipe", SWAPS, ids=[f"{s}->{r}" for s, r in SWAPS])
def test_one_wrong_recipe_is_caught(full_case, site, recipe):
    """Every load and store statement read the other way at the same address (and the reduce
    step's fragment positions exchanged) moves some output far past the bound."""
    out, got = emulate(full_case, tiles=1, swaps={site: recipe})
    errs = errors(full_case, out, got, 1)
    worst = max(errs, key=lambda n: errs[n] if np.isfinite(errs[n]) else np.inf)
    print(f"{site} -> {recipe}: worst {worst} {errs[worst]:.2e}")
    assert not errs[worst] < 3 * BOUND, errs


def test_u_reaches_g9_and_g10_in_two_parts():
    errs = _unit_errors_inside_a_sequence(list(UNIT_TWO_PART_U_BOUNDS))
    assert all(errs[n] < b for n, b in UNIT_TWO_PART_U_BOUNDS.items()), errs


@pytest.mark.parametrize("site", REMAINDER_SITES)
def test_a_wrong_recipe_of_u_s_remainder_is_caught(site):
    recipe = OTHER[kb.SITE[site].recipe]
    errs = _unit_errors_inside_a_sequence(["dq", "dk"], swaps={site: recipe})
    assert not all(errs[n] < UNIT_TWO_PART_U_BOUNDS[n] for n in errs), errs


# the token-gate build's cases, in the lane model here and on the device (test_launch_gpu): whole tiles,
# a partial one, and the wide tile above (the pairwise path)
TOKEN_GATE_CASES = [(64, "random_inputs", False), (21, "unit", False), (48, "random_inputs", True)]


def token_gate_case(T: int, recipe: str, wide: bool) -> dict:
    return make_case(T, seed=3, recipe=recipe, wide=edge_tile(WIDE_SPAN, slice(None)) if wide else None)


@pytest.mark.parametrize("T, recipe, wide", TOKEN_GATE_CASES)
def test_the_token_gate_build_keeps_the_cumsum_builds_errors(T, recipe, wide):
    """Kernel B's token-gate build in the lane model (R1 sums each token's gate itself: docs/kda_forward.md,
    section 8): on whole, partial and past-the-span tiles its gradients keep the cumsum build's errors against
    float64, and the carried states too (the GPU test of the build holds the device to the same)."""
    case = token_gate_case(T, recipe, wide)
    tiles = len(case["ref"])
    before = errors(case, *emulate(case), tiles)
    out, got = emulate(case, token_gate=True)
    after = errors(case, out, got, tiles)
    print("  ".join(f"{n} {before[n]:.3e} -> {after[n]:.3e}" for n in before))
    assert all(after[n] < BOUND and 0.9 * before[n] < after[n] < 1.1 * before[n] for n in before), (before, after)
    assert out.pairwise == emulate(case)[0].pairwise


# The qk_rstd build's cases: raw rows of norms 3 and 0.2 (q's and k's in turn by token) on two full tiles and a
# partial one, and on the wide tile above (its G14-G17 pairwise, which read the stage's rows)
QK_RAW_NORMS = (3.0, 0.2)


@pytest.fixture(scope="module", params=["tiles", "wide"])
def raw_case(request):
    if request.param == "wide":
        return make_case(48, seed=0, wide=_wide_tile, raw_norms=QK_RAW_NORMS)
    return make_case(45, seed=2, raw_norms=QK_RAW_NORMS)


def test_the_qk_rstd_build_normalises_raw_rows_to_the_plain_builds_bits(raw_case):
    """The qk_rstd build on raw q and k rows with their rstd: within the bound of float64 on every tile, and the
    plain build's bits when that is fed the rows bf16(x rstd) and the same rstd (R1 rebuilds exactly those rows,
    and everything after it reads them)."""
    out, got = emulate(raw_case, qk_rstd=True)
    _check(raw_case, out, got, len(raw_case["ref"]))
    plain_out, plain = emulate(raw_case)
    assert out.pairwise == plain_out.pairwise
    for n in GRADS:
        assert np.array_equal(got[n], plain[n], equal_nan=True), n


@pytest.mark.parametrize("use", kb.RSTD_USES)
def test_each_use_of_the_staged_rstd_is_needed(raw_case, use):
    """The proof that the test above sees every use of the staged rstd: the model leaving out any one of them (R1's
    operands, the rows written back to the stage, the l2norm backward's factor; of q or of k) misses float64 by
    more than 3 x BOUND."""
    out, got = emulate(raw_case, qk_rstd=True, leave_out=use)
    errs = errors(raw_case, out, got, len(raw_case["ref"]))
    assert max(errs.values()) > 3 * BOUND, errs


def test_the_qk_rstd_build_reads_the_rstd_at_the_query_head():
    """GVA with one query / key head for the two value heads: the qk_rstd build's rstd rows are H (not HV) apart,
    at qk_head's head; given there the rows head HEAD had, it writes what the CTA without GVA wrote."""
    case = make_case(21, seed=5, raw_norms=QK_RAW_NORMS)
    inp = case["inputs"]
    one = lambda x: np.ascontiguousarray(x[:, HEAD:HEAD + 1])   # noqa: E731  [tokens, 1, ..]
    gva = {**case, "inputs": dataclasses.replace(inp, q_rstd=one(inp.q_rstd), k_rstd=one(inp.k_rstd)),
           "raw": {n: one(x) for n, x in case["raw"].items()}}
    _, mha = emulate(case, qk_rstd=True)
    _, got = emulate(gva, qk_rstd=True)
    for n in GRADS:
        assert np.array_equal(got[n], mha[n], equal_nan=True), n


def test_the_model_refuses_a_qk_rstd_build_without_rstd():
    case = make_case(21, seed=5)
    with pytest.raises(ValueError, match="qk_rstd: the build reads q_rstd and k_rstd"):
        kb.CtaModel(case["inputs"], run=0, h=HEAD, qk_rstd=True)
    with pytest.raises(ValueError, match="leave_out: one of"):
        kb.CtaModel(case["inputs"], run=0, h=HEAD, leave_out="r1 q")
