"""The bench's inputs: raw tensors on the GPU, Kernel A's tile inputs, the snapshot-row map.

Both kernels get the same raw q, k, v, g, beta, do, dht, drawn by torch on the GPU
with the recipe of ``kernel.reference.random_inputs``. Kernel A also needs its tile
inputs gc, mqk, inv (docs/kernel_a.md, section 2), built here in fp32 on the GPU: the float64
``kernel.reference.prepare_tiles`` would need ~100 GB at 32x8192x32.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from kernel import reference as ref
from kernel.shapes import HEAD_DIM, TILE_TOKENS
from kernel.reference import L2NORM_EPS, LN2, snapshot_offsets
from kernel.reference.dstate_scan import tile_table

from .configs import Config


def every_k_rows(lengths: Sequence[int], every: int) -> np.ndarray:
    """Rows of the every-tile snapshot axis that form the every-`every`-tiles one.

    Snapshot m of a sequence with n_t tiles is the one of tile min(every*m + every - 1,
    n_t - 1); both axes are packed per sequence (``kernel.reference.snapshot_offsets``,
    FLA's chunk_offsets)."""
    per_tile = snapshot_offsets(lengths, TILE_TOKENS, 1)
    per_k = snapshot_offsets(lengths, TILE_TOKENS, every)
    n_t, n_s = np.diff(per_tile), np.diff(per_k)
    seq = np.repeat(np.arange(n_t.size), n_s)
    m = np.arange(int(per_k[-1])) - per_k[seq]
    return per_tile[seq] + np.minimum(every * m + every - 1, n_t[seq] - 1)


# the gate recipes make_inputs draws (the first is the default)
GATE_RECIPES = ("clamped", "trained-layer")


def make_inputs(cfg: Config, H: int, *, seed: int, gate_strength: float, gates: str = "clamped",
                projection_scale: float | None = None, device: str = "cuda") -> dict:
    """Raw inputs for both kernels, drawn on the GPU with the recipe of
    ``kernel.reference.random_inputs`` (not its random stream: numpy at these
    sizes would take minutes). q, k, v, do bf16; g, beta, dht fp32.

        q, k, v ~ N(0, 1); do ~ 0.1 N(0, 1); beta = sigmoid(N(0, 1));
        g = clip(gate_strength * logsigmoid(N(3, 1)), -5, 0); dht ~ 0.1 N(0, 1)

    ``gates="trained-layer"``: g is instead :func:`kernel.tools.trained_layer_gate.trained_layer_gate`'s
    activated gate (FLA's layer at its defaults, the projection grown ``projection_scale`` times,
    default the recipe's), drawn on ``device``, unbounded below.
    """
    import torch

    if gates not in GATE_RECIPES:
        raise ValueError(f"gates must be one of {GATE_RECIPES}, got {gates!r}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shape = (cfg.B, cfg.T, H, HEAD_DIM)
    bf16, f32 = torch.bfloat16, torch.float32

    def randn(shp, dtype):
        return torch.randn(shp, generator=gen, device=device, dtype=dtype)

    q, k, v = randn(shape, bf16), randn(shape, bf16), randn(shape, bf16)
    g = randn(shape, f32)   # drawn for either recipe, so that beta, do and dht are the same draws
    if gates == "clamped":
        g = torch.nn.functional.logsigmoid(g.add_(ref.GATE_LOGIT_MEAN)).mul_(gate_strength).clamp_(
            ref.GATE_LOWER_BOUND, 0.0)
    else:
        from kernel.tools.trained_layer_gate import PROJECTION_SCALE, trained_layer_gate

        scale = PROJECTION_SCALE if projection_scale is None else projection_scale
        lengths = list(cfg.lengths) if cfg.varlen else None
        g = trained_layer_gate(cfg.B, cfg.T, H, H, lengths=lengths, seed=seed, projection_scale=scale,
                               device=device)["g"].reshape(shape).contiguous()
    beta = torch.sigmoid(randn(shape[:3], f32))
    do = randn(shape, bf16).mul_(ref.DO_SCALE)
    dht = randn((cfg.N, H, HEAD_DIM, HEAD_DIM), f32).mul_(ref.DHT_SCALE)
    cu = np.concatenate([[0], np.cumsum(cfg.lengths)]).astype(np.int64) if cfg.varlen else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "do": do, "dht": dht, "cu_seqlens": cu}


def cu_for_kernel_a(cu):
    """cu_seqlens as Kernel A takes it in a timed call: host int64 (a device tensor would
    cost dstate_scan a device-to-host copy, a stream sync, inside every call)."""
    return None if cu is None else np.asarray(cu, dtype=np.int64)


def cu_for_fla(cu):
    """cu_seqlens as FLA takes it: an int64 torch tensor on the GPU."""
    import torch
    return None if cu is None else torch.as_tensor(cu, dtype=torch.int64, device="cuda")


def slice_inputs(raw: dict, cfg: Config, heads: int, seqs: int | None) -> tuple[dict, list[int]]:
    """The first `heads` heads (and the first `seqs` sequences) of `raw` as new contiguous
    tensors, and their lengths."""
    lengths = list(cfg.lengths)
    out = {}
    if seqs is not None and seqs < cfg.N:
        if cfg.varlen:
            n_tok = int(sum(lengths[:seqs]))
            tsl, bsl = slice(0, n_tok), slice(0, 1)
        else:
            tsl, bsl = slice(0, cfg.T), slice(0, seqs)
        lengths = lengths[:seqs]
    else:
        tsl, bsl = slice(None), slice(None)
    for key in ("q", "k", "v", "g", "do"):
        out[key] = raw[key][bsl, tsl, :heads].contiguous()
    out["beta"] = raw["beta"][bsl, tsl, :heads].contiguous()
    out["dht"] = raw["dht"][: len(lengths), :heads].contiguous()
    out["cu_seqlens"] = (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                         if cfg.varlen else None)
    out["cu_a"] = cu_for_kernel_a(out["cu_seqlens"])
    return out, lengths


def build_tiles(q, k, g, beta, *, lengths: Sequence[int], scale: float | None = None,
                qk_l2norm: bool = True, out_dtype=None, max_elems: int = 1 << 27):
    """Kernel A's tile inputs (docs/kernel_a.md, section 2) from raw q, k, g, beta, in fp32 on the GPU.

    q, k, g [B, T, H, K] (packed [1, total, ...] when `lengths` has several ragged
    sequences), beta [B, T, H]. Returns gc fp32 [B, T, H, K] and mqk, inv [B, T, H, TILE_TOKENS]
    in `out_dtype` (default bf16, what dstate_scan takes). The same math as
    ``kernel.reference.prepare_tiles``, but fp32 and in slices of at most
    `max_elems` elements of the [tiles, heads, C, C, K] decay tensor, so it fits
    next to the 32x8192x32 inputs.
    """
    import torch

    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    B, T, H, K = q.shape
    C = TILE_TOKENS
    total = B * T
    if int(sum(lengths)) != total:
        raise ValueError(f"lengths sum to {int(sum(lengths))}, inputs hold {total} tokens")
    s = float(scale) if scale is not None else K ** -0.5
    dev = q.device
    qf, kf, gf = (x.reshape(total, H, K) for x in (q, k, g))
    bf = beta.reshape(total, H)
    gc_out = torch.empty(total, H, K, dtype=torch.float32, device=dev)
    mqk_out = torch.empty(total, H, C, dtype=out_dtype, device=dev)
    inv_out = torch.empty(total, H, C, dtype=out_dtype, device=dev)

    start, length = tile_table(lengths, C)
    n_tiles = start.size
    per_tile_head = C * C * K
    hg = max(1, min(H, max_elems // per_tile_head))              # heads per slice
    tg = max(1, max_elems // (per_tile_head * hg))                # tiles per slice
    lane = np.arange(C)
    le = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev))          # j <= c
    lt = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dev), -1)      # j <  c
    eye = torch.eye(C, dtype=torch.float32, device=dev)

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False     # the batched mat-vecs below stay fp32
    try:
        for t0 in range(0, n_tiles, tg):
            st, ln = start[t0:t0 + tg], length[t0:t0 + tg]
            tok0, tok1 = int(st[0]), int(st[-1] + ln[-1])        # tiles cover tokens tok0..tok1-1
            idx_np = np.minimum(st[:, None] + lane, tok1 - 1) - tok0
            valid_np = lane[None, :] < ln[:, None]                 # [nt, C]
            idx = torch.from_numpy(idx_np.reshape(-1)).to(dev)
            valid = torch.from_numpy(valid_np).to(dev)
            nt = st.size
            for h0 in range(0, H, hg):
                h1 = min(H, h0 + hg)

                def gather(x):  # [tok, H, ...] -> [nt, C, h, ...] fp32, padded rows zero
                    t = x[tok0:tok1, h0:h1].index_select(0, idx).float()
                    t = t.reshape((nt, C) + tuple(t.shape[1:]))
                    return t * valid.reshape((nt, C) + (1,) * (t.dim() - 2))

                qt, kt, gt, bt = gather(qf), gather(kf), gather(gf), gather(bf)
                if qk_l2norm:
                    qt = qt * torch.rsqrt((qt * qt).sum(-1, keepdim=True) + L2NORM_EPS)
                    kt = kt * torch.rsqrt((kt * kt).sum(-1, keepdim=True) + L2NORM_EPS)
                gct = torch.cumsum(gt, dim=1) / LN2                 # [nt, C, h, K]
                qh, kh, gh = (x.permute(0, 2, 1, 3) for x in (qt, kt, gct))   # [nt, h, C, K]
                # E[c, j, d] = exp2(gc[c,d] - gc[j,d]) for j <= c (masked to -inf first:
                # a positive exponent above the diagonal could overflow)
                E = gh[:, :, :, None, :] - gh[:, :, None, :, :]    # [nt, h, C(c), C(j), K]
                E.masked_fill_(~le[:, :, None], -math.inf).exp2_()
                P = E.mul_(kh[:, :, None, :, :])                    # k[j, d] E[c, j, d]
                mqk = torch.matmul(P, qh[..., None])[..., 0].mul_(s)          # [nt, h, C, C]
                kk = torch.matmul(P, kh[..., None])[..., 0]
                del E, P
                lkk = kk.masked_fill_(~lt, 0.0).mul_(bt.permute(0, 2, 1)[..., None])
                inv = torch.linalg.solve_triangular(eye + lkk, eye.expand_as(lkk).contiguous(),
                                                    upper=False, unitriangular=True)
                # back to token order: tile row c lives at the tile's token c
                gc_out[tok0:tok1, h0:h1] = gct[valid]
                mqk_out[tok0:tok1, h0:h1] = mqk.permute(0, 2, 1, 3)[valid].to(out_dtype)
                inv_out[tok0:tok1, h0:h1] = inv.permute(0, 2, 1, 3)[valid].to(out_dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return (gc_out.reshape(B, T, H, K), mqk_out.reshape(B, T, H, C),
            inv_out.reshape(B, T, H, C))


def chunk_gate(g):
    """The per-token natural-log gate [B, T, H, D] as FLA's forward keeps it: its cumsum within each
    64-token chunk, in log2 units."""
    import torch

    B, T, H, D = g.shape
    pad = -T % 64
    g = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, pad)).view(B, -1, 64, H, D)
    return (g.cumsum(2) / 0.6931471805599453).view(B, T + pad, H, D)[:, :T].contiguous()
