"""kernel.reference.fla_layout: FLA's forward tensors and Kernel A's inputs read from them.

The three identities are checked in float64 against prepare_tiles, which builds
gc, Mqk, INV tile by tile (forward substitution for INV), while fla_forward_tensors
builds FLA's 64-chunk matrices (a general solve for Akk): two independent routes.
Worst differences seen while writing these tests (about 4000 examples, K 2..5,
gates up to 4x the realistic strength, l2norm on and off, chunk 16..128, tile 4..32):
4.8e-15 (relative to max |Mqk|) for Mqk, 4.3e-15 for INV, 2.1e-16 (relative to
max |g64|) for gc, and 4.2e-15 relative (Frobenius) between the two scans.
"""
from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.ds_scan.launch import bf16_bits, bits_to_f32
from kernel.reference import (dstate_scan_reference, fla_diagonal_blocks, fla_forward_tensors,
                              kernel_a_inputs_from_fla, prepare_tiles, random_inputs)
from kernel.reference.fla_layout import GARBAGE

from ..scan_cases import scan_case, scan_inputs

TOL = 1e-12     # float64 against float64 by another route: far above the ~5e-15 seen
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# (chunk, tile): FLA's 64 with Kernel A's 16 most often; any tile dividing the chunk works
LAYOUTS = [(64, 16)] * 4 + [(32, 16), (128, 16), (48, 16), (16, 16), (64, 8), (64, 32), (32, 4)]


def _close(out, ref, tol: float = TOL) -> None:
    """max |out - ref| <= tol * max(1, max |ref|), and the same places non-finite (none)."""
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.isfinite(out).all() and np.isfinite(ref).all()
    err = float(np.abs(out - ref).max()) if out.size else 0.0
    assert err <= tol * max(1.0, float(np.abs(ref).max())), err


def _is_garbage(values) -> bool:
    """Every value is one of fla_forward_tensors' fills for never-written entries."""
    finite_or_inf = [x for x in GARBAGE if not math.isnan(x)]
    return bool((np.isnan(values) | np.isin(values, finite_or_inf)).all())


def _rel(out, ref) -> float:
    num, den = float(np.linalg.norm(out - ref)), float(np.linalg.norm(ref))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


# ----------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------

@st.composite
def problems(draw):
    """A small problem around chunk and tile edges: partial last chunks and tiles, ragged varlen."""
    chunk, tile = draw(st.sampled_from(LAYOUTS))
    edges = sorted({1, tile - 1 or 1, tile, tile + 1, chunk - 1, chunk, chunk + 1, 2 * chunk + 3})
    length = st.sampled_from(edges) | st.integers(1, 2 * chunk + 20)
    if draw(st.booleans()):
        lengths, B, T = draw(st.lists(length, min_size=1, max_size=4)), None, None
    else:
        lengths, B, T = None, draw(st.integers(1, 2)), draw(length)
    return scan_case(draw, B=B, T=T, lengths=lengths, tile=tile, V_max=4) | dict(chunk=chunk)


_inputs = scan_inputs


def _fla(inp, p, upper="garbage"):
    return fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"], scale=p["scale"],
                               cu_seqlens=inp["cu_seqlens"], qk_l2norm=p["qk_l2norm"],
                               chunk=p["chunk"], upper=upper)


def _tiles(inp, p):
    return prepare_tiles(inp["q"], inp["k"], inp["g"], inp["beta"], scale=p["scale"],
                         qk_l2norm=p["qk_l2norm"], tile=p["tile"], cu_seqlens=inp["cu_seqlens"])


def _from_fla(F, inp, p):
    return kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=inp["cu_seqlens"],
                                    chunk=p["chunk"], tile=p["tile"])


def _blocks(A, inp, p):
    return fla_diagonal_blocks(A, cu_seqlens=inp["cu_seqlens"], chunk=p["chunk"], tile=p["tile"])


def _sequences(inp):
    """(flat bos, eos) of every sequence."""
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"] if inp["cu_seqlens"] is not None else np.arange(B + 1) * T
    return [(int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]


def _row_in_tile(inp, tile):
    """Per flat token: its row in its Kernel A tile."""
    return np.concatenate([np.arange(eos - bos) % tile for bos, eos in _sequences(inp)])


# ----------------------------------------------------------------------------
# the three identities
# ----------------------------------------------------------------------------

@FAST
@given(problems())
def test_mqk_is_the_lower_triangle_of_aqks_diagonal_blocks(p):
    inp = _inputs(p)
    _, mqk, _ = _tiles(inp, p)
    # with a zero upper triangle the blocks as stored are Mqk ...
    _close(_blocks(_fla(inp, p, upper="zero").Aqk, inp, p), mqk)
    # ... and with FLA's garbage there, the masked blocks still are
    F = _fla(inp, p, upper="garbage")
    _, masked, _ = _from_fla(F, inp, p)
    _close(masked, mqk)
    # the garbage does reach the blocks (so the mask is what makes them right): every
    # entry above a row's diagonal is one of FLA's never-written values
    raw = _blocks(F.Aqk, inp, p).reshape(-1, mqk.shape[2], p["tile"])
    row = _row_in_tile(inp, p["tile"])
    above = np.arange(p["tile"])[None, :] > row[:, None]                 # [tokens, tile]
    assert _is_garbage(raw.transpose(0, 2, 1)[above])


@FAST
@given(problems())
def test_inv_is_akks_diagonal_blocks_as_stored(p):
    inp = _inputs(p)
    _, _, inv = _tiles(inp, p)
    F = _fla(inp, p)
    raw = _blocks(F.Akk, inp, p)
    _close(raw, inv)                         # no mask, no diag(beta) factor
    row = _row_in_tile(inp, p["tile"])
    above = np.arange(p["tile"])[None, :] > row[:, None]
    assert (raw.reshape(-1, raw.shape[2], p["tile"]).transpose(0, 2, 1)[above] == 0).all()
    _close(_from_fla(F, inp, p)[2], inv)     # the blueprint's (masked) read is the same


@FAST
@given(problems())
def test_gc_is_g64_minus_its_value_before_the_tile(p):
    inp = _inputs(p)
    gc, _, _ = _tiles(inp, p)
    F = _fla(inp, p)
    out, _, _ = _from_fla(F, inp, p)
    _close(out, gc, TOL * max(1.0, float(np.abs(F.g64).max())))
    # gT (gc at a tile's last real token) is what the scan takes: equal as well
    for bos, eos in _sequences(inp):
        last = np.minimum(np.arange(bos, eos, p["tile"]) + p["tile"], eos) - 1
        flat = out.reshape(-1, *out.shape[2:])
        _close(flat[last], gc.reshape(flat.shape)[last], TOL * max(1.0, float(np.abs(F.g64).max())))


@FAST
@given(problems())
def test_scan_fed_from_fla_equals_scan_fed_from_prepare_tiles(p):
    inp = _inputs(p)
    F = _fla(inp, p)
    fla_tiles, ref_tiles = _from_fla(F, inp, p), _tiles(inp, p)
    for e in (1, 4):
        common = dict(scale=p["scale"], dht=inp["dht"], cu_seqlens=inp["cu_seqlens"], tile=p["tile"],
                      snapshot_every=e)
        # FLA stores q, k already normalised: the scan takes them as they are
        s_f, d_f = dstate_scan_reference(F.q, F.k, fla_tiles[0], inp["beta"], fla_tiles[1], fla_tiles[2],
                                         inp["do"], qk_l2norm=False, **common)
        s_r, d_r = dstate_scan_reference(inp["q"], inp["k"], ref_tiles[0], inp["beta"], ref_tiles[1],
                                         ref_tiles[2], inp["do"], qk_l2norm=p["qk_l2norm"], **common)
        assert np.isfinite(s_f).all() and np.isfinite(d_f).all()
        assert _rel(s_f, s_r) < TOL and _rel(d_f, d_r) < TOL, (e, _rel(s_f, s_r), _rel(d_f, d_r))


# ----------------------------------------------------------------------------
# FLA's tensors themselves, against their definitions
# ----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_fla_tensors_match_their_definitions(p):
    """Every chunk row of Aqk against the sum that defines it, (I + Lkk) Akk = I over each chunk,
    g64 restarting at every chunk and sequence start: no tile algebra involved."""
    inp = _inputs(p)
    F = _fla(inp, p)
    H, K = F.q.shape[2:]
    s = p["scale"] if p["scale"] is not None else K ** -0.5
    flat = lambda x: np.asarray(x, dtype=np.float64).reshape((-1,) + x.shape[2:])
    q, k, g64, aqk, akk = flat(F.q), flat(F.k), flat(F.g64), flat(F.Aqk), flat(F.Akk)
    g, beta = flat(inp["g"]), flat(inp["beta"])
    C = p["chunk"]
    for bos, eos in _sequences(inp):
        for c0 in range(bos, eos, C):
            n = min(C, eos - c0)
            rows = slice(c0, c0 + n)
            _close(g64[rows], np.cumsum(g[rows], axis=0) / math.log(2.0))
            decay = np.exp2(np.minimum(g64[rows][:, None] - g64[rows][None, :], 0.0))   # [c, j, H, K]
            want = s * np.einsum("chd,jhd,cjhd->chj", q[rows], k[rows], decay)
            lkk = beta[rows][:, :, None] * np.einsum("chd,jhd,cjhd->chj", k[rows], k[rows], decay)
            lower = np.tril(np.ones((n, n), dtype=bool))
            got = aqk[rows][:, :, :n]
            _close(np.where(lower[:, None, :], got, 0.0), np.where(lower[:, None, :], want, 0.0))
            strict = np.tril(np.ones((n, n), dtype=bool), -1)
            a = np.eye(n) + np.moveaxis(np.where(strict[:, None, :], lkk, 0.0), 1, 0)   # [H, c, j]
            _close(a @ np.moveaxis(akk[rows][:, :, :n], 1, 0), np.broadcast_to(np.eye(n), (H, n, n)))
            assert (akk[rows][:, :, :n][np.broadcast_to(~lower[:, None, :], (n, H, n))] == 0).all()
            # a partial chunk's columns past the sequence's end: above every row's diagonal
            assert (akk[rows][:, :, n:] == 0).all() and _is_garbage(aqk[rows][:, :, n:])


def test_upper_fills():
    inp = random_inputs(1, 70, 2, 3, 2, seed=5)
    args = (inp["q"], inp["k"], inp["g"], inp["beta"])
    zero, garbage = fla_forward_tensors(*args, upper="zero"), fla_forward_tensors(*args, upper="garbage")
    c = np.arange(70) % 64
    above = (np.arange(64)[None, :] > c[:, None])[None, :, None, :].repeat(2, axis=2)
    assert (zero.Aqk[above] == 0).all()
    vals = garbage.Aqk[above]
    assert np.isnan(vals).any() and np.isposinf(vals).any() and np.isneginf(vals).any()
    assert np.nanmax(np.abs(vals[np.isfinite(vals)])) == 3.0e38
    np.testing.assert_array_equal(zero.Aqk[~above], garbage.Aqk[~above])
    np.testing.assert_array_equal(zero.Akk, garbage.Akk)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 140), st.integers(0, 2**31 - 1))
def test_packed_equal_lengths_match_batch(B, T, seed):
    """FLA's chunks restart at each sequence start: a batch [B, T] and the same sequences
    packed [1, B*T] with cu_seqlens give the same tensors, and the same Kernel A inputs."""
    batch = random_inputs(B, T, 2, 3, 2, seed=seed)
    packed = {n: batch[n].reshape((1, B * T) + batch[n].shape[2:]) for n in ("q", "k", "g", "beta")}
    cu = np.arange(B + 1) * T
    F_b = fla_forward_tensors(batch["q"], batch["k"], batch["g"], batch["beta"], upper="zero")
    F_p = fla_forward_tensors(packed["q"], packed["k"], packed["g"], packed["beta"], cu_seqlens=cu,
                              upper="zero")
    for a, b in zip(F_b, F_p):
        np.testing.assert_allclose(b.reshape(a.shape), a, rtol=1e-13, atol=1e-15)
    for a, b in zip(kernel_a_inputs_from_fla(F_b.Aqk, F_b.Akk, F_b.g64),
                    kernel_a_inputs_from_fla(F_p.Aqk, F_p.Akk, F_p.g64, cu_seqlens=cu)):
        np.testing.assert_allclose(b.reshape(a.shape), a, rtol=1e-13, atol=1e-15)


# ----------------------------------------------------------------------------
# the blueprint in the kernel's own precisions
# ----------------------------------------------------------------------------

def _fla_case(lengths=(1, 15, 16, 17, 63, 64, 65, 150), H=2, K=8, seed=11):
    inp = random_inputs(1, 1, H, K, 2, lengths=list(lengths), seed=seed)
    return inp, fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"], cu_seqlens=inp["cu_seqlens"])


def test_fp32_rebase_costs_only_fp32_rounding():
    """With g64 in fp32 (as FLA stores it) the rebase is an fp32 subtraction, as on chip:
    off the float64 gc by the roundings of g64 and of the difference, no more."""
    inp, F = _fla_case()
    gc64, _, _ = kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=inp["cu_seqlens"])
    gc32, _, _ = kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64.astype(np.float32), cu_seqlens=inp["cu_seqlens"])
    assert gc32.dtype == np.float32
    eps = float(np.finfo(np.float32).eps)
    assert np.abs(gc32 - gc64).max() <= 1.5 * eps * np.abs(F.g64).max()


def test_bf16_bits_and_bf16_values_give_the_same_inputs():
    """The blueprint on uint16 bf16 bits (CuPy's convention) equals it on bf16 values, and
    the masked garbage comes back as +0.0 (bits 0), never inf or NaN."""
    inp, F = _fla_case()
    as_bf16 = dict(Aqk=F.Aqk.astype(ml_dtypes.bfloat16), Akk=F.Akk.astype(ml_dtypes.bfloat16))
    as_bits = dict(Aqk=bf16_bits(F.Aqk), Akk=bf16_bits(F.Akk))
    g32 = F.g64.astype(np.float32)
    gc_v, mqk_v, inv_v = kernel_a_inputs_from_fla(as_bf16["Aqk"], as_bf16["Akk"], g32, cu_seqlens=inp["cu_seqlens"])
    gc_b, mqk_b, inv_b = kernel_a_inputs_from_fla(as_bits["Aqk"], as_bits["Akk"], g32, cu_seqlens=inp["cu_seqlens"])
    assert mqk_b.dtype == np.uint16 and mqk_v.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(gc_v, gc_b)
    np.testing.assert_array_equal(bits_to_f32(mqk_b), mqk_v.astype(np.float32))
    np.testing.assert_array_equal(bits_to_f32(inv_b), inv_v.astype(np.float32))
    assert np.isfinite(mqk_v.astype(np.float32)).all()
    row = _row_in_tile(inp, 16)
    above = np.arange(16)[None, :] > row[:, None]
    assert (mqk_b.reshape(-1, 2, 16).transpose(0, 2, 1)[above] == 0).all()


def test_blocks_are_read_in_place():
    """fla_diagonal_blocks reads only the [tokens, H, tile] result: a view of the chunk
    matrix, then one gather (no full-size copy of Aqk on the way)."""
    inp, F = _fla_case(lengths=(130,))
    A = np.ascontiguousarray(F.Aqk)
    view = A.reshape(A.shape[0] * A.shape[1], A.shape[2], 4, 16)
    assert np.shares_memory(view, A)            # the reshape the blueprint makes is a view
    out = fla_diagonal_blocks(A)
    assert out.shape == A.shape[:3] + (16,) and not np.shares_memory(out, A)


# ----------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------

def test_fla_forward_tensors_argument_errors():
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    q, k, g, beta = inp["q"], inp["k"], inp["g"], inp["beta"]
    with pytest.raises(ValueError, match=r"q must be 4-D \[B, T, H, K\]"):
        fla_forward_tensors(q[0], k, g, beta)
    with pytest.raises(ValueError, match="k must have shape"):
        fla_forward_tensors(q, k[:, :-1], g, beta)
    with pytest.raises(ValueError, match="g has 4 heads and q has 2: that is FLA's GVA"):
        fla_forward_tensors(q, k, np.concatenate([g, g], axis=2), beta)
    with pytest.raises(ValueError, match="beta has 6 heads and q has 2: that is FLA's GVA.*repeat_interleave"):
        fla_forward_tensors(q, k, g, np.concatenate([beta] * 3, axis=2))
    with pytest.raises(ValueError, match="g must have shape"):
        fla_forward_tensors(q, k, g[..., :3], beta)
    with pytest.raises(ValueError, match="q must have a real floating dtype"):
        fla_forward_tensors(q.astype(np.complex128), k, g, beta)
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        fla_forward_tensors(q, k, g, beta, chunk=0)
    with pytest.raises(ValueError, match="upper must be one of"):
        fla_forward_tensors(q, k, g, beta, upper="nan")
    with pytest.raises(ValueError, match="cu_seqlens must end at the total length 20"):
        fla_forward_tensors(q, k, g, beta, cu_seqlens=np.array([0, 19]))


def test_kernel_a_inputs_from_fla_argument_errors():
    inp, F = _fla_case(lengths=(40, 30))
    cu = inp["cu_seqlens"]
    with pytest.raises(ValueError, match="chunk must be a multiple of tile"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=cu, tile=24)
    with pytest.raises(ValueError, match="tile must be a positive integer"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=cu, tile=0)
    with pytest.raises(ValueError, match="Aqk must have chunk = 64 columns.*pass chunk=32"):
        kernel_a_inputs_from_fla(F.Aqk[..., :32], F.Akk[..., :32], F.g64, cu_seqlens=cu)
    with pytest.raises(ValueError, match="Akk must have shape"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk[:, 1:], F.g64, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"Aqk must be 4-D \[B, T, H, chunk\]"):
        kernel_a_inputs_from_fla(F.Aqk[0], F.Akk, F.g64, cu_seqlens=cu)
    with pytest.raises(ValueError, match="g64 must have shape"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64[:, :, :1], cu_seqlens=cu)
    with pytest.raises(ValueError, match="g64 must be float32 or float64"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64.astype(ml_dtypes.bfloat16), cu_seqlens=cu)
    with pytest.raises(ValueError, match="Akk must have a real floating dtype"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk.astype(np.int32), F.g64, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=np.array([1, 70]))
    with pytest.raises(ValueError, match="cu_seqlens must be strictly increasing"):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64, cu_seqlens=np.array([0, 40, 40, 70]))
    with pytest.raises(ValueError, match="cu_seqlens needs a packed batch of size 1"):
        kernel_a_inputs_from_fla(F.Aqk.reshape(2, 35, 2, 64), F.Akk.reshape(2, 35, 2, 64),
                                 F.g64.reshape(2, 35, 2, 8), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"A must be 4-D"):
        fla_diagonal_blocks(F.Aqk[0])


# fla_forward_tensors and kernel_a_inputs_from_fla returned NaN for NaN inputs, g > 0 or scale=nan,
# and read qk_l2norm="no" as True: each is refused by name

@pytest.mark.parametrize("name", ["q", "k", "g", "beta"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_fla_forward_tensors_refuses_non_finite_inputs(name, value):
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    index = (0, 13, 1) + ((2,) if name != "beta" else ())
    inp[name] = inp[name].astype(np.float64)
    inp[name][index] = value
    want = f"{name} holds 1 non-finite value(s) (NaN or inf), the first {name}{list(index)} = {value}"
    with pytest.raises(ValueError, match=re.escape(want)):
        fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"])


def test_fla_forward_tensors_refuses_a_positive_gate():
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    g = inp["g"].astype(np.float64)
    g[0, 7, 0, 1] = 0.25
    with pytest.raises(ValueError, match=re.escape("g must be <= 0 (a natural-log decay gate: exp(g) in "
                                                   "(0, 1]), got 1 positive value(s), the first "
                                                   "g[0, 7, 0, 1] = 0.25")):
        fla_forward_tensors(inp["q"], inp["k"], g, inp["beta"])


@pytest.mark.parametrize("scale, error, match", [
    (float("nan"), ValueError, r"scale must be finite, got nan"),
    (float("inf"), ValueError, r"scale must be finite, got inf"),
    (0.0, ValueError, r"scale must be > 0 .*got 0.0"),
    (-0.5, ValueError, r"scale must be > 0 .*got -0.5"),
    ("x", TypeError, r"scale must be a real number, got 'x' \(str\)"),
    (True, TypeError, r"scale must be a real number, got True"),
])
def test_fla_forward_tensors_refuses_a_bad_scale(scale, error, match):
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    with pytest.raises(error, match=match):
        fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"], scale=scale)


@pytest.mark.parametrize("flag", ["no", 0, 1.0, None])
def test_fla_forward_tensors_qk_l2norm_must_be_a_bool(flag):
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    with pytest.raises(TypeError, match=r"qk_l2norm must be a bool \(True or False\)"):
        fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"], qk_l2norm=flag)
    F = fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"], qk_l2norm=np.bool_(False))
    np.testing.assert_array_equal(F.q, inp["q"].astype(np.float64))    # not normalised


@pytest.mark.parametrize("name", ["q", "k", "g", "beta"])
@pytest.mark.parametrize("dtype", [np.complex128, np.dtype("U8")])
def test_fla_forward_tensors_refuses_dtypes_that_are_not_real(name, dtype):
    inp = random_inputs(1, 20, 2, 4, 3, seed=0)
    inp[name] = inp[name].astype(dtype)
    with pytest.raises(ValueError, match=rf"{name} must have a real floating dtype .*got {np.dtype(dtype)}"):
        fla_forward_tensors(inp["q"], inp["k"], inp["g"], inp["beta"])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 0.5])
def test_kernel_a_inputs_from_fla_refuses_a_bad_g64(value):
    inp, F = _fla_case(lengths=(40, 30))
    g64 = F.g64.copy()
    g64[0, 33, 1, 5] = value
    what = "g64 holds 1 non-finite value(s)" if not np.isfinite(value) else "g64 must be <= 0"
    with pytest.raises(ValueError, match=re.escape(what) + r".*" + re.escape(f"the first g64[0, 33, 1, 5] = {value}")):
        kernel_a_inputs_from_fla(F.Aqk, F.Akk, g64, cu_seqlens=inp["cu_seqlens"])


@pytest.mark.parametrize("name", ["Aqk", "Akk"])
@pytest.mark.parametrize("as_bits", [False, True])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_kernel_a_inputs_from_fla_refuses_non_finite_values_it_reads(name, as_bits, value):
    inp, F = _fla_case(lengths=(70,))
    mats = {"Aqk": F.Aqk.copy(), "Akk": F.Akk.copy()}
    # token 37 is row 5 of its tile, the chunk's third: columns 32 .. 37 of its row are read
    mats[name][0, 37, 1, 32] = value
    mats[name][0, 50, 0, 50] = value               # and a diagonal entry
    if as_bits:
        mats = {n: bf16_bits(m) for n, m in mats.items()}
    want = (f"{name} holds 2 non-finite value(s) (NaN or inf) where Kernel A reads it (on or below the "
            f"diagonal of its 16 x 16 diagonal blocks), the first {name}[0, 37, 1, 32] = {value}")
    with pytest.raises(ValueError, match=re.escape(want)):
        kernel_a_inputs_from_fla(mats["Aqk"], mats["Akk"], F.g64.astype(np.float32))


def test_kernel_a_inputs_from_fla_accepts_non_finite_values_it_masks():
    """Above a row's diagonal (inside its block or not) FLA leaves garbage: never read, never refused."""
    inp, F = _fla_case(lengths=(70,))
    Aqk, Akk = F.Aqk.copy(), F.Akk.copy()
    Aqk[0, 37, 1, 38], Akk[0, 37, 1, 47] = np.nan, np.inf        # in the block, above the diagonal
    Aqk[0, 37, 1, 0], Akk[0, 37, 1, 63] = np.inf, np.nan         # outside the block
    gc, mqk, inv = kernel_a_inputs_from_fla(Aqk, Akk, F.g64)
    want = kernel_a_inputs_from_fla(F.Aqk, F.Akk, F.g64)
    for a, b in zip((gc, mqk, inv), want):
        np.testing.assert_array_equal(a, b)
