"""Kernel S, the forward-state scan: the state entering every 64-token chunk, rebuilt on the GPU.

* ``config``: its knobs (:class:`Config`), options, variants, the auto rule and ``BUILD``;
* ``launch``: :func:`plan_forward_states` (every check, on the host) and :func:`forward_states`;
  :func:`plan_from_layout` and :func:`launch_planned` for a caller that checked its arguments itself;
* ``cuda/``: the entry file ``forward_states.cu`` and its ``forward_states_*.cuh``.
"""
from .config import (BUILD, COMPILER_FLAGS, G6_SPLITS, KERNEL_NAME, KNOB_MACROS, SMEM_OPTIN, SOURCE_DIR, SOURCE_PATH,
                     WARPS, Config, all_variants, auto_config, choose_warps, header_digest, options, source)
from .launch import (StatesPlan, device_tables, forward_states, launch_planned, module, plan_forward_states,
                     plan_from_layout)

__all__ = ["forward_states", "plan_forward_states", "plan_from_layout", "launch_planned", "device_tables", "module", "Config", "StatesPlan", "choose_warps",
           "auto_config", "all_variants", "options", "source", "header_digest", "BUILD", "SOURCE_DIR", "SOURCE_PATH",
           "KERNEL_NAME", "KNOB_MACROS", "COMPILER_FLAGS", "WARPS", "G6_SPLITS", "SMEM_OPTIN"]
