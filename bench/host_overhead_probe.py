"""Where a chunked delta-rule forward's wall time goes besides its kernels: for chunk GDN
(B8 T4096 H16 K=V=128 bf16, the issue's row), flashgrad and fla in one process:
  - do_bench median (what bench/delta_rule_vs_fla.py reports; L2 flushed before each call),
  - back-to-back throughput: 20 calls queued without a sync, divided by 20 (host work overlaps),
  - host time per call (perf_counter around a call that is not waited for, GPU busy beforehand),
  - the sum of the call's CUDA kernel times (torch.profiler).
If do_bench exceeds the kernel sum by about the host time, the difference is host overhead exposed
by the timing method (the GPU idles while the host prepares the call), not kernel time.

usage: python bench/host_overhead_probe.py [--no-fla] [--kind gdn|kda]
"""
import argparse
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashgrad


def inputs(kind, B=8, T=4096, H=16, K=128):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dt)
    v = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    g = F.logsigmoid(torch.randn((B, T, H) if kind == "gdn" else (B, T, H, K), device="cuda")) / 4
    beta = torch.rand(B, T, H, device="cuda").sigmoid().to(dt)
    h0 = torch.randn(B, H, K, K, device="cuda") * 0.1
    return [t.requires_grad_() for t in (q, k, v, g, beta, h0)]


def probe(name, fn, xs):
    call = lambda: fn(*xs)  # noqa: E731
    call(); torch.cuda.synchronize()
    bench = do_bench(call, warmup=10, rep=60, return_mode="median")
    torch.cuda.synchronize(); t0 = time.perf_counter()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        call()
    e.record(); torch.cuda.synchronize()
    queued = s.elapsed_time(e) / 20
    big = torch.empty(2**28, device="cuda")  # keep the GPU busy so the host call is not waited for
    host = []
    for _ in range(10):
        for _ in range(20):
            big.mul_(1.0)
        t0 = time.perf_counter(); call(); host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    host.sort()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    kern = sum(ev.self_device_time_total for ev in prof.key_averages()) / 5 / 1e3
    print(f"{name:28s} do_bench {bench:7.3f} ms | queued x20 {queued:7.3f} ms/call | host {host[len(host)//2]:6.3f} ms/call "
          f"| kernels {kern:7.3f} ms", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-fla", action="store_true"); ap.add_argument("--kind", default="gdn")
    a = ap.parse_args()
    xs = inputs(a.kind)
    fg = flashgrad.chunk_gated_delta_rule if a.kind == "gdn" else flashgrad.chunk_kda
    probe(f"flashgrad chunk {a.kind} fwd", lambda q, k, v, g, b, h: fg(q=q, k=k, v=v, g=g, beta=b, initial_state=h,
                                                                       output_final_state=True), xs)
    if not a.no_fla:
        import fla.ops.common.chunk_o as chunk_o
        chunk_o.TRITON_ABOVE_3_4_0 = False  # timing only (see bench/delta_rule_vs_fla.py)
        if a.kind == "gdn":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as f
        else:
            from fla.ops.kda import chunk_kda as f
        probe(f"fla chunk {a.kind} fwd", lambda q, k, v, g, b, h: f(q=q, k=k, v=v, g=g, beta=b, initial_state=h,
                                                                     output_final_state=True), xs)


if __name__ == "__main__":
    main()
