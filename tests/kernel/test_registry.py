"""kernel.registry: every kernel once, each with its entry file, variants, labels and source."""
from __future__ import annotations

from kernel import registry, row_rstd


def test_the_registry_names_every_kernel_once():
    labels = [k.label(v) for k in registry.KERNELS for v in k.variants()]
    assert len(labels) == len(set(labels))
    assert len({k.entry for k in registry.KERNELS}) == len(registry.KERNELS)
    for k in registry.KERNELS:
        assert k.entry.is_file(), k.entry
        assert k.label(k.default()), k.title
        assert k.source().startswith(f"// headers sha256 {k.header_digest()}\n")
        need = set(k.required_sass(k.default()))
        if k is row_rstd.BUILD:   # no GEMM: its rows loaded into registers, a sum of squares
            assert need == {"LDG"}, k.title
        else:   # every other kernel's GEMMs are MMAs on ldmatrix operands, its loads asynchronous copies
            assert need >= {"HMMA", "LDSM"} and need & {"LDGSTS", "UTMALDG"}, k.title


def test_every_kernels_sources_go_into_the_wheel():
    # a room whose cuda/ files the wheel leaves out builds from a checkout and fails from an install.
    # setuptools matches a file against the patterns of the package that owns it (the deepest folder
    # with an __init__.py), a "*" never crossing a "/"
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(registry.__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for k in registry.KERNELS:
        for path in (k.entry, *k.header_paths()):
            path = path.resolve()
            owner = next(d for d in path.parents if (d / "__init__.py").is_file())
            package = ".".join(owner.relative_to(root).parts)
            rel = path.relative_to(owner).parts
            shipped = any(len(p.split("/")) == len(rel) and all(map(fnmatch.fnmatch, rel, p.split("/")))
                          for p in data.get(package, ()))
            assert shipped, f"{path.relative_to(root)} ({k.title}) matches none of {package}'s package-data patterns"
