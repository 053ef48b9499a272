#!/usr/bin/env bash
# keepvnew (issue 6, lead, session 13): the chunked forward keeps v_new (saved_v_new; the PyTorch
# functions ask for it with FLASHGRAD_KEEP_V_NEW=1) and the backward rebuilds the chunk states from it
# (chunked_state_from_vnew.cuh) instead of re-running stage 2 (docs/perf/delta_rule.md, "Session 13").
# Runs on the H200 from the repo root after tools/gpu-check's build (cap from gpu-check):
#   1. the C++ GPU tests of the kept path (DeltaRuleGpu.ChunkedKeptVNew*: every length of the
#      issue, GVA, f16 / bf16, K 64 / 128, the plain rule, varlen; PastTwoToThe31Elements now runs it
#      too) and the Python ones (test_gpu_keep_v_new_matches_cpu_reference, FLASHGRAD_KEEP_V_NEW=1);
#   2. chunk GDN B8 T4096 and B1 T32768 H16 K=V=128 bf16: FLASHGRAD_KEEP_V_NEW 0 vs 1 in one process
#      each (forward / backward wall, per-kernel times, gradients of 1 against 0);
#   3. compute-sanitizer memcheck / racecheck of a small kept case.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
K=FLASHGRAD_KEEP_V_NEW

echo "== keepvnew 1/3: GPU tests of the kept path"
job_tests keepvnew_tests 45 'DeltaRuleGpu.ChunkedKeptVNew*:DeltaRuleGpu.PastTwoToThe31Elements'
timeout -k 3 "$(cap 40)" python3 -m pytest -q -m gpu tests/python/test_torch_delta_rule.py -k keep_v_new \
  -p no:cacheprovider > "$OUT/extra/keepvnew_pytest.log" 2>&1
rc=$?
l="pytest -k keep_v_new rc=$rc: $(tail -1 "$OUT/extra/keepvnew_pytest.log")"
echo "$l"; summary+=("$l")

echo "== keepvnew 2/3: timing, $K 0 vs 1 (one process each)"
job_compare keepvnew_b8 35 --kind gdn --shape 8,4096,16,128 --env $K --variants recompute=0,kept=1 \
  --focus 'chunk_state' --reps 5,5,2 --note "(run 12.3: backward 2.974, fla 2.736)"
job_compare keepvnew_t32k 40 --kind gdn --shape 1,32768,16,128 --env $K --variants recompute=0,kept=1 \
  --focus 'chunk_state' --reps 3,3,1 --note "(run 12.3: backward 4.055, fla 4.716)"

echo "== keepvnew 3/3: compute-sanitizer of a small kept case"
job_sanitize keepvnew 30 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches'

job_summary keepvnew
