"""FP8 (e4m3) softmax attention for JAX: flashgrad.jax.flash_attention_fp8 (docs/fp8.md).

bf16 q, k, v in; quantized inside with current scales per (sequence, kv head) (the recipe of
flashgrad.fp8, in jax.numpy); flashgrad's low-level e4m3 forward and backward through the XLA FFI
(the same targets as flash_attention, with descale_q / descale_k / descale_v buffers); out bf16,
lse float32; jax.grad gives bf16 gradients for the bf16 inputs, straight through the quantizer.
On the CPU the backend computes exactly on the dequantized inputs; on a GPU, flashgrad's FP8
kernels (a build without them raises, naming the rule).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from flashgrad.jax import _AttentionOptions, _attention_mask, _ffi, _index

E4M3_MAX = 448.0


def _split_heads(x, heads_k):
    """[..., H, D] -> [..., Hk, H / Hk, D] (query head h is in group h // (H / Hk))."""
    *lead, heads, dim = x.shape
    return x.reshape(*lead, heads_k, heads // heads_k, dim)


def _sequence_of_token(cu_seqlens, total):
    """int32 [total]: the packed sequence of each token (see flashgrad.fp8.sequence_of_token)."""
    ends = cu_seqlens[1:]
    seq = jnp.searchsorted(ends, jnp.arange(total, dtype=ends.dtype), side="right")
    return jnp.minimum(seq, max(ends.shape[0] - 1, 0))


def quantize_per_head(x, heads_k, cu_seqlens=None):
    """(x8 float8_e4m3fn, descale float32 [N, Hk]): descale = amax * (1/448) (1 if amax == 0) per
    (sequence, kv-head group), x8 = e4m3(x / descale), nearest even, saturating to +-448."""
    grouped = _split_heads(x, heads_k).astype(jnp.float32)
    if cu_seqlens is None:
        amax = jnp.max(jnp.abs(grouped), axis=(1, 3, 4), initial=0.0)          # [B, Hk]
    else:
        seq = _sequence_of_token(cu_seqlens, x.shape[0])
        per_token = jnp.max(jnp.abs(grouped), axis=(2, 3), initial=0.0)       # [T, Hk]
        amax = jax.ops.segment_max(per_token, seq, num_segments=cu_seqlens.shape[0] - 1)
        amax = jnp.maximum(amax, 0.0)   # empty segments come back as -inf
    descale = jnp.where(amax > 0, amax * (1.0 / E4M3_MAX), 1.0)   # as flashgrad.fp8
    per_element = descale[:, None, :, None, None] if cu_seqlens is None \
        else descale[_sequence_of_token(cu_seqlens, x.shape[0])][:, :, None, None]
    x8 = jnp.clip(grouped / per_element, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
    return x8.reshape(x.shape), descale


def _forward_call(opts, q8, k8, v8, descales, index):
    out_shape = (*q8.shape[:-1], v8.shape[-1])
    lse_shape = (q8.shape[0], q8.shape[2], q8.shape[1]) if q8.ndim == 4 else (q8.shape[1], q8.shape[0])
    res = _ffi("flashgrad_attention_forward",
               {"out": jax.ShapeDtypeStruct(out_shape, jnp.bfloat16),
                "lse": jax.ShapeDtypeStruct(lse_shape, jnp.float32)},
               dict(q=q8, k=k8, v=v8, **index, **descales), **opts.attrs())
    return res["out"], res["lse"]


def _quantize_all(q, k, v, index):
    heads_k = k.shape[-2]
    q8, dsq = quantize_per_head(q, heads_k, index["cu_seqlens_q"])
    k8, dsk = quantize_per_head(k, heads_k, index["cu_seqlens_k"])
    v8, dsv = quantize_per_head(v, heads_k, index["cu_seqlens_k"])
    return q8, k8, v8, dict(descale_q=dsq, descale_k=dsk, descale_v=dsv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_attention(opts, q, k, v, index):
    q8, k8, v8, descales = _quantize_all(q, k, v, index)
    return _forward_call(opts, q8, k8, v8, descales, index)


def _fp8_attention_fwd(opts, q, k, v, index):
    q8, k8, v8, descales = _quantize_all(q, k, v, index)
    out, lse = _forward_call(opts, q8, k8, v8, descales, index)
    # empty arrays carry the input dtypes (residuals must be arrays) for the gradients' casts
    dtypes = tuple(jnp.zeros((0,), x.dtype) for x in (q, k, v))
    return (out, lse), (q8, k8, v8, descales, index, out, lse, dtypes)


def _fp8_attention_bwd(opts, residuals, cotangents):
    q8, k8, v8, descales, index, out, lse, dtypes = residuals
    dout, dlse = cotangents
    res = _ffi("flashgrad_attention_backward",
               {name: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) for name, x in
                (("dq", q8), ("dk", k8), ("dv", v8))},
               dict(q=q8, k=k8, v=v8, **index, **descales, out=out, lse=lse,
                    dout=dout.astype(out.dtype), dlse=dlse.astype(lse.dtype)),
               z_loss_weight=opts.z_loss_weight, **opts.attrs())
    grads = tuple(res[name].astype(like.dtype) for name, like in zip(("dq", "dk", "dv"), dtypes))
    return (*grads, jax.tree_util.tree_map(lambda _: None, index))


_fp8_attention.defvjp(_fp8_attention_fwd, _fp8_attention_bwd)


def flash_attention_fp8(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                        softcap=0.0, softcap_method="tanh", prefix_lengths=None,
                        candidate_bounds=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=None, max_seqlen_k=None, return_lse=False, z_loss_weight=0.0,
                        deterministic=False):
    """flashgrad.jax.flash_attention with e4m3 products inside (docs/fp8.md): q, k, v bfloat16
    (float16 / float32 accepted; out and gradients come back in q's dtype), same arguments."""
    op = "flash_attention_fp8"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.dtype(x.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)):
            raise ValueError(f"flashgrad: {op}: argument '{name}': dtype must be bfloat16, float16 or "
                             f"float32 (quantized to e4m3 inside), got {x.dtype}")
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"flashgrad: {op}: argument 'q': q, k, v must all have rank 4 [B, S, H, D] "
                         f"or rank 3 [T, H, D], got {q.ndim}, {k.ndim}, {v.ndim}")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2] != 0 or v.shape[-2] != k.shape[-2]:
        raise ValueError(f"flashgrad: {op}: argument 'k': heads: q's head count ({q.shape[-2]}) must be "
                         f"a multiple of k's ({k.shape[-2]}), and v's ({v.shape[-2]}) equal to k's")
    if softcap_method not in ("tanh", "soft_sign"):
        raise ValueError(f"flashgrad: {op}: argument 'softcap_method': must be 'tanh' or 'soft_sign', "
                         f"got {softcap_method!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None or max_seqlen_q is None
                   or max_seqlen_k is None or q.ndim != 3):
        raise ValueError(f"flashgrad: {op}: argument 'cu_seqlens_q': packed sequences need q, k, v of "
                         "rank 3, cu_seqlens_q and cu_seqlens_k, and the static ints max_seqlen_q / max_seqlen_k")
    if not varlen and q.ndim != 4:
        raise ValueError(f"flashgrad: {op}: argument 'q': must have rank 4 [B, S, H, D] without cu_seqlens")
    mask, window_left, window_right = _attention_mask(causal, window_size, prefix_lengths, candidate_bounds)
    opts = _AttentionOptions(int(max_seqlen_q or 0), int(max_seqlen_k or 0),
                             None if softmax_scale is None else float(softmax_scale), mask,
                             window_left, window_right, float(softcap), softcap_method,
                             float(z_loss_weight), bool(deterministic))
    index = {"cu_seqlens_q": _index(cu_seqlens_q), "cu_seqlens_k": _index(cu_seqlens_k),
             "prefix_lengths": _index(prefix_lengths), "candidate_bounds": _index(candidate_bounds)}
    out, lse = _fp8_attention(opts, q, k, v, index)
    out = out.astype(q.dtype)
    return (out, lse) if return_lse else out
