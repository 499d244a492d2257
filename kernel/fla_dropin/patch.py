"""One switch for a whole model: FLA's KDA op routed to ``kernel.chunk_kda``.

    import kernel
    kernel.patch_fla()            # FLA's KimiDeltaAttention (and any caller of fla.ops.kda.chunk_kda) runs ours
    ...
    kernel.unpatch_fla()          # FLA's own again
    with kernel.patched_fla():    # or for a block
        loss = model(batch).loss; loss.backward()

FLA's layer module imports the op by name (``from fla.ops.kda import chunk_kda``), so replacing
the package attribute alone would miss it: :func:`patch_fla` replaces the op in every loaded
module that holds FLA's function under any name, and in ``fla.ops.kda`` itself, so that a module
imported later gets the routed one too. :func:`unpatch_fla` puts FLA's back wherever the routed
one still is.

The routed op runs ours where the call is covered and FLA's own otherwise, with a one-time
:class:`~kernel.fla_dropin.FallbackWarning` that names the argument: never an error in the middle
of training. Calls that build no graph (``torch.no_grad``, ``torch.inference_mode``, no input
requiring grad: a prefill, an evaluation) run ours too, in inference mode
(:func:`~.arguments.training_mode`): o and the final state alone, nothing kept for a backward.

The routed op is traceable: under ``torch.compile(fullgraph=True)`` a covered call of a patched
model compiles through our op (a call that falls back to FLA's own meets FLA's compiler-disabled
function, which fullgraph refuses).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from typing import Any, Callable, Iterator

from .entry import check_call, chunk_kda
from .function import warn_once
from .library import chunk_kda_op

__all__ = ["patch_fla", "unpatch_fla", "patched_fla", "is_patched"]

_SIGNATURE = inspect.signature(chunk_kda)
_state: dict[str, Any] = {"original": None, "routed": None, "replaced": []}


def _fla_kda():
    try:
        import fla.ops.kda as fla_kda
    except ImportError as exc:
        raise ImportError(f"kernel.patch_fla routes flash-linear-attention's KDA op: install fla-core 0.6.0 "
                          f"(and flash-linear-attention for its layers) first ({exc})") from exc
    return fla_kda


def _route(original: Callable) -> Callable:
    @functools.wraps(original)
    def chunk_kda_routed(*args: Any, **kwargs: Any):
        try:
            bound = _SIGNATURE.bind(*args, **kwargs)
            bound.apply_defaults()
            call, tensors = check_call(dict(bound.arguments))
        except (TypeError, ValueError) as exc:
            warn_once(f"kernel.patch_fla: FLA's own chunk_kda runs for calls like this one: {exc}")
            return original(*args, **kwargs)
        return chunk_kda_op(call, *tensors)

    chunk_kda_routed.__kernel_routes__ = original
    return chunk_kda_routed


def is_patched() -> bool:
    """Whether FLA's KDA op is routed to ours now."""
    return _state["routed"] is not None


def patch_fla() -> None:
    """Route ``fla.ops.kda.chunk_kda`` to ours in every loaded module that holds it (idempotent)."""
    fla_kda = _fla_kda()
    if is_patched():
        return
    original = fla_kda.chunk_kda
    routed = _route(original)
    replaced = []
    for module in list(sys.modules.values()):
        try:
            names = [name for name, value in vars(module).items() if value is original]
        except TypeError:   # modules without a __dict__
            continue
        for name in names:
            setattr(module, name, routed)
            replaced.append((module, name))
    _state.update(original=original, routed=routed, replaced=replaced)


def unpatch_fla() -> None:
    """FLA's own op back wherever the routed one still is (idempotent)."""
    if not is_patched():
        return
    original, routed = _state["original"], _state["routed"]
    for module in list(sys.modules.values()):
        try:
            names = [name for name, value in vars(module).items() if value is routed]
        except TypeError:
            continue
        for name in names:
            setattr(module, name, original)
    _state.update(original=None, routed=None, replaced=[])


@contextlib.contextmanager
def patched_fla() -> Iterator[None]:
    """:func:`patch_fla` for a block; the state before it comes back after (a block inside a patched
    region leaves it patched)."""
    already = is_patched()
    patch_fla()
    try:
        yield
    finally:
        if not already:
            unpatch_fla()
