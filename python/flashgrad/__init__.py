"""flashgrad: attention kernels whose every forward has a backward.

PyTorch (drop-in for FlashAttention 2/3 and fla)::

    from flashgrad import flash_attn_func, flash_attn_varlen_func
    from flashgrad import flash_attn_fp8_func, flash_attn_varlen_fp8_func   # e4m3 inside (docs/fp8.md)
    from flashgrad import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from flashgrad import chunk_kda, fused_recurrent_kda, chunk_delta_rule, fused_recurrent_delta_rule

JAX::

    import flashgrad.jax as fgj
    fgj.flash_attention(q, k, v, causal=True)
    fgj.gated_delta_rule(q, k, v, g, beta)
    fgj.flash_attention_fp8(q, k, v, causal=True)    # e4m3 inside (docs/fp8.md)

Importing this package does not import torch or jax: the PyTorch functions load on first use, and
``flashgrad.jax`` is a separate module. See docs/python.md.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public PyTorch functions and the module that defines each.
_TORCH_API = {
    "flash_attn_func": "flashgrad.attention",
    "flash_attn_varlen_func": "flashgrad.attention",
    "flash_attn_qkvpacked_func": "flashgrad.attention",
    "flash_attn_kvpacked_func": "flashgrad.attention",
    "flash_attn_fp8_func": "flashgrad.fp8_attention",
    "flash_attn_varlen_fp8_func": "flashgrad.fp8_attention",
    "chunk_gated_delta_rule": "flashgrad.delta_rule",
    "fused_recurrent_gated_delta_rule": "flashgrad.delta_rule",
    "chunk_kda": "flashgrad.delta_rule",
    "fused_recurrent_kda": "flashgrad.delta_rule",
    "chunk_delta_rule": "flashgrad.delta_rule",
    "fused_recurrent_delta_rule": "flashgrad.delta_rule",
}

__all__ = ["build_info", "__version__", *_TORCH_API]


def build_info() -> dict:
    """What this installation was built with: {'cuda': bool} (the CUDA backend compiled in)."""
    try:
        from flashgrad import _build_info
    except ImportError:  # running from a source tree without a build
        return {"cuda": False}
    return {"cuda": bool(_build_info.cuda_built)}


def __getattr__(name: str):
    module = _TORCH_API.get(name)
    if module is None:
        raise AttributeError(f"module 'flashgrad' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_TORCH_API))
