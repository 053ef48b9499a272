#!/usr/bin/env bash
# chains (issue 6, lead, session 11): the backward's stage-2 recomputation beside B1 in one launch
# (chunked_state_chains.cuh; state_chains_wanted in chunked_stages.h; the default since run 11.1, its
# stage 2 single-fragment since run 11.2), and stage 2's own kernel with single-fragment products
# (FLASHGRAD_CHUNKED_STATE_PRODUCTS=single, an experiment). Runs on the H200 from the repo root after
# tools/gpu-check's build into build-gpu (cap 150 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with FLASHGRAD_CHUNKED_STATE_PRODUCTS=single;
#   2. chunk GDN bf16, one process per shape: B1 T32768 H16 K=V=128 chains off / exact (hi + lo) /
#      default (single); stage 2's products hi + lo / single at B1 T32768 (the forward's stage 2),
#      B8 T4096 K=V=128 (the backward's recomputation) and B8 T4096 K=V=64 (both): per-kernel times,
#      wall ms, gradients against the first variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh
focus='state_chains|state_backward|chunk_state_kernel|dv_local'

echo "== chains 1/2: chunked GDN GPU tests with FLASHGRAD_CHUNKED_STATE_PRODUCTS=single"
job_tests chains_tests_single 30 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_STATE_PRODUCTS=single

echo "== chains 2/2: variants in one process per shape"
job_compare chains_32k 35 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_CHAINS \
  --variants off=0,exact=exact,single=- --focus "$focus" --reps 5,5,2
job_compare state_single_32k 25 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_PRODUCTS \
  --variants hilo=-,single=single --focus "$focus" --reps 5,5,2
job_compare state_single_b8 20 --kind gdn --shape 8,4096,16,128 --env FLASHGRAD_CHUNKED_STATE_PRODUCTS \
  --variants hilo=-,single=single --focus "$focus" --reps 5,5,2
job_compare state_single_b8k64 20 --kind gdn --shape 8,4096,16,64 --env FLASHGRAD_CHUNKED_STATE_PRODUCTS \
  --variants hilo=-,single=single --focus "$focus" --reps 5,5,2

job_summary chains
