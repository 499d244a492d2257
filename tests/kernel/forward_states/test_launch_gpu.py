"""Kernel S on the GPU against the float64 reference (kernel.reference.kda_forward_reference).

Inputs are FLA's forward tensors built in float64 from rounded k and v (forward_states_cases):
what the kernel adds is its own rounding (g to fp32, Akk to bf16, bf16 MMA operands S, Kd, Kr,
W = beta Vn, U, and the bf16 output). The same scan emulated in that precision on the CPU
(forward_states_cases.emulate) measured 3.3e-3 relative Frobenius error against float64 over
all entries and at most 3.5e-3 in one (sequence, chunk, head) entry, on every case below; the
bound is 1e-2, about 3x that (the tensor cores add in their own order, and bf16 rounding of W
and U then flips elsewhere). A failure names the entry (sequence, chunk, head), how far off it
is, where its largest difference lies, and how far the output is from the emulation.

Start with the small ones when something fails: entry 0 is the initial state rounded to bf16
(exact: the state's load and the store's fragment order), then one tile's U alone through
Kr^T U (first_tile_only, S0 = 0: no P path), then with S0 (the P path), then everything.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel.ds_scan.launch import bits_to_f32
from kernel.forward_states import Config, all_variants, forward_states

from ..forward_states_cases import RAGGED, as_torch, bf16, emulate, make_case, rel, worst_entry

pytestmark = pytest.mark.gpu

D = 128
BOUND = 1e-2   # 3x the kernel-precision emulation's worst entry (3.5e-3), see the module docstring
CONFIGS = all_variants()


def _run(case: dict, config: Config | None = None):
    import cupy

    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    out = forward_states(dev(case["k"]), dev(case["v"]), dev(case["g"]), dev(case["beta"]), dev(case["Akk"]),
                         initial_state=dev(case["initial_state"]), cu_seqlens=case["cu_seqlens"], config=config)
    B, T, H = case["B"], case["T"], case["H"]
    expect = (1, int(case["offsets"][-1]), H, D, D) if case["cu_seqlens"] is not None else \
        (B, int(case["offsets"][-1]) // B, H, D, D)
    assert tuple(out.shape) == expect and out.dtype == np.uint16, (out.shape, out.dtype)
    return out


def _host(out) -> np.ndarray:
    return bits_to_f32(out.get()).reshape(-1, out.shape[2], D, D)


def _check(out: np.ndarray, case: dict, label: str, entries=None) -> None:
    """Every entry (or those listed) within BOUND of float64; the message says where and how far."""
    bad = ~np.isfinite(out)
    assert not bad.any(), (f"{label}: {int(bad.sum())} non-finite values, the first at [entry, head, k, v] = "
                           f"{[int(i) for i in np.argwhere(bad)[0]]} (an element not written?)")
    if entries is not None:
        keep = np.zeros(out.shape[0], dtype=bool)
        keep[list(entries)] = True
        out = np.where(keep[:, None, None, None], out, case["ref"])
    worst, where = worst_entry(out, case)
    if worst >= BOUND:
        emu = emulate(case)
        raise AssertionError(
            f"{label}: worst entry {where} (bound {BOUND:g}); all entries: rel {rel(out, case['ref']):.3e}; "
            f"distance to the kernel-precision emulation {rel(out, emu):.3e} (emulation vs float64 "
            f"{rel(emu, case['ref']):.3e})")


# ----------------------------------------------------------------------------
# small, to localise a failure
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name())
def test_entry_0_is_the_initial_state_in_bf16(config):
    case = make_case(lengths=RAGGED, H=2, initial_state=True, seed=1)
    out = _host(_run(case, config))
    first = case["offsets"][:-1]
    want = bf16(case["initial_state"])                      # [N, H, K, V]
    got = out[first]
    diff = got != want
    if diff.any():
        n, h, kk, vv = (int(i) for i in np.argwhere(diff)[0])
        pytest.fail(f"{config.name()}: entry 0 differs from bf16(initial_state) in {int(diff.sum())} of {diff.size} "
                    f"values; the first at sequence {n}, head {h}, [k={kk}, v={vv}]: got {got[n, h, kk, vv]}, "
                    f"want {want[n, h, kk, vv]} (S^T's load from initial_state or the snapshot's stmatrix / "
                    f"16-byte store order)")


@pytest.mark.parametrize("initial_state", [False, True], ids=["S0=0 (U alone)", "S0 given (P path)"])
@pytest.mark.parametrize("config", [Config(warps=1), Config(warps=8)], ids=lambda c: c.name())
def test_one_tile_reaches_the_next_entry(config, initial_state):
    # T = 65: entry 1 is the state after 64 tokens, of which only the first 16 carry k, v, beta;
    # no decay, so entry 1 = S0 + Kr^T U of tile 0 exactly (Kr = k)
    case = make_case(B=1, T=65, H=2, seed=2, gate_strength=0.0, first_tile_only=True, initial_state=initial_state)
    out = _host(_run(case, config))
    _check(out, case, f"{config.name()}, one tile ({'S0 given' if initial_state else 'S0 = 0'}), entry 1",
           entries=[1])
    _check(out, case, f"{config.name()}, one tile, all entries")


@pytest.mark.parametrize("config", [Config(warps=1), Config(warps=8)], ids=lambda c: c.name())
def test_one_full_chunk_with_decay(config):
    case = make_case(B=1, T=65, H=1, seed=3)
    _check(_host(_run(case, config)), case, f"{config.name()}, T = 65 with decay")


# ----------------------------------------------------------------------------
# the cases of the contract
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("initial_state", [False, True], ids=["h0 None", "h0"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name())
def test_ragged_batch_matches_float64(config, initial_state):
    case = make_case(lengths=RAGGED, H=2, seed=4, initial_state=initial_state)
    _check(_host(_run(case, config)), case, f"{config.name()}, lengths {RAGGED}, h0 {initial_state}")


@pytest.mark.parametrize("initial_state", [False, True], ids=["h0 None", "h0"])
def test_equal_length_batch_matches_float64(initial_state):
    case = make_case(B=2, T=200, H=2, seed=5, initial_state=initial_state)
    _check(_host(_run(case)), case, f"auto config, B 2 x T 200, h0 {initial_state}")


def test_a_long_sequence_matches_float64():
    case = make_case(B=1, T=1024, H=2, seed=6, initial_state=True)
    _check(_host(_run(case, Config(warps=2))), case, "w2, B 1 x T 1024")


def test_bf16_beta_matches_float64():
    case = make_case(lengths=RAGGED, H=2, seed=7, beta_bf16=True)
    assert case["beta"].dtype == np.uint16
    _check(_host(_run(case)), case, "beta as bf16")


def test_two_calls_are_bit_identical():
    case = make_case(lengths=RAGGED, H=2, seed=8, initial_state=True)
    a, b = _run(case).get(), _run(case).get()
    assert np.array_equal(a, b), f"{int((a != b).sum())} of {a.size} bf16 values differ between two calls"


def test_out_is_written_and_returned_and_a_wrong_one_named():
    import cupy

    case = make_case(lengths=RAGGED, H=2, seed=8, initial_state=True)
    want = _run(case)
    dev = lambda x: None if x is None else cupy.asarray(x)   # noqa: E731
    args = (dev(case["k"]), dev(case["v"]), dev(case["g"]), dev(case["beta"]), dev(case["Akk"]))
    kw = dict(initial_state=dev(case["initial_state"]), cu_seqlens=case["cu_seqlens"])
    out = cupy.full(want.shape, 0xFFFF, dtype=np.uint16)
    assert forward_states(*args, **kw, out=out) is out
    assert np.array_equal(out.get(), want.get())
    with pytest.raises(ValueError, match=r"out must be a C-contiguous cupy.ndarray of uint16"):
        forward_states(*args, **kw, out=out[:, :-1])


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    case = make_case(lengths=RAGGED, H=2, seed=9, initial_state=True)

    out_t = forward_states(as_torch(case["k"], True), as_torch(case["v"], True), as_torch(case["g"], False),
                           as_torch(case["beta"], False), as_torch(case["Akk"], True),
                           initial_state=as_torch(case["initial_state"], False),
                           cu_seqlens=torch.from_numpy(case["cu_seqlens"]).cuda())
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.bfloat16 and out_t.is_cuda
    out_c = _run(case).get()
    assert np.array_equal(out_t.view(torch.int16).cpu().numpy().view(np.uint16), out_c)


@pytest.mark.parametrize("config", [None, Config(warps=1), Config(warps=8)], ids=lambda c: c.name() if c else "auto")
def test_grouped_value_heads_read_k_in_place(config):
    # FLA's GVA: k with 2 heads for the 6 value heads (value head hv reads k's hv // 3), never repeated;
    # the entries are float64's, and the same bits as with k repeated per value head
    import cupy

    case = make_case(lengths=RAGGED, H=6, seed=12, initial_state=True, group=3)
    assert case["k"].shape[2] == 2
    native = _run(case, config)
    _check(_host(native), case, "k in place for 3 value heads each")
    repeated = _run({**case, "k": case["k_repeated"]}, config)
    assert cupy.array_equal(native, repeated), "reading k in place must give what reading it repeated gives"


# ----------------------------------------------------------------------------
# the knobs the auto rule leaves fixed: producers, ring depth, the G6 split# ----------------------------------------------------------------------------
# the knobs the auto rule leaves fixed: producers, ring depth, the G6 split
# ----------------------------------------------------------------------------

KNOB_CONFIGS = [Config(warps=2, producers=1, nstage=2, g6_split=1), Config(warps=2, producers=2, nstage=3, g6_split=2),
                Config(warps=1, producers=8, nstage=7, g6_split=4), Config(warps=4, producers=8, nstage=4, g6_split=1),
                Config(warps=8, producers=1, nstage=3, g6_split=2)]


@pytest.mark.parametrize("config", KNOB_CONFIGS, ids=lambda c: c.name())
def test_every_knob_setting_matches_float64(config):
    # ragged lengths: sequences shorter than the ring (no EMPTY wait at all) beside longer ones
    case = make_case(lengths=RAGGED + [1000], H=2, seed=10, initial_state=True)
    _check(_host(_run(case, config)), case, f"{config.name()}, lengths {RAGGED + [1000]}")
