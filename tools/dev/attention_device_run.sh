#!/usr/bin/env bash
# What one device call runs (binaries prebuilt by attention_build.sh, carried in build-cuda-attn/run):
# the GPU tests, compute-sanitizer memcheck and racecheck on small cases, then the benchmark.
# Logs and bench tables go to $OUT. Usage: tools/dev/attention_device_run.sh [tests|bench|fast|all] (fast: tests and bench, no sanitizers)
cd "$(dirname "$0")/../../build-cuda-attn/run"
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/device.txt
if [[ $what == tests || $what == all || $what == fast ]]; then
  timeout 240 ./attention_gpu_test > $OUT/test.log 2>&1; echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" $OUT/test.log | head -20
fi
if [[ $what == tests || $what == all ]]; then
  timeout 150 compute-sanitizer --tool memcheck ./attention_gpu_test \
    --gtest_filter='*OddLengths*:*Varlen*:*LseGradient*:*Deterministic*:*Packed*' > $OUT/memcheck.log 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | tail -3
  timeout 120 compute-sanitizer --tool racecheck ./attention_gpu_test \
    --gtest_filter='*Varlen*:*Softcap*' > $OUT/racecheck.log 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $OUT/racecheck.log | tail -3
fi
if [[ $what == bench || $what == all || $what == fast ]]; then
  timeout 200 ./attention_bench $OUT ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.log
fi
