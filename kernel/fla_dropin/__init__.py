"""``kernel.chunk_kda``: flash-linear-attention's KDA op with our forward and our backward.

    from kernel import chunk_kda          # instead of: from fla.ops.kda import chunk_kda
    o, final_state = chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias,
                               use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                               use_beta_sigmoid_in_kernel=True, state_v_first=True)

What and why
------------
The same call as fla-core 0.6.0's ``fla.ops.kda.chunk_kda``, argument for argument (names, order,
defaults, semantics), so that switching is one import. The forward is ours: the preprocessing (the
l2norm, the beta sigmoid, the gate's 64-chunk cumsum; FLA's Triton kernels where fla-core is installed,
the same math in torch where it is not: :mod:`.preprocess`), then :func:`kernel.forward.forward`,
which also leaves the states entering every chunk, so the backward runs no forward-state scan.
The backward is ours: :func:`kernel.kda_backward.run` on the tensors the forward left, then the
gate and beta activations' backward, the state layout, the sum over grouped value heads and FLA's
l2norm backward (:mod:`.function` says how).

FLA's forward instead, for comparison (o and the final state then FLA's to the bit, the backward
still ours)::

    kernel.use_forward("fla")            # for the process; kernel.use_forward("ours") back
    with kernel.using_forward("fla"):    # for a block
        ...

The setting (:mod:`.setting`, its default ``DEFAULT_FORWARD`` named once) is read per call at the
boundary; under torch.compile it is a constant of the trace, and a change compiles again.

What it covers
--------------
Everything FLA's ``KimiDeltaAttention`` layer passes: q, k bf16 [B, T, H, 128], v bf16
[B, T, HV, 128] with HV a multiple of H (grouped value heads), g and beta per value head,
precomputed or activated in the op (``use_gate_in_kernel`` with ``A_log`` / ``dt_bias``, the
softplus gate or the ``lower_bound`` sigmoid gate, ``A_log=None``; ``use_beta_sigmoid_in_kernel``,
``allow_neg_eigval``), ``state_v_first`` (and its old name ``transpose_state_layout``), ``scale``,
``initial_state``, ``output_final_state``, ``use_qk_l2norm_in_kernel``, ``cu_seqlens`` /
``cu_seqlens_cpu``, ``safe_gate``, ``lower_bound``, ``disable_recompute``.

With our forward, ``safe_gate`` and ``lower_bound`` (outside the gate activation) change nothing
(they pick FLA's intra-chunk kernel), nor does ``disable_recompute``: a call that a gradient can be
asked of keeps, for the backward, the gate's fp32 cumsum and the bf16 states entering every
64-token chunk (each 512 B a token and value head), and nothing is recomputed.

Inference mode: a call that no gradient can be asked of (under ``torch.no_grad`` or
``torch.inference_mode``, or with no differentiable input requiring grad: a prefill, an evaluation;
:func:`~.arguments.training_mode`) runs the forward with ``training=False``: o and the final state
alone, no states (4.3 GB at 32 x 8192 with 32 value heads), no Aqk or Akk, nothing kept. The
choice is made before the op is called and reaches it as its ``training`` argument (a constant of
a torch.compile trace, guarded: a change of the grad mode compiles again).

Gates are not limited: a 16-token tile whose gate spans more than 110 (log2) in some channel
(``kernel.shapes.SPAN_LIMIT``), beyond what the factorised tile products hold in fp32 under
-ftz=true, has those products formed pairwise, in our forward and in Kernel B, decided on the
device with no host sync.

Refused with a ValueError that names the argument and what to do instead, before anything
touches the GPU: ``cp_context``, ``chunk_size`` other than 64, ``return_intermediate_states``,
``use_graph`` / ``max_num_seqs``, head dimensions other than 128, q, k, v not bf16, and FLA's own
rules (value heads not a multiple of q's, ``allow_neg_eigval`` without the beta sigmoid,
``use_gate_in_kernel`` without ``A_log`` or ``lower_bound``, ``safe_gate`` with the gate in the
op and ``lower_bound`` outside [-5, 0)). A keyword FLA does not know is a TypeError (FLA
ignores it).

Our forward covers every call the checks admit, so nothing falls back to FLA's forward: a user
who asks for ours gets ours, or a refusal naming the argument.

One switch routes FLA's own op to this one for a whole model: :func:`patch_fla` (with
:func:`unpatch_fla` and the context manager :func:`patched_fla`), no-grad calls included (in
inference mode); whatever this op does not cover then runs FLA's own path with a one-time warning.

torch.compile: the op is registered with torch.library (``torch.ops.ptx_lab.chunk_kda_fwd`` and
``chunk_kda_bwd``, fake implementations, the autograd formula), so a model calling
:func:`chunk_kda` compiles with ``fullgraph=True``, FLA's own being compiler-disabled. A uniform
batch (B x T, no ``cu_seqlens``) traces with no host sync. With ``cu_seqlens`` the trace copies
them to the host (``torch.ops.ptx_lab.offsets_on_host``: one sync the first time a tensor is read, as
in eager calls) unless ``cu_seqlens_cpu`` is given, and their values are checked when the forward op
runs rather than at the call; the states the forward keeps
then have a data-dependent chunk count (an unbacked size in the trace): in training mode always
with our forward, with ``disable_recompute`` with FLA's.

The rooms: :mod:`.arguments` (the one check of a call), :mod:`.setting` (whose forward runs),
:mod:`.function` (what the forward and backward run), :mod:`.library` (the ops, their fakes and
autograd), :mod:`.entry` (the signature), :mod:`.patch` (the switch). torch is imported with this
package; fla, :mod:`kernel.forward` and :mod:`kernel.kda_backward` (CuPy) only when the forward or
the backward runs. ``import kernel``
needs none of them: ``kernel.chunk_kda`` loads this package on first use.
"""
from __future__ import annotations

from .arguments import FLA_CALL, Call, check_arguments
from .entry import chunk_kda
from .function import FallbackWarning, forget_warnings
from .patch import is_patched, patch_fla, patched_fla, unpatch_fla
from .setting import DEFAULT_FORWARD, FORWARDS, forward_setting, use_forward, using_forward

__all__ = ["chunk_kda", "FallbackWarning", "FLA_CALL", "Call", "check_arguments",
           "forget_warnings", "patch_fla", "unpatch_fla", "patched_fla", "is_patched", "use_forward",
           "using_forward", "forward_setting", "FORWARDS", "DEFAULT_FORWARD"]
