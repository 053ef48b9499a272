"""Kernel variants of the chunked delta rule side by side, in one process (the GPU jobs' common step).

One problem (chunk GDN or chunk KDA, bf16, the inputs bench/profile_delta_rule.py uses), several
variants selected by one environment variable that the launchers read at every call. For each
variant, in the order given:
  ROW  <label>: forward X ms, backward Y ms; <the --focus kernels' CUDA time per call>
  INFO <label> per call: <every kernel matching --kernels: time per call, calls per step>
and then, for every variant after the first, its output, final state and six gradients against the
first variant's (relative RMS) and whether all are finite:
  ROW  <label> vs <first> rel RMS: o .. ht .. dq .. dk .. dv .. dg .. dbeta .. dh0 .. | finite True

usage: variant_compare.py --kind gdn|kda --shape B,T,H,K --env NAME --variants label=value,...
                          [--kernels REGEX] [--focus REGEX] [--note TEXT] [--reps F,B,S]
  value "-" leaves NAME unset (the default kernels). --reps: timed forward / backward repetitions and
  profiled steps. --device cpu: a smoke test of this script on flashgrad's CPU backend (wall times
  only, no kernel table), for checking the job before a GPU call is spent on it.
"""
import argparse
import os
import re
import time

import torch
import torch.nn.functional as F

import flashgrad

NAMES = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")


def make_inputs(kind, B, T, H, K, device):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device=device, dtype=dt, requires_grad=True)
    k = F.normalize(torch.randn(B, T, H, K, device=device), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, H, K, device=device, dtype=dt, requires_grad=True)
    gshape = (B, T, H) if kind == "gdn" else (B, T, H, K)
    g = (F.logsigmoid(torch.randn(gshape, device=device)) / 4).requires_grad_()
    beta = torch.rand(B, T, H, device=device).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(B, H, K, K, device=device) * 0.1).requires_grad_()
    return q, k, v, g, beta, h0


def op_of(kind):
    if kind == "gdn":
        return lambda q, k, v, g, beta, h0: flashgrad.chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
    return lambda q, k, v, g, beta, h0: flashgrad.chunk_kda(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_ms(f, reps, device):
    """Mean wall time of f in ms over reps calls after one warm-up (CUDA events on the GPU)."""
    f()
    sync(device)
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return (time.perf_counter() - t0) * 1e3 / reps
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        f()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps


def kernel_ms(step, steps, pattern):
    """{kernel: (CUDA ms per call, calls per step)} of the kernels whose name matches `pattern` (its
    first group names the kernel), over `steps` calls of step()."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total = {}
    for e in prof.key_averages():
        m = re.search(pattern, e.key)
        if not m:
            continue
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        ms, calls = total.get(m.group(1), (0.0, 0))
        total[m.group(1)] = (ms + t / 1000.0, calls + e.count)
    return {n: (ms / max(calls, 1), calls // steps) for n, (ms, calls) in total.items()}


def rel_rms(x, ref):
    x, ref = x.float(), ref.float()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("gdn", "kda"), required=True)
    ap.add_argument("--shape", required=True, help="B,T,H,K (K = V)")
    ap.add_argument("--env", required=True, help="the environment variable that selects the variant")
    ap.add_argument("--variants", required=True, help="label=value,... (value - : unset)")
    ap.add_argument("--kernels", default=r"((?:chunk|kda)_\w+?_kernel)", help="kernel-name regex, group 1 = name")
    ap.add_argument("--focus", default="", help="regex: the kernels it finds in their names go in the ROW line")
    ap.add_argument("--note", default="", help="text appended to each timing ROW (the anchor, say)")
    ap.add_argument("--reps", default="5,3,2", help="forward reps, backward reps, profiled steps")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    B, T, H, K = (int(x) for x in a.shape.split(","))
    fwd_reps, bwd_reps, steps = (int(x) for x in a.reps.split(","))
    variants = [tuple(p.split("=", 1)) for p in a.variants.split(",")]

    ins = make_inputs(a.kind, B, T, H, K, a.device)
    op = op_of(a.kind)
    fwd = lambda: op(*ins)

    def step():
        o, ht = fwd()
        torch.autograd.backward((o, ht), (torch.ones_like(o), torch.ones_like(ht)))

    results = {}
    for label, value in variants:
        if value == "-":
            os.environ.pop(a.env, None)
        else:
            os.environ[a.env] = value
        o, ht = fwd()
        do, dht = torch.ones_like(o), torch.ones_like(ht)
        bwd = lambda: torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
        grads = bwd()
        tf = timed_ms(fwd, fwd_reps, a.device)
        tb = timed_ms(bwd, bwd_reps, a.device)
        ks = kernel_ms(step, steps, a.kernels) if a.device == "cuda" else {}
        results[label] = (o.detach(), ht.detach()) + tuple(grads)
        focus = ", ".join(f"{n} {ms:.3f} ms x{c}/step" for n, (ms, c) in sorted(ks.items()) if a.focus and re.search(a.focus, n))
        print(f"ROW {label}: forward {tf:.3f} ms, backward {tb:.3f} ms" + (f"; {focus}" if focus else "")
              + (f" ({a.note})" if a.note else ""), flush=True)
        if ks:
            print(f"INFO {label} per call: " + ", ".join(
                f"{n.replace('_kernel', '')} {ms:.3f} ms x{c}" for n, (ms, c) in sorted(ks.items())), flush=True)

    first = variants[0][0]
    for label, _ in variants[1:]:
        got, ref = results[label], results[first]
        print(f"ROW {label} vs {first} rel RMS: " + " ".join(f"{n} {rel_rms(x, r):.2e}" for n, x, r in zip(NAMES, got, ref))
              + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in got)), flush=True)


if __name__ == "__main__":
    main()
