#!/usr/bin/env bash
# wgs2 (issue 6, lead, session 18): the wgmma chains (B1, stage 2) with two warpgroups splitting K = 128's
# key channels (FLASHGRAD_CHUNKED_B1_WGMMA_WGS / FLASHGRAD_CHUNKED_STATE_WGMMA_WGS = 2) against one.
#   1. the GPU tests of both (every K = 128 chunked length and feature case, both widths, kept v_new and not);
#   2. per-kernel times and gradients against one warpgroup: B1 and stage 2 at B1 T32768 H16 (16 columns),
#      B2 T16384 and B4 T8192 (32 columns);
#   3. compute-sanitizer racecheck / memcheck of the small kept cases with both at two warpgroups;
#   4. wgs2.py: deltabench's configuration, one process, settings interleaved.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
job_tests wgs2_tests 70 'DeltaRuleGpu.Chunked*TwoWarpgroups'
B1=FLASHGRAD_CHUNKED_B1_WGMMA_WGS ST=FLASHGRAD_CHUNKED_STATE_WGMMA_WGS
job_compare b1_t32k 25 --kind gdn --shape 1,32768,16,128 --env $B1 --variants one=1,two=2 \
  --focus 'state_backward|chunk_state_wgmma' --reps 5,3,1 --note "(run 17.2: B1 0.787 ms at 16 columns)"
job_compare st_t32k 20 --kind gdn --shape 1,32768,16,128 --env $ST --variants one=1,two=2 \
  --focus 'chunk_state' --reps 5,3,1 --note "(run 17.2: stage 2 0.623 ms at 16 columns)"
job_compare b1_t16k 20 --kind gdn --shape 2,16384,16,128 --env $B1 --variants one=1,two=2 \
  --focus 'state_backward|chunk_state_wgmma' --reps 5,3,1 --note "(run 17.2: B1 0.578 ms at 32 columns)"
job_compare st_t16k 20 --kind gdn --shape 2,16384,16,128 --env $ST --variants one=1,two=2 --focus 'chunk_state' --reps 5,3,1
job_sanitize wgs2 35 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' $B1=2 $ST=2 \
  FLASHGRAD_CHUNKED_B1_WGMMA=16 FLASHGRAD_CHUNKED_STATE_WGMMA=16 FLASHGRAD_CHUNKED_DVNEW_IN_W=0
timeout -k 3 "$(cap 70)" python3 tools/gpu-extra/wgs2.py > "$OUT/extra/wgs2_ab.log" 2>&1
grep "^ROW" "$OUT/extra/wgs2_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/wgs2_ab.log")
job_summary wgs2
