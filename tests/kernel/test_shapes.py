"""kernel/shapes.cuh and kernel/shapes.py: one vocabulary on both sides, owned by one header per side.

The kernels compile with the header and the host plans with the module, so the two must hold the
same names with the same values; the kernels' own sources must not name a shape a second time; and
a change to the header must reach a compile cache (the builds' header digest).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel import registry, shapes
from kernel.runtime import builds

NAMES = ("HEAD_DIM", "TILE_TOKENS", "CHUNK_TOKENS", "TILES_PER_CHUNK", "SPAN_LIMIT", "RCP_LN2")
CONSTEXPR = re.compile(r"^\s*constexpr (int|float) (\w+) = ([^;]+);", flags=re.M)
FLOAT_LITERAL = re.compile(r"(\d+\.\d*)f")
INCLUDE = '#include "../../shapes.cuh"'
# what the kernels called the shapes before the header owned them
OLD_NAMES = ("D", "C", "FLA_CHUNK", "TILES_PER_FLA_CHUNK", "KERNEL_TILE", "TILE", "CHUNK")


def header_constants(text: str) -> dict[str, int | float]:
    """Every ``constexpr int NAME = expr;`` of a header, evaluated in order (C's integer / as //), and
    every ``constexpr float NAME = literal;`` (``110.f``) as its value."""
    out: dict[str, int | float] = {}
    for kind, name, expr in CONSTEXPR.findall(text):
        if kind == "float":
            literal = FLOAT_LITERAL.fullmatch(expr.strip())
            if literal is None:
                raise ValueError(f"shapes.cuh: constexpr float {name} = {expr}: not a float literal")
            out[name] = float(literal.group(1))
            continue
        if not re.fullmatch(r"[\w\s+*/()-]+", expr):
            raise ValueError(f"shapes.cuh: constexpr {name} = {expr}: not integer arithmetic")
        out[name] = int(eval(expr.replace("/", "//"), {"__builtins__": {}}, dict(out)))   # noqa: S307 (our header)
    return out


def device_sources(kernel: builds.KernelBuild) -> list:
    return [kernel.entry, *(p for p in kernel.header_paths() if p != kernel.entry)]


def test_the_header_holds_the_module_s_names_and_values():
    assert header_constants(builds.SHAPES_HEADER.read_text()) == {name: getattr(shapes, name) for name in NAMES}


def test_the_constexpr_reader_can_fail():
    assert header_constants("constexpr int A = 64;\nconstexpr int B = A / 16;\n") == {"A": 64, "B": 4}
    assert header_constants("constexpr float X = 110.f;\nconstexpr float Y = 0.5f;\n") == {"X": 110.0, "Y": 0.5}
    with pytest.raises(ValueError, match="not integer arithmetic"):
        header_constants("constexpr int A = 1 << 4;\n")
    with pytest.raises(ValueError, match="not a float literal"):
        header_constants("constexpr float X = 2 * 55.f;\n")


def test_the_header_s_span_limit_is_a_float_equal_to_the_module_s():
    # a float on both sides: the kernels compare fp32 spans with it, the models with np.float32 of it
    got = header_constants(builds.SHAPES_HEADER.read_text())["SPAN_LIMIT"]
    assert isinstance(got, float) and isinstance(shapes.SPAN_LIMIT, float) and got == shapes.SPAN_LIMIT == 110.0


@pytest.mark.parametrize("kernel", registry.KERNELS, ids=lambda k: k.entry.name)
def test_every_kernel_includes_the_header_and_names_no_shape_itself(kernel):
    texts = {p.name: p.read_text() for p in device_sources(kernel)}
    assert any(INCLUDE in t for t in texts.values()), f"no source of {kernel.title} includes kernel/shapes.cuh"
    for name, text in texts.items():
        own = {n for _, n, _ in CONSTEXPR.findall(text)}
        assert not own & set(NAMES + OLD_NAMES), f"{name} defines {sorted(own & set(NAMES + OLD_NAMES))} itself"


QK_HEAD = re.compile(r"constexpr int qk_head\(int hv, int HV, int H\) \{ return ([^;]+); \}")


def test_the_header_maps_value_heads_to_query_heads_as_the_module_and_as_fla():
    # FLA's grouped value heads: value head hv reads q and k at hv // G, the head whose
    # repeat_interleave(G) copy it would be; the header's mapping (C's integer /) is the module's
    expr = QK_HEAD.search(builds.SHAPES_HEADER.read_text()).group(1).replace("/", "//")
    for H, HV in ((1, 1), (3, 3), (1, 4), (2, 6), (4, 32)):
        repeated = np.repeat(np.arange(H), HV // H)              # head of each value head after the repeat
        for hv in range(HV):
            device = eval(expr, {"__builtins__": {}}, dict(hv=hv, HV=HV, H=H))   # noqa: S307 (our header)
            assert device == shapes.qk_head(hv, HV, H) == repeated[hv], (H, HV, hv)


def test_a_change_to_the_header_changes_every_build_s_digest(tmp_path, monkeypatch):
    def digests(text: str) -> dict[str, str]:
        copy = tmp_path / "kernel" / builds.SHAPES_HEADER.name   # the same folder and file name
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(text)
        monkeypatch.setattr(builds, "SHAPES_HEADER", copy)
        return {k.title: k.header_digest() for k in registry.KERNELS}

    text = builds.SHAPES_HEADER.read_text()
    before = {k.title: k.header_digest() for k in registry.KERNELS}
    assert digests(text) == before
    after = digests(text.replace("TILE_TOKENS = 16", "TILE_TOKENS = 32"))
    assert all(before[t] != after[t] for t in before)


# ----------------------------------------------------------------------------
# kernel/shapes.py: the vocabulary, the snapshot offsets and the cu_seqlens check
# ----------------------------------------------------------------------------

def test_the_vocabulary():
    assert (shapes.TILE_TOKENS, shapes.CHUNK_TOKENS, shapes.TILES_PER_CHUNK, shapes.HEAD_DIM) == (16, 64, 4, 128)


def test_snapshot_offsets_count_tiles_per_sequence():
    assert shapes.snapshot_offsets(np.array([1, 16, 17, 64, 65]), 16, 4).tolist() == [0, 1, 2, 3, 4, 6]
    assert shapes.snapshot_offsets(np.array([1, 16, 17]), 16, 1).tolist() == [0, 1, 2, 4]


@pytest.mark.parametrize("cu, match", [([0, 3, 3, 8], "strictly increasing"), ([2, 8], "start at 0"),
                                       ([0, 7], "end at the total length 8"), ([0], "at least 2 offsets"),
                                       (np.array([[0, 8]]), "1-D"), ([0, 2.5, 8], "must hold integers"),
                                       ([0, True, 8], "must hold integers")])
def test_cu_seqlens_is_checked_by_name(cu, match):
    with pytest.raises((ValueError, TypeError), match=f"cu_seqlens.*{match}"):
        shapes.check_cu_seqlens(cu, 1, 8)


def test_cu_seqlens_needs_a_packed_batch():
    with pytest.raises(ValueError, match="packed batch of size 1"):
        shapes.check_cu_seqlens([0, 8], 2, 8)


def test_a_chunk_range_is_all_chunks_or_a_nonempty_range_inside_them():
    from kernel.shapes import check_chunk_range

    assert check_chunk_range(None, 7) == (0, 7)
    assert check_chunk_range((2, 5), 7) == (2, 5)
    assert check_chunk_range((6, 7), 7) == (6, 7)
    for bad in ((3, 3), (5, 2), (-1, 2), (0, 8)):
        with pytest.raises(ValueError, match=r"chunks must be a range \(c0, c1\) with 0 <= c0 < c1 <= 7"):
            check_chunk_range(bad, 7)



def test_a_torch_tensors_offsets_are_read_once_until_it_is_written(offsets_reads):
    # a device tensor's read is a host sync: once per tensor, again after an in-place write
    torch = pytest.importorskip("torch")
    reads = offsets_reads
    cu = torch.tensor([0, 2, 5, 8])
    first = shapes.host_offsets(cu)
    assert shapes.host_offsets(cu) is first and len(reads) == 1
    with pytest.raises(ValueError, match="read-only"):   # the kept copy is every later call's
        first[1] = 3
    cu[1] = 3
    assert shapes.host_offsets(cu).tolist() == [0, 3, 5, 8] and len(reads) == 2
    assert shapes.check_cu_seqlens(cu, 1, 8).tolist() == [0, 3, 5, 8] and len(reads) == 2
    shapes.host_offsets(torch.tensor([0, 3, 5, 8]))   # equal values, another tensor
    assert len(reads) == 3


def test_only_the_last_offsets_tensors_keep_their_host_copy(offsets_reads):
    torch = pytest.importorskip("torch")
    reads = offsets_reads
    tensors = [torch.tensor([0, 1 + i % 7, 8]) for i in range(shapes.OFFSETS_KEPT + 1)]
    for cu in tensors + tensors[1:] + tensors[:1]:
        shapes.host_offsets(cu)
    # the first pass reads each; the second finds the last OFFSETS_KEPT kept, the first evicted
    assert [id(x) for x in reads] == [id(x) for x in tensors + tensors[:1]]


def test_an_inference_tensors_offsets_are_read_at_every_call(offsets_reads):
    # made under torch.inference_mode, a tensor has no version counter to show an in-place write
    torch = pytest.importorskip("torch")
    reads = offsets_reads
    with torch.inference_mode():
        cu = torch.tensor([0, 2, 5, 8])
        shapes.host_offsets(cu)
        cu[1] = 6
        assert shapes.host_offsets(cu).tolist() == [0, 6, 5, 8]
    assert len(reads) == 2


def test_a_tensor_read_again_after_a_write_is_the_last_to_go(offsets_reads):
    torch = pytest.importorskip("torch")
    reads = offsets_reads
    first, *others = [torch.tensor([0, 1 + i % 7, 8]) for i in range(shapes.OFFSETS_KEPT + 1)]
    for cu in [first, *others[:-1]]:   # OFFSETS_KEPT kept, the first one oldest
        shapes.host_offsets(cu)
    first[1] = 2
    shapes.host_offsets(first)         # read again, and now the newest
    shapes.host_offsets(others[-1])    # one more: the oldest other one goes, not the first
    shapes.host_offsets(first)
    assert [id(x) for x in reads] == [id(x) for x in [first, *others[:-1], first, others[-1]]]
