#!/usr/bin/env bash
# b1warps (issue 6, lead, session 8): the transposed B1's block shape for few long sequences.
# chunk GDN B1 T32768 H16 K=V=128 bf16 (16 chains: the rule picks 2 warps, 64 blocks) and, as a
# control, B8 T4096 H16 (the rule picks 8): in one process, FLASHGRAD_CHUNKED_B1_WARPS=2 / 4 / 8
# (read per call): backward wall, the B1 kernel's CUDA time per call (torch.profiler), and the
# gradients against the rule's choice (rel RMS; the shapes compute the same sums per column, so
# they should agree to rounding). Prints ROW lines last. Cap 150 s; aims at <= 130 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
timeout -k 3 130 python3 - > "$OUT/extra/b1warps.log" 2>&1 <<'PY'
import os, re, torch, torch.nn.functional as F
import flashgrad

def case(B, T, H=16, K=128):
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
    g = (F.logsigmoid(torch.randn(B, T, H, device=dev)) / 4).requires_grad_()
    beta = torch.rand(B, T, H, device=dev).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(B, H, K, K, device=dev) * 0.1).requires_grad_()
    return (q, k, v, g, beta, h0)

def timed(f, reps):
    f(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): f()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps

rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt().clamp_min(1e-30))
for B, T in ((1, 32768), (8, 4096)):
    ins = case(B, T)
    q, k, v, g, beta, h0 = ins
    o, ht = flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    bwd = lambda: torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
    ref = None
    for w in ("rule", "2", "4", "8"):
        if w == "rule": os.environ.pop("FLASHGRAD_CHUNKED_B1_WARPS", None)
        else: os.environ["FLASHGRAD_CHUNKED_B1_WARPS"] = w
        gs = bwd()
        tb = timed(bwd, 3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            bwd(); torch.cuda.synchronize()
        b1 = sum((getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0))
                 for e in prof.key_averages() if "state_backward" in e.key) / 1000.0
        if ref is None: ref = gs
        cmp = " ".join("%s %.1e" % (n, rel(a, b)) for n, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), gs, ref))
        print(f"ROW B{B} T{T} B1 warps {w}: backward {tb:.3f} ms, B1 kernel {b1:.3f} ms; vs rule: {cmp}", flush=True)
    del ins, o, ht, gs, ref
    torch.cuda.empty_cache()
PY
rc=$?
grep -E "^ROW" "$OUT/extra/b1warps.log"
[ $rc -eq 0 ] || { tail -5 "$OUT/extra/b1warps.log" | cut -c1-300; echo "b1warps rc=$rc"; }
