"""Softmax attention for PyTorch with FlashAttention 2/3's call signatures.

``flash_attn_func`` / ``flash_attn_varlen_func`` take the arguments of flash_attn's functions of
the same names (FlashAttention 2 order), plus keyword-only extensions:

- ``softcap_method``: "tanh" (FlashAttention's, s = c tanh(s/c)) or "soft_sign" (s / (1 + |s|/c)).
- ``prefix_lengths``: int [N], prefix-LM mask (causal, plus a bidirectional prefix per sequence).
- ``candidate_bounds``: int [N, 4] = (h0, h1, c0, c1), candidate-isolation mask (ranking models:
  history rows see history; a candidate row sees history and itself).
- ``return_lse``: also return lse (natural log, float32) with a gradient through it.
- ``z_loss_weight``: adds ``z_loss_weight * lse`` to lse's gradient inside the backward (the
  z-loss (w/2) sum lse^2 acting on gradients only; the returned values do not change).

Not supported (clear errors): ``dropout_p != 0``, ``alibi_slopes``, ``block_table`` (paged KV).
``return_attn_probs=True`` returns ``(out, lse, None)``: FlashAttention 2 returns the dropout
mask / probabilities there, which flashgrad never materializes.
"""

from __future__ import annotations

import math

from ._checks import fail, index_tensor, require_tensor, same_device
from ._torch_library import ops

_SOFTCAP_METHODS = ("tanh", "soft_sign")


def _resolve_mask(op, causal, window_size, prefix_lengths, candidate_bounds):
    """(mask name, window_left, window_right) from FlashAttention's flags and the extensions."""
    try:
        window_left, window_right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        fail(op, "window_size", f"must be a pair of ints (left, right), got {window_size!r}")
    window_left = max(window_left, -1)
    window_right = max(window_right, -1)
    windowed = window_left >= 0 or window_right >= 0
    if prefix_lengths is not None and candidate_bounds is not None:
        fail(op, "candidate_bounds", "cannot be combined with prefix_lengths (one mask per call)")
    if prefix_lengths is not None:
        # The prefix-LM mask is causal outside the prefix; causal=True is accepted (and implied).
        if windowed:
            fail(op, "window_size", "cannot be combined with prefix_lengths (prefix-LM mask)")
        return "prefix_lm", -1, -1
    if candidate_bounds is not None:
        if causal or windowed:
            fail(op, "candidate_bounds", "defines the whole mask; pass neither causal=True nor window_size")
        return "candidate_isolation", -1, -1
    if causal:
        # FlashAttention: causal with a window keeps the left bound and closes the right side.
        return ("sliding_window", window_left, 0) if window_left >= 0 else ("causal", -1, -1)
    if windowed:
        return "sliding_window", window_left, window_right
    return "none", -1, -1


def _check_unsupported(op, dropout_p, alibi_slopes, softcap, softcap_method, softmax_scale):
    if dropout_p != 0.0:
        fail(op, "dropout_p", f"must be 0.0: flashgrad has no attention dropout (got {dropout_p})",
             NotImplementedError)
    if alibi_slopes is not None:
        fail(op, "alibi_slopes", "ALiBi is not supported by flashgrad (pass None)", NotImplementedError)
    if softcap_method not in _SOFTCAP_METHODS:
        fail(op, "softcap_method", f"must be one of {_SOFTCAP_METHODS}, got {softcap_method!r}")
    if softcap is None or softcap < 0:
        fail(op, "softcap", f"must be >= 0 (0 disables it), got {softcap}")
    if softmax_scale is not None and not math.isfinite(softmax_scale):
        fail(op, "softmax_scale", f"must be finite (None: 1/sqrt(head dim)), got {softmax_scale}")


def _attention(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
               softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs, softcap_method, prefix_lengths, candidate_bounds, return_lse,
               z_loss_weight):
    for arg, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(op, arg, t)
    same_device(op, q, "q", k=k, v=v)
    _check_unsupported(op, dropout_p, alibi_slopes, softcap, softcap_method, softmax_scale)
    mask, window_left, window_right = _resolve_mask(op, causal, window_size, prefix_lengths, candidate_bounds)
    cu_seqlens_q = index_tensor(op, "cu_seqlens_q", cu_seqlens_q, q.device)
    cu_seqlens_k = index_tensor(op, "cu_seqlens_k", cu_seqlens_k, q.device)
    prefix_lengths = index_tensor(op, "prefix_lengths", prefix_lengths, q.device)
    candidate_bounds = index_tensor(op, "candidate_bounds", candidate_bounds, q.device)
    out, lse = ops.attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), mask, window_left, window_right,
        prefix_lengths, candidate_bounds, float(softcap), softcap_method, float(z_loss_weight),
        bool(deterministic))
    if return_attn_probs:
        return out, lse, None
    if return_lse:
        return out, lse
    return out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                    softcap_method="tanh", prefix_lengths=None, candidate_bounds=None,
                    return_lse=False, z_loss_weight=0.0):
    """Attention over padded batches.

    q: [B, Sq, Hq, D], k: [B, Sk, Hk, D], v: [B, Sk, Hk, Dv] (Hq % Hk == 0: GQA/MQA); float16,
    bfloat16, float32 or float64. Masks are bottom-right aligned (query i sits at key position
    i + Sk - Sq), as in FlashAttention >= 2.1. window_size=(left, right), -1 = unbounded.

    Returns out [B, Sq, Hq, Dv]; (out, lse) with return_lse (lse [B, Hq, Sq] float32);
    (out, lse, None) with return_attn_probs. Differentiable in q, k, v (and through lse).
    """
    require_tensor("flash_attn_func", "q", q)
    if q.dim() != 4:
        fail("flash_attn_func", "q", f"must have rank 4 [B, Sq, Hq, D], got shape {list(q.shape)} "
             "(packed sequences: use flash_attn_varlen_func)")
    return _attention("flash_attn_func", q, k, v, None, None, 0, 0, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      softcap_method, prefix_lengths, candidate_bounds, return_lse, z_loss_weight)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              **extensions):
    """flash_attn_func on qkv [B, S, 3, H, D] (FlashAttention's packed layout; the gradient flows
    back into qkv through the views)."""
    require_tensor("flash_attn_qkvpacked_func", "qkv", qkv)
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        fail("flash_attn_qkvpacked_func", "qkv", f"must have shape [B, S, 3, H, D], got {list(qkv.shape)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, **extensions)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                             **extensions):
    """flash_attn_func with kv [B, Sk, 2, Hk, D] (FlashAttention's packed layout)."""
    require_tensor("flash_attn_kvpacked_func", "kv", kv)
    if kv.dim() != 5 or kv.shape[2] != 2:
        fail("flash_attn_kvpacked_func", "kv", f"must have shape [B, Sk, 2, Hk, D], got {list(kv.shape)}")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, **extensions)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, softcap_method="tanh",
                           prefix_lengths=None, candidate_bounds=None, return_lse=False,
                           z_loss_weight=0.0):
    """Attention over sequences packed along the token dimension.

    q: [Tq, Hq, D], k: [Tk, Hk, D], v: [Tk, Hk, Dv]; cu_seqlens_q / cu_seqlens_k: int32 [N+1]
    (0, non-decreasing, ending at Tq / Tk; empty sequences allowed); max_seqlen_q / max_seqlen_k:
    upper bounds of the sequence lengths. lse is [Hq, Tq].
    """
    op = "flash_attn_varlen_func"
    if block_table is not None:
        fail(op, "block_table", "paged KV caches are not supported by flashgrad (pass None)",
             NotImplementedError)
    if cu_seqlens_q is None:
        fail(op, "cu_seqlens_q", "is required (int32 [N+1])")
    if cu_seqlens_k is None:
        fail(op, "cu_seqlens_k", "is required (int32 [N+1])")
    return _attention(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, softcap_method, prefix_lengths,
                      candidate_bounds, return_lse, z_loss_weight)
