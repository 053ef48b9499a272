"""Loads the flashgrad torch operator library and registers, for each op, its shape function
(register_fake: torch.compile and meta tensors) and, for each forward op, its autograd formula
(register_autograd: the backward is the matching flashgrad::*_backward op).

The ops (schemas in python/csrc/torch_library.cpp):
    torch.ops.flashgrad.attention_forward / attention_backward
    torch.ops.flashgrad.delta_rule_forward / delta_rule_backward
"""

from __future__ import annotations

import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libflashgrad_torch_ops.so")

if not hasattr(torch.ops.flashgrad, "attention_forward"):
    if not os.path.exists(_LIBRARY):
        raise ImportError(
            f"flashgrad: the PyTorch operator library {_LIBRARY} is missing; build the package with "
            "torch installed: pip install --no-build-isolation ."
        )
    torch.ops.load_library(_LIBRARY)

ops = torch.ops.flashgrad


def _state_dtype(q: torch.Tensor) -> torch.dtype:
    """lse, states and saved prediction errors: float32, float64 for float64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _result_dtype(q: torch.Tensor) -> torch.dtype:
    """Attention out and gradients: q's dtype, bfloat16 for float8_e4m3fn inputs."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


# ---- shape functions ------------------------------------------------------------------------
# They mirror the allocations in python/csrc/torch_*.cpp (contiguous outputs); inputs the core
# would reject get the same placeholder shapes as there (the real call then raises).


@torch.library.register_fake("flashgrad::attention_forward")
def _attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            softmax_scale, mask, window_left, window_right, prefix_lengths,
                            candidate_bounds, softcap, softcap_method, z_loss_weight=0.0,
                            deterministic=False, descale_q=None, descale_k=None, descale_v=None):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]) if q.dim() >= 1 and v.dim() >= 1 else (0,),
                      dtype=_result_dtype(q))
    if q.dim() == 4:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    elif q.dim() == 3:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (0,)
    return out, q.new_empty(lse_shape, dtype=_state_dtype(q))


@torch.library.register_fake("flashgrad::attention_backward")
def _attention_backward_fake(dout, dlse, q, k, v, *args):
    def like(t):
        return torch.empty_like(t, dtype=_result_dtype(q), memory_format=torch.contiguous_format)
    return like(q), like(k), like(v)


def _num_states(q, cu_seqlens):
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None and cu_seqlens.dim() == 1 else q.shape[0]


@torch.library.register_fake("flashgrad::delta_rule_forward")
def _delta_rule_forward_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                             use_qk_l2norm_in_kernel, algorithm, output_final_state, save_r, keep_v_new=False):
    o = q.new_empty(v.shape)
    sdt = _state_dtype(q)
    if output_final_state and q.dim() == 4 and v.dim() == 4:
        final_state = q.new_empty((_num_states(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]), dtype=sdt)
    else:
        final_state = q.new_empty((0,), dtype=sdt)
    saved_r = q.new_empty(v.shape if save_r else (0,), dtype=sdt)
    saved_v_new = v.new_empty(v.shape if keep_v_new else (0,))
    return o, final_state, saved_r, saved_v_new


@torch.library.register_fake("flashgrad::delta_rule_backward")
def _delta_rule_backward_fake(dout, dht, saved_r, q, k, v, g, beta, scale, initial_state, cu_seqlens,
                              use_qk_l2norm_in_kernel, algorithm, saved_v_new=None):
    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    dg = like(g) if g is not None else q.new_empty((0,))
    dh0 = like(initial_state) if initial_state is not None else q.new_empty((0,), dtype=_state_dtype(q))
    return like(q), like(k), like(v), dg, like(beta), dh0


# ---- autograd ---------------------------------------------------------------------------------


def _attention_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask,
     window_left, window_right, prefix_lengths, candidate_bounds, softcap, softcap_method,
     z_loss_weight, deterministic, descale_q, descale_k, descale_v) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds,
                          descale_q, descale_k, descale_v)
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, mask, window_left, window_right,
                   softcap, softcap_method, z_loss_weight, deterministic)
    ctx.set_materialize_grads(False)


def _attention_backward(ctx, dout, dlse):
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, prefix_lengths, candidate_bounds,
     descale_q, descale_k, descale_v) = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, softmax_scale, mask, window_left, window_right, softcap,
     softcap_method, z_loss_weight, deterministic) = ctx.options
    if dout is None:  # only lse reached the loss
        dout = torch.zeros_like(out)
    dq, dk, dv = ops.attention_backward(
        dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, mask, window_left, window_right, prefix_lengths, candidate_bounds, softcap,
        softcap_method, z_loss_weight, deterministic, descale_q, descale_k, descale_v)
    return (dq, dk, dv) + (None,) * 17


torch.library.register_autograd("flashgrad::attention_forward", _attention_backward,
                                setup_context=_attention_setup_context)


def _delta_rule_setup_context(ctx, inputs, output):
    (q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, algorithm,
     output_final_state, save_r, *rest) = inputs
    keep_v_new = bool(rest[0]) if rest else False
    _, _, saved_r, saved_v_new = output
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, saved_r if save_r else None,
                          saved_v_new if keep_v_new else None)
    ctx.options = (scale, use_qk_l2norm_in_kernel, algorithm)
    ctx.num_inputs = len(inputs)  # keep_v_new may come as its default (absent)
    ctx.set_materialize_grads(False)


def _delta_rule_backward(ctx, do, dht, _dr, _dvn):
    q, k, v, g, beta, initial_state, cu_seqlens, saved_r, saved_v_new = ctx.saved_tensors
    scale, use_qk_l2norm_in_kernel, algorithm = ctx.options
    if do is None:  # only the final state reached the loss
        do = q.new_zeros(v.shape)
    if dht is not None and dht.numel() == 0:  # final_state was not requested (placeholder)
        dht = None
    dq, dk, dv, dg, dbeta, dh0 = ops.delta_rule_backward(
        do, dht, saved_r, q, k, v, g, beta, scale, initial_state, cu_seqlens,
        use_qk_l2norm_in_kernel, algorithm, saved_v_new)
    grads = (dq, dk, dv, dg if g is not None else None, dbeta, None, dh0 if initial_state is not None else None)
    return grads + (None,) * (ctx.num_inputs - len(grads))


torch.library.register_autograd("flashgrad::delta_rule_forward", _delta_rule_backward,
                                setup_context=_delta_rule_setup_context)
