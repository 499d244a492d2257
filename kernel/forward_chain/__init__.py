"""The forward chain: the middle pass of the three-pass forward, the states entering every 64-token
chunk and each chunk's v_new from the chunks' products, one step of two GEMMs per chunk.

* ``config``: its knob (:class:`Config`), options, variants and ``BUILD``;
* ``launch``: :func:`plan_chain` (every check, on the host) and :func:`forward_chain`; for a caller that walks
  one sequence in pieces, :func:`allocate`, :func:`piece` and :func:`launch_planned`;
* ``cuda/``: the entry file ``forward_chain.cu``.
"""
from .config import BUILD, KERNEL_NAME, NSTAGES, SOURCE_DIR, SOURCE_PATH, Config, all_variants, options
from .launch import (VGROUPS, ChainOutputs, ChainPlan, allocate, device_cu_chunks, forward_chain, launch_planned, piece,
                     plan_chain)

__all__ = ["forward_chain", "plan_chain", "launch_planned", "allocate", "piece", "device_cu_chunks", "ChainPlan",
           "ChainOutputs", "Config", "all_variants",
           "options", "BUILD", "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME", "NSTAGES", "VGROUPS"]
