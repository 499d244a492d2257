"""The products pass: the first pass of the three-pass forward, every 64-token chunk's state-free products
(w, u, kg, qg, Aqk, the decay) at once.

* ``config``: its build (:class:`Config`: each token's gate or FLA's cumsum, q and k normalised by the caller
  or here), options and ``BUILD``;
* ``launch``: :func:`plan_products` (every check, on the host) and :func:`forward_products`; for a caller that
  runs the pass in pieces, :func:`allocate` and :func:`launch_planned` over a range of chunks;
* ``cuda/``: the entry file ``forward_products.cu``.
"""
from .config import BUILD, KERNEL_NAME, KNOB_MACROS, SOURCE_DIR, SOURCE_PATH, Config, all_variants, options
from .launch import (CHUNK_MAJOR, TOKEN_MAJOR, ProductsOutputs, ProductsPlan, allocate, chunk_table, forward_products,
                     launch_planned, plan_products)

__all__ = ["forward_products", "plan_products", "launch_planned", "allocate", "CHUNK_MAJOR", "TOKEN_MAJOR",
           "chunk_table", "ProductsPlan", "ProductsOutputs", "Config", "all_variants", "options", "KNOB_MACROS", "BUILD",
           "SOURCE_DIR", "SOURCE_PATH", "KERNEL_NAME"]
