"""The gated delta rule family for PyTorch with fla's call signatures (flash-linear-attention):

    chunk_gated_delta_rule / fused_recurrent_gated_delta_rule    GDN, g [B, T, HV]
    chunk_kda / fused_recurrent_kda                              KDA, g [B, T, HV, K]
    chunk_delta_rule / fused_recurrent_delta_rule                no gate

Each returns ``(o, final_state)`` (final_state None unless output_final_state) and is
differentiable in q, k, v, g, beta and initial_state -- the fused recurrent ones too: their forward
saves the prediction errors r (float32, the size of v) and the backward runs two passes over time
with O(K*V) state, never materializing per-step states (docs/delta_rule.md).

``chunk_*`` run the chunked (UT/WY, chunks of 64) algorithm, ``fused_recurrent_*`` the step by step
one; both compute the same function.

fla conveniences handled here, before the op: ``beta=None`` (ones), initial states of any float
dtype (cast to float32, the gradient is cast back), KDA's ``use_gate_in_kernel`` (with ``A_log``,
``dt_bias``, ``lower_bound``), ``use_beta_sigmoid_in_kernel`` / ``allow_neg_eigval`` and
``state_v_first``: plain differentiable torch ops around the same core op. Options that change
nothing in the math (``cu_seqlens_cpu``, ``disable_recompute``, ``chunk_size``, ``safe_gate``) are
accepted; ones flashgrad does not implement (``return_intermediate_states``, ``cp_context``,
``head_first=True``, ``gv``, ``use_graph``) raise NotImplementedError.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ._checks import fail, require_tensor, same_device
from ._torch_library import ops

# Keyword arguments of fla's functions that do not change the result here.
_IGNORED_OPTIONS = {"cu_seqlens_cpu", "disable_recompute", "chunk_size", "safe_gate", "max_num_seqs"}
# Keyword arguments of fla's functions whose non-default value flashgrad does not implement.
_UNSUPPORTED_OPTIONS = {"return_intermediate_states": False, "cp_context": None, "head_first": False,
                        "use_graph": False, "gv": None, "ssm_state_indices": None,
                        "num_accepted_tokens": None, "inplace_final_state": False}


def _check_options(op: str, options: dict) -> None:
    for name, value in options.items():
        if name in _IGNORED_OPTIONS:
            continue
        if name in _UNSUPPORTED_OPTIONS:
            default = _UNSUPPORTED_OPTIONS[name]
            if value is not default and value != default:
                fail(op, name, f"is not supported by flashgrad (leave it at {default!r})", NotImplementedError)
            continue
        raise TypeError(f"flashgrad: {op}() got an unexpected keyword argument '{name}'")


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _kda_gate(op, g, A_log, dt_bias, lower_bound, q):
    """fla's in-kernel KDA gate on raw g [B, T, HV, K]:
    -exp(A_log) * softplus(g + dt_bias), or with lower_bound:
    lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) (A_log optional there).
    A_log: [HV]; dt_bias: [HV * K] or [HV, K]. Computed in float32 (float64 for float64 q)."""
    dtype = _compute_dtype(q)
    x = g.to(dtype)
    hv, kdim = g.shape[-2], g.shape[-1]
    if dt_bias is not None:
        require_tensor(op, "dt_bias", dt_bias)
        if dt_bias.numel() != hv * kdim:
            fail(op, "dt_bias", f"must have HV * K = {hv * kdim} elements, got shape {list(dt_bias.shape)}")
        x = x + dt_bias.to(dtype).reshape(hv, kdim)
    a = None
    if A_log is not None:
        require_tensor(op, "A_log", A_log)
        if A_log.numel() != hv:
            fail(op, "A_log", f"must have HV = {hv} elements, got shape {list(A_log.shape)}")
        a = A_log.to(dtype).reshape(hv, 1).exp()
    if lower_bound is not None:
        return float(lower_bound) * torch.sigmoid(x if a is None else a * x)
    if a is None:
        fail(op, "A_log", "is required with use_gate_in_kernel=True unless lower_bound is set")
    return -a * F.softplus(x)


def _keeps_v_new(algorithm, q, k, v, g):
    """Whether the forward keeps v_new (beta_t r_t, v's dtype and shape) for the backward, which then
    rebuilds the chunk states from it instead of re-running the forward's serial state pass. Taken by
    the CUDA chunked path for GDN and the plain delta rule (the core's delta_rule_keeps_v_new; this
    mirrors its rule: 16-bit inputs, K in {64, 128}, V a multiple of 64 up to 256). Costs one tensor the
    size of v held until the backward (the backward then allocates none of its own). Kept by default
    where taken (H200, run 14.4, forward + backward in deltabench's configuration: B8 T4096 H16
    K=V=128 3.83 -> 3.67 ms, B1 T32768 backward 4.04 -> 3.99 ms and 1801 -> 1545 MiB peak; with the
    in-kernel L2 norm (run 13.5) the T32768 backward 4.67 -> 4.34 ms). FLASHGRAD_KEEP_V_NEW=0 turns it
    off (read per call)."""
    if os.environ.get("FLASHGRAD_KEEP_V_NEW") == "0":
        return False
    return (algorithm == "chunked" and q.is_cuda and q.dim() == 4 and v.dim() == 4
            and q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype and v.dtype == q.dtype
            and (g is None or g.dim() == 3) and q.shape[-1] in (64, 128)
            and v.shape[-1] % 64 == 0 and 0 < v.shape[-1] <= 256)


def _delta_rule(op, algorithm, q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens, state_v_first=False):
    for arg, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(op, arg, t)
    same_device(op, q, "q", k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    if cu_seqlens is not None:
        require_tensor(op, "cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            fail(op, "cu_seqlens", f"must be int32 or int64, got {cu_seqlens.dtype}")
        if cu_seqlens.device != q.device and cu_seqlens.device.type != "cpu":
            fail(op, "cu_seqlens", f"must be on the CPU or on q's device ({q.device}), got {cu_seqlens.device}")
    if beta is None:  # fla: beta defaults to ones
        beta = q.new_ones(v.shape[:3] if v.dim() == 4 else q.shape[:3])
    if initial_state is not None:
        if state_v_first:  # [N, HV, V, K] -> [N, HV, K, V]
            initial_state = initial_state.transpose(-1, -2)
        # States are float32 (float64 for float64 q); autograd casts dh0 back to the caller's dtype.
        if initial_state.dtype != _compute_dtype(q):
            initial_state = initial_state.to(_compute_dtype(q))
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
    save_r = algorithm == "recurrent" and needs_grad
    o, final_state, _, _ = ops.delta_rule_forward(
        q, k, v, g, beta, None if scale is None else float(scale), initial_state, cu_seqlens,
        bool(use_qk_l2norm_in_kernel), algorithm, bool(output_final_state), save_r,
        needs_grad and _keeps_v_new(algorithm, q, k, v, g))
    if not output_final_state:
        return o, None
    if state_v_first:
        final_state = final_state.transpose(-1, -2)
    return o, final_state


def _beta_activation(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval, op):
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        fail(op, "allow_neg_eigval", "requires use_beta_sigmoid_in_kernel=True")
    if not use_beta_sigmoid_in_kernel:
        return beta
    beta = torch.sigmoid(beta)
    return 2.0 * beta if allow_neg_eigval else beta


# ---- GDN: one decay per value head and step -------------------------------------------------------


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """Gated DeltaNet, chunked. q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]
    (g: log decay); initial_state [N, HV, K, V]; cu_seqlens [N+1] with B == 1."""
    op = "chunk_gated_delta_rule"
    _check_options(op, kwargs)
    if g is None:
        fail(op, "g", "is required ([B, T, HV] log decay); for no gate use chunk_delta_rule")
    return _delta_rule(op, "chunked", q, k, v, g, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, cu_seqlens)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False, *, gk=None, **kwargs):
    """Gated DeltaNet, step by step, with a backward. As chunk_gated_delta_rule; also accepts fla's
    per-key-channel gate ``gk`` [B, T, HV, K] (KDA) instead of ``g``; beta defaults to ones."""
    op = "fused_recurrent_gated_delta_rule"
    _check_options(op, kwargs)
    if g is not None and gk is not None:
        fail(op, "gk", "cannot be combined with g (pass one gate)", NotImplementedError)
    return _delta_rule(op, "recurrent", q, k, v, g if gk is None else gk, beta, scale, initial_state,
                       output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)


# ---- KDA: one decay per key channel ----------------------------------------------------------------


def _kda(op, algorithm, q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
         lower_bound, state_v_first, cu_seqlens):
    require_tensor(op, "g", g)
    if use_gate_in_kernel:
        g = _kda_gate(op, g, A_log, dt_bias, lower_bound, q)
    beta = _beta_activation(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval, op)
    return _delta_rule(op, algorithm, q, k, v, g, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, cu_seqlens, state_v_first)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, **kwargs):
    """Kimi Delta Attention, chunked. g [B, T, HV, K] (log decay, or raw with
    use_gate_in_kernel=True and A_log / dt_bias passed as keywords, as in fla)."""
    op = "chunk_kda"
    if "transpose_state_layout" in kwargs:  # fla's deprecated name of state_v_first
        state_v_first = bool(kwargs.pop("transpose_state_layout")) or state_v_first
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    _check_options(op, dict(kwargs, return_intermediate_states=return_intermediate_states,
                            cp_context=cp_context))
    return _kda(op, "chunked", q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False,
                        use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                        allow_neg_eigval=False, lower_bound=None, state_v_first=False,
                        cu_seqlens=None, **kwargs):
    """Kimi Delta Attention, step by step, with a backward. As chunk_kda."""
    op = "fused_recurrent_kda"
    if "transpose_state_layout" in kwargs:
        state_v_first = bool(kwargs.pop("transpose_state_layout")) or state_v_first
    _check_options(op, kwargs)
    return _kda(op, "recurrent", q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens)


# ---- the plain delta rule (no decay) ---------------------------------------------------------------


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """DeltaNet, chunked. q, k [B, T, H, K]; v [B, T, HV, V]; beta [B, T, HV]."""
    op = "chunk_delta_rule"
    _check_options(op, kwargs)
    return _delta_rule(op, "chunked", q, k, v, None, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, cu_seqlens)


def fused_recurrent_delta_rule(q, k, v, beta=None, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                               cu_seqlens=None, **kwargs):
    """DeltaNet, step by step, with a backward; beta defaults to ones."""
    op = "fused_recurrent_delta_rule"
    _check_options(op, kwargs)
    return _delta_rule(op, "recurrent", q, k, v, None, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, cu_seqlens)
