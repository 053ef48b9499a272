#!/usr/bin/env bash
# fwdsched (issue 5): why the B8 H16 S2048 D128 causal forward moves between runs (280-379 TFLOP/s,
# FA2 282), and whether the persistent or ping-pong wgmma forward is the better default:
#   1. AttentionWgmma* with the variants on (FLASHGRAD_TEST_WGMMA_VARIANTS=1): correctness first;
#   2. bench/attention_fwd_variants.py: per row, the forward with grad-requiring inputs, without,
#      replayed from a CUDA graph (GPU time alone), persistent, ping-pong, beside FA2 and cuDNN.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
rc=0
if [ -n "$tests" ]; then
  FLASHGRAD_TEST_WGMMA_VARIANTS=1 timeout -k 3 40 "$tests" --gtest_filter='AttentionWgmmaVariants.*' \
    > "$OUT/extra/fwdsched_tests.log" 2>&1
  rc=$?
  grep -E "Failure|^\[  (PASSED|FAILED|  FAILED  ) " "$OUT/extra/fwdsched_tests.log" | tail -10
  echo "variant tests rc=$rc"
fi
timeout -k 3 100 python3 bench/attention_fwd_variants.py --out "$OUT/extra/fwd_variants.md" > "$OUT/extra/fwdsched.log" 2>&1
echo "bench rc=$?"
cat "$OUT/extra/fwd_variants.md" 2>/dev/null || tail -20 "$OUT/extra/fwdsched.log"
exit $rc
