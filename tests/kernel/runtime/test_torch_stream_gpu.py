"""kernel.runtime.arrays.torch_stream_for_cupy on the GPU: CuPy launches on torch's current stream, without
CuPy's deprecation of ExternalStream."""
from __future__ import annotations

import warnings

import pytest

from kernel.runtime.arrays import torch_stream_for_cupy

pytestmark = pytest.mark.gpu


def test_cupy_launches_on_torchs_current_stream_and_orders_with_it():
    torch = pytest.importorskip("torch")
    import cupy

    side = torch.cuda.Stream()
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        x = torch.zeros(1 << 24, device="cuda")
        torch.cuda._sleep(50_000_000)   # keeps the side stream busy, so an unordered launch would overtake it
        x.fill_(1.0)
        with torch_stream_for_cupy():
            assert cupy.cuda.get_current_stream().ptr == side.cuda_stream
            y = cupy.asarray(x) * 2    # CuPy's work queued behind torch's on the same stream
        z = torch.as_tensor(y, device="cuda")
    side.synchronize()
    assert float(z.min()) == 2.0 and float(z.max()) == 2.0
    assert cupy.cuda.get_current_stream().ptr != side.cuda_stream   # the block restored CuPy's stream
