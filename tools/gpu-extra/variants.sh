#!/usr/bin/env bash
# variants (issue 6, lead, session 10's final run). Cap 150 s; logs in $OUT/extra/.
#   1. the chunked GDN GPU tests with the non-default B1 shapes, which the default tests (small cases:
#      B1 in channel quarters at K = 128) no longer take: FLASHGRAD_CHUNKED_B1_KSPLIT=2 (halves) and =0;
#   2. the same tests with the opt-in overlap of the backward's stage 2 and B1
#      (FLASHGRAD_CHUNKED_BWD_OVERLAP=1: a side stream, dh in its own buffer);
#   3. chunk GDN bf16 K=V=128 B1 T32768 H16 and B2 T16384 H16, one process each: overlap off / on
#      (wall ms, per-kernel times, peak memory, gradients on vs off).
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh
filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'
job_tests variants_b1_halves 30 "$filter" FLASHGRAD_CHUNKED_B1_KSPLIT=2
job_tests variants_b1_unsplit 30 "$filter" FLASHGRAD_CHUNKED_B1_KSPLIT=0
job_tests variants_overlap 30 "$filter" FLASHGRAD_CHUNKED_BWD_OVERLAP=1
for shape in 1,32768,16,128 2,16384,16,128; do
  job_compare "variants_overlap_${shape//,/_}" 25 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_BWD_OVERLAP \
    --variants serial=-,overlap=1 --focus 'state_backward|chunk_state_kernel' --reps 5,5,2
done
job_summary variants
