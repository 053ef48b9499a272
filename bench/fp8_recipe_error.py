"""The FP8 recipe's measured error (docs/fp8.md), from its emulation (flashgrad.fp8_reference);
runs on the CPU (or a GPU: --device cuda) in plain PyTorch, float32 products.

For each shape, with bf16 inputs x ~ N(0, 1) and random bf16 dO, relative RMS errors
||X - X_ref|| / ||X_ref|| of out, lse, dq, dk, dv for
  recipe      the recipe (P, dO in e4m3; dS, P bf16 in the gradient products) against the exact
              float32 attention of the same dequantized inputs: what the kernels add;
  fp8 total   the recipe on quantized inputs against float32 attention of the bf16 inputs
              (gradients straight through the quantizer): what a trainer sees;
  bf16        plain-torch attention computed in bf16 (the yardstick of flashgrad's bf16 GPU tests)
              against float32 on the same bf16 inputs;
  ablations   the recipe with dS in e4m3 (one scale per query row) for dq, dk, or with P in e4m3
              for dv: why those products stay bf16; and with dP from the bf16 dO: what the one
              fp8 product of the backward costs.

usage: python bench/fp8_recipe_error.py [--device cpu] [--out table.md] [--seeds 2]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from flashgrad.fp8 import dequantize_per_head, quantize_per_head
from flashgrad.fp8_reference import fp8_attention_reference, fp8_attention_reference_backward

SHAPES = [  # B, H, Hk, S, D, causal
    (1, 4, 4, 1024, 128, True), (1, 4, 4, 1024, 128, False), (1, 4, 4, 1024, 64, True),
    (1, 4, 4, 1024, 256, True), (1, 8, 2, 1024, 128, True),
]
NAMES = ("out", "lse", "dq", "dk", "dv")


def rel_rms(x, ref):
    x, ref = x.double(), ref.double()
    keep = torch.isfinite(ref)
    return float(((x - ref)[keep] ** 2).mean().sqrt() / (ref[keep] ** 2).mean().sqrt())


def exact(q, k, v, dout, causal, hk):
    """float32 attention and gradients of float inputs (descale 1: the emulation's exact mode is
    plain float32 math when fed 'e4m3' tensors that hold arbitrary float32 values)."""
    ones = torch.ones(q.shape[0], hk, device=q.device)
    out, lse = fp8_attention_reference(q, k, v, ones, ones, ones, causal=causal, emulate_recipe=False)
    grads = fp8_attention_reference_backward(dout, q, k, v, ones, ones, ones, out, lse, causal=causal,
                                             emulate_recipe=False)
    return (out, lse, *grads)


def bf16_plain(q, k, v, dout, causal):
    """Attention in bf16 by plain torch (autograd), as flashgrad's bf16 GPU tests' yardstick."""
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * q.shape[-1] ** -0.5
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    grads = torch.autograd.grad((out * dout.bfloat16()).sum(), (q, k, v))
    return (out.detach(), lse.detach(), *grads)


def measure(b, h, hk, s, d, causal, seed, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(b, s, heads, d, generator=g).bfloat16().to(device) for heads in (h, hk, hk))
    dout = torch.randn(b, s, h, d, generator=g).bfloat16().to(device)
    (q8, dsq), (k8, dsk), (v8, dsv) = (quantize_per_head(t, hk) for t in (q, k, v))
    qkv8 = (q8, k8, v8, dsq, dsk, dsv)
    out, lse = fp8_attention_reference(*qkv8, causal=causal)
    recipe = (out, lse, *fp8_attention_reference_backward(dout, *qkv8, out, lse, causal=causal))
    ablations = {a: fp8_attention_reference_backward(dout, *qkv8, out, lse, causal=causal, ablation=a)
                 for a in ("ds_e4m3", "p_e4m3", "dp_bf16")}
    deq = [dequantize_per_head(x, ds) for x, ds in ((q8, dsq), (k8, dsk), (v8, dsv))]
    ref_deq = exact(*deq, dout, causal, hk)
    ref_bf16 = exact(*(t.float() for t in (q, k, v)), dout, causal, hk)
    plain = bf16_plain(q, k, v, dout, causal)
    row = {}
    for i, n in enumerate(NAMES):
        row[("recipe", n)] = rel_rms(recipe[i], ref_deq[i])
        row[("fp8 total", n)] = rel_rms(recipe[i], ref_bf16[i])
        row[("bf16", n)] = rel_rms(plain[i], ref_bf16[i])
    row[("ablation dS e4m3", "dq")] = rel_rms(ablations["ds_e4m3"][0], ref_deq[2])
    row[("ablation dS e4m3", "dk")] = rel_rms(ablations["ds_e4m3"][1], ref_deq[3])
    row[("ablation P e4m3", "dv")] = rel_rms(ablations["p_e4m3"][2], ref_deq[4])
    row[("ablation dP bf16", "dq")] = rel_rms(ablations["dp_bf16"][0], ref_deq[2])
    row[("ablation dP bf16", "dk")] = rel_rms(ablations["dp_bf16"][1], ref_deq[3])
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    args = ap.parse_args(argv)
    kinds = ("recipe", "fp8 total", "bf16")
    lines = [f"Relative RMS error against float32, mean over {args.seeds} seeds (bench/fp8_recipe_error.py, "
             f"{args.device}, {time.strftime('%Y-%m-%d')}):", "",
             "| shape | compared | out | lse | dq | dk | dv |", "|---|---|---|---|---|---|---|"]
    for b, h, hk, s, d, causal in SHAPES[:1] if args.quick else SHAPES:
        rows = [measure(b, h, hk, s, d, causal, seed, args.device) for seed in range(args.seeds)]
        mean = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
        shape = f"B{b} Hq{h} Hk{hk} S{s} D{d} {'causal' if causal else 'full'}"
        for kind in kinds:
            lines.append(f"| {shape} | {kind} | " + " | ".join(f"{mean[(kind, n)]:.2e}" for n in NAMES) + " |")
        lines.append(f"| {shape} | ablations | | | {mean[('ablation dS e4m3', 'dq')]:.2e} (dS e4m3) | "
                     f"{mean[('ablation dS e4m3', 'dk')]:.2e} (dS e4m3) | {mean[('ablation P e4m3', 'dv')]:.2e} (P e4m3) |")
        lines.append(f"| {shape} | ablations | | | {mean[('ablation dP bf16', 'dq')]:.2e} (dP bf16) | "
                     f"{mean[('ablation dP bf16', 'dk')]:.2e} (dP bf16) | |")
        print(lines[-5:], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
