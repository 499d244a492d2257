"""Float64 references: the numerical contracts the GPU kernels are checked against.

Every function is array-module agnostic (numpy in, numpy out; CuPy in, CuPy
out) and never needs CuPy or a GPU.

* :mod:`kernel.reference.dstate_scan`: Kernel A's contract (tile quantities,
  the backward dstate scan, snapshot layout) and the seeded input generators.
* :mod:`kernel.reference.kda`: the whole KDA forward and backward, tile by
  tile (dq, dk, dv, dg, dbeta, dh0 from Kernel A's dS and the forward states).
"""
from .dstate_scan import (FLA_CHUNK, L2NORM_EPS, LN2, _l2norm, array_module, dstate_scan_reference,
                          prepare_tiles, ragged_lengths, random_inputs, snapshot_offsets)
from .kda import kda_backward_reference, kda_forward_reference

__all__ = [
    "array_module",
    "prepare_tiles",
    "dstate_scan_reference",
    "snapshot_offsets",
    "random_inputs",
    "ragged_lengths",
    "kda_forward_reference",
    "kda_backward_reference",
]
