"""kernel: Kernel A, the serial dstate scan of the KDA backward pass, and its float64 references.

* :func:`dstate_scan` (``kernel.ds_scan``): Kernel A on the GPU; its contract is
  ``docs/kernel_a.md``, stated in float64 by ``kernel.reference``.
* :func:`kernel.ds_scan.dstate_scan_from_fla`: the same scan fed with
  flash-linear-attention's forward tensors as they are.
* ``kernel.cp``: the scan split over ranks (context parallelism);
  ``kernel.cp.backward``: the whole backward split the same way.
* ``chunk_kda``: a drop-in for FLA's ``fla.ops.kda.chunk_kda``, our forward
  (``kernel.forward``) and our backward (``kernel.fla_dropin``, loaded with torch on first use);
  ``use_forward("fla")`` / ``using_forward("fla")`` / ``forward_setting()``: FLA's forward with our
  backward instead, for comparison; ``patch_fla`` / ``unpatch_fla`` / ``patched_fla``: the one
  switch that routes FLA's own op (and so its KimiDeltaAttention layer) to it.
* :func:`kernel.kda_backward.kda_backward`: the whole KDA backward on FLA's
  forward tensors.

Importing this package never needs CuPy, torch or a GPU.
"""

from .ds_scan import dstate_scan  # noqa: E402  (numpy-only at import; CuPy is loaded on first call)

_TORCH_NAMES = ("chunk_kda", "patch_fla", "unpatch_fla", "patched_fla", "use_forward", "using_forward",
                "forward_setting")
__all__ = ["dstate_scan", *_TORCH_NAMES]


def __getattr__(name: str):
    # the drop-in needs torch: import it only when asked for
    if name in _TORCH_NAMES:
        from . import fla_dropin

        return getattr(fla_dropin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
