"""What every kernel of the package runs on: one bridge for arrays, one description of a build.

* :mod:`kernel.runtime.arrays`: the torch / CuPy bridge and the one style of argument check
  (what an array is, its shape, dtype and device, named in every error);
* :mod:`kernel.runtime.builds`: a kernel's build (entry file and header digest, options,
  variants, the shared memory and threads it exports) and its launch helpers (SM count, side
  stream, the CTA order and device tables of a batch layout).

:mod:`kernel.registry` lists the kernels; the tools iterate it. Importing this package needs
neither CuPy nor torch: both are loaded on first use.
"""
