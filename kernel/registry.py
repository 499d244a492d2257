"""Every kernel the package builds, one entry each: what the tools and CI iterate.

``ptx-lab resources`` compiles every variant of every entry (registers, spills, shared memory,
the SASS each must hold), CI compiles each entry file with its default variant's options, and
racecheck and the SASS digest name kernels by these entries. Adding a kernel is one line here:
its room's ``BUILD`` (a :class:`kernel.runtime.builds.KernelBuild`).
"""
from __future__ import annotations

from . import (ds_scan, forward, forward_chain, forward_output, forward_products, forward_states, row_rstd,
               token_gradients)
from .runtime.builds import KernelBuild

KERNELS: tuple[KernelBuild, ...] = (ds_scan.BUILD, forward_states.BUILD, token_gradients.BUILD, forward.BUILD,
                                   forward_products.BUILD,
                                   forward_chain.BUILD,
                                   forward_output.BUILD,
                                   row_rstd.BUILD)

__all__ = ["KERNELS"]
