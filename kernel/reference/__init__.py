"""Float64 references: the numerical contracts the GPU kernels are checked against.

Every function is array-module agnostic (numpy in, numpy out; CuPy in, CuPy
out) and never needs CuPy or a GPU.

* :mod:`kernel.reference.dstate_scan`: Kernel A's contract (tile quantities,
  the backward dstate scan, snapshot layout).
* :mod:`kernel.reference.inputs`: the seeded input recipe of the tests and benchmarks.
* :mod:`kernel.reference.checks`: the argument checks and tile layout they share.
* :mod:`kernel.reference.segments`: the same scan split along the sequence
  (segment summaries, their fold, the three passes).
* :mod:`kernel.reference.forward_segments`: the forward's chain split the same
  way, left to right (summaries of the state's affine step, their fold, three passes).
* :mod:`kernel.reference.fla_layout`: FLA's forward tensors (Aqk, Akk, g) and how
  Kernel A's gc, Mqk, INV are read from them.
* :mod:`kernel.reference.kda`: the whole KDA forward and backward, tile by
  tile (dq, dk, dv, dg, dbeta, dh0 from Kernel A's dS and the forward states).
"""
from .checks import L2NORM_EPS, LN2, l2norm, l2norm_rstd, array_module
from .dstate_scan import dstate_scan_reference, prepare_tiles, snapshot_offsets
from .inputs import DHT_SCALE, DO_SCALE, GATE_LOGIT_MEAN, GATE_LOWER_BOUND, ragged_lengths, random_inputs
from .fla_layout import (FlaTensors, fla_diagonal_blocks, fla_forward_tensors,
                         kernel_a_inputs_from_fla)
from .kda import kda_backward_reference, kda_forward_reference
from .forward_segments import fold_forward_summaries, forward_segment_summary, kda_forward_segmented
from .segments import (dstate_scan_segmented, fold_summaries, segment_bounds, segment_snapshots,
                       segment_summary)

__all__ = [
    "array_module",
    "prepare_tiles",
    "dstate_scan_reference",
    "snapshot_offsets",
    "random_inputs",
    "ragged_lengths",
    "segment_bounds",
    "segment_snapshots",
    "segment_summary",
    "fold_summaries",
    "dstate_scan_segmented",
    "FlaTensors",
    "fla_forward_tensors",
    "fla_diagonal_blocks",
    "kernel_a_inputs_from_fla",
    "kda_forward_reference",
    "kda_backward_reference",
    "forward_segment_summary",
    "fold_forward_summaries",
    "kda_forward_segmented",
]
