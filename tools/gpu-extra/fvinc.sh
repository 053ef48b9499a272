#!/usr/bin/env bash
# fvinc (issue 6, lead, session 15): the wide rebuild's pass 2 with each chunk's products into fresh
# accumulators before h_c's store (kIncFirst, chunked_state_from_vnew_wide.cuh; the default in run 15.4's
# tree) against the store first (FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_INC=0, run 15.3's default):
#   1. the kept-path tests with =0 (gpu-check's suite runs the default);
#   2. per-kernel times and gradients at B8 T4096 and B1 T32768;
#   3. compute-sanitizer of a small kept case (default) with 3 segments x 2 sub-segments.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_INC
job_tests fvinc_tests_off 40 'DeltaRuleGpu.ChunkedKeptVNew*' $E=0
job_compare fvinc_b8 25 --kind gdn --shape 8,4096,16,128 --env $E --variants off=0,inc=- \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.3: 0.227 ms, store first)"
job_compare fvinc_t32k 25 --kind gdn --shape 1,32768,16,128 --env $E --variants off=0,inc=- \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.3: 0.141 + 0.228 ms, store first)"
job_sanitize fvinc 25 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' \
  FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS=3 FLASHGRAD_CHUNKED_FROM_VNEW_SUBSEGMENTS=2
job_summary fvinc
