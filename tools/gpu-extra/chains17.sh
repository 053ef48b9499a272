#!/usr/bin/env bash
# chains17 (issue 6, lead, session 17): the chains kernel (stage 2 again and B1 in one launch,
# chunked_state_chains.cuh), off by default since session 17, against the wgmma stage 2 and B1 run apart,
# on the path that reaches it (no kept v_new: FLASHGRAD_KEEP_V_NEW=0), B1 T32768 H16 K=V=128; and the new
# defaults against the mma.sync kernels (both wgmma settings 0) with the kept v_new, at B1 T32768.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
FLASHGRAD_KEEP_V_NEW=0 job_compare chains17_t32k 40 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_CHAINS \
  --variants chains=1,default=- --focus 'chunk_state|dv_local' --reps 5,3,1 --note "(run 11.1: chains 2.499 ms)"
job_summary chains17
