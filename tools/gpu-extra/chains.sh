#!/usr/bin/env bash
# chains (issue 6, lead, session 11): the backward's stage-2 recomputation beside B1 in one launch
# (chunked_state_chains.cuh, FLASHGRAD_CHUNKED_STATE_CHAINS=1; state_chains_wanted in chunked_stages.h).
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu (cap 150 s; logs in
# $OUT/extra/):
#   1. the chunked GDN GPU tests with the chains kernel's experiments: =single (stage 2's products
#      single-fragment) and =halves (B1 in channel halves on warps 0-1, stage 2 on warps 2-3); the
#      chains launch itself (=1) is the default since run 11.1 where K = 128 and the blocks fit one wave;
#   2. chunk GDN bf16 K=V=128 B1 T32768 H16, one process: off / on / single / halves, per-kernel times,
#      wall ms, gradients against off;
#   3. ncu of the =halves chains kernel at B1 T32768 (occupancy, issue active, stalls).
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== chains 1/3: chunked GDN GPU tests with the chains kernel's experiments (=1 is the default since run 11.1)"
job_tests chains_tests_single 30 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_STATE_CHAINS=single
job_tests chains_tests_halves 30 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_STATE_CHAINS=halves

echo "== chains 2/3: off / on / single / halves at B1 T32768"
job_compare chains_32k 45 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_CHAINS \
  --variants off=0,on=1,single=single,halves=halves --focus 'state_chains|state_backward|chunk_state_kernel|dv_local' \
  --reps 5,5,2

echo "== chains 3/3: ncu of the chains kernel (=halves) at B1 T32768"
JOB_NCU_SKIP=0 job_ncu chains_ncu_halves 25 'chunk_state_chains' 0 FLASHGRAD_CHUNKED_STATE_CHAINS=halves -- \
  --B 1 --T 32768

job_summary chains
