"""``kernel.chunk_kda``: fla-core 0.6.0's ``fla.ops.kda.chunk_kda`` signature, argument for argument."""
from __future__ import annotations

from typing import Any

import torch

from .arguments import BOOL_ARGUMENTS, NOT_COVERED, Call, check_arguments
from .library import chunk_kda_op
from . import setting
from .setting import forward_setting

__all__ = ["chunk_kda", "check_call"]


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA's chunked layer: our forward (or FLA's, :func:`~.setting.use_forward`) and our backward. Arguments
    and semantics as ``fla.ops.kda.chunk_kda``.

    q, k: bf16 [B, T, H, 128]; v: bf16 [B, T, HV, 128], HV a multiple of H (grouped value heads);
    g [B, T, HV, 128]: the per-token natural-log gate, or with ``use_gate_in_kernel`` the raw
    projection that ``-exp(A_log) softplus(g + dt_bias)`` (or, with ``lower_bound``,
    ``lower_bound sigmoid(exp(A_log) (g + dt_bias))``) activates, ``A_log`` [HV] and ``dt_bias``
    [HV * 128] given as keywords; beta [B, T, HV], or its logits with ``use_beta_sigmoid_in_kernel``
    (times 2 with ``allow_neg_eigval``); with ``cu_seqlens`` (N+1 offsets) B = 1 and T = the total.
    ``initial_state``: fp32 [N, HV, 128, 128] ([K, V], or [V, K] with ``state_v_first``) or None.
    ``scale`` defaults to 128**-0.5.

    Returns (o [B, T, HV, 128] in q's dtype, final_state fp32 [N, HV, 128, 128] or None).
    Gradients flow to q, k, v, g, beta, A_log, dt_bias and initial_state. A call that no gradient
    can be asked of (``torch.no_grad``, ``torch.inference_mode``, or no input requiring grad:
    :func:`~.arguments.training_mode`) runs in inference mode: the forward makes o and the final state
    alone and keeps nothing for a backward (no states, no Aqk or Akk, no gate cumsum).

    Raises ValueError naming the argument for everything outside the covered cases (the package
    docstring lists them), TypeError for a keyword FLA's chunk_kda does not know or a switch that
    is not a bool, ImportError for FLA's forward (``kernel.use_forward("fla")``) without fla-core (our
    forward and backward run without it: the preprocessing is then torch's, :mod:`.preprocess`).

    Runs through the ``torch.ops.ptx_lab.chunk_kda_fwd`` op (:mod:`.library`), so that
    ``torch.compile(fullgraph=True)`` traces a model through it (FLA's own is compiler-disabled).
    Meta tensors get the ops' fake implementations: a dry run of the shapes.
    """
    # the arguments by name, as check_call takes them (**kwargs under "kwargs"); spelled out, not
    # locals(), which torch.compile (2.11) cannot trace
    call, tensors = check_call(dict(
        q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
        disable_recompute=disable_recompute, return_intermediate_states=return_intermediate_states,
        state_v_first=state_v_first, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, cp_context=cp_context,
        use_graph=use_graph, max_num_seqs=max_num_seqs, kwargs=kwargs))
    return chunk_kda_op(call, *tensors)


def check_call(arguments: dict[str, Any]) -> tuple[Call, tuple]:
    """The one check of a call given as :func:`chunk_kda`'s arguments by name (``**kwargs`` under
    "kwargs"): its :class:`Call` and the tensors :func:`~.library.chunk_kda_op` takes after it. Raises as
    :func:`chunk_kda` does, before anything touches the GPU. Tensors on the meta device pass (the
    ops' fake implementations serve them). The call's forward and ``raw_qk_rows`` are the settings now
    (:func:`~.setting.forward_setting`, :data:`~.setting.RAW_QK_ROWS`), its ``training`` the grad mode now
    and the inputs' ``requires_grad`` (:func:`~.arguments.training_mode`)."""
    a = arguments
    flags = {name: a[name] for name, _, _ in NOT_COVERED}
    given = {name: a[name] for name in BOOL_ARGUMENTS}
    q, k, v, g, beta = a["q"], a["k"], a["v"], a["g"], a["beta"]
    kwargs, initial_state, cu_seqlens = a["kwargs"], a["initial_state"], a["cu_seqlens"]
    call = check_arguments(q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens, flags=flags,
                           kwargs=kwargs, switches=given, forward=forward_setting(),
                           grad_enabled=torch.is_grad_enabled(), raw_qk_rows=setting.RAW_QK_ROWS, scale=a["scale"],
                           lower_bound=a["lower_bound"], cu_seqlens_cpu=a["cu_seqlens_cpu"])
    A_log, dt_bias = (kwargs.get("A_log"), kwargs.get("dt_bias")) if call.use_gate_in_kernel else (None, None)
    if q.device.type not in ("cuda", "meta"):
        raise ValueError(f"q: expected a CUDA tensor (the op runs on the GPU: FLA's Triton kernels and ours), "
                         f"got one on {q.device}")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state),
                    ("cu_seqlens", cu_seqlens), ("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on q's device {q.device}, got one on {x.device}")
    return call, (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, a["cu_seqlens_cpu"])
