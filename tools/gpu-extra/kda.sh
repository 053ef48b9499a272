#!/usr/bin/env bash
# GPU job of the chunked KDA stages (tools/gpu-check runs it on the H200 after building build-gpu;
# cap 150 s): the DeltaRuleChunkedKda* GPU tests (every stage against the CPU chunked reference,
# end to end against the CPU recurrence; tests/cpp/delta_rule_chunked_kda_gpu_test.cu), then, with
# the time left, the per-stage timing of chunk KDA B4 T4096 H16 K=V=128 (bench/delta_rule/
# kda_chunked_bench.cu, built here against build-gpu's libflashgrad.a).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 145 - ($(date +%s) - t0) )); }
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
status=()

echo "== kda: DeltaRuleChunkedKda* GPU tests"
if [ -n "$tests" ]; then
  timeout -k 3 110 "$tests" --gtest_filter='DeltaRuleChunkedKda*' > "$OUT/extra/kda_tests.log" 2>&1
  rc=$?
  # Failures, the end-to-end numbers (vs CPU) and the gtest verdicts; every stage's numbers are in the log.
  grep -E "vs CPU|Failure|Expected|Which is|error|^\[  (PASSED|FAILED|  OK  |  FAILED  |  SKIPPED )" \
    "$OUT/extra/kda_tests.log" | sed -E 's/ \(bar [^)]*\)//' | tail -150
  echo "-- per-case worst ratios to the bar (rel_rms / bar):"
  awk '/rel_rms/ { for (i = 1; i <= NF; ++i) if ($i == "rel_rms") { v = $(i+1); b = $(i+3); sub(/,/, "", b);
       r = v / b; if (r > worst) { worst = r; line = $0 } } } END { printf "worst %.3f: %s\n", worst, line }' \
    "$OUT/extra/kda_tests.log"
  grep -cE "rel_rms" "$OUT/extra/kda_tests.log" | sed 's/^/comparisons: /'
  status+=("DeltaRuleChunkedKda* rc=$rc")
else
  status+=("no flashgrad_gpu_tests binary")
fi

if [ -f bench/delta_rule/kda_chunked_bench.cu ] && [ -n "$lib" ] && [ "$(left)" -gt 25 ]; then
  bin=/tmp/kda_chunked_bench
  if nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc bench/delta_rule/kda_chunked_bench.cu \
       "$lib" -o "$bin" -lpthread > "$OUT/extra/kda_bench_build.log" 2>&1; then
    cap=$(left); [ "$cap" -gt 30 ] && cap=30
    timeout -k 3 "$cap" "$bin" | tee "$OUT/extra/kda_bench.txt"
    status+=("bench rc=${PIPESTATUS[0]}")
  else
    tail -20 "$OUT/extra/kda_bench_build.log"
    status+=("bench build FAILED")
  fi
fi
echo "kda summary: ${status[*]}"
