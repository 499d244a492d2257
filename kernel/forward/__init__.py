"""The forward: KDA's chunked forward in one pass over 16-token tiles (o, the final state, and in training
mode the states and Aqk's and Akk's diagonal blocks our backward reads).

* ``config``: its knobs (:class:`Config`), options, variants, the auto rule and ``BUILD``;
* ``launch``: :func:`plan_forward` (every check, on the host) and :func:`forward`; :func:`launch_planned`
  for a caller that checked its arguments itself;
* ``cuda/``: the entry file ``forward.cu`` and its ``forward_*.cuh``.
"""
from .config import (BUILD, COMPILER_FLAGS, G6_SPLITS, KERNEL_NAME, KNOB_MACROS, NSTAGES, PRODUCERS, PRODUCT_WARPS,
                     SMEM_OPTIN, SOURCE_DIR, SOURCE_PATH, WARPS, Config, all_variants, auto_config, barrier_ids,
                     header_digest, max_stages, options, smem_bytes, source)
from .launch import ForwardOutputs, ForwardPlan, forward, launch_planned, module, plan_forward

__all__ = ["forward", "plan_forward", "launch_planned", "module", "Config", "ForwardPlan", "ForwardOutputs",
           "auto_config", "all_variants", "options", "source", "header_digest", "smem_bytes", "BUILD", "SOURCE_DIR",
           "SOURCE_PATH", "KERNEL_NAME", "KNOB_MACROS", "COMPILER_FLAGS", "WARPS", "PRODUCERS", "NSTAGES", "G6_SPLITS",
           "PRODUCT_WARPS", "SMEM_OPTIN", "barrier_ids", "max_stages"]
