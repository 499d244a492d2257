"""An independent float64 oracle for Kernel A: state gradients by perturbation.

No tile algebra and no autograd: a plain token-by-token KDA forward (docs/kernel_a.md,
section 1) computes L = sum(o * do) + sum(S_T * dht). L is affine in the state
handed from token t to token t + 1, so the gradient with respect to that state
is, entry (i, j), L(with E_ij added to the state inside the loop) - L(as is).
All K * V unit perturbations (and every boundary asked for) run at once as a
batch axis of the state, so K, V must stay tiny (2..5).

This module lives in tests/ so that the code under test never uses it.
"""
from __future__ import annotations

import math

import numpy as np

L2NORM_EPS = 1e-6  # flash-linear-attention's l2norm eps (docs/kernel_a.md, section 1)


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + L2NORM_EPS)


def state_gradients(q, k, v, g, beta, do, dht, boundaries, *, scale=None, qk_l2norm=True):
    """dL/dS at the given boundaries of ONE sequence, all heads: [len(boundaries), H, K, V].

    q, k, g: [T, H, K]; v, do: [T, H, V]; beta: [T, H]; dht: [H, K, V] or None.
    Boundary b in -1 .. T-1 means the state after token b (b = -1: the initial
    state S_0, b = T-1: the final state S_T).
    """
    q, k, v, g, beta, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta, do))
    T, H, K = q.shape
    V = v.shape[-1]
    s = K ** -0.5 if scale is None else float(scale)
    if qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    dht = np.zeros((H, K, V)) if dht is None else np.asarray(dht, dtype=np.float64)

    P = K * V
    # copy 0 is unperturbed, copy 1 + (i * V + j) gets + E_ij at its boundary
    pert = np.concatenate([np.zeros((1, K, V)), np.eye(P).reshape(P, K, V)])   # [1+P, K, V]
    bnd = np.asarray(boundaries)
    S = np.zeros((H, len(bnd), 1 + P, K, V))                                     # S_0 = 0
    loss = np.zeros((H, len(bnd), 1 + P))
    S[:, bnd == -1] += pert
    for t in range(T):
        S = np.exp(g[t])[:, None, None, :, None] * S                            # decay
        kt = k[t][:, None, None, :]                                              # [H, 1, 1, K]
        pred = np.einsum("hbpkv,hk->hbpv", S, k[t])                              # S^T k
        resid = v[t][:, None, None, :] - pred                                    # v - S^T k
        S = S + beta[t][:, None, None, None, None] * kt[..., None] * resid[..., None, :]
        o = s * np.einsum("hbpkv,hk->hbpv", S, q[t])
        loss += np.einsum("hbpv,hv->hbp", o, do[t])
        S[:, bnd == t] += pert
    loss += np.einsum("hbpkv,hkv->hbp", S, dht)
    grad = (loss[:, :, 1:] - loss[:, :, :1]).reshape(H, len(bnd), K, V)
    return grad.transpose(1, 0, 2, 3)


def snapshot_tiles(n_tokens: int, tile: int, snapshot_every: int) -> list[int]:
    """Tiles whose exit state is snapshotted: min(e*m + e - 1, n_t - 1), m = 0..n_s-1."""
    n_t = math.ceil(n_tokens / tile)
    e = snapshot_every
    return [min(e * m + e - 1, n_t - 1) for m in range(math.ceil(n_t / e))]


def oracle_dstate(inp: dict, *, tile: int, snapshot_every: int, scale=None, qk_l2norm=True):
    """(snapshots, dh0) in the layout of ``dstate_scan_reference``, from the oracle.

    ``inp`` holds q, k, v, g, beta, do ([B, T, H, ..]), dht ([N, H, K, V] or
    None) and cu_seqlens (None, or N+1 offsets with B = 1).
    """
    B, T = inp["q"].shape[:2]
    cu = inp["cu_seqlens"]
    if cu is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        seqs = [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    snaps, dh0 = [], []
    for n, (b, bos, eos) in enumerate(seqs):
        length = eos - bos
        # the state after tile t = the state after its last real token
        last_token = [min((t + 1) * tile, length) - 1
                      for t in snapshot_tiles(length, tile, snapshot_every)]
        x = {name: np.asarray(inp[name])[b, bos:eos] for name in ("q", "k", "v", "g", "beta", "do")}
        dht = None if inp["dht"] is None else np.asarray(inp["dht"])[n]
        grads = state_gradients(x["q"], x["k"], x["v"], x["g"], x["beta"], x["do"], dht,
                                last_token + [-1], scale=scale, qk_l2norm=qk_l2norm)
        snaps.append(grads[:-1])
        dh0.append(grads[-1])
    if cu is None:
        return np.stack(snaps), np.stack(dh0)
    return np.concatenate(snaps)[None], np.stack(dh0)
