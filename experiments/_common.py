"""What every single-warp experiment shares: the result, the checker, the runner.

An experiment module exposes

    NAME: str                       # its module name
    SUMMARY: str                    # one line
    observe(backend) -> dict        # every lane's registers / the memory image it produced
    check(observations) -> Checker  # compare them with the closed form
    run(backend) -> Result          # check(observe(backend)) wrapped up

with backend "gpu" (the instruction, through a CUDA kernel that includes the
ptx_lab header) or "model" (the same sequence through ptx_lab.model). Keeping
observe and check apart lets the tests feed the checker tampered observations
and see that it names the lanes involved.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np

from ptx_lab.fragments import fragment_map

WARP = 32
BACKENDS = ("gpu", "model")
MAX_LINES = 40  # failure lines printed before "... and N more"


# ------------------------------------------------------------------ results

@dataclasses.dataclass
class Result:
    name: str
    backend: str
    failures: list[str]
    checked: int

    @property
    def passed(self) -> bool:
        return not self.failures and self.checked > 0

    def report(self) -> str:
        if self.passed:
            return f"[PASS] {self.name} on {self.backend}: all {self.checked} values as the closed form says"
        head = (f"[FAIL] {self.name} on {self.backend}: {len(self.failures)} of {self.checked} "
                "values differ from the closed form")
        lines = [head, *("  " + f for f in self.failures[:MAX_LINES])]
        if len(self.failures) > MAX_LINES:
            lines.append(f"  ... and {len(self.failures) - MAX_LINES} more")
        return "\n".join(lines)


class Checker:
    """Collects element-wise comparisons; each mismatch becomes one failure line."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.checked = 0

    def compare(self, case: str, got: np.ndarray, expected: np.ndarray,
                where: Callable[..., str], fmt: Callable[[Any], str] = str) -> None:
        """Compare two same-shaped arrays element by element.

        `case` prefixes every line (e.g. "bf16, C = 0"); `where(*index)` names
        the element (e.g. "lane 14 c1 D[3][5]"); `fmt` prints a value.
        """
        got, expected = np.asarray(got), np.asarray(expected)
        if got.shape != expected.shape:
            self.checked += 1
            self.failures.append(f"{case}: got an array of shape {got.shape}, expected {expected.shape}")
            return
        for index in np.ndindex(expected.shape):
            self.checked += 1
            g, e = got[index], expected[index]
            if g != e:
                self.failures.append(f"{case}: {where(*index)}: got {fmt(g)}, expected {fmt(e)}")

    def result(self, name: str, backend: str) -> Result:
        return Result(name, backend, list(self.failures), self.checked)


def swap_lanes(observations: dict[str, np.ndarray], a: int, b: int) -> dict[str, np.ndarray]:
    """Copy of `observations` with lanes a and b exchanged in every lane-first array."""
    out = {}
    for key, arr in observations.items():
        arr = np.array(arr)
        if arr.shape[:1] == (WARP,):
            arr[[a, b]] = arr[[b, a]]
        out[key] = arr
    return out


# ------------------------------------------------------------------ closed forms

def lane_values(operand: str, value: Callable[[np.ndarray, np.ndarray], Any]) -> np.ndarray:
    """value(row, col) at the cell every (lane, register, element) holds: (32, regs, elems).

    The closed form of a fragment: e.g. lane_values("mma.c", lambda i, j: 16 * i * j)
    is what an mma with A[i][k] = i, B[k][j] = j must leave in each register.
    """
    fmap = fragment_map(operand)
    rows, cols = fmap[..., 0], fmap[..., 1]
    return np.broadcast_to(np.asarray(value(rows, cols)), rows.shape).copy()


_FLOAT16 = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def to_bits(x, dtype: str) -> np.ndarray:
    """Floats -> uint16 bit patterns of bf16 / f16 (round to nearest even)."""
    return np.asarray(x, dtype=np.float32).astype(_FLOAT16[dtype]).view(np.uint16)


def from_bits(bits, dtype: str) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(_FLOAT16[dtype]).astype(np.float32)


def pack(pairs: np.ndarray) -> np.ndarray:
    """(..., 2) uint16 -> (...) uint32, element 0 in bits 0..15."""
    pairs = np.asarray(pairs, dtype=np.uint32)
    return pairs[..., 0] | (pairs[..., 1] << np.uint32(16))


def unpack(regs: np.ndarray) -> np.ndarray:
    """(...) uint32 -> (..., 2) uint16, element 0 from bits 0..15."""
    regs = np.asarray(regs, dtype=np.uint32)
    return np.stack([regs & np.uint32(0xFFFF), regs >> np.uint32(16)], axis=-1).astype(np.uint16)


HALF = ("lo", "hi")


def hex16(v) -> str:
    return f"0x{int(v):04x}"


def hex8(v) -> str:
    return f"0x{int(v):02x}"


def num(v) -> str:
    return f"{float(v):g}"


# ------------------------------------------------------------------ running on the GPU

def run_warp(source: str, kernel: str, inputs: Sequence[Any],
             outputs: Sequence[tuple[tuple[int, ...], Any] | np.ndarray]) -> list[np.ndarray]:
    """Launch `kernel` from `source` on one warp (1 block x 32 threads).

    inputs: numpy arrays (copied to the device) or numpy scalars, in kernel
    argument order; outputs: the device arrays passed after them, each given
    as (shape, dtype) for a zero-initialised array or as a numpy array it
    starts as a copy of (a sentinel the kernel must overwrite, or must not).
    Returns the outputs as numpy arrays.
    """
    import cupy

    from ptx_lab.gpu import load_module

    fn = load_module(source).get_function(kernel)
    args = [cupy.asarray(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in inputs]
    outs = [cupy.array(np.ascontiguousarray(o)) if isinstance(o, np.ndarray) else cupy.zeros(*o)
            for o in outputs]
    fn((1,), (WARP,), (*args, *outs))
    cupy.cuda.runtime.deviceSynchronize()
    return [cupy.asnumpy(o) for o in outs]


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")


# ------------------------------------------------------------------ command line

def choose_backend(emulate: bool) -> str:
    from ptx_lab.gpu import gpu_reason

    if emulate:
        print("--emulate: running on the CPU model")
        return "model"
    reason = gpu_reason()
    if reason is not None:
        print(f"no GPU ({reason}): running on the CPU model")
        return "model"
    return "gpu"


def main(module: ModuleType, argv: Sequence[str] | None = None) -> int:
    """`python -m experiments.<name> [--emulate]`: run, print, exit 1 on failure."""
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{module.NAME}",
                                     description=module.SUMMARY)
    parser.add_argument("--emulate", action="store_true",
                        help="run on the CPU model (ptx_lab.model) even when a GPU is present")
    args = parser.parse_args(argv)
    result = module.run(choose_backend(args.emulate))
    print(result.report())
    return 0 if result.passed else 1


def entry_point(module_name: str) -> None:
    """Call from an experiment's `if __name__ == "__main__":`."""
    sys.exit(main(sys.modules[module_name]))
