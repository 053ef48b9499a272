#!/usr/bin/env bash
# kdab2s (issue 6: the chunked KDA backward's B2 state kernel, session 11, helper kdab2s:
# kda_grads_state_kernel with FLASHGRAD_CHUNKED_KDA_B2=staged, chunked_kda_grads_state.cuh +
# chunked_kda_grads_state_product.cuh; docs/perf/delta_rule.md "KDA B2 state kernel, session 11
# (helper kdab2s)"). Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu
# and the package install (cap 150 s, budget 138 s; logs in $OUT/extra/):
#   1. the DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_B2=staged (every stage against
#      the CPU chunked reference, end to end against the CPU recurrence);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16, one process: the default B2 (split kernels), then =staged:
#      forward / backward wall, every kda_* kernel's CUDA time per call, and staged's gradients
#      against the default's (rel RMS);
#   2b. compute-sanitizer racecheck and memcheck of small KDA GPU cases with =staged;
#   3. ncu of one launch of the staged state kernel (occupancy, issue active, stalls, and the
#      warp-stall samples per phase from the SASS source page; the csv comes back gzipped) while
#      time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdab2s 1/3: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_B2=staged"
job_tests kdab2s_tests 40 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_B2=staged

echo "== kdab2s 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, default vs staged B2 (one process)"
job_compare kdab2s_compare 50 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_B2 \
  --variants split=-,staged=staged --focus 'kda_grads' --note "(fla backward ~4.2 ms)"

echo "== kdab2s 2b: compute-sanitizer racecheck / memcheck of small KDA cases with =staged"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
bin=$(find build-gpu -name flashgrad_gpu_tests -type f 2>/dev/null | head -1)
if [ -n "$san" ] && [ -n "$bin" ]; then
  for tool in racecheck memcheck; do
    filt='DeltaRuleChunkedKdaGpu.NoStatesNoNormF16'
    [ $tool = memcheck ] && filt='DeltaRuleChunkedKdaGpu.NoStatesNoNormF16:DeltaRuleChunkedKdaGpu.KeyNotValue'
    FLASHGRAD_CHUNKED_KDA_B2=staged timeout -k 3 "$(cap 25)" "$san" --tool $tool --error-exitcode 1 "$bin" \
      --gtest_filter="$filt" > "$OUT/extra/kdab2s_$tool.log" 2>&1
    rc=$?
    l="$tool (=staged, $filt) rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/extra/kdab2s_$tool.log" | tr '\n' ' ')"
    echo "$l"; summary+=("$l")
  done
else
  summary+=("sanitizer: skipped (no compute-sanitizer or no test binary)")
fi

echo "== kdab2s 3/3: ncu of the staged state kernel"
job_ncu kdab2s_ncu_state 40 'kda_grads_state_kernel' 1 FLASHGRAD_CHUNKED_KDA_B2=staged -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

job_summary kdab2s
