"""Which forward ``kernel.chunk_kda`` runs: ours (:mod:`kernel.forward`) or FLA's; the backward is ours either way.

    kernel.use_forward("fla")            # for the process: FLA's forward, our backward (for comparison)
    with kernel.using_forward("fla"):    # for a block; the setting before it comes back after
        loss = model(batch).loss; loss.backward()
    kernel.forward_setting()             # "ours" or "fla"

The setting is read once per call, at the boundary (:func:`.entry.check_call`, which the routed
op of :func:`.patch.patch_fla` goes through too), into the call's :class:`~.arguments.Call`, whose
``forward`` the ops take as a string argument: the backward op knows whose tensors it reads, and
under torch.compile the value is a constant of the trace, guarded (a change compiles again).
:data:`DEFAULT_FORWARD` is the one place the process's default is chosen.

:data:`RAW_QK_ROWS` is the other process setting, a module attribute for the tools that compare the two
paths (``ptx-lab bench --qk-copies``); it is read the same way, once per call into the call's ``raw_qk_rows``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["FORWARDS", "DEFAULT_FORWARD", "RAW_QK_ROWS", "use_forward", "using_forward", "forward_setting",
           "check_forward"]

# "ours": kernel.forward after FLA's preprocessing (the l2norm, the beta sigmoid, the gate's cumsum);
# "fla": FLA's chunk_kda_fwd, so that o and the final state are FLA's to the bit
FORWARDS = ("ours", "fla")
DEFAULT_FORWARD = "ours"

_forward = DEFAULT_FORWARD

# Where a call asks for the l2norm of bf16 q and k under our forward: True, our kernels read q and k as they came
# with each row's rstd (kernel.fla_dropin.function.reads_raw_qk); False, normalised bf16 copies of them (the
# copies path, for comparison). On: the step's kernels took about 1 ms less at 32x8192 and 0.1 ms less at 4x8192
# than on the copies path, and the same at 1x131072 (docs/log/61).
RAW_QK_ROWS = True


def check_forward(name: object) -> str:
    """``name`` if it is one of :data:`FORWARDS`, else a ValueError saying which are."""
    if not isinstance(name, str) or name not in FORWARDS:
        raise ValueError(f"forward: expected one of {FORWARDS}, got {name!r}")
    return name


def use_forward(name: str) -> None:
    """Run ``name``'s forward ("ours" or "fla") in every later call of ``kernel.chunk_kda``."""
    global _forward
    _forward = check_forward(name)


def forward_setting() -> str:
    """The forward later calls run: "ours" or "fla"."""
    return _forward


@contextlib.contextmanager
def using_forward(name: str) -> Iterator[None]:
    """:func:`use_forward` for a block; the setting before it comes back after, on an error too."""
    before = _forward
    use_forward(name)
    try:
        yield
    finally:
        use_forward(before)
