"""kernel.registry: every kernel once, each with its entry file, variants, labels and source."""
from __future__ import annotations

from kernel import registry


def test_the_registry_names_every_kernel_once():
    labels = [k.label(v) for k in registry.KERNELS for v in k.variants()]
    assert len(labels) == len(set(labels))
    assert len({k.entry for k in registry.KERNELS}) == len(registry.KERNELS)
    for k in registry.KERNELS:
        assert k.entry.is_file(), k.entry
        assert k.label(k.default()), k.title
        need = set(k.required_sass(k.default()))
        # every kernel's GEMMs are MMAs on ldmatrix operands, its loads asynchronous copies of one kind or the other
        assert need >= {"HMMA", "LDSM"} and need & {"LDGSTS", "UTMALDG"}, k.title
        assert k.source().startswith(f"// headers sha256 {k.header_digest()}\n")
