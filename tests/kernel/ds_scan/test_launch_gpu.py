"""Kernel A on the GPU against the float64 reference (kernel.tools.check's cases), and its API's errors."""
import numpy as np
import pytest

from kernel.tools import check

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", check.CASES, ids=lambda c: c.name)
def test_matches_float64_reference(case):
    r = check.run_case(case)
    assert not r["nan"], f"{case.name}: NaN in the output (an element was not written?)"
    assert r["snapshots"] < check.BOUND, r
    assert r["worst_snapshot"] < check.BOUND, r
    assert r["dh0"] < check.BOUND, r
    assert r["deterministic"], f"{case.name}: two runs on the same inputs differ"


def _good_inputs(B=1, T=40, H=2):
    kern, _ = check.inputs(check.Case("api", B=B, T=T, H=H))
    return kern


def _call(kern, **over):
    from kernel.ds_scan.launch import dstate_scan

    args = {**kern, **over}
    return dstate_scan(args["q"], args["k"], args["gc"], args["beta"], args["mqk"], args["inv"], args["do"],
                       dht=args["dht"], cu_seqlens=args["cu_seqlens"])


def test_bad_inputs_name_the_argument():
    import cupy

    kern = _good_inputs()
    with pytest.raises(ValueError, match="k must have shape"):
        _call(kern, k=kern["k"][:, :-1])
    with pytest.raises(TypeError, match="gc must be float32"):
        _call(kern, gc=kern["gc"].astype(np.float64))
    with pytest.raises(TypeError, match="q must hold|q must be bf16"):
        _call(kern, q=kern["q"].astype(np.float32))
    with pytest.raises(ValueError, match="do must be C-contiguous"):
        _call(kern, do=cupy.asfortranarray(kern["do"]))
    with pytest.raises(TypeError, match="mqk must be a cupy.ndarray"):
        _call(kern, mqk=kern["mqk"].get())
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        _call(kern, cu_seqlens=np.array([1, 40]))
    with pytest.raises(ValueError, match="cu_seqlens must be strictly increasing"):
        _call(kern, cu_seqlens=np.array([0, 20, 20, 40]))
    with pytest.raises(ValueError, match="cu_seqlens must end at the total length 40"):
        _call(kern, cu_seqlens=np.array([0, 20, 39]))
    with pytest.raises(ValueError, match="dht must have shape"):
        _call(kern, dht=cupy.zeros((2, 2, 128, 128), dtype=np.float32))
    from kernel.ds_scan.launch import dstate_scan

    with pytest.raises(ValueError, match="snapshot_every must be 1 or 4"):
        dstate_scan(kern["q"], kern["k"], kern["gc"], kern["beta"], kern["mqk"], kern["inv"], kern["do"],
                    snapshot_every=2)
    with pytest.raises(ValueError, match="q's head dimension must be 128"):
        _call(kern, q=kern["q"][..., :64].copy())


def _as_torch(kern: dict, torch) -> dict:
    """The CuPy inputs as torch tensors on the same memory, bf16 ones as torch.bfloat16."""
    as_t = {n: torch.from_dlpack(v) for n, v in kern.items() if n != "cu_seqlens" and v is not None}
    for n in ("q", "k", "do", "mqk", "inv"):
        as_t[n] = as_t[n].view(torch.int16).view(torch.bfloat16)
    return as_t


def test_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    from kernel.ds_scan.launch import dstate_scan

    kern = _good_inputs()
    as_t = _as_torch(kern, torch)
    s_t, d_t = dstate_scan(as_t["q"], as_t["k"], as_t["gc"], as_t["beta"], as_t["mqk"], as_t["inv"], as_t["do"],
                           dht=as_t["dht"], snapshot_dtype="bfloat16", snapshot_every=4)
    s_c, d_c = dstate_scan(kern["q"], kern["k"], kern["gc"], kern["beta"], kern["mqk"], kern["inv"], kern["do"],
                           dht=kern["dht"], snapshot_dtype="bfloat16", snapshot_every=4)
    assert isinstance(s_t, torch.Tensor) and s_t.dtype == torch.bfloat16 and s_t.is_cuda
    assert torch.equal(s_t.view(torch.int16).cpu(), torch.from_numpy(s_c.get().view(np.int16)))
    assert torch.equal(d_t.cpu(), torch.from_numpy(d_c.get()))


def test_torch_inputs_are_checked_like_cupy_ones():
    """torch tensors are viewed in place (no DLPack): the layout and device checks still name the argument."""
    torch = pytest.importorskip("torch")
    from kernel.ds_scan.launch import dstate_scan

    as_t = _as_torch(_good_inputs(), torch)
    args = lambda **over: [over.get(n, as_t[n]) for n in ("q", "k", "gc", "beta", "mqk", "inv", "do")]
    swapped = as_t["do"].transpose(1, 2).contiguous().transpose(1, 2)   # same shape, not C-contiguous
    with pytest.raises(ValueError, match="do must be C-contiguous"):
        dstate_scan(*args(do=swapped))
    with pytest.raises(TypeError, match="gc must be a CUDA tensor"):
        dstate_scan(*args(gc=as_t["gc"].cpu()))
    with pytest.raises(TypeError, match="beta must be float32 or bf16"):
        dstate_scan(*args(beta=as_t["beta"].double()))


@pytest.mark.parametrize("producers, split", [(4, 0), (8, 1), (16, 1)])
def test_the_launched_build_moves_registers_where_it_should(producers, split):
    # The API's NVRTC build must target sm_90a (ptx_lab.gpu.arch_options): on plain sm_90
    # setmaxnreg is compiled out, and the 8 or 16 producers' build spills.
    from kernel.ds_scan import config, launch
    from kernel.runtime import builds

    cfg = config.Config(vsplit=1, snap_bf16=True, snap_every=4, producers=producers)
    (reg_split,) = builds.read_int_constants(launch.module(cfg), "kda_reg_split", 1)
    assert reg_split == split
    attrs = launch.kernel(cfg)[0].attributes
    assert attrs["local_size_bytes"] == 0, attrs


@pytest.mark.parametrize("vsplit, wgmma", [(1, 1), (2, 1), (4, 0)])
def test_the_launched_build_runs_g4_g5_as_wgmma_where_it_should(vsplit, wgmma):
    # WGMMA is compiled out of a plain sm_90 build: the API's NVRTC build (sm_90a) must keep it
    # wherever config.Config turns it on (the consumers are one warpgroup).
    from kernel.ds_scan import config, launch
    from kernel.runtime import builds

    cfg = config.Config(vsplit=vsplit, snap_bf16=True, snap_every=4)
    assert cfg.wgmma == wgmma
    (on,) = builds.read_int_constants(launch.module(cfg), "kda_wgmma", 1)
    assert on == wgmma
    assert launch.kernel(cfg)[0].attributes["local_size_bytes"] == 0


GVA_RUNS = [dict(vsplit=2), dict(vsplit=1, tuning={"loads": 2, "snap_store": 3}),
            dict(vsplit=4, tuning={"loads": 2}), dict(vsplit="auto", segments=3)]


@pytest.mark.parametrize("run", GVA_RUNS, ids=["cp.async", "tma-loads-and-store", "tma-loads", "split"])
def test_grouped_value_heads_read_q_and_k_in_place(run):
    # FLA's GVA: q and k with 2 heads for 6 value heads. Read in place (cp.async rows of their own
    # stride, or tensor copies from maps of 2 heads), they must give the bits of q and k repeated
    # per value head (kernel.tools.check's gva cases hold both to float64)
    import cupy

    from kernel.ds_scan.launch import dstate_scan

    kern, _ = check.inputs(check.Case("gva", lengths=(1, 17, 700, 64), H=6, seed=43, group=3))
    assert kern["q"].shape[2] == 2

    def scan(q, k):
        return dstate_scan(q, k, kern["gc"], kern["beta"], kern["mqk"], kern["inv"], kern["do"], dht=kern["dht"],
                           cu_seqlens=kern["cu_seqlens"], **run)

    native = scan(kern["q"], kern["k"])
    repeated = scan(*(cupy.repeat(kern[n], 3, axis=2) for n in ("q", "k")))
    for name, a, b in zip(("snapshots", "dh0"), native, repeated):
        assert a.shape == b.shape and cupy.array_equal(a, b), name


@pytest.mark.parametrize("segments", [1, 3])
def test_out_is_written_in_place_with_the_bits_of_a_call_that_allocates(segments):
    import cupy

    from kernel.ds_scan.launch import launch, output_shapes

    kern, _ = check.inputs(check.Case("out", lengths=(17, 700, 64), H=2, seed=5))
    args = [kern[n] for n in ("q", "k", "gc", "beta", "mqk", "inv", "do")]
    kw = dict(dht=kern["dht"], cu_seqlens=kern["cu_seqlens"], snapshot_dtype="bfloat16", segments=segments)
    want = launch(*args, **kw)
    shapes = output_shapes(1, 2, cupy.asnumpy(kern["cu_seqlens"]).astype(np.int64), 1, varlen=True)
    out = {"snapshots": cupy.zeros(shapes["snapshots"], np.uint16), "dh0": cupy.zeros(shapes["dh0"], np.float32)}
    got = launch(*args, **kw, out=out)
    assert got[0] is out["snapshots"] and got[1] is out["dh0"]
    for name, a, b in zip(("snapshots", "dh0"), want, got):
        assert a.shape == b.shape and cupy.array_equal(a, b), name
