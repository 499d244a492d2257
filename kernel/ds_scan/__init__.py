"""Kernel A, the dS scan: its build, its launch, the sequence split and its FLA-input entry.

* ``config``: the compile-time :class:`Config` (every knob, its auto rule), its options and
  variants, and ``BUILD``;
* ``launch``: :func:`dstate_scan` and :func:`summaries` behind an array API;
* ``split``: the sequence split's plan and its three passes;
* ``fla``: :func:`dstate_scan_from_fla`, the scan fed with FLA's forward tensors as stored;
* ``cuda/``: the entry file ``dstate_scan.cu`` and its headers.

Importing this package never needs CuPy, torch or a GPU.
"""
from .config import BUILD, Config
from .fla import dstate_scan_from_fla, plan_fla_launch
from .launch import bf16_bits, bits_to_f32, choose_vsplit, dstate_scan, summaries

__all__ = ["dstate_scan", "summaries", "dstate_scan_from_fla", "plan_fla_launch", "choose_vsplit", "bf16_bits",
           "bits_to_f32", "Config", "BUILD"]
