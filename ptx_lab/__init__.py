"""ptx_lab: verified warp-level tensor-core PTX primitives.

Each primitive exists twice: once as inline PTX in ``ptx_lab/cuda/<name>.cuh``
(the only place its asm string lives) and once as an exact numpy model in
``ptx_lab.model`` that says which lane and register holds which element.
"""
from pathlib import Path

CUDA_INCLUDE_DIR = Path(__file__).resolve().parent / "cuda"

__all__ = ["CUDA_INCLUDE_DIR"]
