#!/usr/bin/env python3
"""FP8 (e4m3) attention forward: environment-variable variants timed side by side in one process
(fp8fwd.sh, issue 7). The library reads its FLASHGRAD_ATTN_FP8_* switches at every call, so one
process can time several variants on the same inputs, in interleaved rounds (each round times every
variant once), which keeps clock drift out of the comparison.

usage: fp8fwd_time.py [--shape B,H,S] [--dims 128,64,256] [--masks none,causal] [--rounds 3] [--reps 10]
                      LABEL=NAME=VALUE[:NAME=VALUE...] | LABEL=- ...
  LABEL=- : no variable set (the library's defaults); NAME=VALUE pairs are set for that variant only
  (every NAME any variant mentions is unset before each variant's calls).
Prints per (head dim, mask):
  ROW d128 none | LABEL: T TFLOP/s (best of the rounds; mean M) | ...
  DIFF d128 none LABEL vs FIRST: out rel RMS .., max |d| .., lse max |d| ..
(4 B H S^2 D FLOPs, halved when causal; inputs q, k, v ~ N(0, 1) in bf16 quantized with flashgrad's
current scaling; the timed call is the low-level e4m3 op: the V^T pre-pass and the kernel.)
"""
import argparse
import os
import time

import torch

import flashgrad  # noqa: F401  (registers the ops)
from flashgrad._torch_library import ops
from flashgrad.fp8 import quantize_per_head


def parse_variants(specs):
    out = []
    for spec in specs:
        label, _, rest = spec.partition("=")
        env = {}
        if rest and rest != "-":
            for kv in rest.split(":"):
                name, _, value = kv.partition("=")
                env[name] = value
        out.append((label, env))
    return out


def set_env(env, names):
    for n in names:
        os.environ.pop(n, None)
    os.environ.update(env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,16,8192")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (CPU reference)")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    B, H, S = (int(x) for x in a.shape.split(","))
    variants = parse_variants(a.variants)
    names = sorted({n for _, env in variants for n in env})
    dev = a.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for D in (int(x) for x in a.dims.split(",")):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        (q8, dq), (k8, dk), (v8, dv) = (quantize_per_head(x, H) for x in (q, k, v))
        del q, k, v
        for mask in a.masks.split(","):
            def call():
                return ops.attention_forward(q8, k8, v8, None, None, S, S, None, mask, -1, -1, None, None, 0.0,
                                             "tanh", 0.0, False, descale_q=dq, descale_k=dk, descale_v=dv)
            flops = 4.0 * B * H * S * S * D * (0.5 if mask == "causal" else 1.0)
            times = {label: [] for label, _ in variants}
            outs = {}
            for rnd in range(a.rounds):
                for label, env in variants:
                    set_env(env, names)
                    o = call()  # warm-up (and the output compared below)
                    sync()
                    if rnd == 0:
                        outs[label] = (o[0].float(), o[1].float())
                    t0 = time.perf_counter()
                    if dev == "cuda":
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                    for _ in range(a.reps):
                        call()
                    if dev == "cuda":
                        e1.record()
                        sync()
                        times[label].append(e0.elapsed_time(e1) / a.reps)
                    else:
                        times[label].append((time.perf_counter() - t0) * 1e3 / a.reps)
            set_env({}, names)
            cells = []
            for label, _ in variants:
                best, mean = min(times[label]), sum(times[label]) / len(times[label])
                cells.append(f"{label}: {flops / best / 1e9:.1f} TFLOP/s (mean {flops / mean / 1e9:.1f})")
            print(f"ROW d{D} {mask} | " + " | ".join(cells), flush=True)
            first = variants[0][0]
            o0, l0 = outs[first]
            for label, _ in variants[1:]:
                o1, l1 = outs[label]
                d = (o1 - o0)
                rel = (d.square().sum() / o0.square().sum().clamp_min(1e-30)).sqrt().item()
                fin = bool(torch.isfinite(o1).all()) and bool(torch.isfinite(l1).all())
                print(f"DIFF d{D} {mask} {label} vs {first}: out rel RMS {rel:.2e}, max |d| {d.abs().max().item():.2e}, "
                      f"lse max |d| {(l1 - l0).abs().max().item():.2e}, finite {fin}", flush=True)
            del outs


if __name__ == "__main__":
    main()
