"""ptx-lab bench's timing on the GPU (torch): calls in turn, and the GPU timed, not the host."""
import pytest

pytestmark = pytest.mark.gpu


def test_bench_times_kernels_in_turn():
    """time_alternating: every function once per round, forward then backward,
    and each one's own time (a 4096^3 matmul is slower than adding 1 to a 4 MB vector)."""
    torch = pytest.importorskip("torch")
    from kernel.tools.bench import timing

    vec = torch.zeros(1 << 20, device="cuda")
    mat = torch.randn(4096, 4096, device="cuda")
    order = []
    res = timing.time_alternating({"add": lambda: vec.add_(1), "matmul": lambda: mat @ mat},
                                  warmup=1, reps=3, record=order)
    assert order == ["add", "matmul", "matmul", "add", "add", "matmul"]
    assert set(res) == {"add", "matmul"}
    assert all(r["reps"] == 3 and 0 < r["min_ms"] <= r["median_ms"] for r in res.values())
    assert res["matmul"]["median_ms"] > res["add"]["median_ms"]
    assert float(vec[0]) == 1 + 3   # the warm-up call and the three timed ones


def test_bench_times_the_gpu_not_the_host():
    """time_cuda queues GPU work ahead of each call, so a call's host time (here 1 ms of
    time.sleep before a tiny kernel) stays out of the event time and shows up as host_ms."""
    torch = pytest.importorskip("torch")
    import time

    from kernel.tools.bench import timing

    vec = torch.zeros(1 << 10, device="cuda")

    def slow_host():
        time.sleep(1e-3)
        return vec.add_(1)

    res = timing.time_cuda(slow_host, warmup=1, reps=5)
    assert res["host_ms"] >= 1.0
    assert res["median_ms"] < 0.5, res
