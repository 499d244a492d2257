"""The kernels' tools: what checks, times and inspects the product, apart from it.

* :mod:`kernel.tools.check`      every case against the float64 reference (GPU)
* :mod:`kernel.tools.bench`      Kernel A against flash-linear-attention (GPU, torch, fla-core)
* :mod:`kernel.tools.profile`    clock64 cycles per tile and phase (GPU)
* :mod:`kernel.tools.racecheck`  compute-sanitizer racecheck of every registered kernel beside calibrating probes (GPU)
* :mod:`kernel.tools.resources`  registers, spills, shared memory, SASS of every variant (nvcc)
* :mod:`kernel.tools.fla_adapter` FLA's side of the bench
* :mod:`kernel.tools.floors`     byte and tensor-core floors of the whole KDA backward, and with --forward of the forward's designs (no GPU)
* :mod:`kernel.tools.kda_precision` FLA's gradients, o and final state and ours against float64 (GPU, torch, fla-core)
* :mod:`kernel.tools.fla_kda`     FLA's whole KDA forward and backward as its autograd function calls them
* :mod:`kernel.tools.cp_check`    one sequence's scan split over torch.distributed ranks: exactness, pass times
* :mod:`kernel.tools.stalls`      each whole-backward kernel's binding stall, from one ncu run (GPU, ncu)
* :mod:`kernel.tools.source_ab`   Kernel A, S, B or the forward from two source trees, timed in one process (GPU)
* :mod:`kernel.tools.trained_layer_gate` the trained-layer gate recipe (FLA's layer gate, its projection scaled) and its statistics
* :mod:`kernel.tools.fla_configs`  FLA's autotune choices from Triton's cache as FLA config files, for the GPU tests (.ci/gpu-checks)

Each is ``ptx-lab <name>`` (the Commands below, declared in pyproject.toml's
``ptx_lab.commands`` entry points) and ``python -m kernel.tools.<name>``. The product
(``kernel.ds_scan.launch``, ``kernel.ds_scan.config``, ``kernel.reference``) imports none of them; importing
this package imports no tool.
"""
from __future__ import annotations

from ptx_lab.commands import Command

CHECK = Command("Kernel A against its float64 reference on the GPU: relative errors, determinism",
                "kernel.tools.check:main")
BENCH = Command("Kernel A against flash-linear-attention's dAv+dhu on one GPU (needs torch, fla-core); --backward: "
                "the whole KDA backward, ours against FLA's", 
                "kernel.tools.bench.cli:main")
PROFILE = Command("where Kernel A's cycles go: clock64 cycles per tile, phase and warp role (GPU)",
                  "kernel.tools.profile:main")
RACECHECK = Command("compute-sanitizer racecheck of every kernel in kernel.registry beside probes with known answers (GPU)",
                    "kernel.tools.racecheck:main")
RESOURCES = Command("registers, spills, shared memory and SASS of every variant of every kernel (nvcc, no GPU)",
                    "kernel.tools.resources:main")
FLOORS = Command("byte and tensor-core floors of the whole KDA backward per design and configuration; "
                 "--forward: the forward's designs beside FLA's (no GPU)",
                 "kernel.tools.floors:main")
KDA_PRECISION = Command("FLA's KDA and ours against the float64 reference: every gradient's error, and the "
                        "forward's o and final state (GPU, torch, fla-core)", "kernel.tools.kda_precision:main")
CP_CHECK = Command("one sequence's Kernel A scan (kernel.cp; --backward: its whole backward, kernel.cp.backward) "
                   "split over torch.distributed ranks: exactness against the unsplit one and each pass's "
                   "time (torch; --spawn N or under torchrun)",
                   "kernel.tools.cp_check:main")
SOURCE_AB = Command("Kernel A, S, B or the forward built from the working tree and from an old source (its cuda directory "
                    "or a git revision), timed in turn in one process (GPU)", "kernel.tools.source_ab:main")
STALLS = Command("what binds each kernel of the whole backward (--forward: our forward): one kda_backward under "
                 "ncu (--clock-control none), its stall reasons, issue rate, DRAM and tensor-pipe use (GPU, torch, ncu)",
                 "kernel.tools.stalls:main")
