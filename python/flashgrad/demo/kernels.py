"""The two kernel sets a demo layer can run on: flashgrad's ops, or the plain PyTorch references.

A layer asks its kernel set for three things: causal softmax attention returning (out, lse), the
chunked gated delta rule and the fused recurrent gated delta rule. Everything else in a layer
(projections, gates, norms) is ordinary PyTorch, identical for both sets, so the gradient check
compares exactly the kernels.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from . import reference_ops


@dataclass(frozen=True)
class Kernels:
    name: str
    # attention(q, k, v, softcap=...) -> (out, lse or None); causal, GQA by head counts.
    attention: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    chunk_gated_delta_rule: Callable[..., torch.Tensor]
    recurrent_gated_delta_rule: Callable[..., torch.Tensor]
    # The dtype the kernels are fed (fp32 on the CPU, bf16 on a GPU); layers cast around the call.
    compute_dtype: torch.dtype = torch.float32
    # True when the attention kernel returns lse; otherwise the z-loss rides on z_loss_weight.
    returns_lse: bool = True


def reference_kernels() -> Kernels:
    def attention(q, k, v, *, softcap, z_loss_weight=0.0):
        return reference_ops.softmax_attention(q, k, v, softcap=softcap, causal=True)

    def delta_rule(q, k, v, g, beta):
        return reference_ops.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)

    return Kernels("torch-reference", attention, delta_rule, delta_rule)


class KernelsUnavailable(RuntimeError):
    """The installed flashgrad lacks an op the demo needs; the message says which."""


def _require(module, name: str, what: str | None = None):
    """module.name, or KernelsUnavailable saying that `what` (default: the op) is missing."""
    try:
        op = getattr(module, name, None)
    except ImportError as error:  # flashgrad loads its PyTorch ops (the native extension) lazily
        raise KernelsUnavailable(f"flashgrad.{name} cannot be loaded: {error}") from error
    if op is None:
        raise KernelsUnavailable(
            f"{what or 'flashgrad.' + name} is not available in this build of flashgrad "
            f"(no flashgrad.{name} in {getattr(module, '__file__', 'an unknown location')})")
    return op


def _require_fp8_kernels(attention_op, device: torch.device) -> None:
    """A CUDA build whose kernels do not take e4m3 refuses with NotImplementedError (never a
    silent bf16 fallback); the demo turns that into its 'not available' message."""
    x = torch.zeros(1, 16, 1, 64, device=device, dtype=torch.bfloat16)
    try:
        attention_op(x, x, x, causal=True)
    except NotImplementedError as error:
        raise KernelsUnavailable(f"fp8 attention is not available in this build of flashgrad "
                                 f"(its CUDA backend refuses e4m3 inputs: {error})") from error


def flashgrad_kernels(device: torch.device, *, fp8: bool = False) -> Kernels:
    """flashgrad's ops. fp8 swaps the attention for flash_attn_fp8_func (GPU only)."""
    if fp8 and device.type != "cuda":
        raise KernelsUnavailable("fp8 attention runs on a GPU only: pass --device cuda")
    try:
        import flashgrad
    except ImportError as error:  # the demo lives inside the package, so this means a broken install
        raise KernelsUnavailable(f"cannot import flashgrad: {error}") from error

    build_info = getattr(flashgrad, "build_info", None)
    if device.type == "cuda" and build_info is not None and not build_info().get("cuda", False):
        raise KernelsUnavailable("this flashgrad was built without its CUDA backend: reinstall it "
                                 "with FLASHGRAD_CUDA=ON (docs/python.md), or pass --device cpu")
    chunk_op = _require(flashgrad, "chunk_gated_delta_rule")
    recurrent_op = _require(flashgrad, "fused_recurrent_gated_delta_rule")
    compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    if fp8:
        attention_op = _require(flashgrad, "flash_attn_fp8_func", what="fp8 attention")
        _require_fp8_kernels(attention_op, device)
        compute_dtype = torch.bfloat16
    else:
        attention_op = _require(flashgrad, "flash_attn_func")

    parameters = inspect.signature(attention_op).parameters
    returns_lse = "return_lse" in parameters
    has_z_loss_weight = "z_loss_weight" in parameters
    if not returns_lse and not has_z_loss_weight:
        raise KernelsUnavailable(f"flashgrad.{attention_op.__name__} offers neither return_lse "
                                 "nor z_loss_weight: the demo's z-loss needs one of them")

    def attention(q, k, v, *, softcap, z_loss_weight=0.0):
        if returns_lse:
            out, lse = attention_op(q, k, v, causal=True, softcap=softcap, return_lse=True)
            return out, lse
        # The z-loss then acts inside the backward only (dLSE += w * lse) and has no value to log.
        out = attention_op(q, k, v, causal=True, softcap=softcap, z_loss_weight=z_loss_weight)
        return out, None

    def chunk(q, k, v, g, beta):
        out, _ = chunk_op(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        return out

    def recurrent(q, k, v, g, beta):
        out, _ = recurrent_op(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        return out

    name = "flashgrad-fp8" if fp8 else "flashgrad"
    return Kernels(name, attention, chunk, recurrent, compute_dtype, returns_lse)
