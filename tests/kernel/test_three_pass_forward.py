"""kernel.three_pass_forward on the CPU: the call is kernel.forward's plan (every check, before any GPU work),
and the three passes are wired pass to pass with the layouts the one pass returns. The passes themselves are
recorders here; the real ones are tested in their rooms and, composed, in test_three_pass_forward_gpu.py."""
from __future__ import annotations

import types

import numpy as np
import pytest

from kernel import forward_chain, forward_output, forward_products
from kernel.three_pass_forward import three_pass_forward

from .scan_stand_ins import FORWARD, D

HV = 2


def _wired(monkeypatch, B: int, T: int, cu, *, training=True, final=True, **forms) -> tuple:
    calls = {}
    chunks = int(np.sum(-(-np.diff(cu if cu is not None else np.arange(B + 1) * T) // 64)))

    def products(q, k, v, g, beta, *, scale, cu_seqlens, training, token_gate, l2norm, norm_copies):
        calls["products"] = dict(cu_seqlens=cu_seqlens, training=training, scale=scale, token_gate=token_gate,
                                 l2norm=l2norm, norm_copies=norm_copies)
        norms = {n: f"{n} normalised" if l2norm and training and (norm_copies or n.endswith("rstd")) else None
                 for n in ("q", "k", "q_rstd", "k_rstd")}
        return types.SimpleNamespace(w="w", u="u", u_scale="u_scale", kg="kg", decay="decay", qg="qg", aqk="aqk",
                                     aqk_lo="aqk_lo", cu_chunks="cu_chunks", Aqk="Aqk" if training else None,
                                     Akk="Akk" if training else None, **norms)

    def chain(w, u, kg, decay, u_scale, *, cu_chunks, initial_state, output_final_state):
        calls["chain"] = (w, u, kg, decay, u_scale, cu_chunks, initial_state, output_final_state)
        return types.SimpleNamespace(states=np.zeros((chunks, HV, D, D)), v_new="v_new",
                                     final_state="final" if output_final_state else None)

    def output(qg, states, aqk, aqk_lo, v_new, *, cu_seqlens):
        calls["output"] = (qg, states.shape, aqk, aqk_lo, v_new, tuple(cu_seqlens))
        return np.zeros((int(cu_seqlens[-1]), HV, D))

    monkeypatch.setattr(forward_products, "forward_products", products)
    monkeypatch.setattr(forward_chain, "forward_chain", chain)
    monkeypatch.setattr(forward_output, "forward_output", output)
    a, kw = FORWARD.args(B=B, T=T, H=HV, h0=True, N=B if cu is None else len(cu) - 1)
    out = FORWARD.call(three_pass_forward, a, kw, cu_seqlens=cu, training=training, output_final_state=final,
                       **forms)
    return out, calls, kw["initial_state"]


def test_a_batch_goes_through_as_b_sequences_in_the_one_passs_layouts(monkeypatch):
    out, calls, h0 = _wired(monkeypatch, 2, 130, None)
    assert calls["products"]["cu_seqlens"] is None and calls["products"]["training"]
    assert calls["chain"] == ("w", "u", "kg", "decay", "u_scale", "cu_chunks", h0, True)
    assert calls["output"] == ("qg", (6, HV, D, D), "aqk", "aqk_lo", "v_new", (0, 130, 260))
    assert out.o.shape == (2, 130, HV, D) and out.states.shape == (2, 3, HV, D, D)
    assert (out.final_state, out.Aqk, out.Akk) == ("final", "Aqk", "Akk")


def test_varlen_passes_the_token_offsets_to_the_products_and_the_o_pass(monkeypatch):
    cu = np.array([0, 1, 66, 330])
    out, calls, _ = _wired(monkeypatch, 1, 330, cu)
    np.testing.assert_array_equal(calls["products"]["cu_seqlens"], cu)
    assert calls["output"][-1] == (0, 1, 66, 330) and out.states.shape == (1, 8, HV, D, D)


@pytest.mark.parametrize("token_gate", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_the_forms_of_the_gate_and_of_q_and_k_go_to_the_products_pass(monkeypatch, token_gate, l2norm):
    # the products pass is the one pass that reads g, q and k; its normalised q, k and rstd come back as the one
    # pass's l2norm build returns them
    out, calls, _ = _wired(monkeypatch, 2, 130, None, token_gate=token_gate, l2norm=l2norm)
    assert (calls["products"]["token_gate"], calls["products"]["l2norm"]) == (token_gate, l2norm)
    want = ("q normalised", "k normalised", "q_rstd normalised", "k_rstd normalised") if l2norm else (None,) * 4
    assert (out.q, out.k, out.q_rstd, out.k_rstd) == want


def test_without_norm_copies_the_rstd_alone_come_back(monkeypatch):
    out, calls, _ = _wired(monkeypatch, 2, 130, None, l2norm=True, norm_copies=False)
    assert calls["products"]["norm_copies"] is False
    assert (out.q, out.k, out.q_rstd, out.k_rstd) == (None, None, "q_rstd normalised", "k_rstd normalised")


def test_inference_keeps_no_states_and_no_blocks(monkeypatch):
    out, calls, _ = _wired(monkeypatch, 1, 200, None, training=False, final=False)
    assert not calls["products"]["training"] and calls["chain"][-1] is False
    assert (out.states, out.Aqk, out.Akk, out.final_state) == (None, None, None, None)


def test_the_one_passs_checks_come_first():
    a, kw = FORWARD.args(B=1, T=100, H=2)
    with pytest.raises(ValueError, match="scale must be finite"):
        FORWARD.call(three_pass_forward, a, kw, scale=-1.0)


@pytest.mark.parametrize("HV, B, T, offsets, pays", [
    (16, 1, 131072, None, True),                      # the measured win: 16 pairs, 0.58x the one pass
    (32, 1, 131072, None, True),                      # the rule's last: 32 pairs
    (16, 4, 8192, None, False),                       # the measured loss: 64 pairs, 1.46x
    (33, 1, 4096, None, False),
    (16, 1, 240, [0, 200, 210, 220, 230, 240], True),  # one long sequence among short ones: 19.2 pairs
    (8, 1, 250, [0, 50, 100, 150, 200, 250], False),   # five even ones: 40 pairs
    (4, 1, 0, [0, 0], False),                         # no tokens: the one pass's plan answers it
])
def test_the_three_passes_run_while_the_batchs_pairs_are_few(HV, B, T, offsets, pays):
    from kernel.three_pass_forward import THREE_PASS_MAX_PAIRS, three_passes_pay

    assert THREE_PASS_MAX_PAIRS == 32
    assert three_passes_pay(HV, B, T, None if offsets is None else np.asarray(offsets)) is pays


def test_one_long_sequence_runs_in_pieces_and_a_batch_in_one():
    from kernel.three_pass_forward import MAX_PIECES, MIN_PIECE_CHUNKS, piece_count

    assert piece_count(2048, 1) == min(MAX_PIECES, 2048 // MIN_PIECE_CHUNKS)   # 1x131072
    assert piece_count(2 * MIN_PIECE_CHUNKS - 1, 1) == 1         # too short for two pieces
    assert piece_count(2 * MIN_PIECE_CHUNKS, 1) == 2
    assert piece_count(2048, 2) == 1                             # two sequences: one launch of each pass


@pytest.mark.parametrize("chunks, count", [(1, 1), (7, 3), (2048, 8), (37, 7)])
def test_piece_edges_cover_every_chunk_once(chunks, count):
    from kernel.three_pass_forward import piece_edges

    edges = piece_edges(chunks, count)
    assert edges[0] == 0 and edges[-1] == chunks and len(edges) == count + 1
    lengths = np.diff(edges)
    assert lengths.min() >= 1 and lengths.max() - lengths.min() <= 1


def test_pieces_are_refused_by_name_where_they_cannot_run():
    from kernel.three_pass_forward import piece_edges

    with pytest.raises(ValueError, match="between 1 and the chunks"):
        piece_edges(3, 4)
    a, kw = FORWARD.args(B=2, T=300, H=2)
    with pytest.raises(ValueError, match="only one sequence runs in pieces, this batch has 2"):
        FORWARD.call(three_pass_forward, a, kw, pieces=2)
    a, kw = FORWARD.args(B=1, T=300, H=2)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="pieces must be None or an integer"):
            FORWARD.call(three_pass_forward, a, kw, pieces=bad)
