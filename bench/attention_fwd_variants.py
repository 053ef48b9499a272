"""Forward timing of flashgrad's wgmma attention forward, variants and measurement modes side by
side in one process, for the rows where the benchmark's forward number moves between runs
(B8 H16 S2048 D128 causal: 280-379 TFLOP/s in three runs on 2026-11-30, FA2 282).

Per row, TFLOP/s (4 B H S^2 D, / 2 causal), each the median of triton's do_bench:
  grad     : flash_attn_func on inputs that require grad (what bench/attention_vs_sdpa.py times)
  nograd   : the same call under torch.no_grad()
  graph    : the no-grad call captured in a CUDA graph of 20 calls, replayed (GPU time only: no
             host overhead between the kernels)
  persist  : nograd with FLASHGRAD_ATTN_WGMMA_PERSISTENT=1 (one CTA per SM, heaviest tiles first
             from a counter; the forward reads the switch at every call)
  pgraph   : persist captured in a CUDA graph (its tile counter comes from the workspace or a
             stream-ordered allocation, both legal inside capture)
  pingpong : nograd with FLASHGRAD_ATTN_WGMMA_PINGPONG=1
  fa2, cudnn: torch SDPA backends, no grad
Each flashgrad mode is timed twice (in two rounds) to show the spread within the process.
usage: python3 bench/attention_fwd_variants.py [--out FILE.md]"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashgrad

ROWS = [(8, 16, 2048, 128, True), (8, 16, 2048, 128, False), (2, 16, 8192, 128, True),
        (2, 16, 8192, 128, False), (4, 16, 4096, 64, True), (4, 16, 4096, 64, False), (2, 16, 8192, 256, True),
        (2, 16, 8192, 256, False)]


def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def with_env(name, value, fn):
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run


def graph_ms(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return ms(g.replay) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cols = ["grad", "nograd", "graph", "persist", "pgraph", "pingpong"]
    lines = [f"# wgmma forward: variants and measurement modes, TFLOP/s — {torch.cuda.get_device_name()}, "
             f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}", "",
             "| row | causal | " + " | ".join(f"{c} (r1 / r2)" for c in cols) + " | FA2 | cuDNN |",
             "|---|---|" + "---|" * (len(cols) + 2)]
    print("\n".join(lines), flush=True)
    for B, H, S, D, causal in ROWS:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        tf = lambda t: flops / t / 1e9
        nograd = lambda: flashgrad.flash_attn_func(q, k, v, causal=causal)

        def nograd_call():
            with torch.no_grad():
                return nograd()
        modes = {
            "grad": lambda: ms(lambda: flashgrad.flash_attn_func(qg, kg, vg, causal=causal)),
            "nograd": lambda: ms(nograd_call),
            "graph": lambda: graph_ms(nograd_call),
            "persist": lambda: ms(with_env("FLASHGRAD_ATTN_WGMMA_PERSISTENT", "1", nograd_call)),
            "pgraph": lambda: graph_ms(with_env("FLASHGRAD_ATTN_WGMMA_PERSISTENT", "1", nograd_call)),
            "pingpong": lambda: ms(with_env("FLASHGRAD_ATTN_WGMMA_PINGPONG", "1", nograd_call)),
        }
        res = {c: [] for c in cols}
        for _ in range(2):
            for c in cols:
                try:
                    res[c].append(f"{tf(modes[c]()):.0f}")
                except Exception as e:  # a variant failing is reported, not fatal
                    res[c].append(f"err {type(e).__name__}")
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        ref = {}
        for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def sd(be=be):
                with sdpa_kernel([be]), torch.no_grad():
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            try:
                ref[name] = f"{tf(ms(sd)):.0f}"
            except Exception as e:
                ref[name] = f"err {type(e).__name__}"
        line = (f"| B{B} H{H} S{S} D{D} | {'yes' if causal else 'no'} | " +
                " | ".join(" / ".join(res[c]) for c in cols) + f" | {ref['fa2']} | {ref['cudnn']} |")
        lines.append(line)
        print(line, flush=True)
        del q, k, v, qg, kg, vg, qt, kt, vt
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
