#!/usr/bin/env bash
# gdnbwd (issue 6: speed of the chunked GDN backward; docs/perf/delta_rule.md "Backward stages, session 4").
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, aims at < 60 s; $OUT/extra/ collects the logs):
#   1. the chunked GPU tests (DeltaRuleChunked*, DeltaRuleGpu.Chunked*) with the new backward stages
#      (B1 transposed, B2 on ldmatrix bf16 fragments: FLASHGRAD_CHUNKED_BACKWARD=new, FLASHGRAD_CHUNKED_B2=mma);
#   2. chunk GDN B8 T4096, B5 T2048 and B1 T32768, H16 K=V=128 bf16 (8 / 4 / 2-warp B1 blocks), in one
#      process: the backward's wall time with the legacy stages, with the session-4 B2 (8-warp TF32,
#      FLASHGRAD_CHUNKED_B2=v8) and with the session-5 B2 (mma); the mma gradients against both (rel RMS);
#   3. bench/profile_delta_rule.py (forward + backward per-kernel table) with B2 v8 and B2 mma;
#   4. if >= 40 s are left: ncu (speed of light, memory, warp stalls, pipes) of one launch of the new B2.
#      Prints a compact table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 146 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== gdnbwd 1/3: chunked GPU tests with the new backward"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  FLASHGRAD_CHUNKED_BACKWARD=new FLASHGRAD_CHUNKED_B2=mma timeout -k 3 "$(cap 45)" "$tests" \
    --gtest_filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*' > "$OUT/extra/gdnbwd_tests.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/gdnbwd_tests.log" | cut -c1-300 | tail -40
  # backward outputs (dh, dv_new, dq, dk, dv, dbeta, dg, dh0) of the GDN cases
  grep -E "dh|dv_new|dq|dk|dbeta|dg" "$OUT/extra/gdnbwd_tests.log" | grep -v Kda | cut -c1-200 | head -24
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/gdnbwd_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/gdnbwd_tests.log")
  summary+=("tests (new backward) rc=$rc: $npass ok, $nfail failed lines")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== gdnbwd 2/3: legacy / new with B2 v8 / new with B2 mma at B8 T4096, B5 T2048, B1 T32768 (H16 K=V=128)"
timeout -k 3 "$(cap 50)" python3 - > "$OUT/extra/gdnbwd_compare.log" 2>&1 <<'EOF'
import os, torch, torch.nn.functional as F
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
    o, ht = flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                             output_final_state=True)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    ins = (q, k, v, g, beta, h0)
    def grads(which, reps, b2="mma"):
        os.environ["FLASHGRAD_CHUNKED_BACKWARD"] = which  # read by the launchers at every call
        os.environ["FLASHGRAD_CHUNKED_B2"] = b2
        gs = torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps): torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
        e1.record(); torch.cuda.synchronize()
        return gs, e0.elapsed_time(e1) / reps
    gl, tl = grads("legacy", 2)
    g8, t8 = grads("new", 2, "v8")
    gn, tn = grads("new", 3, "mma")
    rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt())
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    tag = f"B{B} T{T} H{H} K=V={K}"
    print(f"ROW {tag} bwd wall (incl. recomputed fwd stages): legacy {tl:.3f} ms, new+B2 v8 {t8:.3f} ms, "
          f"new+B2 mma {tn:.3f} ms")
    print(f"ROW {tag} mma vs legacy rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, gl))
          + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gn)))
    print(f"ROW {tag} mma vs v8 rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, g8)))

case(8, 4096)   # 128 chains: 8-warp B1 blocks
case(5, 2048)   # 80 chains: 4-warp B1 blocks
case(1, 32768)  # 16 chains: 2-warp B1 blocks
EOF
rc=$?
tail -12 "$OUT/extra/gdnbwd_compare.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/gdnbwd_compare.log")
[ $rc -eq 0 ] || summary+=("compare rc=$rc")

echo "== gdnbwd 3/3: bench/profile_delta_rule.py, new backward with B2 v8 then B2 mma"
for which in v8 mma; do
  FLASHGRAD_CHUNKED_BACKWARD=new FLASHGRAD_CHUNKED_B2=$which timeout -k 3 "$(cap 30)" python3 bench/profile_delta_rule.py \
    --B 8 --T 4096 --H 16 --K 128 --reps 2 > "$OUT/extra/gdnbwd_profile_$which.log" 2>&1
  rc=$?
  echo "-- $which (rc=$rc)"
  grep -E "chunk_|Self CUDA time total" "$OUT/extra/gdnbwd_profile_$which.log" | cut -c1-160 | head -10
  # compact: every chunk_* kernel with its Self CUDA time per step
  while IFS= read -r l; do summary+=("$which: $l"); done < <(
    python3 tools/gpu-extra/gdnbwd_profile_ms.py "$OUT/extra/gdnbwd_profile_$which.log" 2)
done

echo "== gdnbwd 4/4: ncu of one chunk_grads_mma_kernel launch (B8 T4096 H16 K=V=128), if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  # (the metric regexes of tools/gpu-extra/ncu.sh, known to work there)
  metrics='regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  FLASHGRAD_CHUNKED_BACKWARD=new FLASHGRAD_CHUNKED_B2=mma timeout -k 3 "$(( $(left) - 5 ))" "$ncu_bin" --clock-control none \
    -k regex:chunk_grads_mma --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --metrics "$metrics" \
    python3 bench/profile_delta_rule.py --B 8 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$OUT/extra/gdnbwd_ncu_b2.txt" 2>&1
  echo "rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|pipe_|issue_stalled|issue_active|Shared" \
    "$OUT/extra/gdnbwd_ncu_b2.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -40
  d=$(grep -E "^ +Duration" "$OUT/extra/gdnbwd_ncu_b2.txt" | head -1 | awk '{print $(NF-1), $NF}')
  summary+=("ncu chunk_grads_mma_kernel: duration ${d:-?} (details: extra/gdnbwd_ncu_b2.txt)")
else
  summary+=("ncu: skipped (no ncu or < 40 s left)")
fi

echo "== gdnbwd summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
