"""kernel.tools.triton_cache: each cached kernel cut to its metadata and binary, its group file
naming only those, everything else in the cache untouched."""
from __future__ import annotations

import json

from kernel.tools import triton_cache


def _kernel(cache, digest: str, name: str, made_at: str = "/root/.triton/cache") -> dict:
    d = cache / digest
    d.mkdir(parents=True)
    files = {}
    for suffix, size in ((".source", 10), (".ttir", 20), (".ttgir", 30), (".llir", 40), (".ptx", 50),
                         (".cubin", 60), (".json", 7)):
        (d / f"{name}{suffix}").write_bytes(b"x" * size)
        files[f"{name}{suffix}"] = f"{made_at}/{digest}/{name}{suffix}"
    (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": files}))
    return files


def test_a_kernel_keeps_its_metadata_and_binary_and_its_group_names_only_them(tmp_path):
    files = _kernel(tmp_path, "AAAA", "k_fwd")
    (tmp_path / "AAAA" / "k_fwd.autotune.json").write_text("{}")          # not in the group: kept
    (tmp_path / "BBBB").mkdir()
    (tmp_path / "BBBB" / "__triton_launcher.so").write_bytes(b"elf")       # no group: kept
    assert triton_cache.slim(tmp_path) == (1, 10 + 20 + 30 + 40 + 50)
    assert sorted(p.name for p in (tmp_path / "AAAA").iterdir()) == [
        "__grp__k_fwd.json", "k_fwd.autotune.json", "k_fwd.cubin", "k_fwd.json"]
    group = json.loads((tmp_path / "AAAA" / "__grp__k_fwd.json").read_text())
    # the kept files' paths as Triton wrote them (where the cache was made), the rest gone
    assert group["child_paths"] == {n: p for n, p in files.items() if n.endswith((".cubin", ".json"))}
    assert (tmp_path / "BBBB" / "__triton_launcher.so").read_bytes() == b"elf"
    assert triton_cache.slim(tmp_path) == (0, 0)                            # a second pass finds nothing


def test_a_group_that_is_unreadable_or_points_elsewhere_is_left_alone(tmp_path):
    _kernel(tmp_path, "CCCC", "k_bwd")
    group = tmp_path / "CCCC" / "__grp__k_bwd.json"
    data = json.loads(group.read_text())
    data["child_paths"]["k_bwd.ptx"] = "/root/.triton/cache/OTHER/k_bwd.ptx"
    group.write_text(json.dumps(data))
    (tmp_path / "DDDD").mkdir()
    (tmp_path / "DDDD" / "__grp__broken.json").write_text("{not json")
    assert triton_cache.slim(tmp_path) == (0, 0)
    assert (tmp_path / "CCCC" / "k_bwd.ptx").exists() and json.loads(group.read_text()) == data


def test_the_command_says_what_it_freed(tmp_path, capsys):
    _kernel(tmp_path, "EEEE", "k")
    assert triton_cache.main([str(tmp_path)]) == 0
    assert "1 kernels slimmed to their metadata and binary" in capsys.readouterr().out
