"""kernel: Kernel A, the serial dstate scan of the KDA backward pass, and its float64 references.

* :func:`dstate_scan` (``kernel.api``): Kernel A on the GPU; its contract is
  ``docs/kernel_a.md``, stated in float64 by ``kernel.reference``.
* :func:`kernel.fla_entry.dstate_scan_from_fla`: the same scan fed with
  flash-linear-attention's forward tensors as they are.
* ``kernel.cp``: the scan split over ranks (context parallelism).
* ``chunk_kda``: a drop-in for FLA's ``fla.ops.kda.chunk_kda``, FLA's forward
  with our backward; the module ``kernel.chunk_kda``, callable as its function,
  loaded (with torch) on first use.

Importing this package never needs CuPy, torch or a GPU.
"""

from .api import dstate_scan  # noqa: E402  (numpy-only at import; CuPy is loaded on first call)

__all__ = ["dstate_scan", "chunk_kda"]


def __getattr__(name: str):
    # chunk_kda needs torch: import it only when asked for. Importing the submodule binds
    # kernel.chunk_kda to it (a module callable as the function), whatever the import order.
    if name == "chunk_kda":
        import importlib

        return importlib.import_module(".chunk_kda", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
