"""An independent oracle for the whole KDA backward: complex-step derivatives of a plain forward.

No tile algebra, no hand-derived gradient and no autograd. The forward is the
recurrence token by token (per sequence, all heads)::

    S_t = Diag(exp(g_t)) S_{t-1}
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T
    o_t = s S_t^T q_t

with the l2norm written x / sqrt(sum(x * x) + 1e-6) (x * x, not |x|^2, so
that it stays analytic), and the loss L = sum(o * do) + sum(S_T * dht).
Everything is real-analytic, so for any real input element x_j

    dL/dx_j = Im(L(x + i h e_j)) / h,    h = 1e-30,

to machine precision: no difference of nearly equal numbers is ever taken.
Each input gets one batched forward in which batch entry j carries the
perturbation of element j (so the cost is a few hundred tiny forwards, run as
one). The state gradients at any token boundary come the same way, by adding
i h E_ab to the state inside the loop.

The arithmetic is numpy's widest: long double (x86-64's 80-bit extended,
eps 1.1e-19; plain double where the platform has no wider type), so that the
oracle's own rounding, which forward-mode propagation of the imaginary part
still has where a derivative is small next to its terms, stays far below the
reference's.

This module lives in tests/ and imports nothing from the code under test.
"""
from __future__ import annotations

import numpy as np

L2NORM_EPS = 1e-6  # flash-linear-attention's l2norm eps
STEP = 1e-30       # the complex step: far below every input's rounding
REAL = np.longdouble

INPUTS = ("q", "k", "v", "g", "beta", "h0")


def _l2norm(x):
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + L2NORM_EPS)


def forward(q, k, v, g, beta, h0, *, scale=None, qk_l2norm=True, kick=None):
    """The token-by-token forward of ONE sequence, batched over a leading axis P.

    q, k, g: [P, T, H, K]; v: [P, T, H, V]; beta: [P, T, H]; h0: [P, H, K, V]
    (P may be 1 for any of them: it broadcasts). Real or complex.
    kick: None or (t, E) with E [P, H, K, V]: E is added to the state after
    token t (t = -1: before the first token).

    Returns (o [P, T, H, V], states [P, T + 1, H, K, V]); states[:, t] is the
    state after token t - 1 (states[:, 0] = h0, states[:, T] = S_T).
    """
    T, H, K = q.shape[1:]
    s = K ** -0.5 if scale is None else float(scale)
    if qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    P = max(x.shape[0] for x in (q, k, v, g, beta, h0) + ((kick[1],) if kick else ()))
    dtype = np.result_type(q, k, v, g, beta, h0, *(kick[1:] if kick else ()))
    S = np.broadcast_to(h0, (P,) + h0.shape[1:]).astype(dtype)
    if kick is not None and kick[0] == -1:
        S = S + kick[1]
    states, outs = [S], []
    for t in range(T):
        S = np.exp(g[:, t])[..., None] * S                                 # decay
        kt = k[:, t]                                                       # [P, H, K]
        pred = (S * kt[..., None]).sum(axis=-2)                            # S^T k
        resid = v[:, t] - pred
        S = S + beta[:, t][..., None, None] * kt[..., :, None] * resid[..., None, :]
        outs.append(s * (S * q[:, t][..., None]).sum(axis=-2))
        if kick is not None and kick[0] == t:
            S = S + kick[1]
        states.append(S)
    return np.stack(outs, axis=1), np.stack(states, axis=1)


def loss(o, states, do, dht):
    """L = sum(o * do) + sum(S_T * dht) per batch entry: [P]."""
    out = (o * do).sum(axis=(1, 2, 3))
    if dht is not None:
        out = out + (states[:, -1] * dht).sum(axis=(1, 2, 3))
    return out


def _base(seq: dict) -> dict:
    """The unperturbed inputs, each with a batch axis of 1 (h0 zeros when absent)."""
    T, H, K = seq["q"].shape
    V = seq["v"].shape[-1]
    h0 = np.zeros((H, K, V)) if seq.get("h0") is None else seq["h0"]
    base = {name: np.asarray(seq[name], dtype=REAL)[None]
            for name in ("q", "k", "v", "g", "beta")}
    base["h0"] = np.asarray(h0, dtype=REAL)[None]
    return base


def _loss_terms(seq: dict):
    do = np.asarray(seq["do"], dtype=REAL)
    dht = None if seq.get("dht") is None else np.asarray(seq["dht"], dtype=REAL)
    return do, dht


def gradients(seq: dict, *, scale=None, qk_l2norm=True) -> dict:
    """dL/dx for x in q, k, v, g, beta, h0 of ONE sequence, by complex steps.

    seq: q, k, g [T, H, K]; v, do [T, H, V]; beta [T, H]; h0, dht [H, K, V]
    or None (zeros). Returns {"q": [T, H, K], ..., "h0": [H, K, V]}.
    """
    base = _base(seq)
    do, dht = _loss_terms(seq)
    out = {}
    for name in INPUTS:
        x = base[name][0]
        P = x.size
        # batch entry j = the input with i * STEP added to its element j
        pert = x[None] + 1j * STEP * np.eye(P).reshape((P,) + x.shape)
        args = {**base, name: pert}
        o, states = forward(**args, scale=scale, qk_l2norm=qk_l2norm)
        out[name] = (loss(o, states, do, dht).imag / STEP).reshape(x.shape).astype(np.float64)
    return out


def state_gradient(seq: dict, after_token: int, *, scale=None, qk_l2norm=True) -> np.ndarray:
    """dL/dS for the state after token ``after_token`` (-1: the initial state): [H, K, V]."""
    base = _base(seq)
    H, K, V = base["h0"].shape[1:]
    P = H * K * V
    kick = 1j * STEP * np.eye(P).reshape(P, H, K, V)
    o, states = forward(**base, scale=scale, qk_l2norm=qk_l2norm, kick=(after_token, kick))
    do, dht = _loss_terms(seq)
    return (loss(o, states, do, dht).imag / STEP).reshape(H, K, V).astype(np.float64)


def plain_forward(seq: dict, *, scale=None, qk_l2norm=True):
    """(o [T, H, V], states [T + 1, H, K, V]) of ONE sequence, real, float64."""
    o, states = forward(**_base(seq), scale=scale, qk_l2norm=qk_l2norm)
    return o[0].astype(np.float64), states[0].astype(np.float64)
