"""Kernel A against flash-linear-attention on one GPU, in one process: ``ptx-lab bench``.

What and why
------------
Kernel A (``kernel.dstate_scan``) does the serial half of the KDA backward: it
walks each sequence backwards in 16-token tiles and stores snapshots of the
state gradient dS. flash-linear-attention (fla-core 0.6.0, Triton) does the
same work with ``chunk_kda_bwd_dAv`` + ``chunk_gated_delta_rule_bwd_dhu`` at
64-token chunks (see ``kernel.tools.fla_adapter``). The bench feeds both the same
raw inputs (q, k, v, g, beta, do, dht), times them with CUDA events, prices
Kernel A against a copy of the bytes it must move, and (``--precision``)
measures both against the float64 reference of ``kernel.reference``.

One module per concern:

* :mod:`.configs`  what is benched: configurations, Kernel A's snapshot modes, the byte floor
* :mod:`.inputs`   raw inputs on the GPU, Kernel A's tile inputs, the snapshot-row index math
* :mod:`.timing`   CUDA-event timing (alone and in turn), CUPTI kernel time, the copy floor
* :mod:`.measure`  one configuration: Kernel A and FLA timed, and their precision
* :mod:`.report`   tables, the plot, earlier runs' JSON
* :mod:`.cli`      arguments and the run loop (``main``)
* :mod:`.backward`, :mod:`.backward_report`, :mod:`.backward_run`  ``--backward``: the whole KDA
  backward, ours (``kernel.kda_backward``) against FLA's ``chunk_kda_bwd``: one configuration
  measured, its table and plot, the loop that gives each configuration its own process (``--layer``'s too)
* :mod:`.layer`, :mod:`.layer_report`  ``--layer``: FLA's KDA layer, forward + backward, FLA's path
  against ``kernel.patch_fla()``'s: one configuration measured, its table
* :mod:`.forward`, :mod:`.forward_report`  ``--forward``: the training forward (inputs that require a
  gradient), ``kernel.chunk_kda`` with our forward against FLA's ``chunk_kda`` and cuDNN's op, and our
  bare ``kernel.forward.forward``: one configuration measured, its table and plot

``--backward``'s step and ``--layer`` run ``kernel.chunk_kda`` with the forward ``--our-forward`` names
(ours by default; ``fla``: FLA's forward, our backward), recorded in each result as ``our_forward``.

    ptx-lab bench                       # the five configs, H = 32, D = 128
    ptx-lab bench --quick               # 4x8192 and 1x32768, few repetitions
    ptx-lab bench --configs 32x8192,varlen64x262144 --precision --json out.json
    ptx-lab bench --backward --json b.json --plot b.png
    ptx-lab bench --forward --json f.json --plot f.png

Importing any of these needs neither torch, CuPy nor fla (only numpy); the
device work is imported inside the functions that do it.
"""
