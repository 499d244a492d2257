"""The o pass: the third pass of the three-pass forward, o from the state entering every 64-token chunk and
each chunk's v_new, with the first pass's qg and Aqk, every (chunk, value head) at once.

* ``config``: its knob (:class:`Config`), options, variants and ``BUILD``;
* ``launch``: :func:`plan_output` (every check, on the host) and :func:`forward_output`; for a caller that
  runs the pass in pieces, :func:`allocate` and :func:`launch_planned` over a range of chunks;
* ``cuda/``: the entry file ``forward_output.cu``.
"""
from .config import BUILD, KERNEL_NAME, SOURCE_DIR, SOURCE_PATH, WARPS, Config, all_variants, options
from .launch import OutputPlan, allocate, forward_output, launch_planned, plan_output

__all__ = ["forward_output", "plan_output", "launch_planned", "allocate", "OutputPlan", "Config", "all_variants",
           "options", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "WARPS"]
