#!/usr/bin/env bash
# b1wg (issue 6, lead, session 17): B1 on wgmma (chunked_state_backward_wgmma.cuh;
# FLASHGRAD_CHUNKED_B1_WGMMA=32 / 64 value columns per block, =0 the mma.sync kernels) and the default
# rule of the wgmma stage 2 (FLASHGRAD_CHUNKED_STATE_WGMMA, session 16).
#   1. per-kernel times and gradients against the first variant: B1 at B1 T32768 H16 and B2 T16384
#      (the local B1 in channel quarters / halves), then B8 T4096 K=V=128 and K=V=64 with the local B1
#      forced (FLASHGRAD_CHUNKED_B1_LOCAL=1, dv_new out of w's region) against the same mma.sync kernel;
#   2. stage 2 wgmma on / off at B2 T16384 (the edge of the channel-split shape);
#   3. compute-sanitizer racecheck / memcheck of the small kept cases with the wgmma B1;
#   4. b1wg.py: deltabench's configuration, one process, settings interleaved;
#   5. ncu of the wgmma B1 at B1 T32768 (32 columns), if time is left.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_B1_WGMMA
job_compare b1wg_t32k 35 --kind gdn --shape 1,32768,16,128 --env $E --variants mma=0,wg32=32,wg64=64 \
  --focus 'state_backward|dv_local' --reps 5,3,1 --note "(run 16.4: B1 1.385 ms)"
job_compare b1wg_t16k 30 --kind gdn --shape 2,16384,16,128 --env $E --variants mma=0,wg32=32,wg64=64 \
  --focus 'state_backward|dv_local' --reps 5,3,1
FLASHGRAD_CHUNKED_B1_LOCAL=1 FLASHGRAD_CHUNKED_DVNEW_IN_W=0 \
  job_compare b1wg_b8 30 --kind gdn --shape 8,4096,16,128 --env $E --variants mma=0,wg32=32,wg64=64 \
  --focus 'state_backward|dv_local' --reps 5,3,1 --note "(local B1 forced; the default runs 8 warps, ~0.57 ms)"
FLASHGRAD_CHUNKED_B1_LOCAL=1 FLASHGRAD_CHUNKED_DVNEW_IN_W=0 \
  job_compare b1wg_k64 25 --kind gdn --shape 8,4096,16,64 --env $E --variants mma=0,wg32=32,wg64=64 \
  --focus 'state_backward|dv_local' --reps 5,3,1 --note "(local B1 forced)"
job_compare b1wg_st16k 25 --kind gdn --shape 2,16384,16,128 --env FLASHGRAD_CHUNKED_STATE_WGMMA --variants mma=0,wg32=32 \
  --focus 'chunk_state' --reps 5,3,1
job_sanitize b1wg 35 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' $E=32 \
  FLASHGRAD_CHUNKED_DVNEW_IN_W=0
timeout -k 3 "$(cap 60)" python3 tools/gpu-extra/b1wg.py > "$OUT/extra/b1wg_ab.log" 2>&1
grep "^ROW" "$OUT/extra/b1wg_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/b1wg_ab.log")
JOB_NCU_SKIP=0 job_ncu b1wg_ncu_t32k 40 'chunk_state_backward_wgmma_kernel' 0 $E=32 -- --kind gdn --B 1 --T 32768 --H 16 --K 128
job_summary b1wg
