#!/usr/bin/env bash
# GPU job of the wgmma forward (tools/gpu-check runs it on the H200 after building build-gpu; cap
# 150 s): the focused tests (wgmma vs legacy vs CPU reference), a forward timing of the anchors.md
# rows (new vs legacy kernel, ratio to cuDNN's anchor), then the general attention GPU tests with
# whatever time is left (they run with the wgmma kernel as the default forward).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 145 - ($(date +%s) - t0) )); }
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
status=()

if [ -n "$tests" ]; then
  timeout -k 3 60 "$tests" --gtest_filter='AttentionWgmma*' > "$OUT/extra/wgmma_tests.log" 2>&1
  rc=$?
  grep -E "^  case|max\||Failure|Expected|Which is|^\[  (PASSED|FAILED|  OK  |  FAILED  )" "$OUT/extra/wgmma_tests.log" | tail -120
  status+=("AttentionWgmma* rc=$rc")
else
  status+=("no flashgrad_gpu_tests binary")
fi

if [ -n "$lib" ] && [ "$(left)" -gt 30 ]; then
  bin=/tmp/wgmma_bench
  if nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/attention/wgmma_bench.cu "$lib" \
       -o "$bin" -lpthread > "$OUT/extra/wgmma_bench_build.log" 2>&1; then
    timeout -k 3 $(( $(left) > 60 ? 60 : $(left) )) "$bin" | tee "$OUT/extra/wgmma_bench.md"
    status+=("bench rc=${PIPESTATUS[0]}")
  else
    tail -20 "$OUT/extra/wgmma_bench_build.log"
    status+=("bench build FAILED")
  fi
else
  status+=("bench skipped (lib: ${lib:-none}, $(left) s left)")
fi

if [ -n "$tests" ] && [ "$(left)" -gt 10 ]; then
  timeout -k 3 "$(left)" "$tests" --gtest_filter='AttentionGpu*' > "$OUT/extra/wgmma_attention_gpu.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/extra/wgmma_attention_gpu.log" | tail -20
  status+=("AttentionGpu* rc=$rc")
fi
echo "wgmma summary: ${status[*]}"
