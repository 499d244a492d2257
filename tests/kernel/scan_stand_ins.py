"""The two scans' entry points with stand-in arguments, what their CPU tests share: Kernel S's
(kernel.forward_states: plan_forward_states, forward_states) and the forward's (kernel.forward:
plan_forward, forward), which check their batches with the same code.

The arguments are stand-ins for GPU arrays (tests/kernel/ds_scan/test_fla.py's DeviceArray: the CUDA
array interface and a device id, no memory), so every check runs without a GPU.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from kernel.forward import forward, plan_forward
from kernel.forward_states import forward_states, plan_forward_states

from .ds_scan.test_fla import DeviceArray

D, C64 = 128, 64
BF16 = np.uint16


@dataclasses.dataclass(frozen=True)
class Scan:
    """One scan: its plan and launch, its positional arrays (``names``), the one whose B, T and heads the
    others follow (``anchor``), what a wrong config is refused for not being (``config_type``) and the
    plan's keywords that ask for the states (``states_kw``)."""
    name: str
    plan: Callable
    run: Callable
    names: tuple[str, ...]
    anchor: str
    config_type: str
    states_kw: dict = dataclasses.field(default_factory=dict)

    def args(self, B=2, T=100, H=3, *, HV=None, h0=False, beta_dtype=np.float32, N=None):
        """Stand-ins: q and k with H heads, the others with HV (None: H; more: FLA's grouped value heads)."""
        N = B if N is None else N
        HV = H if HV is None else HV
        wide = (B, T, HV, D)
        make = dict(q=lambda: DeviceArray((B, T, H, D), BF16), k=lambda: DeviceArray((B, T, H, D), BF16),
                    v=lambda: DeviceArray(wide, BF16), g=lambda: DeviceArray(wide, np.float32),
                    beta=lambda: DeviceArray((B, T, HV), beta_dtype), Akk=lambda: DeviceArray((B, T, HV, C64), BF16))
        a = {name: make[name]() for name in self.names}
        kw = dict(initial_state=DeviceArray((N, HV, D, D), np.float32) if h0 else None)
        return a, kw

    def call(self, fn, a, kw, **over):
        """fn (the plan or the launch) on the stand-ins ``a`` and ``kw``, ``over`` replacing any of them."""
        args = {**a, **kw, **over}
        pos = [args.pop(n) for n in self.names]
        return fn(*pos, **args)


STATES = Scan("forward_states", plan_forward_states, forward_states, ("k", "v", "g", "beta", "Akk"), "k",
              "kernel.forward_states.Config")
FORWARD = Scan("forward", plan_forward, forward, ("q", "k", "v", "g", "beta"), "q", "kernel.forward.Config",
               {"training": True})
SCANS = (STATES, FORWARD)
