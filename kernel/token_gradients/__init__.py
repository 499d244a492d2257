"""Kernel B, the per-token gradients: dq, dk, dv, dg and dbeta, one CTA per run of consecutive 64-token chunks
of a sequence (``launch.run_plan``: the chunks a run) and head.

* ``launch``: its two builds (``BUILD``, :func:`options`, :func:`source`): the plain one, which
  writes dg, and the gate build, which applies the backward of the gate activation FLA's layer asks
  the op for (``cuda/token_gradients_gate.cuh``) and writes the raw gate's gradient and partial sums
  of dA_log and ddt_bias instead; its batch tables and ``launch.launch``, which
  :func:`kernel.kda_backward.kda_backward` calls;
* ``cuda/``: the entry file ``token_gradients.cu`` and its ``token_gradients_*.cuh``.

The launch function is not re-exported here: ``kernel.token_gradients.launch`` stays the module.
"""
from .launch import (BUILD, KERNEL_NAME, RUN_CHUNKS, SOURCE_PATH, Build, RunPlan, all_variants, kernel, options,
                     run_plan, source, tables)

__all__ = ["BUILD", "KERNEL_NAME", "RUN_CHUNKS", "SOURCE_PATH", "Build", "RunPlan", "all_variants", "kernel", "options",
           "run_plan", "source", "tables"]
