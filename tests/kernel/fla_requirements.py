"""What the GPU tests of kernel.chunk_kda need, checked in one place: each missing piece skips the test
with its name."""
from __future__ import annotations

import pytest


def skip_without_fla_gpu(*, layers: bool = False) -> None:
    """Skip unless torch sees a CUDA device, fla-core 0.6.0 (with triton) and CuPy import, and, with
    ``layers``, flash-linear-attention's ``fla.layers`` (which imports transformers) does too."""
    torch = pytest.importorskip("torch", reason="kernel.chunk_kda needs torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    pytest.importorskip("triton", reason="fla-core needs triton")
    if layers:
        pytest.importorskip("transformers", reason="fla.layers imports transformers, which is not installed")
        pytest.importorskip("fla.layers.kda", reason="flash-linear-attention 0.6.0 (fla.layers) is not installed")
    else:
        pytest.importorskip("fla.ops.kda", reason="fla-core 0.6.0 is not installed")
    pytest.importorskip("cupy", reason="our backward needs CuPy")
