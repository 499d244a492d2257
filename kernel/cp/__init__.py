"""Context parallelism: one sequence split over the ranks of a group, each rank holding a contiguous part.

* ``scan``: Kernel A's dS scan over ranks (:func:`cp_dstate_scan`, its float64 and GPU pairs);
* ``backward``: the whole KDA backward over ranks (``kernel.cp.backward.cp_kda_backward``);
* ``exchange``: what both share: the token ranges, the header checks, :class:`CPInputError`, the
  group (:func:`init_group`) and the one all_gather of the summaries.

torch is needed only by the distributed calls; numpy is enough for the rest.
"""
from .exchange import DEFAULT_TIMEOUT, CPInputError, check_headers, init_group
from .scan import (INPUT_NAMES, Part, ScanOptions, cp_dstate_scan, cp_dstate_scan_serial, header, kernel_scan,
                   kernel_summary, reference_scan, reference_summary, shard)

__all__ = ["INPUT_NAMES", "DEFAULT_TIMEOUT", "CPInputError", "ScanOptions", "Part", "shard", "reference_summary",
           "reference_scan", "kernel_summary", "kernel_scan", "cp_dstate_scan", "cp_dstate_scan_serial", "init_group",
           "header", "check_headers"]
