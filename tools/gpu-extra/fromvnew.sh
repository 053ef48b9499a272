#!/usr/bin/env bash
# fromvnew (issue 6, session 12, lead): the chunk-entry states rebuilt from v_new
# (chunked_state_from_vnew.cuh; FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1: the backward runs it after stage 2's
# recomputation and B1 / B2 read the states it wrote; the chains launch is off with it). Checks its
# states through the whole backward and times the kernel, which a forward-kept v_new would let the
# backward run instead of stage 2 (docs/perf/delta_rule.md, "Session 12 (lead)").
# Run 12.1 timed the first version (one chunk ahead): 0.51 ms at B8 T4096, 1.10 ms at B1 T32768 (~2.1 us
# per chunk, ~4x its instructions): its loop waits on its copies. Now STAGES chunks in flight
# (FLASHGRAD_CHUNKED_FROM_VNEW_STAGES=2 / 4 forces; the launcher picks 4 for few blocks).
# Runs on the H200 from the repo root after tools/gpu-check's build (cap 150 s, budget 138 s):
#   1. the chunked GDN GPU tests with the states from v_new, the launcher's stages (4 in the tests' small
#      shapes) and with 2 forced;
#   2. chunk GDN B8 T4096 H16 K=V=128 and B1 T32768 H16 bf16, one process each, the states from v_new
#      with 2 and with 4 stages: per-kernel times and the gradients of 4 against 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_STATES_FROM_VNEW
ST=FLASHGRAD_CHUNKED_FROM_VNEW_STAGES
F='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'

echo "== fromvnew 1/2: chunked GDN GPU tests with $V=1 (launcher's stages, then 2)"
job_tests fromvnew_tests 30 "$F" $V=1
job_tests fromvnew_tests2 30 "$F" $V=1 $ST=2

echo "== fromvnew 2/2: B8 T4096 and B1 T32768, 2 vs 4 chunks in flight (one process each)"
export $V=1
job_compare fromvnew_b8 35 --kind gdn --shape 8,4096,16,128 --env $ST --variants two=2,four=4 \
  --focus 'chunk_state' --reps 3,3,1 --note "(run 12.1, one ahead: 0.512 ms; stage 2 recomputation 0.38)"
job_compare fromvnew_t32k 40 --kind gdn --shape 1,32768,16,128 --env $ST --variants two=2,four=4 \
  --focus 'chunk_state' --reps 2,2,1 --note "(run 12.1, one ahead: 1.100 ms; stage 2 1.05)"
unset $V

job_summary fromvnew
