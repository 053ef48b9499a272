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
from triton.testing import do_bench

from delta_rule_vs_fla import fla_fn, flashgrad_fn, make_inputs  # the same inputs and calls as the bench


def probe(name, fn, xs):
    call = lambda: fn(*xs)  # noqa: E731
    call(); torch.cuda.synchronize()
    bench = do_bench(call, warmup=10, rep=60, return_mode="median")
    torch.cuda.synchronize()
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
    xs = make_inputs(a.kind, 8, 4096, 16, 128)
    probe(f"flashgrad chunk {a.kind} fwd", flashgrad_fn(a.kind, "chunk"), xs)
    if not a.no_fla:
        probe(f"fla chunk {a.kind} fwd", fla_fn(a.kind, "chunk"), xs)


if __name__ == "__main__":
    main()
