"""Before training: does each layer type give the gradients of its plain PyTorch twin?

For each mixer kind the demo uses, one layer is built with random weights and run twice on the
same random input: once on the kernel set under test (flashgrad) and once on the plain PyTorch
references (autograd through the textbook formulas, fp32). The loss is <y, dy> + <lse, dlse> with
random cotangents, so every output, including the lse that carries the z-loss, sends a gradient
back. Reported per layer, as relative errors max|a - b| / max|b|: the output and lse; the op's
own input gradients (dq, dk, dv, and dg, dbeta for the delta rule; the worst of them), each
against its own largest entry; the gradient of the layer input x; the weight gradients taken as
one vector.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import asdict, dataclass, field

import torch

from .kernels import Kernels, reference_kernels
from .model import ModelConfig, make_mixer


@dataclass
class LayerCheck:
    layer: str
    kernel: str
    out: float
    lse: float | None
    d_op_inputs: float          # worst of the op's own input gradients (dq, dk, dv[, dg, dbeta])
    worst_op_input: str
    d_input: float              # the layer input x
    d_weights: float            # all weight gradients as one vector
    worst_weight: str           # the weight holding the largest absolute difference
    tolerance: float
    # For the log: each op gradient's error, and each weight's error against its own largest entry.
    op_input_errors: dict = field(default_factory=dict)
    weight_errors: dict = field(default_factory=dict)

    @property
    def worst(self) -> float:
        errors = (self.out, self.lse, self.d_op_inputs, self.d_input, self.d_weights)
        return max(e for e in errors if e is not None)

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
    """fp32 kernels against fp32 references differ only in summation order (measured: ~1e-6):
    1e-4 leaves room for the order, not for a wrong term. bf16 and fp8 inputs carry their
    rounding (8 and 4 mantissa bits) into every product."""
    if kernels.name.endswith("fp8"):
        return 0.15
    return 1e-4 if kernels.compute_dtype == torch.float32 else 5e-2


OP_INPUT_NAMES = {"attention": ("q", "k", "v"), "delta_rule": ("q", "k", "v", "g", "beta")}


def _recording(kernels: Kernels, seen: dict) -> Kernels:
    """The same kernels, keeping the tensors each op is called with so that their gradients
    (the op's own backward outputs) can be compared, not only what the layer makes of them."""
    def record(op, names):
        def call(*tensors, **options):
            for name, tensor in zip(names, tensors):
                if tensor.requires_grad:
                    tensor.retain_grad()
                    seen[name] = tensor
            return op(*tensors, **options)
        return call
    return dataclasses.replace(
        kernels, attention=record(kernels.attention, OP_INPUT_NAMES["attention"]),
        chunk_gated_delta_rule=record(kernels.chunk_gated_delta_rule, OP_INPUT_NAMES["delta_rule"]),
        recurrent_gated_delta_rule=record(kernels.recurrent_gated_delta_rule,
                                          OP_INPUT_NAMES["delta_rule"]))


def _run_layer(layer, x, kernels, dy, dlse):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    op_inputs = {}
    y, lse = layer(x, _recording(kernels, op_inputs))
    objective = (y * dy).sum()
    if lse is not None and dlse is not None:
        objective = objective + (lse.float() * dlse).sum()
    objective.backward()
    weight_grads = {name: p.grad.detach().clone() for name, p in layer.named_parameters()
                    if p.grad is not None}
    op_grads = {name: t.grad.detach().clone() for name, t in op_inputs.items()
                if t.grad is not None}
    return (y.detach(), (None if lse is None else lse.detach().float()), x.grad.detach(),
            op_grads, weight_grads)


KERNEL_OF_LAYER = {
    "attention": "flash_attn_func",
    "chunk_gdn": "chunk_gated_delta_rule",
    "recurrent_gdn": "fused_recurrent_gated_delta_rule",
}


def _missing(kind: str, kernels: Kernels, what: str, names) -> None:
    if names:  # a kernel that drops a gradient path leaves these without a gradient
        raise RuntimeError(f"{kind}: no gradient reached {what} {', '.join(sorted(names))} "
                           f"through {kernels.name}")


def check_layer(kind: str, config: ModelConfig, kernels: Kernels, *, batch: int, steps: int,
                device: torch.device, seed: int) -> LayerCheck:
    torch.manual_seed(seed)
    layer = make_mixer(kind, config).to(device)
    twin = copy.deepcopy(layer)            # same weights, run on the references
    x = torch.randn(batch, steps, config.d_model, device=device)
    dy = torch.randn(batch, steps, config.d_model, device=device)
    dlse = torch.randn(batch, config.attn_heads_q, steps, device=device)

    y, lse, dx, op_grads, weight_grads = _run_layer(layer, x, kernels, dy, dlse)
    y_ref, lse_ref, dx_ref, op_grads_ref, weight_grads_ref = _run_layer(
        twin, x, reference_kernels(), dy, dlse)
    _missing(kind, kernels, "the op inputs", set(op_grads_ref) - set(op_grads))
    _missing(kind, kernels, "the weights", set(weight_grads_ref) - set(weight_grads))

    # Each op gradient is compared element by element against its own largest entry.
    op_errors = {name: relative_error(op_grads[name], op_grads_ref[name]) for name in op_grads_ref}
    worst_op_input = max(op_errors, key=lambda name: op_errors[name])
    # Weight gradients are sums over every token of products of those, and some are nearly
    # cancelling sums (A_log and dt_bias have one entry per head): one scale for the layer's whole
    # gradient vector keeps their fp32 rounding from reading as an error, while a wrong op
    # gradient is caught element by element above.
    names = sorted(weight_grads_ref)
    flat = torch.cat([weight_grads[n].double().flatten() for n in names])
    flat_ref = torch.cat([weight_grads_ref[n].double().flatten() for n in names])
    differences = {n: float((weight_grads[n].double() - weight_grads_ref[n].double()).abs().max())
                   for n in names}
    worst_weight = max(differences, key=lambda name: differences[name])

    kernel_name = KERNEL_OF_LAYER[kind]
    if kind == "attention" and kernels.name.endswith("fp8"):
        kernel_name = "flash_attn_fp8_func"
    return LayerCheck(kind, kernel_name, relative_error(y, y_ref),
                      None if lse is None else relative_error(lse, lse_ref),
                      op_errors[worst_op_input], worst_op_input, relative_error(dx, dx_ref),
                      relative_error(flat, flat_ref), worst_weight, tolerance_for(kernels),
                      op_errors, {n: relative_error(weight_grads[n], weight_grads_ref[n])
                                  for n in names})


def run_gradient_check(config: ModelConfig, kernels: Kernels, *, batch: int, steps: int,
                       device: torch.device, seed: int) -> list[LayerCheck]:
    kinds = list(dict.fromkeys(config.layout))  # each layer type once, in model order
    return [check_layer(kind, config, kernels, batch=batch, steps=steps, device=device,
                        seed=seed + i) for i, kind in enumerate(kinds)]


def format_table(checks: list[LayerCheck]) -> str:
    header = (f"{'layer':<14} {'flashgrad op':<33} {'out':>8} {'lse':>8} {'d op in':>8} "
              f"{'d x':>8} {'d weights':>9} {'tol':>6}  result")
    lines = [header, "-" * len(header)]
    for c in checks:
        lse = "-" if c.lse is None else f"{c.lse:.1e}"
        verdict = "ok" if c.passed else (f"FAILED (worst op gradient d{c.worst_op_input}, "
                                         f"worst weight {c.worst_weight})")
        lines.append(f"{c.layer:<14} {c.kernel:<33} {c.out:>8.1e} {lse:>8} {c.d_op_inputs:>8.1e} "
                     f"{c.d_input:>8.1e} {c.d_weights:>9.1e} {c.tolerance:>6.0e}  {verdict}")
    return "\n".join(lines)
