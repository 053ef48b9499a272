"""flashgrad softmax attention beside torch SDPA's cuDNN and FLASH (FlashAttention 2) backends.

One process, same inputs, CUDA-event medians (triton.testing.do_bench). Prints TFLOP/s, the ratio
to cuDNN, and the fraction of a bf16 matmul measured in the same run. FLOPs (docs/attention.md):
forward 4*B*Hq*Sq*Sk*D, halved when causal with Sq == Sk; backward 2.5 x forward;
backward time = (forward + backward) - forward, as in anchors.md.

usage: python bench/attention_vs_sdpa.py [--out results.md] [--quick]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from triton.testing import do_bench
except ImportError:  # pragma: no cover
    do_bench = None

import flashgrad

ROWS = [  # B, Hq, Hk, S, D, label
    (8, 16, 16, 2048, 128, ""), (2, 16, 16, 8192, 128, ""), (4, 16, 16, 4096, 64, ""),
    (2, 16, 16, 8192, 256, ""), (2, 32, 8, 8192, 128, "GQA 4:1"),
]


def bench_ms(fn):
    if do_bench is not None:
        return do_bench(fn, warmup=50, rep=200, return_mode="median")
    torch.cuda.synchronize()
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record(); fn(); end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def matmul_ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench_ms(lambda: a @ b)
    return 2 * 8192**3 / ms / 1e9


def time_fwd_bwd(run):
    """run() -> output tensor requiring grad; returns (fwd ms, bwd ms)."""
    out = run()
    g = torch.randn_like(out)
    fwd = bench_ms(run)
    both = bench_ms(lambda: run().backward(g))
    return fwd, max(both - fwd, 1e-9)


def sdpa_runner(q, k, v, causal, backend):
    # SDPA wants [B, H, S, D]; make contiguous copies once, outside the timed region.
    qt, kt, vt = (x.transpose(1, 2).contiguous().detach().requires_grad_() for x in (q, k, v))
    gqa = qt.shape[1] != kt.shape[1]

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
    run()  # raises if the backend refuses this case
    return run


def flashgrad_runner(q, k, v, causal):
    return lambda: flashgrad.flash_attn_func(q, k, v, causal=causal)


def varlen_row(causal, ceiling):
    torch.manual_seed(0)
    lens = [8192, 4096, 2048, 1024, 512, 384, 128, 8192, 3000, 1000]
    H, D = 16, 128
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    T = int(cu[-1])
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    run = lambda: flashgrad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    fwd, bwd = time_fwd_bwd(run)
    flops = sum(4 * H * L * L * D * (0.5 if causal else 1.0) for L in lens)
    return dict(row=f"varlen {len(lens)} seqs T={T} H{H} D{D}", causal=causal,
                fg_fwd=flops / fwd / 1e9, fg_bwd=2.5 * flops / bwd / 1e9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    ceiling = matmul_ceiling()
    print(f"device {dev}; torch {torch.__version__}; cuDNN {torch.backends.cudnn.version()}; "
          f"bf16 matmul ceiling {ceiling:.0f} TFLOP/s", flush=True)
    results = []
    rows = ROWS[:1] if args.quick else ROWS
    for (B, Hq, Hk, S, D, label) in rows:
        for causal in (False, True):
            torch.manual_seed(0)
            q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            flops = 4 * B * Hq * S * S * D * (0.5 if causal else 1.0)
            r = dict(row=f"B{B} Hq{Hq} Hk{Hk} S{S} D{D} {label}".strip(), causal=causal)
            for name, make in (("fg", lambda: flashgrad_runner(q, k, v, causal)),
                               ("cudnn", lambda: sdpa_runner(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)),
                               ("fa2", lambda: sdpa_runner(q, k, v, causal, SDPBackend.FLASH_ATTENTION))):
                try:
                    fwd, bwd = time_fwd_bwd(make())
                    r[f"{name}_fwd"], r[f"{name}_bwd"] = flops / fwd / 1e9, 2.5 * flops / bwd / 1e9
                except Exception as e:  # a backend refusing a case is reported, not fatal
                    r[f"{name}_err"] = f"{type(e).__name__}: {str(e)[:80]}"
            results.append(r)
            print(json.dumps(r), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    if not args.quick:
        for causal in (False, True):
            try:
                r = varlen_row(causal, ceiling)
            except Exception as e:
                r = dict(row="varlen", causal=causal, fg_err=f"{type(e).__name__}: {str(e)[:80]}")
            results.append(r)
            print(json.dumps(r), flush=True)

    def f(r, key):
        return f"{r[key]:.0f}" if key in r else "n/a"

    def ratio(r, a, b):
        return f"{r[a] / r[b]:.2f}" if a in r and b in r else "n/a"

    lines = [f"# Attention, bf16, TFLOP/s — {dev}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
             f"cuDNN {torch.backends.cudnn.version()}; bf16 matmul ceiling {ceiling:.0f} TFLOP/s", "",
             "| row | causal | flashgrad fwd | cuDNN fwd | FA2 fwd | fwd vs cuDNN | flashgrad bwd | cuDNN bwd | FA2 bwd | bwd vs cuDNN | fwd/ceiling | bwd/ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['row']} | {'yes' if r['causal'] else 'no'} | {f(r, 'fg_fwd')} | {f(r, 'cudnn_fwd')} | "
                     f"{f(r, 'fa2_fwd')} | {ratio(r, 'fg_fwd', 'cudnn_fwd')} | {f(r, 'fg_bwd')} | {f(r, 'cudnn_bwd')} | "
                     f"{f(r, 'fa2_bwd')} | {ratio(r, 'fg_bwd', 'cudnn_bwd')} | "
                     f"{(r['fg_fwd'] / ceiling if 'fg_fwd' in r else float('nan')):.2f} | "
                     f"{(r['fg_bwd'] / ceiling if 'fg_bwd' in r else float('nan')):.2f} |")
    errs = [f"- {r['row']} causal={r['causal']}: {k}={v}" for r in results for k, v in r.items() if k.endswith("_err")]
    table = "\n".join(lines + ([""] + ["Refused or failed:"] + errs if errs else []))
    print(table)
    if args.out:
        open(args.out, "w").write(table + "\n")
    if args.json:
        json.dump(dict(device=dev, ceiling=ceiling, results=results), open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
