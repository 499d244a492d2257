"""kernel.tools.fla_configs: Triton's autotune records as FLA config files, read back by fla-core itself.

The records here are written as Triton writes them (``<kernel>.autotune.json`` in a hash directory:
the tuning key and each config's timings). fla-core's own loader (fla/ops/utils/cache.py) then reads
the files in its ``full`` mode: the exact key finds its winner, a key that differs only in sizes
finds the winner of its structure, and an unseen structure gets the config that won most often."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kernel.tools import fla_configs


def _config(BK, warps, stages=3):
    return {"kwargs": {"BK": BK}, "num_warps": warps, "num_ctas": 1, "num_stages": stages, "maxnreg": None,
            "pre_hook": None, "ir_override": None}


def _record(cache, directory, kernel, key, timed):
    (cache / directory).mkdir(parents=True)
    (cache / directory / f"{kernel}.autotune.json").write_text(json.dumps(
        {"key": key, "configs_timings": [[config, timings] for config, timings in timed]}))


@pytest.fixture
def cache(tmp_path):
    cache = tmp_path / "triton"
    inf = [math.inf] * 3
    # two keys where BK=64/4 warps wins, one (another switch) where BK=32/8 warps wins; a failed config is inf
    _record(cache, "A", "kern", [64, True, "torch.bfloat16"],
            [(_config(32, 8), [0.020, 0.019, 0.021]), (_config(64, 4), [0.010, 0.009, 0.011]), (_config(128, 4), inf)])
    _record(cache, "B", "kern", [128, True, "torch.bfloat16"],
            [(_config(32, 8), [0.030, 0.029, 0.031]), (_config(64, 4), [0.020, 0.019, 0.021])])
    _record(cache, "C", "kern", [64, False, "torch.bfloat16"],
            [(_config(32, 8), [0.010, 0.009, 0.011]), (_config(64, 4), [0.020, 0.019, 0.021])])
    _record(cache, "D", "dead", [1], [(_config(64, 4), inf)])
    (cache / "E").mkdir()
    (cache / "E" / "kern.cubin").write_bytes(b"\0")   # a compiled kernel beside the records is not one
    return cache


def test_each_key_keeps_its_winner_and_the_default_won_most(cache):
    files = fla_configs.tuned_configs(cache)
    assert list(files) == ["kern"]      # a kernel whose every config failed has no file
    entries = files["kern"]["autotune_entries"]
    winners = {json.dumps(e["autotune_key"]): (e["config"]["kwargs"]["BK"], e["config"]["num_warps"])
               for e in entries.values()}
    assert winners == {'[64, true, "torch.bfloat16"]': (64, 4), '[128, true, "torch.bfloat16"]': (64, 4),
                       '[64, false, "torch.bfloat16"]': (32, 8)}
    assert files["kern"]["default_config"]["kwargs"] == {"BK": 64}
    assert "pre_hook" not in files["kern"]["default_config"]


def test_fla_reads_the_files_exactly_by_structure_and_by_default(cache, tmp_path, monkeypatch):
    fla_cache = pytest.importorskip("fla.ops.utils.cache", reason="needs fla-core")
    out = tmp_path / "configs"
    assert fla_configs.write_configs(cache, out) == ["kern"]
    monkeypatch.setenv("FLA_CONFIG_DIR", str(out))
    monkeypatch.setattr(fla_cache, "FLA_CACHE_MODE", fla_cache.FlaCacheMode.FULL)
    fla_cache.load_config_file.cache_clear()

    def chosen(*key):
        config = fla_cache.load_cached_config("kern", fla_cache.AutotuneKey(autotune_key=key))
        return config["kwargs"]["BK"], config["num_warps"]

    assert chosen(64, False, "torch.bfloat16") == (32, 8)        # exact
    assert chosen(4096, False, "torch.bfloat16") == (32, 8)      # only the size differs: its structure's winner
    assert chosen(64, False, "torch.float32") == (64, 4)         # a dtype never tuned: the default
    assert fla_cache.load_cached_config("other", None) is None   # no file: FLA tunes


def test_the_command_says_what_it_wrote(cache, tmp_path, capsys):
    assert fla_configs.main([str(cache), str(tmp_path / "out")]) == 0
    assert "1 kernels' autotune choices written" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert fla_configs.main([str(tmp_path / "empty"), str(tmp_path / "out2")]) == 0
    assert "no autotune records: FLA will tune" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fla_configs.main([str(tmp_path / "missing"), str(tmp_path / "out3")])
    assert "is not a directory" in capsys.readouterr().err


def test_the_cache_adds_to_the_files_it_is_merged_over_and_wins_where_both_hold_a_key(cache, tmp_path):
    base = tmp_path / "base"
    fla_configs.write_configs(cache, base)
    content = json.loads((base / "kern.json").read_text())
    exact = fla_configs._key_hash([64, False, "torch.bfloat16"])
    content["autotune_entries"][exact]["config"] = _config(16, 2)   # a choice the cache will replace
    only_base = fla_configs._key_hash([8, False, "torch.bfloat16"])
    content["autotune_entries"][only_base] = {"autotune_key": [8, False, "torch.bfloat16"], "config": _config(16, 2)}
    (base / "kern.json").write_text(json.dumps(content))
    (base / "other.json").write_text(json.dumps({"kernel_name": "other", "autotune_entries": {},
                                                 "default_config": _config(16, 2)}))
    files = fla_configs.merged(fla_configs.tuned_configs(cache), base)
    assert list(files) == ["kern", "other"]
    entries = files["kern"]["autotune_entries"]
    assert entries[exact]["config"]["kwargs"] == {"BK": 32}        # the cache's winner
    assert entries[only_base]["config"]["kwargs"] == {"BK": 16}    # kept from the base
    assert len(entries) == 4
    assert files["other"]["default_config"]["kwargs"] == {"BK": 16}


def test_with_over_a_machine_without_a_cache_gets_the_files_alone(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "other.json").write_text(json.dumps({"kernel_name": "other", "autotune_entries": {},
                                                 "default_config": _config(16, 2)}))
    assert fla_configs.main([str(tmp_path / "no-cache"), str(tmp_path / "out"), "--over", str(base)]) == 0
    assert "1 kernels' autotune choices written" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "other.json").read_text())["kernel_name"] == "other"


COMMITTED = Path(__file__).resolve().parents[2] / "fla_autotune"


@pytest.mark.parametrize("path", sorted(COMMITTED.glob("*.json")), ids=lambda p: p.stem)
def test_the_committed_choices_are_fla_config_files(path):
    content = json.loads(path.read_text())
    assert content["kernel_name"] == path.stem
    assert content["autotune_entries"], "a kernel file with no tuned key"
    for key_hash, entry in content["autotune_entries"].items():
        assert fla_configs._key_hash(entry["autotune_key"]) == key_hash   # FLA finds an exact key by this hash
        assert entry["config"]["num_warps"] in (1, 2, 4, 8, 16, 32)
    assert "num_warps" in content["default_config"] and "pre_hook" not in content["default_config"]
