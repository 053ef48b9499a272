#!/usr/bin/env bash
# bwdlag (issue 5): the wgmma backward's lagged-dQ schedule (FLASHGRAD_ATTN_BWD_LAGGED_DQ=1; see
# wgmma_backward_kernel.cuh) on the H200, after tools/gpu-check's build (cap 150 s):
#   1. every AttentionGpu.* case with the switch on, in its own process (a hang traps after the
#      mbarrier watchdog and fails this step only);
#   2. if they pass: bench/attention_vs_sdpa.py with the switch on (same process as cuDNN / FA2), to
#      set beside the default run's table in bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
[ -n "$tests" ] || { echo "bwdlag: no flashgrad_gpu_tests binary"; exit 1; }
echo "== bwdlag 1/2: AttentionGpu.* with FLASHGRAD_ATTN_BWD_LAGGED_DQ=1"
FLASHGRAD_ATTN_BWD_LAGGED_DQ=1 timeout -k 3 70 "$tests" --gtest_filter='AttentionGpu.*' > "$OUT/extra/bwdlag_tests.log" 2>&1
rc=$?
grep -E "Failure|Expected|Which is|error|^\[  (PASSED|FAILED|  FAILED  ) " "$OUT/extra/bwdlag_tests.log" | cut -c1-240 | tail -40
echo "tests rc=$rc"
if [ $rc = 0 ]; then
  echo "== bwdlag 2/2: attention bench with the switch on"
  FLASHGRAD_ATTN_BWD_LAGGED_DQ=1 timeout -k 3 70 python3 bench/attention_vs_sdpa.py --out "$OUT/extra/bwdlag_attention.md" \
    > "$OUT/extra/bwdlag_bench.log" 2>&1
  echo "bench rc=$?"
  cat "$OUT/extra/bwdlag_attention.md" 2>/dev/null || tail -20 "$OUT/extra/bwdlag_bench.log"
fi
exit $rc
