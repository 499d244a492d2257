"""ptx-lab bench --layer on the GPU (torch, fla-core, flash-linear-attention, CuPy): one small
configuration measured in this process (the layer's step, then the op's backward alone, FLA's, ours
and ours bare), and the layer's module and kernel.kda_backward.run left as they were."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.fla]


@pytest.mark.parametrize("config", ["2x256", "varlen8x1000"])
def test_one_small_configuration_is_measured(config):
    pytest.importorskip("torch")
    from kernel.tools.bench import cli, layer, layer_report
    from kernel.tools.bench.configs import parse_config
    from kernel.tools.bench.timing import L2_FLUSH_BYTES

    why = layer.missing_requirement()
    if why:
        pytest.skip(why)
    import fla.layers.kda as layer_module
    import torch

    original = layer_module.chunk_kda
    args = cli.parse_args(["--layer", "--in-process", "--configs", config, "--heads", "2", "--hidden", "256",
                           "--reps", "2", "--warmup", "1"])
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    res = layer.bench_layer_config(parse_config(config), args, flush)
    assert res["our_forward"] == "ours"      # kernel.chunk_kda on our forward, the default of --our-forward
    for side in layer.SIDES:
        assert res["layer"][side]["median_ms"] > 0 and res["peak_memory"][side]["bytes"] > 0, res
    assert res["ratio"] == pytest.approx(res["layer"][layer.LAYER_OURS]["median_ms"]
                                         / res["layer"][layer.LAYER_FLA]["median_ms"])
    for side in (layer.OP_FLA, layer.OP_OURS, layer.OP_BARE):   # the op's backward alone, and ours bare
        assert res["op_backward"][side]["median_ms"] > 0 and res["op_backward"][side]["host_ms"] > 0, res
    assert res["backward_ratio"] == pytest.approx(res["op_backward"][layer.OP_OURS]["median_ms"]
                                                  / res["op_backward"][layer.OP_FLA]["median_ms"])
    assert res["wrapper"] == pytest.approx(res["op_backward"][layer.OP_OURS]["median_ms"]
                                           / res["op_backward"][layer.OP_BARE]["median_ms"] - 1)
    assert layer_module.chunk_kda is original      # the route was put back after every call
    assert res["fla_autotune"], "FLA's autotune choices were not recorded"
    import kernel.kda_backward
    assert kernel.kda_backward.run.__name__ == "run"   # the recording wrapper was taken out
    assert len(layer_report.layer_row(res)) == len(layer_report.LAYER_COLUMNS)
