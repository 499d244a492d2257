"""Element-type names, spelled once for ptx_lab.model and ptx_lab.tensormap.

The API spells a type the way numpy and ml_dtypes name it: ``'bfloat16'``,
``'float16'``, ``'float32'``, ``'uint16'``, ``'uint32'`` (so ``np.dtype(name)``
with ml_dtypes imported is that type). PTX's short names are accepted as
aliases, because they are what the instructions say (``mma...f32.bf16.bf16.f32``,
``ldmatrix...b16``): ``'bf16'``, ``'f16'``, ``'f32'``, ``'b16'`` / ``'u16'``
(16-bit patterns, whatever they encode) and ``'b32'`` / ``'u32'``. A numpy
dtype (``np.float32``, ``ml_dtypes.bfloat16``) is accepted by its name too.

Each module accepts its own subset (the model has no uint32 matrices; a tensor
map has no float16 in ptx_lab) and refuses the rest with a ValueError that lists
both the accepted spellings and their aliases.
"""
from __future__ import annotations

from typing import Any, Sequence

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so np.dtype("bfloat16") works)
import numpy as np

NAMES = ("bfloat16", "float16", "float32", "uint16", "uint32")
ALIASES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32",
           "b16": "uint16", "u16": "uint16", "b32": "uint32", "u32": "uint32"}


def canonical(dtype: Any, accepted: Sequence[str], name: str = "dtype") -> str:
    """The numpy name of `dtype` (a name of NAMES, an alias of ALIASES, or a numpy dtype),
    which must be one of `accepted`; ValueError naming `name` and every accepted spelling.

    Strings are looked up, never handed to np.dtype: numpy reads "f16" as a 16-BYTE float.
    """
    if isinstance(dtype, str):
        found = ALIASES.get(dtype, dtype)
    else:
        try:
            found = np.dtype(dtype).name
        except TypeError:
            found = None
    if found not in accepted:
        aliases = [a for a, n in ALIASES.items() if n in accepted]
        raise ValueError(f"{name} must be one of {', '.join(accepted)} (aliases {', '.join(aliases)}; "
                         f"or that numpy dtype); got {dtype!r}")
    return found


__all__ = ["NAMES", "ALIASES", "canonical"]
