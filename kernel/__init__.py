"""kernel: Kernel A, the serial dstate scan of the KDA backward pass, and its float64 references.

* :func:`dstate_scan` (``kernel.api``): Kernel A on the GPU; its contract is
  ``docs/kernel_a.md``, stated in float64 by ``kernel.reference``.
* :func:`kernel.fla_entry.dstate_scan_from_fla`: the same scan fed with
  flash-linear-attention's forward tensors as they are.
* ``kernel.cp``: the scan split over ranks (context parallelism).

Importing this package never needs CuPy or a GPU.
"""

from .api import dstate_scan  # noqa: E402  (numpy-only at import; CuPy is loaded on first call)

__all__ = ["dstate_scan"]
