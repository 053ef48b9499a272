#!/usr/bin/env bash
# fromvnew (issue 6, session 12, lead): the chunk-entry states rebuilt from v_new
# (chunked_state_from_vnew.cuh; FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1: the backward runs it after stage 2's
# recomputation and B1 / B2 read the states it wrote; the chains launch is off with it). Checks its
# states through the whole backward and times the kernel, which a forward-kept v_new would let the
# backward run instead of stage 2 (docs/perf/delta_rule.md, "Session 12 (lead)").
# Runs on the H200 from the repo root after tools/gpu-check's build (cap 150 s, budget 138 s):
#   1. the chunked GDN GPU tests with the variable set (every stage against the CPU chunked reference,
#      end to end against the CPU recurrence);
#   2. chunk GDN B8 T4096 H16 K=V=128 and B1 T32768 H16 bf16, one process each: default vs =1, per-kernel
#      times (chunk_state: stage 2, forward and backward; chunk_state_from_vnew: the new kernel) and the
#      gradients against the default's.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_STATES_FROM_VNEW

echo "== fromvnew 1/2: chunked GDN GPU tests with $V=1"
job_tests fromvnew_tests 35 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' $V=1

echo "== fromvnew 2/2: B8 T4096 and B1 T32768, default vs the states from v_new (one process each)"
job_compare fromvnew_b8 45 --kind gdn --shape 8,4096,16,128 --env $V --variants default=-,fromvnew=1 \
  --focus 'chunk_state' --note "(stage 2 recomputation 0.38 ms in run 12.0)"
job_compare fromvnew_t32k 50 --kind gdn --shape 1,32768,16,128 --env $V --variants default=-,fromvnew=1 \
  --focus 'chunk_state' --reps 3,2,1

job_summary fromvnew
