"""Argument checks that need the framework (devices, Python-level types). Everything else is
checked once, in the C++ core, whose messages name the argument and the rule."""

from __future__ import annotations

import torch


def fail(op: str, arg: str, rule: str, kind=ValueError):
    raise kind(f"flashgrad: {op}: argument '{arg}': {rule}")


def require_tensor(op: str, arg: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        fail(op, arg, f"must be a torch.Tensor, got {type(t).__name__}", TypeError)


def same_device(op: str, reference: torch.Tensor, reference_arg: str, **tensors) -> None:
    """Every tensor given (None skipped) is on reference's device."""
    for arg, t in tensors.items():
        if t is None:
            continue
        require_tensor(op, arg, t)
        if t.device != reference.device:
            fail(op, arg, f"must be on the same device as {reference_arg} ({reference.device}), got {t.device}")


def index_tensor(op: str, arg: str, t, device: torch.device, dtype=torch.int32):
    """An index tensor (cu_seqlens, prefix lengths, bounds) as `dtype` on `device`. Integer
    tensors of another width are converted; floating ones are refused."""
    if t is None:
        return None
    require_tensor(op, arg, t)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        fail(op, arg, f"must be an integer tensor (int32), got {t.dtype}")
    if t.device != device:
        fail(op, arg, f"must be on the same device as q ({device}), got {t.device}")
    return t if t.dtype == dtype else t.to(dtype)
