"""kernel.tools.cudnn_kda on the CPU, with a stand-in for cuDNN's op: the layouts it is given (THD
tokens, int32 cu_seqlens, [N, H, V, K] states, q and k l2-normalised as FLA does, fp32 g and beta)
and the layouts handed back (FLA's), gradients flowing to every leaf; and the reason it gives where
cuDNN frontend is not installed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel.tools import cudnn_kda  # noqa: E402


def test_without_cudnn_frontend_it_says_what_is_missing(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cudnn(name, *a, **k):
        if name.startswith("cudnn"):
            raise ImportError("No module named 'cudnn'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cudnn)
    why = cudnn_kda.missing_requirement()
    assert "is missing" in why and "pip install nvidia-cudnn-frontend" in why


@pytest.mark.parametrize("lengths", [None, [3, 9]])
def test_a_step_hands_cudnn_its_layouts_and_gives_back_flas(monkeypatch, lengths):
    B, T, H, K = (2, 6, 2, 128) if lengths is None else (1, 12, 2, 128)
    N = B if lengths is None else len(lengths)
    gen = torch.Generator().manual_seed(0)
    raw = {"q": torch.randn(B, T, H, K, generator=gen).bfloat16(), "k": torch.randn(B, T, H, K, generator=gen).bfloat16(),
           "v": torch.randn(B, T, H, K, generator=gen).bfloat16(), "g": -torch.rand(B, T, H, K, generator=gen),
           "beta": torch.rand(B, T, H, generator=gen).bfloat16()}
    h0 = torch.randn(N, H, K, K, generator=gen)
    cu = None if lengths is None else torch.tensor([0, 3, 12])
    seen = {}

    def stand_in(q, k, v, g, beta, cu_seqlens, *, initial_state, output_final_state):
        seen.update(q=q, k=k, v=v, g=g, beta=beta, cu=cu_seqlens, h0=initial_state, final=output_final_state)
        return v * 2, initial_state * 3      # o like v; the final state in cuDNN's [N, H, V, K]

    monkeypatch.setattr(cudnn_kda, "import_kda", lambda: stand_in)
    step = cudnn_kda.step_inputs(raw, h0=h0, cu_seqlens=cu)
    o, ht = step["forward"](step["leaves"])
    assert seen["q"].shape == (B * T, H, K) and seen["v"].shape == (B * T, H, K) and seen["beta"].shape == (B * T, H)
    assert seen["g"].dtype == seen["beta"].dtype == torch.float32 and seen["final"] is True
    assert seen["cu"].dtype == torch.int32 and seen["cu"].tolist() == ([0, 6, 12] if lengths is None else [0, 3, 12])
    assert seen["h0"].is_contiguous() and torch.equal(seen["h0"], h0.transpose(-1, -2))
    xf = raw["q"].float()
    want = (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).bfloat16().reshape(B * T, H, K)
    assert torch.equal(seen["q"], want)
    assert o.shape == (B, T, H, K) and torch.equal(ht, 3 * h0)        # FLA's layouts back
    grads = torch.autograd.grad((o.float().sum() + ht.sum()), [step["leaves"][n] for n in ("q", "v", "initial_state")],
                                allow_unused=True)
    assert grads[0] is None and torch.equal(grads[1], torch.full_like(raw["v"], 2.0))   # q unused by the stand-in
    assert torch.equal(grads[2], torch.full_like(h0, 3.0))
