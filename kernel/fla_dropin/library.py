"""``kernel.chunk_kda``'s op, registered with torch.library: three custom ops and the autograd formula
that joins the first two, so that torch.compile traces a model through it and autograd runs through
torch's registration.

* ``torch.ops.ptx_lab.chunk_kda_fwd``: our forward or FLA's, as its ``forward`` argument says
  (:func:`.function.forward`). It returns o, the final state and every tensor the backward reads,
  :data:`~.function.FORWARD_OUTPUTS` in that order (a custom op keeps no state between its forward
  and backward, so what an autograd function would save is returned); one the call does not make
  is an empty tensor. With ``training`` False (no gradient can be asked for:
  :func:`~.arguments.training_mode`, decided before the op is called) it makes o and the final state
  alone, and the autograd formula refuses it inputs that require grad. Aqk and Akk are partly
  written by either forward (FLA's below the diagonal, ours only the 16 x 16 diagonal blocks), the
  rest whatever memory held: compare them only where written.
* ``torch.ops.ptx_lab.chunk_kda_bwd``: our backward (:func:`.function.backward`): the gradients of
  :data:`~.function.GRADIENT_INPUTS` in that order, an empty tensor for one nobody asked for.
* ``torch.ops.ptx_lab.offsets_on_host``: cu_seqlens' values as a host int64 tensor, read from the
  device once per offsets tensor (:func:`kernel.shapes.host_offsets`), as the boundary reads them in
  eager mode. Reading a device tensor is a host sync; a compiled model's KDA layers share one offsets
  tensor a batch, and a traced ``cu_seqlens.cpu()`` would sync at every layer's call.

The call's settings (:class:`~.arguments.Call` less its sizes, ``forward`` among them: "ours" or
"fla", and ``training``, each a constant of a torch.compile trace) are the ops' scalar arguments. The
varlen offsets reach the ops as ``offsets``, a host int64 tensor of cu_seqlens (the backward's
launch tables are built from it): :func:`chunk_kda_op` passes the copy that the boundary checked,
or, under torch.compile, where the boundary cannot read values, ``cu_seqlens_cpu`` or
``offsets_on_host``'s result. The forward op checks the offsets it reads (cheap: N + 1 integers on
the host), because it can be called on its own through ``torch.ops``.

Each op has a fake implementation: its outputs' shapes and dtypes from the inputs alone, as the
forward allocates them: FLA's code (``chunk_kda_fwd``, ``chunk_kda_fwd_intra``, ``recompute_w_u_fwd``,
``chunk_gated_delta_rule_fwd_h``, ``l2norm_fwd``, ``fused_beta_sigmoid_fwd`` in fla-core 0.6.0) and,
for ours, :func:`kernel.forward.plan_forward`'s shapes (the same but for the states: always made,
always [K, V], and the gate's cumsum, always kept in training mode). The one data-dependent shape is
the states h of a varlen call in training mode (one per 64-token chunk of every sequence), ours or
FLA's with ``disable_recompute``:
there the fake makes its chunk count an unbacked size, which torch.compile carries but a plain meta
tensor cannot (a varlen dry run on meta tensors under our forward raises torch's data-dependent
shape error; FakeTensorMode serves it).

The fake also serves meta tensors, so a call on the meta device is a dry run of the shapes (but for
the data-dependent one above).
"""
import dataclasses
from typing import Optional, Sequence

import numpy as np

import torch
from torch import Tensor

from ..shapes import CHUNK_TOKENS, check_cu_seqlens, host_offsets
from .arguments import Call
from . import function
from .function import FORWARD_OUTPUTS, GRADIENT_INPUTS

__all__ = ["chunk_kda_op", "chunk_kda_fwd", "chunk_kda_bwd", "offsets_on_host_op", "NAMESPACE", "SETTINGS", "TENSOR_ARGUMENTS", "SAVED",
           "RETURNED"]

NAMESPACE = "ptx_lab"
# the Call's fields that are not sizes: the ops' scalar arguments, in this order
SIZES = ("B", "T", "H", "HV", "N", "offsets")
SETTINGS = tuple(f.name for f in dataclasses.fields(Call) if f.name not in SIZES)
# the forward op's tensor arguments, before the settings (the first ones are GRADIENT_INPUTS)
TENSOR_ARGUMENTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "cu_seqlens_cpu",
                    "offsets")
# what the autograd formula keeps for the backward op, its arguments after do and dht: q and k as the
# kernels read them, the call's gate where the op activated it or our kernels read it as it came
# (function.token_gate), the call's beta and the sigmoid's
SAVED = ("q", "q_rstd", "k", "k_rstd", "v", "g_cumsum", "g_raw", "beta", "beta_activated", "A_log", "dt_bias", "Aqk",
         "Akk", "h", "initial_state", "cu_seqlens", "cu_seqlens_cpu", "offsets")
# the forward's outputs that are the user's (the rest exist for the backward)
RETURNED = ("o", "final_state")


def _absent(like: Tensor) -> Tensor:
    """The empty tensor that stands for an output the call does not make."""
    return like.new_empty(0, dtype=torch.float32)


def _forward_made(output_final_state: bool, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
                  use_beta_sigmoid_in_kernel: bool, disable_recompute: bool, forward: str, training: bool,
                  raw_qk_rows: bool, q_dtype: torch.dtype, k_dtype: torch.dtype) -> tuple[bool, ...]:
    """Which of FORWARD_OUTPUTS a call makes: FLA's forward frees its gate cumsum where the op activated
    the gate, unless disable_recompute keeps everything, h included; ours keeps h always and the cumsum
    where the op activates the gate (else our kernels read the call's own gate, which the op keeps:
    function.token_gate), and no normalised q and k where our kernels read the call's own with their rstd
    (function.reads_raw_qk, from the call's raw_qk_rows and q's and k's dtypes). Out of training mode: only what
    is RETURNED."""
    ours = forward == "ours"
    copies = use_qk_l2norm_in_kernel and not function.reads_raw_qk(raw_qk_rows, forward, use_qk_l2norm_in_kernel,
                                                                  q_dtype, k_dtype)
    made = dict(o=True, final_state=output_final_state, q=copies,
                q_rstd=use_qk_l2norm_in_kernel, k=copies, k_rstd=use_qk_l2norm_in_kernel,
                beta=use_beta_sigmoid_in_kernel,
                g_cumsum=use_gate_in_kernel if ours else disable_recompute or not use_gate_in_kernel,
                Aqk=True, Akk=True, h=ours or disable_recompute)
    return tuple(made[name] and (training or name in RETURNED) for name in FORWARD_OUTPUTS)


def _gradients_made(need: Sequence[bool], use_gate_in_kernel: bool, A_log: Optional[Tensor],
                    dt_bias: Optional[Tensor], initial_state: Optional[Tensor]) -> tuple[bool, ...]:
    """Which of GRADIENT_INPUTS the backward returns: those asked for that the call has."""
    has = dict(q=True, k=True, v=True, g=True, beta=True, A_log=use_gate_in_kernel and A_log is not None,
               dt_bias=use_gate_in_kernel and dt_bias is not None, initial_state=initial_state is not None)
    return tuple(bool(wanted) and has[name] for name, wanted in zip(GRADIENT_INPUTS, need))


def _call(q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], offsets, settings: dict) -> Call:
    B, T, H = q.shape[:3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return Call(B=B, T=T, H=H, HV=v.shape[2], N=N, offsets=offsets, **settings)


def _host_offsets(q: Tensor, cu_seqlens: Optional[Tensor], offsets: Optional[Tensor]):
    """The checked host copy of cu_seqlens (from ``offsets`` where given), or None."""
    if cu_seqlens is None:
        return None
    return check_cu_seqlens(offsets if offsets is not None else cu_seqlens, q.shape[0], q.shape[1])


FORWARD_RETURNS = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
BACKWARD_RETURNS = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_fwd", mutates_args=())
def chunk_kda_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                  dt_bias: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                  cu_seqlens_cpu: Optional[Tensor], offsets: Optional[Tensor], scale: float,
                  output_final_state: bool, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
                  use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, safe_gate: bool,
                  lower_bound: Optional[float], disable_recompute: bool, state_v_first: bool,
                  forward: str, training: bool, raw_qk_rows: bool) -> FORWARD_RETURNS:
    """The KDA forward (``forward``: "ours" or "fla") on a checked call: FORWARD_OUTPUTS, each absent one
    (all but o and the final state out of ``training`` mode) an empty tensor."""
    arguments = locals()
    settings = {name: arguments[name] for name in SETTINGS}
    call = _call(q, v, cu_seqlens, _host_offsets(q, cu_seqlens, offsets), settings)
    out = function.forward(call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu)
    made = _forward_made(output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                         use_beta_sigmoid_in_kernel, disable_recompute, forward, training, raw_qk_rows, q.dtype,
                         k.dtype)
    return tuple(out[name] if m else _absent(q) for name, m in zip(FORWARD_OUTPUTS, made))


@chunk_kda_fwd.register_fake
def _chunk_kda_fwd_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, offsets, scale,
                        output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                        allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, forward,
                        training, raw_qk_rows):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    state = (V, K) if state_v_first else (K, V)
    shapes = dict(   # (shape, dtype) of each output, as FLA allocates it
        o=(v.shape, q.dtype),                                           # empty_like(v), then type_as(q)
        final_state=((N, HV, *state), torch.float32),                   # chunk_gated_delta_rule_fwd_h
        q=(q.shape, q.dtype), q_rstd=(q.shape[:-1], torch.float32),     # l2norm_fwd
        k=(k.shape, k.dtype), k_rstd=(k.shape[:-1], torch.float32),
        beta=(beta.shape, torch.float32),                               # fused_beta_sigmoid_fwd
        g_cumsum=(g.shape, torch.float32),                              # chunk_local_cumsum, kda_gate_chunk_cumsum
        Aqk=((B, T, HV, CHUNK_TOKENS), k.dtype), Akk=((B, T, HV, CHUNK_TOKENS), k.dtype),   # chunk_kda_fwd_intra
    )
    made = _forward_made(output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                         use_beta_sigmoid_in_kernel, disable_recompute, forward, training, raw_qk_rows, q.dtype,
                         k.dtype)
    if made[FORWARD_OUTPUTS.index("h")]:
        # one state per 64-token chunk of every sequence, bf16 (FLA's chunk_gated_delta_rule_fwd_h: in
        # kg's dtype, k's, in the state's layout; ours: [K, V] always); with cu_seqlens the chunk count
        # depends on the offsets' values
        NT = -(-T // CHUNK_TOKENS) if cu_seqlens is None else torch.library.get_ctx().new_dynamic_size()
        shapes["h"] = ((B, NT, HV, *((K, V) if forward == "ours" else state)), k.dtype)
    return tuple(q.new_empty(shapes[name][0], dtype=shapes[name][1]) if m else _absent(q)
                 for name, m in zip(FORWARD_OUTPUTS, made))


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_bwd", mutates_args=())
def chunk_kda_bwd(do: Optional[Tensor], dht: Optional[Tensor], q: Tensor, q_rstd: Optional[Tensor], k: Tensor,
                  k_rstd: Optional[Tensor], v: Tensor, g_cumsum: Optional[Tensor], g_raw: Optional[Tensor],
                  beta: Tensor, beta_activated: Optional[Tensor], A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                  Aqk: Tensor, Akk: Tensor, h: Optional[Tensor], initial_state: Optional[Tensor],
                  cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], offsets: Optional[Tensor],
                  g_dtype: torch.dtype, need: Sequence[bool], scale: float, output_final_state: bool,
                  use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
                  allow_neg_eigval: bool, safe_gate: bool, lower_bound: Optional[float], disable_recompute: bool,
                  state_v_first: bool, forward: str, training: bool, raw_qk_rows: bool) -> BACKWARD_RETURNS:
    """Our KDA backward from the forward op's tensors: the gradients of GRADIENT_INPUTS, each one
    ``need`` leaves out (or the call has not) an empty tensor."""
    arguments = locals()
    settings = {name: arguments[name] for name in SETTINGS}
    # the forward op checked these offsets; here they are only read
    host = None if cu_seqlens is None else host_offsets(offsets if offsets is not None else cu_seqlens).astype("int64")
    call = _call(q, v, cu_seqlens, host, settings)
    made = _gradients_made(need, use_gate_in_kernel, A_log, dt_bias, initial_state)
    grads = function.backward(call, made, g_dtype, do, dht, q, q_rstd, k, k_rstd, v, g_cumsum, g_raw, beta,
                              beta_activated, A_log, dt_bias, Aqk, Akk, h, initial_state, cu_seqlens, cu_seqlens_cpu)
    return tuple(x if m else _absent(q) for x, m in zip(grads, made))


@chunk_kda_bwd.register_fake
def _chunk_kda_bwd_fake(do, dht, q, q_rstd, k, k_rstd, v, g_cumsum, g_raw, beta, beta_activated, A_log, dt_bias, Aqk,
                        Akk, h, initial_state, cu_seqlens, cu_seqlens_cpu, offsets, g_dtype, need, scale,
                        output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                        allow_neg_eigval, safe_gate, lower_bound, disable_recompute, state_v_first, forward,
                        training, raw_qk_rows):
    g = g_raw if g_raw is not None else g_cumsum
    like = dict(q=(q, q.dtype), k=(k, k.dtype), v=(v, v.dtype), g=(g, g_dtype), beta=(beta, beta.dtype),
                A_log=(A_log, None), dt_bias=(dt_bias, None), initial_state=(initial_state, None))
    made = _gradients_made(need, use_gate_in_kernel, A_log, dt_bias, initial_state)
    out = []
    for name, m in zip(GRADIENT_INPUTS, made):
        x, dtype = like[name]
        out.append(x.new_empty(x.shape, dtype=dtype or x.dtype) if m else _absent(q))
    return tuple(out)


def _setup_context(ctx, inputs, output) -> None:
    a = dict(zip(TENSOR_ARGUMENTS + SETTINGS, inputs))
    s = {name: a[name] for name in SETTINGS}
    if not s["training"]:
        # autograd runs this only for a call that requires grad; out of training mode nothing was kept
        raise RuntimeError(f"{NAMESPACE}::chunk_kda_fwd: called with training=False on inputs that require grad "
                           f"(with grad mode on), so no backward could run: pass training=True (kernel.chunk_kda "
                           f"decides it itself: kernel.fla_dropin.arguments.training_mode)")
    made = _forward_made(s["output_final_state"], s["use_qk_l2norm_in_kernel"], s["use_gate_in_kernel"],
                         s["use_beta_sigmoid_in_kernel"], s["disable_recompute"], s["forward"], s["training"],
                         s["raw_qk_rows"], a["q"].dtype, a["k"].dtype)
    out = {name: (x if m else None) for name, x, m in zip(FORWARD_OUTPUTS, output, made)}
    ctx.mark_non_differentiable(*[x for name, x in zip(FORWARD_OUTPUTS, output)
                                  if name not in RETURNED or out[name] is None])
    # an output that no gradient reached comes as None, not as a tensor of zeros made for it
    ctx.set_materialize_grads(False)
    # q and k as the kernels read them: the normalised copies where the forward made them, else the call's own
    keep = dict(a, q=out["q"] if made[FORWARD_OUTPUTS.index("q")] else a["q"],
                k=out["k"] if made[FORWARD_OUTPUTS.index("k")] else a["k"], q_rstd=out["q_rstd"],
                k_rstd=out["k_rstd"], g_cumsum=out["g_cumsum"],
                g_raw=a["g"] if s["use_gate_in_kernel"] or s["forward"] == "ours" else None,
                beta_activated=out["beta"], Aqk=out["Aqk"], Akk=out["Akk"], h=out["h"])
    ctx.save_for_backward(*(keep[name] for name in SAVED))
    ctx.settings = s
    ctx.g_dtype = a["g"].dtype


def _backward(ctx, do, dht, *_residuals):
    s = ctx.settings
    need = tuple(ctx.needs_input_grad[:len(GRADIENT_INPUTS)])
    saved = ctx.saved_tensors
    kept = dict(zip(SAVED, saved))
    grads = chunk_kda_bwd(do, dht if s["output_final_state"] else None, *saved, ctx.g_dtype, need,
                          *(s[name] for name in SETTINGS))
    made = _gradients_made(need, s["use_gate_in_kernel"], kept["A_log"], kept["dt_bias"], kept["initial_state"])
    return (*(x if m else None for x, m in zip(grads, made)),
            *([None] * (len(TENSOR_ARGUMENTS) + len(SETTINGS) - len(GRADIENT_INPUTS))))


chunk_kda_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op(f"{NAMESPACE}::offsets_on_host", mutates_args=())
def offsets_on_host_op(cu_seqlens: Tensor) -> Tensor:
    """cu_seqlens' values as a new host int64 tensor, read from the device once per offsets tensor
    (:func:`kernel.shapes.host_offsets`): what a torch.compile trace calls for the offsets, where eager
    calls have the boundary's copy."""
    return torch.from_numpy(host_offsets(cu_seqlens).astype(np.int64))


@offsets_on_host_op.register_fake
def _offsets_on_host_fake(cu_seqlens: Tensor) -> Tensor:
    return torch.empty(cu_seqlens.shape, dtype=torch.int64, device="cpu")


def chunk_kda_op(call: Call, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                 cu_seqlens_cpu) -> tuple[Tensor, Optional[Tensor]]:
    """(o, final_state or None) of a checked call through the forward op (autograd through the
    backward op). The varlen offsets: the boundary's checked host copy, or, where the boundary could
    not read them (torch.compile), ``cu_seqlens_cpu`` or :func:`offsets_on_host_op`'s."""
    offsets = None
    if cu_seqlens is not None:
        if call.offsets is not None:
            offsets = torch.from_numpy(call.offsets)
        else:
            offsets = cu_seqlens_cpu if cu_seqlens_cpu is not None else offsets_on_host_op(cu_seqlens)
    out = chunk_kda_fwd(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu, offsets,
                        *(getattr(call, name) for name in SETTINGS))
    return out[0], (out[1] if call.output_final_state else None)
