#!/usr/bin/env bash
# fp8k (FP8 attention kernels): the AttentionFp8* GPU tests, then fp8 vs bf16 TFLOP/s for
# B2 H16 S8192, head dims 128 / 256, causal and not (bench/attention/fp8_bench.cu, built here
# against build-gpu's libflashgrad.a). Runs from the repo root after tools/gpu-check's build.
set -u
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
echo "== fp8k: AttentionFp8* GPU tests"
if [ -n "$tests" ]; then
  timeout 75 "$tests" --gtest_filter='AttentionFp8*' > /tmp/fp8k_tests.log 2>&1
  echo "rc $?"
  grep -E "^\s+case |rel RMS|mantissa|Failure|Expected|Which is|error|^\[  (PASSED|FAILED|  OK|  FAILED) " /tmp/fp8k_tests.log | head -200
else
  echo "no flashgrad_gpu_tests binary under build-gpu"
fi
echo "== fp8k: fp8 vs bf16 bench"
if [ -n "$lib" ] && nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
    bench/attention/fp8_bench.cu "$lib" -lcudart -o /tmp/fp8k_bench 2>/tmp/fp8k_bench_build.log; then
  FLASHGRAD_ATTN_FP8_FORWARD=mma FLASHGRAD_ATTN_FP8_BACKWARD=mma timeout 55 /tmp/fp8k_bench  # the mma.sync FP8 kernels (fp8w.sh / fp8b.sh time the wgmma ones)
else
  echo "bench build failed (lib: ${lib:-none})"; tail -20 /tmp/fp8k_bench_build.log
fi
