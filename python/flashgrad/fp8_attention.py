"""FP8 (e4m3) softmax attention for PyTorch, for training: bf16 in, bf16 out, bf16 gradients.

``flash_attn_fp8_func`` / ``flash_attn_varlen_fp8_func`` take flash_attn_func's arguments (the
same names, order and semantics; see flashgrad.attention) with q, k, v in bfloat16 (float16 and
float32 are accepted too). Inside, each call

1. quantizes q, k, v to e4m3 with current scales per (sequence, kv head) (flashgrad.fp8:
   descale = amax / 448; q's scale covers the query heads of a kv-head group),
2. runs flashgrad's low-level e4m3 forward (torch.ops.flashgrad.attention_forward with
   descale_q/k/v): out bf16, lse float32,
3. on backward, runs the low-level e4m3 backward from the bf16 dO (which quantizes dO, P, dS as
   docs/fp8.md says) and hands its gradients, taken with respect to the dequantized q, k, v,
   straight through to the bf16 inputs (the quantizer's rounding counts as identity).

Backends: CUDA tensors run flashgrad's FP8 kernels (Hopper); a build or GPU whose kernels do
not take e4m3 raises NotImplementedError naming the rule, never a silent bf16 fallback. CPU
tensors run the CPU reference, which dequantizes the e4m3 inputs and computes forward and
backward exactly in float32: the CPU result is the exact attention of the quantized inputs,
without the recipe's internal quantization of P, dO and dS (docs/fp8.md).
"""

from __future__ import annotations

import torch

from ._checks import fail, index_tensor, require_tensor, same_device
from ._torch_library import ops
from .attention import _check_unsupported, _resolve_mask
from .fp8 import quantize_per_head

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _Fp8Attention(torch.autograd.Function):
    """bf16 q, k, v -> (out bf16, lse float32); backward gives bf16 dq, dk, dv (straight-through)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                mask, window_left, window_right, prefix_lengths, candidate_bounds, softcap,
                softcap_method, z_loss_weight, deterministic):
        heads_k = k.shape[-2]
        q8, descale_q = quantize_per_head(q, heads_k, cu_seqlens_q)
        k8, descale_k = quantize_per_head(k, heads_k, cu_seqlens_k)
        v8, descale_v = quantize_per_head(v, heads_k, cu_seqlens_k)
        out, lse = ops.attention_forward(
            q8, k8, v8, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask,
            window_left, window_right, prefix_lengths, candidate_bounds, softcap, softcap_method,
            z_loss_weight, deterministic, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v)
        ctx.save_for_backward(q8, k8, v8, descale_q, descale_k, descale_v, out, lse, cu_seqlens_q,
                              cu_seqlens_k, prefix_lengths, candidate_bounds)
        ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, mask, window_left, window_right,
                       softcap, softcap_method, z_loss_weight, deterministic)
        ctx.input_dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        (q8, k8, v8, descale_q, descale_k, descale_v, out, lse, cu_seqlens_q, cu_seqlens_k,
         prefix_lengths, candidate_bounds) = ctx.saved_tensors
        (max_seqlen_q, max_seqlen_k, softmax_scale, mask, window_left, window_right, softcap,
         softcap_method, z_loss_weight, deterministic) = ctx.options
        dout = torch.zeros_like(out) if dout is None else dout.to(out.dtype)  # None: only lse used
        dq, dk, dv = ops.attention_backward(
            dout, dlse, q8, k8, v8, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, mask, window_left, window_right, prefix_lengths, candidate_bounds, softcap,
            softcap_method, z_loss_weight, deterministic, descale_q=descale_q, descale_k=descale_k,
            descale_v=descale_v)
        grads = tuple(g.to(dtype) for g, dtype in zip((dq, dk, dv), ctx.input_dtypes))
        return grads + (None,) * 14


def _check_inputs(op, q, k, v, rank, layout):
    for arg, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(op, arg, t)
        if t.dtype == torch.float8_e4m3fn:
            fail(op, arg, "takes bfloat16 (or float16 / float32) and quantizes it inside; for "
                 "inputs already in float8_e4m3fn call torch.ops.flashgrad.attention_forward with "
                 "descale_q / descale_k / descale_v")
        if t.dtype not in _INPUT_DTYPES:
            fail(op, arg, f"dtype must be bfloat16, float16 or float32, got {t.dtype}")
        if t.dim() != rank:
            fail(op, arg, f"must have rank {rank} {layout}, got shape {list(t.shape)}")
    same_device(op, q, "q", k=k, v=v)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        fail(op, "k" if q.dtype != k.dtype else "v",
             f"must have q's dtype ({q.dtype}), got {k.dtype if q.dtype != k.dtype else v.dtype}")
    heads_q, heads_k = q.shape[-2], k.shape[-2]
    if heads_k == 0 or heads_q % heads_k != 0:
        fail(op, "k", f"heads: q's head count ({heads_q}) must be a multiple of k's ({heads_k}) (GQA/MQA)")
    if v.shape[-2] != heads_k:
        fail(op, "v", f"heads: must equal k's head count ({heads_k}), got {v.shape[-2]}")


def _fp8_attention(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, softcap_method, prefix_lengths, candidate_bounds, return_lse,
                   z_loss_weight):
    _check_unsupported(op, dropout_p, alibi_slopes, softcap, softcap_method, softmax_scale)
    mask, window_left, window_right = _resolve_mask(op, causal, window_size, prefix_lengths, candidate_bounds)
    cu_seqlens_q = index_tensor(op, "cu_seqlens_q", cu_seqlens_q, q.device)
    cu_seqlens_k = index_tensor(op, "cu_seqlens_k", cu_seqlens_k, q.device)
    prefix_lengths = index_tensor(op, "prefix_lengths", prefix_lengths, q.device)
    candidate_bounds = index_tensor(op, "candidate_bounds", candidate_bounds, q.device)
    for arg, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t is not None and t.dim() != 1:
            fail(op, arg, f"must have rank 1 [N+1], got shape {list(t.shape)}")
    out, lse = _Fp8Attention.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), mask, window_left, window_right,
        prefix_lengths, candidate_bounds, float(softcap), softcap_method, float(z_loss_weight),
        bool(deterministic))
    if out.dtype != q.dtype:
        out = out.to(q.dtype)
    if return_attn_probs:
        return out, lse, None
    if return_lse:
        return out, lse
    return out


def flash_attn_fp8_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                        softcap_method="tanh", prefix_lengths=None, candidate_bounds=None,
                        return_lse=False, z_loss_weight=0.0):
    """flash_attn_func with e4m3 tensor-core products inside (docs/fp8.md).

    q: [B, Sq, Hq, D], k: [B, Sk, Hk, D], v: [B, Sk, Hk, Dv], bfloat16 (float16 / float32 are
    computed the same way and returned in their dtype). Arguments, masks, GQA, softcap, lse and
    z-loss as flashgrad.flash_attn_func. Returns out [B, Sq, Hq, Dv] (or (out, lse) /
    (out, lse, None)); differentiable in q, k, v (straight-through the quantizer) and through lse.
    """
    op = "flash_attn_fp8_func"
    _check_inputs(op, q, k, v, 4, "[B, S, H, D] (packed sequences: use flash_attn_varlen_fp8_func)")
    return _fp8_attention(op, q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal,
                          window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                          softcap_method, prefix_lengths, candidate_bounds, return_lse, z_loss_weight)


def flash_attn_varlen_fp8_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                               softcap=0.0, alibi_slopes=None, deterministic=False,
                               return_attn_probs=False, block_table=None, *, softcap_method="tanh",
                               prefix_lengths=None, candidate_bounds=None, return_lse=False,
                               z_loss_weight=0.0):
    """flash_attn_varlen_func with e4m3 products inside: q [Tq, Hq, D], k [Tk, Hk, D],
    v [Tk, Hk, Dv] packed along tokens, cu_seqlens_q / cu_seqlens_k int32 [N+1]. Each packed
    sequence gets its own scales (per sequence and kv head). lse is [Hq, Tq]."""
    op = "flash_attn_varlen_fp8_func"
    if block_table is not None:
        fail(op, "block_table", "paged KV caches are not supported by flashgrad (pass None)",
             NotImplementedError)
    if cu_seqlens_q is None:
        fail(op, "cu_seqlens_q", "is required (int32 [N+1])")
    if cu_seqlens_k is None:
        fail(op, "cu_seqlens_k", "is required (int32 [N+1])")
    _check_inputs(op, q, k, v, 3, "[T, H, D] (padded batches: use flash_attn_fp8_func)")
    return _fp8_attention(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          deterministic, return_attn_probs, softcap_method, prefix_lengths,
                          candidate_bounds, return_lse, z_loss_weight)
