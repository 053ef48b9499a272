#!/usr/bin/env bash
# quarters (issue 6, lead, session 10): stage 2 and the local B1 with their key channels in four parts
# (FLASHGRAD_CHUNKED_STATE_KSPLIT=4, FLASHGRAD_CHUNKED_B1_KSPLIT=4; chunked_channel_split.cuh) against
# the halves (the default for few chains). Runs on the H200 from the repo root after tools/gpu-check's
# build into build-gpu (cap 150 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with both set to 4;
#   2. one process per (shape, variable), chunk GDN bf16 K=V=128, B1 T32768 H16 and B2 T16384 H16:
#      halves (unset) against quarters (=4): wall ms, per-kernel times, gradients of quarters vs halves.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== quarters 1/2: chunked GDN GPU tests with the quarter splits"
job_tests quarters_tests 40 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' \
  FLASHGRAD_CHUNKED_STATE_KSPLIT=4 FLASHGRAD_CHUNKED_B1_KSPLIT=4

echo "== quarters 2/2: halves vs quarters, one process per shape and variable"
for shape in 1,32768,16,128 2,16384,16,128; do
  for var in FLASHGRAD_CHUNKED_STATE_KSPLIT FLASHGRAD_CHUNKED_B1_KSPLIT; do
    job_compare "quarters_${var##*_CHUNKED_}_${shape//,/_}" 25 --kind gdn --shape "$shape" --env "$var" \
      --variants halves=-,quarters=4 --focus 'state_backward|chunk_state_kernel' --reps 5,5,2
  done
done

job_summary quarters
