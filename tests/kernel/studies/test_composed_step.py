"""kernel.studies.b1_composition.composed_step: the composed scan's serial step on the GPU,
and its host side.

CPU: the operand blocks and snapshot orders the kernels read and write, and that the steps
built by compose.lowrank_steps reproduce compose.emulate(mode="lowrank") exactly. GPU: both
kernels against that emulation and the float64 reference on a random sequence."""
import ml_dtypes
import numpy as np
import pytest

from kernel.reference import prepare_tiles, random_inputs
from kernel.studies.b1_composition import compose, composed_step as cs


def test_a_packed_block_holds_the_step_for_its_v_columns():
    rng = np.random.default_rng(1)
    D, U, W, B = (rng.standard_normal(s).astype(np.float32) for s in ((128,), (128, 64), (64, 128), (128, 128)))
    block = cs.pack_step(D, U, W, B, vs=2)
    assert block.dtype == np.uint8 and block.size == cs.OPERAND_BYTES == 74240   # the .cu static_asserts 74,240
    f = cs.unpack_step(block)
    as_bf16 = lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(f["w_rk"], as_bf16(W))
    assert np.array_equal(f["negu_kr"], -as_bf16(U))
    assert np.array_equal(f["d"], D)
    assert np.array_equal(f["b_kv"], B[:, 64:96]) and np.array_equal(f["bt_vk"], B[:, 64:96].T)


def test_a_partial_step_is_refused():
    with pytest.raises(ValueError, match="full 4-tile step"):
        cs.pack_step(np.ones(128, np.float32), np.ones((128, 48), np.float32), np.ones((48, 128), np.float32),
                     np.ones((128, 128), np.float32), vs=0)


@pytest.mark.parametrize("kernel", cs.KERNELS)
def test_each_snapshot_order_names_every_element_once(kernel):
    idx = cs.snapshot_index(kernel)
    assert idx.shape == (4096, 2)
    seen = np.zeros((32, 128), int)
    np.add.at(seen, (idx[:, 0], idx[:, 1]), 1)
    assert (seen == 1).all()


def test_decoding_inverts_the_snapshot_order():
    rng = np.random.default_rng(2)
    want = rng.standard_normal((3, 2, 32, 128)).astype(np.float32)
    want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    for kernel in cs.KERNELS:
        idx = cs.snapshot_index(kernel)
        flat = want[:, :, idx[:, 0], idx[:, 1]].astype(ml_dtypes.bfloat16).view(np.uint16).ravel()
        assert np.array_equal(cs.decode_snapshots(flat.view(np.uint32), kernel, 3, 2), want)


def test_lowrank_steps_reproduce_the_emulation_exactly():
    raw = random_inputs(1, 256, 1, seed=4)
    gc, mqk, inv = prepare_tiles(raw["q"], raw["k"], raw["g"], raw["beta"])
    tiles = compose.tile_operands(raw["q"][0, :, 0], raw["k"][0, :, 0], gc[0, :, 0], raw["beta"][0, :, 0],
                                  mqk[0, :, 0], inv[0, :, 0], raw["do"][0, :, 0])
    dS0 = np.asarray(raw["dht"][0, 0], np.float64)
    snaps, dh0 = compose.emulate(tiles, dS0, 4, mode="lowrank")
    steps = compose.lowrank_steps(tiles, 4)
    assert len(steps) == 4 and all(s[1].shape == (128, 64) for s in steps)
    dS = dS0.astype(np.float32)
    mine = []
    for D, U, W, B in steps:            # the kernels' step, in walk order (the last group first)
        mine.append(dS.astype(np.float64))
        bf = compose.bf16
        dS = D[:, None] * dS - bf(U) @ bf(bf(W) @ bf(dS)) + B
    assert np.array_equal(np.stack(mine[::-1]), snaps)
    assert np.array_equal(dS.astype(np.float64), dh0)


def test_check_needs_whole_64_token_steps():
    with pytest.raises(ValueError, match="multiple of 64"):
        cs.check(T=100)


def test_without_a_gpu_it_says_so(capsys):
    from ptx_lab.gpu import gpu_reason

    if gpu_reason() is None:
        pytest.skip("a GPU is present: the CPU-only message does not apply")
    assert cs.main([]) == 2
    assert "needs an sm_90 GPU" in capsys.readouterr().out


@pytest.mark.gpu
def test_both_kernels_match_the_emulation_and_the_reference():
    rows = cs.check(T=1024, heads=2, seed=5)
    assert [r["kernel"] for r in rows] == list(cs.KERNELS)
    for r in rows:
        assert r["passed"], r
        assert r["dh0_vs_emulation"] < 2e-3, r


@pytest.mark.gpu
def test_companion_warps_count_their_work_and_leave_the_chain_bit_identical():
    import cupy

    ctas, nsteps = 2, 64
    steps, dsT_in = cs.resident_operands(ctas)
    outs = []
    for companions, flags, per_round in ((0, 0, 1), (8, 0, 32), (4, cs.STEP_WGMMA_COMPANIONS, 64)):
        dsT_out = cupy.zeros((ctas, 32, 128), cupy.float32)
        hmma = cupy.zeros(ctas * cs.MAX_COMPANIONS, cupy.uint64)
        cs._launch("composed_step_mma", steps, nsteps, cs.STEP_SNAPSHOT | flags, dsT_in, dsT_out,
                   cupy.zeros(ctas * nsteps * 2048, cupy.uint32), cupy.zeros(9 * ctas, cupy.int64), ctas,
                   companions, hmma)
        outs.append(dsT_out.get())
        counts = hmma.get().reshape(ctas, cs.MAX_COMPANIONS)
        assert (counts[:, :companions] > 0).all() and (counts[:, companions:] == 0).all()
        assert (counts[:, :companions] % per_round == 0).all()      # whole rounds
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
