"""Before training: does each layer type give the gradients of its plain PyTorch twin?

For each mixer kind the demo uses, one layer is built with random weights and run twice on the
same random input: once on the kernel set under test (flashgrad) and once on the plain PyTorch
references (autograd through the textbook formulas, fp32). The loss is <y, dy> + <lse, dlse> with
random cotangents, so every output, including the lse that carries the z-loss, sends a gradient
back. Reported per layer: the relative error max|a - b| / max|b| of the output, of lse, of the
input gradient and (worst of) the weight gradients.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch

from .kernels import Kernels, reference_kernels
from .model import ModelConfig, make_mixer


@dataclass
class LayerCheck:
    layer: str
    kernel: str
    out: float
    lse: float | None
    d_input: float
    d_weights: float
    worst_weight: str
    tolerance: float

    @property
    def worst(self) -> float:
        return max(e for e in (self.out, self.lse, self.d_input, self.d_weights) if e is not None)

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance  # NaN compares False: a NaN fails

    def as_dict(self) -> dict:
        return {**asdict(self), "worst": self.worst, "passed": self.passed}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = expected.abs().max().clamp_min(1e-30)
    return float((actual - expected).abs().max() / scale)


def tolerance_for(kernels: Kernels) -> float:
    """fp32 kernels against fp32 references differ only in summation order: 1e-4 is generous.
    bf16 and fp8 inputs carry their rounding (8 and 4 mantissa bits) into every product."""
    if kernels.name.endswith("fp8"):
        return 0.15
    return 1e-4 if kernels.compute_dtype == torch.float32 else 5e-2


def _run_layer(layer, x, kernels, dy, dlse):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y, lse = layer(x, kernels)
    objective = (y * dy).sum()
    if lse is not None and dlse is not None:
        objective = objective + (lse.float() * dlse).sum()
    objective.backward()
    grads = {name: p.grad.detach().clone() for name, p in layer.named_parameters()
             if p.grad is not None}
    return y.detach(), (None if lse is None else lse.detach().float()), x.grad.detach(), grads


KERNEL_OF_LAYER = {
    "attention": "flash_attn_func",
    "chunk_gdn": "chunk_gated_delta_rule",
    "recurrent_gdn": "fused_recurrent_gated_delta_rule",
}


def check_layer(kind: str, config: ModelConfig, kernels: Kernels, *, batch: int, steps: int,
                device: torch.device, seed: int) -> LayerCheck:
    torch.manual_seed(seed)
    layer = make_mixer(kind, config).to(device)
    twin = copy.deepcopy(layer)            # same weights, run on the references
    x = torch.randn(batch, steps, config.d_model, device=device)
    dy = torch.randn(batch, steps, config.d_model, device=device)
    dlse = torch.randn(batch, config.attn_heads_q, steps, device=device)

    y, lse, dx, grads = _run_layer(layer, x, kernels, dy, dlse)
    y_ref, lse_ref, dx_ref, grads_ref = _run_layer(twin, x, reference_kernels(), dy, dlse)

    missing = sorted(set(grads_ref) - set(grads))
    if missing:  # a kernel that drops a gradient path leaves these weights without a grad
        raise RuntimeError(f"{kind}: no gradient reached {', '.join(missing)} through {kernels.name}")
    weight_errors = {name: relative_error(grads[name], grads_ref[name]) for name in grads_ref}
    worst_weight = max(weight_errors, key=lambda name: weight_errors[name])
    lse_error = None
    if lse is not None:
        lse_error = relative_error(lse, lse_ref)
    kernel_name = KERNEL_OF_LAYER[kind]
    if kind == "attention" and kernels.name.endswith("fp8"):
        kernel_name = "flash_attn_fp8_func"
    return LayerCheck(kind, kernel_name, relative_error(y, y_ref), lse_error,
                      relative_error(dx, dx_ref), weight_errors[worst_weight], worst_weight,
                      tolerance_for(kernels))


def run_gradient_check(config: ModelConfig, kernels: Kernels, *, batch: int, steps: int,
                       device: torch.device, seed: int) -> list[LayerCheck]:
    kinds = list(dict.fromkeys(config.layout))  # each layer type once, in model order
    return [check_layer(kind, config, kernels, batch=batch, steps=steps, device=device,
                        seed=seed + i) for i, kind in enumerate(kinds)]


def format_table(checks: list[LayerCheck]) -> str:
    header = (f"{'layer':<14} {'flashgrad op':<33} {'out':>9} {'lse':>9} {'d input':>9} "
              f"{'d weights':>9} {'tol':>8}  result")
    lines = [header, "-" * len(header)]
    for c in checks:
        lse = "-" if c.lse is None else f"{c.lse:.2e}"
        lines.append(f"{c.layer:<14} {c.kernel:<33} {c.out:>9.2e} {lse:>9} {c.d_input:>9.2e} "
                     f"{c.d_weights:>9.2e} {c.tolerance:>8.0e}  "
                     f"{'ok' if c.passed else 'FAILED (worst weight: ' + c.worst_weight + ')'}")
    return "\n".join(lines)
