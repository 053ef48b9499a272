"""What one chunked delta-rule backward call puts on the GPU, in order, and where the GPU idles.

bench/delta_rule_vs_fla.py times the backward as (forward + backward) - forward with do_bench; at B8
T4096 the events gave ~0.2 ms more than the kernels (session 22). This prints, for one
torch.autograd.backward call (the forward run before it, outside the profile), every GPU activity
(kernels, memsets, copies) with its start, duration and the idle gap before it, then the totals:
span, busy, idle, and the host time of the call (perf_counter around it while the GPU is kept busy, so
the call is not waited for). Twice: with the inputs' .grad already set (the bench's repeated calls add
into them: PyTorch's AccumulateGrad) and with .grad = None first (a training step after
zero_grad(set_to_none=True), the default).

usage: python bench/backward_timeline.py [--kind gdn|kda] [--B 8 --T 4096 --H 16 --K 128] [--fla]
"""
import argparse
import time

import torch

from delta_rule_vs_fla import fla_fn, flashgrad_fn, make_inputs


def gpu_events(prof):
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def timeline(label, fn, xs, keep_grads):
    o, ht = fn(*xs)
    do, dht = torch.randn_like(o), torch.randn_like(ht)

    def step():
        if not keep_grads:
            for x in xs:
                x.grad = None
        o, ht = fn(*xs)
        return o, ht

    for _ in range(3):  # warm-up (and, with keep_grads, .grad set before the profiled call)
        torch.autograd.backward(step(), (do, dht))
    torch.cuda.synchronize()
    # host time of the backward call alone, the GPU kept busy so that the call is not waited for
    big = torch.empty(2**28, device="cuda")
    host = []
    for _ in range(7):
        outs = step()
        for _ in range(30):
            big.mul_(1.0)
        t0 = time.perf_counter()
        torch.autograd.backward(outs, (do, dht))
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    host.sort()
    del big
    outs = step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.backward(outs, (do, dht))
        torch.cuda.synchronize()
    ev = gpu_events(prof)
    if not ev:
        print(f"{label}: no GPU events recorded")
        return
    t0, busy, idle, prev_end = ev[0][0], 0.0, 0.0, ev[0][0]
    print(f"== {label} ({'.grad set: AccumulateGrad adds' if keep_grads else '.grad None first'})")
    print(f"{'start us':>9} {'dur us':>8} {'gap us':>7}  name")
    for s, e, name in ev:
        gap = max(0.0, s - prev_end)
        idle += gap
        busy += e - s
        prev_end = max(prev_end, e)
        print(f"{s - t0:9.1f} {e - s:8.1f} {gap:7.1f}  {name[:90]}")
    span = prev_end - t0
    print(f"TOTAL {label}: {len(ev)} GPU activities, span {span / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms, "
          f"idle {idle / 1e3:.3f} ms; host time of the call {host[len(host) // 2]:.3f} ms (median of 7)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="gdn", choices=["gdn", "kda"])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--fla", action="store_true", help="also fla's backward (fla-core installed)")
    args = ap.parse_args()
    xs = make_inputs(args.kind, args.B, args.T, args.H, args.K)
    shape = f"{args.kind} B{args.B} T{args.T} H{args.H} K=V={args.K}"
    for keep in (True, False):
        timeline(f"flashgrad {shape}", flashgrad_fn(args.kind, "chunk"), xs, keep)
    if args.fla:
        for keep in (True, False):
            timeline(f"fla {shape}", fla_fn(args.kind, "chunk"), xs, keep)


if __name__ == "__main__":
    main()
