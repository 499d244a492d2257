"""kernel: Kernel A, the serial dstate scan of the KDA backward pass.

``kernel.reference`` holds its numerical contract in float64 (numpy or CuPy
arrays); see ``/work/shared/spec/kernel_a.md``. Importing this package never
needs CuPy or a GPU.
"""

from .api import dstate_scan  # noqa: E402  (numpy-only at import; CuPy is loaded on first call)

__all__ = ["dstate_scan"]
