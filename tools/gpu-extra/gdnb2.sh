#!/usr/bin/env bash
# gdnb2 (issue 6: the chunked GDN backward's B2 split into two kernels, chunked_grads_split.cuh;
# docs/perf/delta_rule.md "B2 split (session 7)"). Runs on the H200 from the repo root after
# tools/gpu-check's build into build-gpu and the package install (cap 150 s; budget 135 s; logs in
# $OUT/extra/):
#   1. the chunked GDN GPU tests with the default B2 (the split one where it applies; FLASHGRAD_CHUNKED_B2 unset);
#   2. one python process, B8 T4096 H16 K=V=128 and K=V=64 bf16: the fused B2 (FLASHGRAD_CHUNKED_B2=fused,
#      read per call) against the split one (the default: one item per 8-warp block, =split) and the
#      experiment =split2 (two value heads per 16-warp block): forward / backward wall ms,
#      per-kernel CUDA time of the B2 kernels (torch.profiler), peak extra MiB, and the splits'
#      gradients against the fused one's (relative RMS);
#   3. ncu of one launch of each split kernel (default shape; occupancy, issue, stalls) if >= 40 s are left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 135 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== gdnb2 1/3: chunked GDN GPU tests, default B2 (split)"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  env -u FLASHGRAD_CHUNKED_B2 timeout -k 3 "$(cap 45)" "$tests" \
    --gtest_filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' > "$OUT/extra/gdnb2_tests.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/gdnb2_tests.log" | cut -c1-300 | tail -30
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/gdnb2_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/gdnb2_tests.log")
  summary+=("tests (default = split B2) rc=$rc: $npass ok, $nfail failed lines")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== gdnb2 2/3: fused vs split B2 in one process"
timeout -k 3 "$(cap 80)" python3 - > "$OUT/extra/gdnb2_compare.log" 2>&1 <<'EOF'
import os, torch, torch.nn.functional as F
import flashgrad

def ms(fn, reps):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps

def kernel_ms(fn, reps):
    """Self CUDA ms per call of each chunk_grads* kernel over `reps` runs of fn."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps): fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "chunk_grads" not in e.key: continue
        name = e.key.split("delta_rule::")[1].split("<")[0]
        t = getattr(e, "self_device_time_total", None)
        if t is None: t = e.self_cuda_time_total
        out[name] = out.get(name, 0.0) + t / 1000.0 / reps
    return out

def case(B, T, H=16, HV=16, K=128, reps=5):
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=dt).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, HV, K, device=dev, dtype=dt).requires_grad_()
    g = (F.logsigmoid(torch.randn(B, T, HV, device=dev)) / 4).requires_grad_()
    beta = torch.rand(B, T, HV, device=dev).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(B, HV, K, K, device=dev) * 0.1).requires_grad_()
    ins = (q, k, v, g, beta, h0)
    fn = lambda: flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, ht = fn()
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    def both():
        o, ht = fn()
        return torch.autograd.grad((o, ht), ins, (do, dht))
    res = {}
    for mode in ("fused", "split", "split2"):
        os.environ["FLASHGRAD_CHUNKED_B2"] = mode  # read at every call
        gs = both(); torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        both(); torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        f = ms(fn, reps)
        fb = ms(both, reps)
        km = kernel_ms(both, 2)
        res[mode] = (gs, f, fb - f, peak, km)
    os.environ["FLASHGRAD_CHUNKED_B2"] = ""
    rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt())
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    tag = f"B{B} T{T} H{H} HV{HV} K=V={K}"
    for mode in ("fused", "split", "split2"):
        _, f, b, p, km = res[mode]
        ks = ", ".join(f"{n} {t:.3f}" for n, t in sorted(km.items()))
        b2 = sum(km.values())
        print(f"ROW {tag} {mode}: fwd {f:.3f} ms, bwd {b:.3f} ms, peak extra {p:.0f} MiB | B2 {b2:.3f} ms ({ks})")
    gf = res["fused"][0]
    for mode in ("split", "split2"):
        gs = res[mode][0]
        print(f"ROW {tag} {mode} vs fused rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gs, gf))
              + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gs)))
    del res, gs, gf
    torch.cuda.empty_cache()

case(8, 4096)
case(8, 4096, K=64)
EOF
rc=$?
tail -12 "$OUT/extra/gdnb2_compare.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/gdnb2_compare.log")
[ $rc -eq 0 ] || summary+=("compare rc=$rc")

echo "== gdnb2 3/3: ncu of one launch of each split kernel (B8 T4096 H16 K=V=128), if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  metrics='regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_(long_scoreboard|short_scoreboard|wait|barrier|math_pipe_throttle|mio_throttle|lg_throttle|no_instruction)_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  env -u FLASHGRAD_CHUNKED_B2 timeout -k 3 "$(( $(left) - 5 ))" "$ncu_bin" --clock-control none \
    -k regex:'chunk_grads_(state|local)' --launch-count 2 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --metrics "$metrics" \
    python3 bench/profile_delta_rule.py --B 8 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$OUT/extra/gdnb2_ncu.txt" 2>&1
  echo "rc=$?"
  grep -E "chunk_grads_|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Block Limit|pipe_tensor|issue_stalled|issue_active" \
    "$OUT/extra/gdnb2_ncu.txt" | cut -c1-160 | head -40
  while IFS= read -r l; do summary+=("ncu $l"); done < <(
    awk '/chunk_grads_(state|local)_kernel/ {n=($0 ~ /state/) ? "B2a" : "B2b"} /^ +Duration/ {print n, "duration", $(NF-1), $NF}
         /Achieved Occupancy/ {print n, "achieved occupancy", $NF, "%"} /issue_active/ {print n, "issue active", $NF, "%"}' \
      "$OUT/extra/gdnb2_ncu.txt" | head -8)
else
  summary+=("ncu: skipped (no ncu or < 40 s left)")
fi

echo "== gdnb2 summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
