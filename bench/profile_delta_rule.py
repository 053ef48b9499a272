"""Per-kernel CUDA times of flashgrad's chunked gated delta rule (torch.profiler), to see where the
time of a forward and a backward goes.

usage: python bench/profile_delta_rule.py [--B 8 --T 4096 --H 16 --K 128] [--kind gdn|kda] [--reps 3]
       [--recurrent]     (the fused recurrent op instead of the chunked one)
       [--no-profiler]   (just run the steps: for an outside profiler such as ncu, which cannot share
                          the GPU's counters with torch.profiler)
"""
import argparse

import torch
import torch.nn.functional as F

import flashgrad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=8); ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16); ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--kind", default="gdn"); ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("--recurrent", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(a.B, a.T, a.H, a.K, device=dev, dtype=dt, requires_grad=True)
    k = F.normalize(torch.randn(a.B, a.T, a.H, a.K, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(a.B, a.T, a.H, a.K, device=dev, dtype=dt, requires_grad=True)
    gshape = (a.B, a.T, a.H) if a.kind == "gdn" else (a.B, a.T, a.H, a.K)
    g = (F.logsigmoid(torch.randn(gshape, device=dev)) / 4).requires_grad_()
    beta = torch.rand(a.B, a.T, a.H, device=dev).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(a.B, a.H, a.K, a.K, device=dev) * 0.1).requires_grad_()
    if a.recurrent:
        fn = flashgrad.fused_recurrent_gated_delta_rule if a.kind == "gdn" else flashgrad.fused_recurrent_kda
    else:
        fn = flashgrad.chunk_gated_delta_rule if a.kind == "gdn" else flashgrad.chunk_kda

    def step():
        o, ht = fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)
        torch.autograd.backward((o, ht), (torch.ones_like(o), torch.ones_like(ht)))

    step(); torch.cuda.synchronize()
    if a.no_profiler:
        for _ in range(a.reps):
            step()
        torch.cuda.synchronize()
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(a.reps):
            step()
        torch.cuda.synchronize()
    print(f"{'recurrent' if a.recurrent else 'chunk'} {a.kind} B{a.B} T{a.T} H{a.H} K=V={a.K}: per-kernel CUDA time, {a.reps} forward+backward steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
