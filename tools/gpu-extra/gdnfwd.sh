#!/usr/bin/env bash
# gdnfwd (issue 6: speed of the chunked GDN forward; docs/perf/delta_rule.md "Forward stages, session 4").
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s; $OUT/extra/ collects the logs), in order of what it tells:
#   1. the chunked GPU tests: DeltaRuleChunked* (every stage against the CPU chunked reference, end to
#      end against the CPU recurrence; KDA's too) and DeltaRuleGpu.Chunked*;
#   2. forward-only per-kernel times (torch.profiler) and the forward's wall time (CUDA events) of chunk
#      GDN B8 T4096 H16 K=V=128 and B1 T32768 H16, bf16, with h0 and the final state;
#   3. bench/profile_delta_rule.py (forward + backward per-kernel table) for B8 T4096 H16 K=V=128.
# Prints a compact table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 146 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== gdnfwd 1/3: chunked GPU tests"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  timeout -k 3 "$(cap 60)" "$tests" --gtest_filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*' \
    > "$OUT/extra/gdnfwd_tests.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/gdnfwd_tests.log" | cut -c1-300 | tail -60
  # stage 2 / 3 outputs of the GDN cases (v_new, h, final state, o) against the CPU references
  grep -E "v_new|final|[^a-z]o |o vs" "$OUT/extra/gdnfwd_tests.log" | grep -v Kda | cut -c1-200 | head -30
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/gdnfwd_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/gdnfwd_tests.log")
  summary+=("tests rc=$rc: $npass passed, $nfail failed lines")
  # End to end through the API again with stage 3 fused into stage 2 (FLASHGRAD_CHUNKED_FUSED_OUTPUT).
  FLASHGRAD_CHUNKED_FUSED_OUTPUT=1 timeout -k 3 "$(cap 25)" "$tests" --gtest_filter='DeltaRuleGpu.Chunked*' \
    > "$OUT/extra/gdnfwd_tests_fused.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  )" \
    "$OUT/extra/gdnfwd_tests_fused.log" | cut -c1-300 | tail -20
  summary+=("fused-output tests (DeltaRuleGpu.Chunked*) rc=$rc")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== gdnfwd 2/3: forward-only per-kernel times"
timeout -k 3 "$(cap 40)" python3 - > "$OUT/extra/gdnfwd_forward.log" 2>&1 <<'EOF'
import torch, torch.nn.functional as F
import flashgrad

import os

def case(B, T, H, K, reps=5, fused="0"):
    os.environ["FLASHGRAD_CHUNKED_FUSED_OUTPUT"] = fused  # read by the launcher at every call
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, H, K, device=dev, dtype=dt)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev)) / 4
    beta = torch.rand(B, T, H, device=dev).sigmoid().to(dt)
    h0 = torch.randn(B, H, K, K, device=dev) * 0.1
    fwd = lambda: flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                   output_final_state=True)
    fwd(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): fwd()
    e1.record(); torch.cuda.synchronize()
    wall = e0.elapsed_time(e1) / reps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps): fwd()
        torch.cuda.synchronize()
    per = {}
    for ev in prof.key_averages():
        name = ev.key
        for tag in ("chunk_prepare", "chunk_state_kernel", "chunk_output"):
            if tag in name:
                t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                per[tag] = per.get(tag, 0.0) + t / 1000.0 / reps
    row = f"GDN fwd B{B} T{T} H{H} K=V={K} fused={fused}: wall {wall:.3f} ms | " + " | ".join(
        f"{k} {v:.3f} ms" for k, v in per.items())
    # Agreement with the recurrent kernels at this size (the blocks the launcher picks here are
    # not the ones the small GPU tests get): relative RMS, bars o / ht 5e-3.
    o, ht = fwd()
    ro, rht = flashgrad.fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                         output_final_state=True)
    rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt())
    row += f" | vs recurrent: o {rel(o, ro):.2e} ht {rel(ht, rht):.2e}"
    print("ROW", row)

case(8, 4096, 16, 128)
case(8, 4096, 16, 128, fused="1")
case(1, 32768, 16, 128, reps=3)
case(1, 32768, 16, 128, reps=3, fused="1")
EOF
rc=$?
cat "$OUT/extra/gdnfwd_forward.log" | tail -20
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/gdnfwd_forward.log")
[ $rc -eq 0 ] || summary+=("forward timing rc=$rc")

echo "== gdnfwd 3/3: bench/profile_delta_rule.py (forward + backward)"
timeout -k 3 "$(cap 30)" python3 bench/profile_delta_rule.py --B 8 --T 4096 --H 16 --K 128 --reps 2 \
  > "$OUT/extra/gdnfwd_profile.log" 2>&1
rc=$?
grep -E "chunk_|Self CUDA|per-kernel" "$OUT/extra/gdnfwd_profile.log" | cut -c1-160 | head -16
summary+=("profile_delta_rule rc=$rc")

echo "== gdnfwd summary (commit $(git rev-parse --short HEAD 2>/dev/null))"
for s in "${summary[@]}"; do echo "  $s"; done
