"""ptx-lab floors (kernel.tools.floors): the forward's counts against hand-computed values.

The backward's tables are checked where they are used (tests/kernel/tools/test_bench_cpu.py,
test_bench_backward.py; the GEMM shapes in tests/kernel/reference/test_kda.py). Here: the forward's
GEMMs, its per-token bytes for each design at 32x8192 (issue 35's rough floor: q, k, v bf16, g fp32
and beta read once, o written once, 12.9 GB and 3.0 ms at 4.3 TB/s; a bf16 state every 64 tokens
4.3 GB and 1.0 ms), FLA's forward above every one-pass design, the backward a design feeds, and the
CLI.
"""
from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from kernel.shapes import CHUNK_TOKENS, HEAD_DIM, TILE_TOKENS
from kernel.tools import floors

C, K, V, BT = TILE_TOKENS, HEAD_DIM, HEAD_DIM, CHUNK_TOKENS
B, T, H = 32, 8192, 32                            # 32x8192, the bench's heads
TOKEN_HEADS = B * T * H                           # 8,388,608
STATE = K * V                                     # elements of one state
BY_NAME = {d.name: d for d in floors.FORWARD_DESIGNS}
INFERENCE = BY_NAME["one pass, inference"]
TODAY = BY_NAME["one pass, for our backward on normalised copies"]


def _gemm(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


# ---------------------------------------------------------------- GEMMs ----

def test_our_tile_gemms_by_hand():
    # A1, A2 (C x C x K); INV (2 C^3, forward substitution); G6, G8, F1 (the K x V ones); G7, F2 (C-wide)
    dims = {"C": C, "K": K, "V": V}
    got = {s.gemm.name: s.times * s.gemm.flops(dims) for s in floors.FORWARD_GEMMS}
    assert got == {"A1": _gemm(C, C, K), "A2": _gemm(C, C, K), "INV": _gemm(C, C, C),
                   "G6": _gemm(C, V, K), "G7": _gemm(C, V, C), "G8": _gemm(K, V, C),
                   "F1": _gemm(C, V, K), "F2": _gemm(C, V, C)}
    assert sum(got.values()) == 1_843_200 == 115_200 * C
    chain = {s.gemm.name for s in floors.FORWARD_GEMMS if s.role == "chain"}
    assert chain == {"G6", "G7", "G8"}                      # S -> Vn -> U -> S
    assert {s.gemm.name for s in floors.FORWARD_GEMMS if s.role == "off chain"} == {"F1", "F2"}


def test_the_output_gemms_are_the_references():
    """F1 + F2 have the shapes kernel/reference/kda.py's _tile_forward comments give (o = Qd S0 + Mqk U)."""
    from kernel.reference import kda

    line = next(ln for ln in Path(kda.__file__).read_text().splitlines() if "# F1 + F2" in ln)
    m, n, k1, k2 = re.search(r"M=(\w) N=(\w) K=(\w), then K=(\w)", line).groups()
    f1, f2 = (next(s.gemm for s in floors.FORWARD_GEMMS if s.gemm.name == name) for name in ("F1", "F2"))
    assert (f1.m, f1.n, f1.k) == (m, n, k1)
    assert (f2.m, f2.n, f2.k) == (m, n, k2)


def test_flas_chunk_gemms_by_hand():
    # per 64-token chunk: 4 + 6 blocks of Aqk and of Akk (C x C x K), 4 diagonal inverses and the
    # merged inverse's 16 dots (C x C x C), w and u (BT x 128 x BT), v_new, h and qg h (the K x V
    # ones at BT), Aqk v_new (BT x V x BT)
    dims = {"C": C, "BT": BT, "K": K, "V": V}
    per_chunk = sum(s.times * s.gemm.flops(dims) for s in floors.FLA_FORWARD_GEMMS)
    assert per_chunk == (20 * _gemm(C, C, K) + 20 * _gemm(C, C, C) + 3 * _gemm(BT, V, BT)
                         + 3 * _gemm(BT, V, K)) == 10_911_744
    # issue 35's rough "~1.4 TFLOP" at 32x8192 is FLA's 64-token count; ours at 16-token tiles is less
    fla = floors.forward_count(floors.FLA_FORWARD, [T] * B)
    assert fla.total_flops == per_chunk * (T // BT) * B * H
    assert abs(fla.total_flops / 1e12 - 1.43) < 0.005
    assert abs(floors.forward_count(INFERENCE, [T] * B).total_flops / 1e12 - 0.966) < 0.001


# ---------------------------------------------------------------- bytes ----

def test_the_inference_pass_is_the_rough_floor():
    # q, k, v bf16 (768 B), g fp32 (512), beta fp32 (4), o bf16 (256) a token and head: 1,540 B,
    # 12.92 GB at 32x8192; the initial and the final state (fp32, read and written once per sequence
    # and head) add 0.13 GB: 13.05 GB, 3.07 ms at the measured copy rate (3.04 at 4.3 TB/s)
    got = floors.forward_count(INFERENCE, [T] * B).total_bytes
    per_token = 2 * K + 2 * K + 2 * V + 4 * K + 4 + 2 * V
    assert per_token == 1540
    assert got == per_token * TOKEN_HEADS + 2 * B * H * STATE * 4
    assert abs(per_token * TOKEN_HEADS / 1e9 - 12.9) < 0.05
    assert abs(per_token * TOKEN_HEADS / 4.3e12 * 1e3 - 3.0) < 0.01
    assert abs(got / floors.COPY_BYTES_PER_S * 1e3 - 3.07) < 0.005


def test_a_bf16_state_every_64_tokens_adds_4_3_gb():
    states_only = floors.forward_count(floors.STATES_ONLY, [T] * B).total_bytes
    inference = floors.forward_count(INFERENCE, [T] * B).total_bytes
    assert states_only - inference == B * (T // BT) * H * STATE * 2 == 4_294_967_296
    assert abs((states_only - inference) / floors.COPY_BYTES_PER_S * 1e3 - 1.01) < 0.005
    assert abs(states_only / floors.COPY_BYTES_PER_S * 1e3 - 4.08) < 0.005   # the moonshot's 2x: 8.2 ms


def test_the_variants_by_hand():
    n = 1 << 20                                             # long: h0 and ht are 1/8 B a token
    per_token = {d.name: floors.forward_count(d, [n], heads=1).total_bytes / n - 2 * STATE * 4 / n
                 for d in floors.FORWARD_DESIGNS}
    assert per_token["one pass, inference, gate in the op"] == 1540 - 512 + 256        # g: raw bf16
    assert per_token["one pass, inference, l2norm a pass before"] == 1540 + 2 * (2 * K + 2 * K + 4)
    # today's inputs of kernel.kda_backward: qn, kn, two rstd, gc, Mqk and INV's diagonal blocks, states
    assert per_token[TODAY.name] == 1540 + 4 * K + 8 + 4 * K + 2 * 2 * C + 2 * STATE // BT
    assert per_token[floors.STATES_ONLY.name] == 1540 + 2 * STATE // BT
    # the op's one pass on raw rows: the rstd pass reads q and k again and writes two rstd, which the one pass reads;
    # it writes Mqk's and INV's diagonal blocks and the states, no copies of q and k and no cumsum
    assert per_token["the rstd pass, then one pass, for our backward on raw rows"] == (
        1540 + (2 * K + 2 * K + 8) + 8 + 2 * 2 * C + 2 * STATE // BT)
    # the products a pass before: it reads q, k, g and beta again and writes Mqk and INV, which the chain reads
    assert (per_token["products a pass before, for our backward on normalised copies"]
            == per_token[TODAY.name] + (2 * K + 2 * K + 4 * K + 4) + 2 * 2 * C)
    # three passes: the products pass writes what our backward reads (Mqk inside the whole Aqk), Aqk's second
    # bf16 part and w, u, kg; the chain reads w, u, kg and the chunk's last gate row, writes the states and v_new;
    # o from them, Aqk in two parts
    assert per_token["three passes (64-token chain), for our backward on normalised copies"] == (
        1540 + (4 * K + 8 + 4 * K + 2 * C) + (2 * BT + 2 * BT + 3 * 2 * K)
        + (3 * 2 * K + 4 * K / BT + 2 * STATE // BT + 2 * V)
        + (2 * K + 4 * K + 2 * STATE // BT + 2 * V + 2 * BT + 2 * BT)) == 6964


def test_flas_forward_kernel_by_kernel():
    # read from fla-core 0.6.0's source; per token and head, long sequences
    n = 1 << 20
    want = {                                               # (read, written)
        "l2norm_fwd_kernel (q, then k)": (2 * 2 * K, 2 * (2 * K + 4)),
        "chunk_local_cumsum_vector_kernel": (4 * K, 4 * K),
        "torch.zeros (Akk)": (0, 2 * BT),
        "chunk_kda_fwd_kernel_intra_sub_chunk": (2 * K + 2 * K + 4 * K + 4, 2 * C + 4 * C),
        "chunk_kda_fwd_kernel_inter_solve_fused": (0.75 * 2 * K + 2 * K + 4 * K + 0.75 * 4 + 4 * C,
                                                   2 * 24 + 2 * 40),
        "recompute_w_u_fwd_kda_kernel": (2 * K + 2 * V + 4 + 2 * BT + 4 * K, 2 * K + 2 * V + 2 * K),
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": (2 * K + 2 * K + 2 * V + 4 * K / BT,
                                                           2 * STATE / BT + 2 * V),
        "torch.zeros (o, ht)": (0, 2 * V),
        "chunk_gla_fwd_kernel_o": (2 * K + 4 * K + 2 * STATE / BT + 2 * V + 2 * BT, 2 * V),
    }
    got = {}
    for k in floors.FLA_FORWARD.kernels:
        r, w = floors.kernel_bytes(k, [n], heads=1)
        h0_ht = {"chunk_gated_delta_rule_fwd_kernel_h_blockdim64": (1, 1), "torch.zeros (o, ht)": (0, 1)}
        sr, sw = h0_ht.get(k.name, (0, 0))
        got[k.name] = (r / n - sr * STATE * 4 / n, w / n - sw * STATE * 4 / n)
    assert got == want
    assert sum(r + w for r, w in want.values()) == 10_107


def test_flas_forward_moves_more_than_every_one_pass_design():
    for shape, lengths in floors.FORWARD_SHAPES.items():
        fla = floors.forward_count(floors.FLA_FORWARD, lengths).total_bytes
        for d in floors.FORWARD_DESIGNS:
            if d.kernels[-1].name == floors.ONE_PASS:
                assert fla > 3 * floors.forward_count(d, lengths).total_bytes, (shape, d.name)


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")
def test_flas_kernels_are_named_as_in_its_source():
    root = Path(importlib.util.find_spec("fla").origin).parent
    source = "\n".join(p.read_text() for p in root.rglob("*.py"))
    for k in floors.FLA_FORWARD.kernels + BY_NAME["FLA 0.6.0, gate in the op"].kernels:
        name = k.name.split(" (")[0]
        if name != "torch.zeros":
            assert f"def {name}(" in source, name


# ---------------------------------------------------- the backward after ----

def test_today_saves_what_kernel_kda_backward_reads():
    """The tensors of kernel.kda_backward.run that FLA's forward makes (v, beta, do, h0, dht and the raw
    gate with its A_log and dt_bias, for Kernel B's gate build, are the caller's) are the ones the 'for
    our backward' design writes."""
    from kernel.kda_backward import run

    made_by_the_forward = {"q": ("qn",), "k": ("kn",), "g": ("gc",), "Aqk": ("Mqk",), "Akk": ("INV",),
                           "states": ("h",), "rstd": ("q_rstd", "k_rstd")}   # rstd: the l2norm's, for Kernel B
    options = {"batch", "side_by_side", "dqk_bf16", "segments", "token_gate", "qk_raw"}
    params = set(inspect.signature(run).parameters) - options
    assert params - set(made_by_the_forward) == {"v", "beta", "do", "initial_state", "dht", "gate"}
    assert set(floors.OUR_BACKWARD_READS) == {name for names in made_by_the_forward.values() for name in names}
    written = {name for name, _ in TODAY.kernels[-1].writes}
    assert written == set(floors.OUR_BACKWARD_READS) | {"o", "ht"}


def test_saved_states_and_rebuilt_blocks_in_the_backward():
    n = 1 << 20
    built = floors.count(floors.BUILT, [n], heads=1)
    saved = floors.count(floors.SAVED_STATES, [n], heads=1)
    rebuilt = floors.count(floors.SAVED_STATES, [n], heads=1, rebuilt=("Mqk", "INV"))
    assert saved.bytes["state"] == saved.flops["state"] == 0                # the scan goes
    assert saved.bytes["per_token"] == built.bytes["per_token"]            # Kernel B reads the same states
    # Mqk and INV's diagonal blocks (32 B each) no longer read by Kernel A and Kernel B
    assert saved.total_bytes - rebuilt.total_bytes == 2 * 2 * (2 * C) * n
    per_tile = _gemm(C, C, K) + _gemm(C, C, K) + _gemm(C, C, C)           # A1, A2, INV
    assert rebuilt.total_flops - saved.total_flops == 2 * per_tile * n // C
    with pytest.raises(ValueError, match=r"rebuilt must name tensors of \['INV', 'Mqk'\], got \['dS'\]"):
        floors.count(floors.BUILT, [n], rebuilt=("dS",))


def test_chain_at_b1_is_kernel_s_tile_times_the_tiles():
    assert floors.chain_tiles([131072]) == 8192
    assert abs(floors.chain_floor_ms([131072]) - 8192 * 0.69e-3) < 1e-9
    assert floors.chain_tiles([10, 17, 33]) == 3
    steps = dict(tokens=floors.CHUNK_TOKENS)
    assert floors.chain_tiles([131072], **steps) == 2048 and floors.chain_tiles([10, 65, 33], **steps) == 2
    assert abs(floors.chain_floor_ms([131072], floors.CHAIN_STEP_S, **steps) - 1.791) < 1e-9   # the composed
    # step's measured 2,048 steps


# ------------------------------------------------------------------ CLI ----

def test_forward_tables_print(capsys):
    floors.main(["--forward"])
    out = capsys.readouterr().out
    assert "| FLA chunk_kda, measured | 3.78 | 26.80 | - | 17.00 | - | 14.30 |" in out
    floor_row = next(ln for ln in out.splitlines() if ln.startswith("| one pass, inference |") and " / " in ln)
    assert floor_row.split(" | ")[2] == "3.07 / 1.22"                      # 32x8192: bytes / tensor ms
    assert "| chain: tiles a CTA x 0.69 us |" in out and "8,192: 5.65" in out
    floors.main(["--forward", "--gemms"])
    out = capsys.readouterr().out
    assert "1,843,200 FLOP in all, 115,200 a token" in out
    assert "10,911,744 FLOP in all, 170,496 a token" in out


def test_default_output_is_the_backwards(capsys):
    floors.main([])
    out = capsys.readouterr().out
    assert out.startswith("per token and head (H = 32, K = V = 128, 16-token tiles, long sequences)")
    assert "FLA 0.6.0" not in out
