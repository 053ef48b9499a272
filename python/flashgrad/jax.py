"""flashgrad for JAX: XLA FFI calls into the C++ core (CPU, and CUDA when built with it), with
custom VJPs so that jax.grad runs flashgrad's own backward. Usable under jit, grad and vmap
(vmap runs the batch sequentially).

    import flashgrad.jax as fgj
    out = fgj.flash_attention(q, k, v, causal=True)                 # q [B, Sq, Hq, D]
    o, ht = fgj.gated_delta_rule(q, k, v, g, beta, output_final_state=True)

float64 inputs (with jax_enable_x64) run the reference in double precision.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flashgrad import _jax_ffi


def _register_targets() -> None:
    for name, platforms in _jax_ffi.registrations().items():
        for platform, capsule in platforms.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register_targets()


def _attr(value):
    """Python option -> an FFI attribute of the type the handlers read."""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if isinstance(value, (int, np.integer)):
        return np.int64(value)
    if isinstance(value, (float, np.floating)):
        return np.float32(value)
    return value  # str


def _ffi(target: str, outputs: dict, inputs: dict, **attrs):
    """Calls an FFI target with the inputs that are not None, naming them (and the outputs) in
    the 'inputs' / 'outputs' attributes, as python/csrc/jax_common.h expects. Returns a dict."""
    present = {name: x for name, x in inputs.items() if x is not None}
    call = jax.ffi.ffi_call(target, list(outputs.values()), vmap_method="sequential")
    results = call(*present.values(), inputs=",".join(present), outputs=",".join(outputs),
                   **{name: _attr(value) for name, value in attrs.items()})
    return dict(zip(outputs, results))


def _state_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _scale_attr(scale):
    return math.nan if scale is None else float(scale)


# ---- softmax attention --------------------------------------------------------------------------


class _AttentionOptions(NamedTuple):
    """Static (hashable) options of one attention call."""
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float | None
    mask: str
    window_left: int
    window_right: int
    softcap: float
    softcap_method: str
    z_loss_weight: float
    deterministic: bool

    def attrs(self):
        return dict(max_seqlen_q=self.max_seqlen_q, max_seqlen_k=self.max_seqlen_k,
                    softmax_scale=_scale_attr(self.softmax_scale), mask=self.mask,
                    window_left=self.window_left, window_right=self.window_right,
                    softcap=self.softcap, softcap_method=self.softcap_method,
                    deterministic=self.deterministic)


def _attention_fwd_call(opts, q, k, v, index):
    out_shape = (*q.shape[:-1], v.shape[-1])
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (q.shape[1], q.shape[0])
    res = _ffi("flashgrad_attention_forward",
               {"out": jax.ShapeDtypeStruct(out_shape, q.dtype),
                "lse": jax.ShapeDtypeStruct(lse_shape, _state_dtype(q.dtype))},
               dict(q=q, k=k, v=v, **index), **opts.attrs())
    return res["out"], res["lse"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts, q, k, v, index):
    return _attention_fwd_call(opts, q, k, v, index)


def _attention_fwd(opts, q, k, v, index):
    out, lse = _attention_fwd_call(opts, q, k, v, index)
    return (out, lse), (q, k, v, index, out, lse)


def _attention_bwd(opts, residuals, cotangents):
    q, k, v, index, out, lse = residuals
    dout, dlse = cotangents
    res = _ffi("flashgrad_attention_backward",
               {"dq": jax.ShapeDtypeStruct(q.shape, q.dtype), "dk": jax.ShapeDtypeStruct(k.shape, k.dtype),
                "dv": jax.ShapeDtypeStruct(v.shape, v.dtype)},
               dict(q=q, k=k, v=v, **index, out=out, lse=lse, dout=dout.astype(out.dtype),
                    dlse=dlse.astype(lse.dtype)),
               z_loss_weight=opts.z_loss_weight, **opts.attrs())
    return res["dq"], res["dk"], res["dv"], jax.tree_util.tree_map(lambda _: None, index)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _attention_mask(causal, window_size, prefix_lengths, candidate_bounds):
    """(mask, window_left, window_right), as flashgrad.attention resolves FlashAttention's flags."""
    window_left, window_right = (max(int(w), -1) for w in window_size)
    windowed = window_left >= 0 or window_right >= 0
    if prefix_lengths is not None and candidate_bounds is not None:
        raise ValueError("flashgrad: flash_attention: argument 'candidate_bounds': cannot be combined "
                         "with prefix_lengths (one mask per call)")
    if prefix_lengths is not None:
        if windowed:
            raise ValueError("flashgrad: flash_attention: argument 'window_size': cannot be combined "
                             "with prefix_lengths (prefix-LM mask)")
        return "prefix_lm", -1, -1
    if candidate_bounds is not None:
        if causal or windowed:
            raise ValueError("flashgrad: flash_attention: argument 'candidate_bounds': defines the "
                             "whole mask; pass neither causal=True nor window_size")
        return "candidate_isolation", -1, -1
    if causal:
        return ("sliding_window", window_left, 0) if window_left >= 0 else ("causal", -1, -1)
    if windowed:
        return "sliding_window", window_left, window_right
    return "none", -1, -1


def _index(x):
    return None if x is None else jnp.asarray(x, dtype=jnp.int32)


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    softcap_method="tanh", prefix_lengths=None, candidate_bounds=None,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                    return_lse=False, z_loss_weight=0.0, deterministic=False):
    """Softmax attention with flashgrad's backward under jax.grad.

    Padded: q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] -> out [B, Sq, Hq, Dv].
    Packed: q [Tq, Hq, D] ... with cu_seqlens_q / cu_seqlens_k int32 [N+1] and the static ints
    max_seqlen_q / max_seqlen_k. Masks as flashgrad.flash_attn_func (bottom-right aligned causal,
    window_size, prefix_lengths int [N], candidate_bounds int [N, 4]). return_lse gives
    (out, lse) with a gradient through lse (lse [B, Hq, Sq] / [Hq, Tq], float32). z_loss_weight
    adds z_loss_weight * lse to lse's cotangent inside the backward.
    """
    if softcap_method not in ("tanh", "soft_sign"):
        raise ValueError(f"flashgrad: flash_attention: argument 'softcap_method': must be 'tanh' or "
                         f"'soft_sign', got {softcap_method!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("flashgrad: flash_attention: argument 'cu_seqlens_k': cu_seqlens_q and "
                         "cu_seqlens_k are passed together (packed sequences) or not at all")
    if varlen and (max_seqlen_q is None or max_seqlen_k is None):
        raise ValueError("flashgrad: flash_attention: argument 'max_seqlen_q': packed sequences need "
                         "the static ints max_seqlen_q and max_seqlen_k")
    mask, window_left, window_right = _attention_mask(causal, window_size, prefix_lengths, candidate_bounds)
    opts = _AttentionOptions(int(max_seqlen_q or 0), int(max_seqlen_k or 0),
                             None if softmax_scale is None else float(softmax_scale), mask,
                             window_left, window_right, float(softcap), softcap_method,
                             float(z_loss_weight), bool(deterministic))
    index = {"cu_seqlens_q": _index(cu_seqlens_q), "cu_seqlens_k": _index(cu_seqlens_k),
             "prefix_lengths": _index(prefix_lengths), "candidate_bounds": _index(candidate_bounds)}
    out, lse = _attention(opts, q, k, v, index)
    return (out, lse) if return_lse else out


# ---- the gated delta rule family ------------------------------------------------------------------


class _DeltaRuleOptions(NamedTuple):
    scale: float | None
    use_qk_l2norm_in_kernel: bool
    algorithm: str
    output_final_state: bool

    def attrs(self):
        return dict(scale=_scale_attr(self.scale), use_qk_l2norm_in_kernel=self.use_qk_l2norm_in_kernel,
                    algorithm=self.algorithm)


def _num_states(q, cu_seqlens):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _asks_v_new(opts, q, k, v, g):
    """Whether the forward asks to keep v_new (beta_t r_t, v's dtype and shape) for the backward, which
    then rebuilds the chunk states from it instead of re-running the forward's serial state pass (as
    flashgrad.delta_rule's _keeps_v_new for PyTorch: H200, run 14.4, B8 T4096 H16 K=V=128 forward +
    backward 3.83 -> 3.67 ms, B1 T32768 peak 1801 -> 1545 MiB). The rule mirrors the core's
    delta_rule_keeps_v_new (chunked, GDN or the plain rule, 16-bit inputs, K in {64, 128}, V a
    multiple of 64 up to 256) where JAX's default backend is a GPU; the FFI ops use the buffer only
    where the core keeps it (jax_delta_rule.cpp), so a CPU call traced on a GPU machine stays correct.
    FLASHGRAD_KEEP_V_NEW=0 turns it off (read when the function is traced)."""
    if os.environ.get("FLASHGRAD_KEEP_V_NEW") == "0" or jax.default_backend() != "gpu":
        return False
    return (opts.algorithm == "chunked" and q.ndim == 4 and v.ndim == 4
            and q.dtype in (jnp.bfloat16, jnp.float16) and k.dtype == q.dtype and v.dtype == q.dtype
            and (g is None or g.ndim == 3) and q.shape[-1] in (64, 128)
            and v.shape[-1] % 64 == 0 and 0 < v.shape[-1] <= 256)


def _delta_rule_fwd_call(opts, q, k, v, g, beta, initial_state, cu_seqlens, save_r, keep_v_new=False):
    sdt = _state_dtype(q.dtype)
    outputs = {"o": jax.ShapeDtypeStruct(v.shape, q.dtype)}
    if opts.output_final_state:
        state_shape = (_num_states(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3])
        outputs["final_state"] = jax.ShapeDtypeStruct(state_shape, sdt)
    if save_r:
        outputs["saved_r"] = jax.ShapeDtypeStruct(v.shape, sdt)
    if keep_v_new:
        outputs["saved_v_new"] = jax.ShapeDtypeStruct(v.shape, v.dtype)
    return _ffi("flashgrad_delta_rule_forward", outputs,
                dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens),
                **opts.attrs())


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _delta_rule(opts, q, k, v, g, beta, initial_state, cu_seqlens):
    res = _delta_rule_fwd_call(opts, q, k, v, g, beta, initial_state, cu_seqlens, save_r=False)
    return res["o"], res.get("final_state")


def _delta_rule_fwd(opts, q, k, v, g, beta, initial_state, cu_seqlens):
    # The recurrent backward reads the forward's prediction errors r instead of re-running it.
    # The chunked one may keep v_new (_asks_v_new).
    save_r = opts.algorithm == "recurrent"
    res = _delta_rule_fwd_call(opts, q, k, v, g, beta, initial_state, cu_seqlens, save_r,
                               _asks_v_new(opts, q, k, v, g))
    residuals = (q, k, v, g, beta, initial_state, cu_seqlens, res.get("saved_r"), res.get("saved_v_new"))
    return (res["o"], res.get("final_state")), residuals


def _delta_rule_bwd(opts, residuals, cotangents):
    q, k, v, g, beta, initial_state, cu_seqlens, saved_r, saved_v_new = residuals
    do, dht = cotangents
    outputs = {"dq": jax.ShapeDtypeStruct(q.shape, q.dtype), "dk": jax.ShapeDtypeStruct(k.shape, k.dtype),
               "dv": jax.ShapeDtypeStruct(v.shape, v.dtype)}
    if g is not None:
        outputs["dg"] = jax.ShapeDtypeStruct(g.shape, g.dtype)
    outputs["dbeta"] = jax.ShapeDtypeStruct(beta.shape, beta.dtype)
    if initial_state is not None:
        outputs["dh0"] = jax.ShapeDtypeStruct(initial_state.shape, initial_state.dtype)
    res = _ffi("flashgrad_delta_rule_backward", outputs,
               dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    dout=do.astype(q.dtype), dht=dht, saved_r=saved_r, saved_v_new=saved_v_new),
               **opts.attrs())
    return (res["dq"], res["dk"], res["dv"], res.get("dg"), res["dbeta"], res.get("dh0"),
            None if cu_seqlens is None else None)


_delta_rule.defvjp(_delta_rule_fwd, _delta_rule_bwd)


def gated_delta_rule(q, k, v, g, beta=None, *, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, algorithm="chunked", cu_seqlens=None):
    """The gated delta rule, gate kind by g's shape (fla's layout and semantics):
    g [B, T, HV] GDN, g [B, T, HV, K] KDA, g None the plain delta rule.

    q, k [B, T, H, K]; v [B, T, HV, V]; beta [B, T, HV] (None: ones); initial_state
    [N, HV, K, V] (cast to float32); cu_seqlens int [N+1] with B == 1. algorithm: "chunked"
    (chunks of 64, UT/WY) or "recurrent" (step by step; its backward uses the saved prediction
    errors). Returns (o [B, T, HV, V], final_state [N, HV, K, V] float32 or None).
    """
    if algorithm not in ("chunked", "recurrent"):
        raise ValueError(f"flashgrad: gated_delta_rule: argument 'algorithm': must be 'chunked' or "
                         f"'recurrent', got {algorithm!r}")
    if beta is None:
        beta = jnp.ones(v.shape[:3], dtype=q.dtype)
    if initial_state is not None:
        initial_state = jnp.asarray(initial_state).astype(_state_dtype(q.dtype))
    if cu_seqlens is not None:
        cu_seqlens = jnp.asarray(cu_seqlens)
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
            raise ValueError("flashgrad: gated_delta_rule: argument 'cu_seqlens': must be an integer array")
    opts = _DeltaRuleOptions(None if scale is None else float(scale), bool(use_qk_l2norm_in_kernel),
                             algorithm, bool(output_final_state))
    return _delta_rule(opts, q, k, v, g, beta, initial_state, cu_seqlens)


# ---- FP8 (e4m3) softmax attention: flashgrad/jax_fp8.py (docs/fp8.md) ---------------------------
from flashgrad.jax_fp8 import flash_attention_fp8  # noqa: E402,F401  (imports this module's helpers)
