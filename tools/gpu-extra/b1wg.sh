#!/usr/bin/env bash
# b1wg (issue 6, lead, session 17): B1 on wgmma (chunked_state_backward_wgmma.cuh;
# FLASHGRAD_CHUNKED_B1_WGMMA=32 / 16 value columns per block, =0 the mma.sync kernels; since run 17.1 with
# B0's row scales of do) and stage 2 on wgmma (FLASHGRAD_CHUNKED_STATE_WGMMA, 64 / 32 / 16; the default
# with 32 columns where the mma.sync kernel would split channels, since run 17.1).
#   1. per-kernel times and gradients against the first variant: B1 at B1 T32768 H16, B2 T16384 (the local
#      B1 in channel quarters / halves) and B4 T8192 (halves); stage 2 at B1 T32768 and B4 T8192 (the
#      two-warp shape, not the wgmma default);
#   2. compute-sanitizer racecheck / memcheck of the small kept cases with both at 16 columns;
#   3. b1wg.py: deltabench's configuration, one process, settings interleaved;
#   4. ncu of the wgmma B1 at B1 T32768, if time is left.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_B1_WGMMA
job_compare b1wg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $E --variants mma=0,wg32=32,wg16=16 \
  --focus 'state_backward|dv_local' --reps 5,3,1 --note "(run 17.1: mma 1.408, wg32 without B0's row scales 1.562 ms)"
job_compare b1wg_t16k 25 --kind gdn --shape 2,16384,16,128 --env $E --variants mma=0,wg32=32,wg16=16 \
  --focus 'state_backward|dv_local' --reps 5,3,1 --note "(run 17.1: mma 0.797, wg32 0.727 ms)"
job_compare b1wg_t8k 25 --kind gdn --shape 4,8192,16,128 --env $E --variants mma=0,wg32=32,wg16=16 \
  --focus 'state_backward|dv_local' --reps 5,3,1
job_compare st_t32k 25 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_WGMMA \
  --variants mma=0,wg32=32,wg16=16 --focus 'chunk_state' --reps 5,3,1 --note "(run 16.4: mma 0.865, wg32 0.795 ms)"
job_compare st_t8k 25 --kind gdn --shape 4,8192,16,128 --env FLASHGRAD_CHUNKED_STATE_WGMMA \
  --variants default=-,wg32=32,wg16=16 --focus 'chunk_state' --reps 5,3,1
job_sanitize b1wg 35 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' $E=16 \
  FLASHGRAD_CHUNKED_STATE_WGMMA=16 FLASHGRAD_CHUNKED_DVNEW_IN_W=0
timeout -k 3 "$(cap 80)" python3 tools/gpu-extra/b1wg.py > "$OUT/extra/b1wg_ab.log" 2>&1
grep "^ROW" "$OUT/extra/b1wg_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/b1wg_ab.log")
JOB_NCU_SKIP=0 job_ncu b1wg_ncu_t32k 40 'chunk_state_backward_wgmma_kernel' 0 $E=16 -- --kind gdn --B 1 --T 32768 --H 16 --K 128
job_summary b1wg
