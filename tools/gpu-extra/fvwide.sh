#!/usr/bin/env bash
# fvwide (issue 6, lead, session 15): the chunk states rebuilt from v_new by the wide kernels
# (chunked_state_from_vnew_wide.cuh: each warp 16 value columns x all K channels, pass 1 as one
# product per sub-segment; the default since run 15.1, FLASHGRAD_CHUNKED_FROM_VNEW=chain gives the
# chain kernel of sessions 13-14). (Run 15.2 also timed pass 2 at 4 / 5 stages: no faster, retired.)
#   1. pytest keep_v_new and the JAX chunked test with 3 segments x 2 sub-segments forced (the C++ kept
#      tests, with ChunkedKeptVNewRebuildShapes, run in gpu-check's suite);
#   2. per-kernel times and gradients, chain vs wide, at B1 T32768 and B8 T4096;
#   3. fvwide.py: off / kept chain / kept wide in deltabench's configuration, one process;
#   4. compute-sanitizer of a small kept case with 3 segments x 2 sub-segments;
#   5. if time is left: ncu of the wide pass 2 at B8 T4096 with stall samples by SASS line.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
FV=FLASHGRAD_CHUNKED_FROM_VNEW
env ${FV}_SEGMENTS=3 ${FV}_SUBSEGMENTS=2 timeout -k 3 "$(cap 40)" \
  python3 -m pytest -q -m gpu tests/python/test_torch_delta_rule.py tests/python/test_jax.py \
  -k "keep_v_new or chunked_delta_rule" -p no:cacheprovider > "$OUT/extra/fvwide_pytest.log" 2>&1
l="pytest (3 segments x 2) -k 'keep_v_new or chunked_delta_rule' rc=$?: $(tail -1 "$OUT/extra/fvwide_pytest.log")"
echo "$l"; summary+=("$l")
job_compare fvwide_t32k 30 --kind gdn --shape 1,32768,16,128 --env $FV --variants chain=chain,wide=wide \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 14.4: chain 0.280 ms per pass, 2 passes)"
job_compare fvwide_b8 30 --kind gdn --shape 8,4096,16,128 --env $FV --variants chain=chain,wide=wide \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 14.4: chain 0.311 ms, one pass)"
timeout -k 3 "$(cap 70)" python3 tools/gpu-extra/fvwide.py > "$OUT/extra/fvwide_ab.log" 2>&1
grep "^ROW" "$OUT/extra/fvwide_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/fvwide_ab.log")
job_sanitize fvwide 25 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' \
  ${FV}_SEGMENTS=3 ${FV}_SUBSEGMENTS=2
JOB_NCU_SKIP=1 job_ncu fvwide_ncu_b8 50 'chunk_state_from_vnew_wide_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
job_summary fvwide
