"""The rstd pass: each row's 1 / sqrt(sum x^2 + 1e-6) of q and k (the op's l2norm scale), without the
normalised copies, both tensors in one launch.

* ``config``: its knob (:class:`Config`: the rows in flight a thread), options, variants and ``BUILD``;
* ``launch``: :func:`plan_row_rstd` (every check, on the host) and :func:`row_rstd`; for a caller with CuPy
  arrays of its own, :func:`launch_planned`;
* ``cuda/``: the entry file ``row_rstd.cu``.

``python -m kernel.studies.row_rstd`` times the pass beside FLA's l2norm pass.
"""
from .config import BUILD, DEPTHS, KERNEL_NAME, KNOB_MACROS, SOURCE_DIR, SOURCE_PATH, WARPS, Config, all_variants, \
    options
from .launch import ALIGN, RstdPlan, launch_planned, plan_row_rstd, row_rstd

__all__ = ["row_rstd", "plan_row_rstd", "launch_planned", "RstdPlan", "ALIGN", "Config", "all_variants",
           "options", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "WARPS", "DEPTHS", "KNOB_MACROS"]
