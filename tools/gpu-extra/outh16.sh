#!/usr/bin/env bash
# outh16 (issue 6, lead, session 17): the forward's unfused stages 2 and 3 with h_c in T and single
# products in stage 3 (FLASHGRAD_CHUNKED_OUTPUT_H16, the default since session 17) against fp32 h_c with
# hi + lo products (=0), where the forward runs them unfused: few long sequences, and K = V = 64.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
# (run with gpu-check --no-tests when device time is short: the delta-rule suites here, one process)
job_tests outh16_tests 170 'DeltaRule*'
job_compare outh16_t32k 25 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_OUTPUT_H16 --variants fp32=0,h16=- \
  --focus 'chunk_output|chunk_state_wgmma' --reps 5,1,1 --note "(run 17.3: output 0.425 ms)"
job_compare outh16_t16k 20 --kind gdn --shape 2,16384,16,128 --env FLASHGRAD_CHUNKED_OUTPUT_H16 --variants fp32=0,h16=- \
  --focus 'chunk_output|chunk_state_wgmma' --reps 5,1,1
job_compare outh16_k64 20 --kind gdn --shape 8,4096,16,64 --env FLASHGRAD_CHUNKED_OUTPUT_H16 --variants fp32=0,h16=- \
  --focus 'chunk_output|chunk_state' --reps 5,1,1 --note "(K=V=64: no fused forward, stage 3 unfused)"
job_summary outh16
