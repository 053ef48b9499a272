#!/usr/bin/env bash
# fvwide (issue 6, lead, session 15): the chunk states rebuilt from v_new by the wide kernels
# (chunked_state_from_vnew_wide.cuh: each warp 16 value columns x all K channels, pass 1 as one
# product per sub-segment; the default, FLASHGRAD_CHUNKED_FROM_VNEW=chain gives the chain kernel of
# sessions 13-14). Run 15.2: pass 2 with 3 / 4 / 5 stages (FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_STAGES).
#   1. the kept-path tests with 5 and 4 stages (C++ ChunkedKeptVNew* incl. RebuildShapes); pytest
#      keep_v_new and the JAX chunked test with 3 segments x 2 sub-segments forced;
#   2. per-kernel times and gradients, 3 / 4 / 5 stages, at B8 T4096 and B1 T32768;
#   3. fvwide.py: kept chain / kept wide at 3, 4, 5 stages in deltabench's configuration, one process;
#   4. compute-sanitizer of a small kept case with 5 stages and 3 segments x 2 sub-segments;
#   5. if time is left: ncu of B2's two kernels at B8 T4096 (where the backward's time is now).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
FV=FLASHGRAD_CHUNKED_FROM_VNEW
KEPT='DeltaRuleGpu.ChunkedKeptVNew*'
job_tests fvwide_tests_s5 40 "$KEPT" ${FV}_WIDE_STAGES=5
job_tests fvwide_tests_s4 40 "$KEPT" ${FV}_WIDE_STAGES=4
env ${FV}_SEGMENTS=3 ${FV}_SUBSEGMENTS=2 timeout -k 3 "$(cap 40)" \
  python3 -m pytest -q -m gpu tests/python/test_torch_delta_rule.py tests/python/test_jax.py \
  -k "keep_v_new or chunked_delta_rule" -p no:cacheprovider > "$OUT/extra/fvwide_pytest.log" 2>&1
l="pytest (3 segments x 2) -k 'keep_v_new or chunked_delta_rule' rc=$?: $(tail -1 "$OUT/extra/fvwide_pytest.log")"
echo "$l"; summary+=("$l")
job_compare fvwide_stages_b8 30 --kind gdn --shape 8,4096,16,128 --env ${FV}_WIDE_STAGES --variants s3=-,s4=4,s5=5 \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.1: 0.219 ms, 3 stages)"
job_compare fvwide_stages_t32k 30 --kind gdn --shape 1,32768,16,128 --env ${FV}_WIDE_STAGES --variants s3=-,s4=4,s5=5 \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.1: 2 x 0.195 ms, 3 stages)"
timeout -k 3 "$(cap 80)" python3 tools/gpu-extra/fvwide.py > "$OUT/extra/fvwide_ab.log" 2>&1
grep "^ROW" "$OUT/extra/fvwide_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/fvwide_ab.log")
job_sanitize fvwide 25 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' \
  ${FV}_WIDE_STAGES=5 ${FV}_SEGMENTS=3 ${FV}_SUBSEGMENTS=2
JOB_NCU_SKIP=0 job_ncu fvwide_ncu_b2local 40 'chunk_grads_local_kernel' 0 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
JOB_NCU_SKIP=0 job_ncu fvwide_ncu_b2state 40 'chunk_grads_state' 0 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
job_summary fvwide
