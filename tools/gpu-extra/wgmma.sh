#!/usr/bin/env bash
# GPU job of the wgmma forward (tools/gpu-check runs it on the H200 after building build-gpu; cap
# 150 s), in order of what it tells:
#   1. AttentionWgmma.*: wgmma vs legacy vs CPU reference (2x rule), the default variant;
#   2. AttentionWgmmaVariants.*: the same for the ping-pong and persistent variants (environment
#      switches), with its own cap (a named-barrier hang cannot eat the rest);
#   3. forward timing of the anchors.md rows: wgmma, its variants (only if 2 passed), legacy, ratio
#      to cuDNN's anchor (bench/attention/wgmma_bench.cu, built here against build-gpu's
#      libflashgrad.a);
#   4. AttentionGpu* (the general suite, forward now on wgmma) with the time left.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 145 - ($(date +%s) - t0) )); }
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
status=()
show() { grep -E "^  case|max\||Failure|Expected|Which is|error|trap|^\[  (PASSED|FAILED|  OK  |  FAILED  |  SKIPPED )" "$1" | tail -${2:-80}; }

pp_ok=0
if [ -n "$tests" ]; then
  timeout -k 3 50 "$tests" --gtest_filter='AttentionWgmma.*' > "$OUT/extra/wgmma_tests.log" 2>&1
  rc=$?
  show "$OUT/extra/wgmma_tests.log" 110
  status+=("AttentionWgmma.* rc=$rc")
  FLASHGRAD_TEST_WGMMA_VARIANTS=1 timeout -k 3 30 "$tests" --gtest_filter='AttentionWgmmaVariants.*' \
    > "$OUT/extra/wgmma_variants_tests.log" 2>&1
  rc=$?
  show "$OUT/extra/wgmma_variants_tests.log" 60
  status+=("AttentionWgmmaVariants.* rc=$rc")
  [ $rc = 0 ] && pp_ok=1
else
  status+=("no flashgrad_gpu_tests binary")
fi

if [ -n "$lib" ] && [ "$(left)" -gt 25 ]; then
  bin=/tmp/wgmma_bench
  if nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/attention/wgmma_bench.cu "$lib" \
       -o "$bin" -lpthread > "$OUT/extra/wgmma_bench_build.log" 2>&1; then
    flags=(); [ $pp_ok = 1 ] || flags+=(--no-variants)
    cap=$(left); [ "$cap" -gt 45 ] && cap=45
    timeout -k 3 "$cap" "$bin" "${flags[@]}" | tee "$OUT/extra/wgmma_bench.md"
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
