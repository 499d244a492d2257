"""kernel.row_rstd on the GPU: the rstd of q and k against float64 within the derived bound, and bit for bit
against the kernel's fp32 order in numpy (tests/kernel/row_rstd/model.py says where the two must agree and why),
on shapes that no step of the pass divides, H = 1, one varlen-like [1, total, H, 128] batch and one row; zero
rows (rstd 1000), rows of tiny and huge norms, rows past fp32's range (rstd 0). The same bits from two calls and
from every depth; torch in, torch out on torch's current stream (a side stream too); CuPy in, CuPy out; beside
FLA's l2norm_fwd where fla-core is installed.

FLA's rstd sums the squares in another order (and Triton may take approximate square roots and divisions), so
the two agree within the bound of float64 each, not bit for bit: the test holds their difference within 2 BOUND
and at least 90% of the rows within 2 fp32 ulps of each other."""
from __future__ import annotations

import numpy as np
import pytest

from kernel.row_rstd import DEPTHS, Config, row_rstd

from . import model
from .model import BOUND, D, kernel_order, reference, relative_error

pytestmark = pytest.mark.gpu

SHAPES = {"B x T x H, T of no step": (2, 1000, 3, D), "H = 1": (3, 333, 1, D), "varlen-like": (1, 4099, 5, D),
          "one row": (1, 1, 1, D), "2-D": (7, D)}
FLA_APART = 2 * BOUND     # ours and FLA's, each within about BOUND of float64
FLA_NEAR_ULPS, FLA_NEAR_SHARE = 2, 0.9


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def _on_gpu(x):
    """bf16 values (float32 numpy) -> a torch bf16 CUDA tensor of the same values (exact)."""
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to("cuda").to(torch.bfloat16)


def _inputs(shape, seed: int):
    # q: norms over 2^+-40, k: 2^+-50 (the squares' sum stays within fp32's range), zero rows in both
    return model.rows(shape, seed=seed, span=40.0, zero_every=29), model.rows(shape, seed=seed + 1, span=50.0,
                                                                              zero_every=31)


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request):
    q, k = _inputs(SHAPES[request.param], seed=7)
    qt, kt = _on_gpu(q), _on_gpu(k)
    q_rstd, k_rstd = row_rstd(qt, kt)
    return q, k, q_rstd, k_rstd


def test_the_rstd_is_within_the_bound_of_float64(case):
    q, k, q_rstd, k_rstd = case
    torch = _torch()
    for name, x, got in (("q", q, q_rstd), ("k", k, k_rstd)):
        assert got.dtype == torch.float32 and tuple(got.shape) == x.shape[:-1] and got.is_cuda
        err = relative_error(got.cpu().numpy(), reference(x))
        assert err.max() <= BOUND, f"{name}: worst {err.max():.3e} past {BOUND:.3e}"


def test_the_rstd_is_the_kernels_order_bit_for_bit(case):
    q, k, q_rstd, k_rstd = case
    for name, x, got in (("q", q, q_rstd), ("k", k, k_rstd)):
        normal = model.normal_squares(x)
        assert normal.mean() > 0.98       # nearly every row; the others are held to the bound above
        got, want = got.cpu().numpy()[normal], kernel_order(x)[normal]
        differ = np.flatnonzero(got != want)
        assert differ.size == 0, f"{name}: {differ.size} rows differ from the fp32 model, first {got[differ[0]]} " \
                                 f"against {want[differ[0]]}"


def test_zero_rows_are_one_over_the_root_of_eps(case):
    q, _, q_rstd, _ = case
    zero = np.all(q == 0, axis=-1)
    if not zero.any():
        pytest.skip("no zero row in this shape")
    assert np.all(q_rstd.cpu().numpy()[zero] == np.float32(1) / np.sqrt(np.float32(1e-6)))   # 1000 in fp32


def test_a_row_past_fp32s_range_gets_zero_and_its_neighbours_do_not():
    x = model.rows((4, 9, D), seed=3)
    x[1, 4] = 1e19                        # squares of 1e38, their sum past 3.4e38
    x[2, 0, 0] = 3e19                     # one square alone past it
    x = model.bf16(x)
    q_rstd, k_rstd = row_rstd(_on_gpu(x), _on_gpu(x[::-1].copy()))
    got = q_rstd.cpu().numpy()
    assert got[1, 4] == 0 and got[2, 0] == 0
    np.testing.assert_array_equal(got, kernel_order(x))
    np.testing.assert_array_equal(k_rstd.cpu().numpy(), got[::-1])


def test_two_calls_and_every_depth_give_the_same_bits():
    torch = _torch()
    q, k = (_on_gpu(x) for x in _inputs((2, 777, 3, D), seed=11))
    first = row_rstd(q, k)
    for cfg in [None, *(Config(depth=d) for d in DEPTHS)]:
        again = row_rstd(q, k, config=cfg)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), cfg


def test_the_outputs_are_torchs_on_its_current_stream():
    # on a side stream, q and k are written after a wait of ~50 ms of GPU time and the pass is asked for at once:
    # launched anywhere but on that stream it would read them before they are written
    torch = _torch()
    q, k = _inputs((2, 3000, 4, D), seed=13)
    src_q, src_k = _on_gpu(q), _on_gpu(k)
    dst_q, dst_k = torch.zeros_like(src_q), torch.zeros_like(src_k)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        dst_q.copy_(src_q)
        dst_k.copy_(src_k)
        q_rstd, k_rstd = row_rstd(dst_q, dst_k)
        assert torch.cuda.current_stream() == side
    side.synchronize()
    # torch's allocator holds them: each lies in one of its segments (a count of memory_allocated() before and
    # after also saw the allocator free a small block of its own in between)
    segments = [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()]
    for x in (q_rstd, k_rstd):
        assert any(lo <= x.data_ptr() and x.data_ptr() + x.numel() * 4 <= hi for lo, hi in segments)
    np.testing.assert_array_equal(q_rstd.cpu().numpy(), kernel_order(q))
    np.testing.assert_array_equal(k_rstd.cpu().numpy(), kernel_order(k))


def test_cupy_in_cupy_out():
    import cupy

    from kernel.runtime.arrays import bf16_bits

    q, k = _inputs((3, 50, 2, D), seed=17)
    q_rstd, k_rstd = row_rstd(cupy.asarray(bf16_bits(q)), cupy.asarray(bf16_bits(k)))
    assert isinstance(q_rstd, cupy.ndarray) and q_rstd.dtype == np.float32 and q_rstd.shape == (3, 50, 2)
    np.testing.assert_array_equal(q_rstd.get(), kernel_order(q))
    np.testing.assert_array_equal(k_rstd.get(), kernel_order(k))


def test_no_rows_give_empty_outputs():
    torch = _torch()
    q = torch.zeros(2, 0, 3, D, dtype=torch.bfloat16, device="cuda")
    q_rstd, k_rstd = row_rstd(q, q.clone())
    assert tuple(q_rstd.shape) == (2, 0, 3) and tuple(k_rstd.shape) == (2, 0, 3)


def test_real_tensors_are_refused_by_name():
    torch = _torch()
    q = torch.zeros(2, 16, 3, D, dtype=torch.bfloat16, device="cuda")
    odd = torch.zeros(2 * 16 * 3 * D + 4, dtype=torch.bfloat16, device="cuda")[4:].view(2, 16, 3, D)   # 8 bytes in
    with pytest.raises(ValueError, match=r"k's data must be 16-byte aligned"):
        row_rstd(q, odd)
    with pytest.raises(ValueError, match=r"q must be C-contiguous"):
        row_rstd(q.transpose(1, 2), q.transpose(1, 2))
    with pytest.raises(TypeError, match=r"k must be bf16 .* got float32"):
        row_rstd(q, q.float())
    with pytest.raises(ValueError, match=r"k must have q's shape"):
        row_rstd(q, q[:, :8].contiguous())


@pytest.mark.fla
def test_beside_flas_l2norm_rstd():
    _torch()
    l2norm = pytest.importorskip("fla.modules.l2norm", reason="fla-core is not installed")
    q, k = _inputs((2, 1000, 3, D), seed=19)
    qt, kt = _on_gpu(q), _on_gpu(k)
    ours = row_rstd(qt, kt)
    for name, x, xt, got in (("q", q, qt, ours[0]), ("k", k, kt, ours[1])):
        _, fla_rstd = l2norm.l2norm_fwd(xt)
        fla_rstd = fla_rstd.float().reshape(x.shape[:-1]).cpu().numpy()
        got = got.cpu().numpy()
        apart = relative_error(got, fla_rstd)
        ulps = model.ulps_apart(got, fla_rstd)
        near = float(np.mean(ulps <= FLA_NEAR_ULPS))
        stats = f"{name}: worst {apart.max():.3e}, {ulps.max()} ulps; {near:.4f} within {FLA_NEAR_ULPS} ulps; " \
                f"FLA's worst from float64 {relative_error(fla_rstd, reference(x)).max():.3e}"
        assert apart.max() <= FLA_APART, stats
        assert near >= FLA_NEAR_SHARE, stats
