#!/usr/bin/env bash
# fromvnew (issue 6, lead): the chunk-entry states rebuilt from v_new (chunked_state_from_vnew.cuh;
# FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1: the backward runs it after stage 2's recomputation and B1 / B2
# read the states it wrote; the chains launch is off with it). Checks its states through the whole
# backward and times the kernel, which a forward-kept v_new would let the backward run instead of
# stage 2 (docs/perf/delta_rule.md, "Session 12 (lead)" and "Session 13 (lead)").
# Session 12's kernel (retired in session 13): 0.52 ms at B8 T4096, 0.79 ms at B1 T32768.
# Session 13's (the default of the switch): one barrier per chunk, increments in fresh registers, and
# each sequence split into segments where the blocks would not fill the SMs
# (FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS=n forces n); run 13.1: ~0.56 ms per pass, copy-bound (k's rows
# copied per 16 value columns). Now WV x 16 value columns per block (FLASHGRAD_CHUNKED_FROM_VNEW_WV=1 / 2
# / 4; default 4 where V % 64 == 0).
# Runs on the H200 from the repo root after tools/gpu-check's build (cap from gpu-check):
#   1. the chunked GDN GPU tests with the states from v_new: the launcher's choices (64 columns, many
#      segments in the tests' small shapes), then 16 columns and one segment forced;
#   2. B8 T4096 H16 K=V=128 bf16: WV 1 / 2 / 4; B1 T32768: 1 / 2 / 4 / 8 segments (one process each;
#      per-kernel times, gradients);
#   3. compute-sanitizer racecheck / memcheck of small GDN cases with it (3 segments forced).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_STATES_FROM_VNEW
SEG=FLASHGRAD_CHUNKED_FROM_VNEW_SEGMENTS
F='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'

WV=FLASHGRAD_CHUNKED_FROM_VNEW_WV
echo "== fromvnew 1/3: chunked GDN GPU tests with $V=1 (launcher's choices, then WV=1 and one segment)"
job_tests fromvnew_tests 30 "$F" $V=1
job_tests fromvnew_tests_w1 30 "$F" $V=1 $WV=1 $SEG=1

echo "== fromvnew 2/3: timing (one process each)"
export $V=1
job_compare fromvnew_b8 35 --kind gdn --shape 8,4096,16,128 --env $WV --variants w1=1,w2=2,w4=4 \
  --focus 'chunk_state' --reps 2,3,1 --note "(run 13.1: w1 0.576 ms; stage 2 recomputation 0.38)"
job_compare fromvnew_t32k_seg 40 --kind gdn --shape 1,32768,16,128 --env $SEG --variants p1=1,p2=2,p4=4,p8=8 \
  --focus 'chunk_state' --reps 1,3,1
unset $V

echo "== fromvnew 3/3: compute-sanitizer of small GDN cases with $V=1, 3 segments"
job_sanitize fromvnew 25 'DeltaRuleChunkedGpu.PlainDeltaRuleKeyNotValue' 'DeltaRuleChunkedGpu.VarlenUnevenLengths' \
  $V=1 $SEG=3

job_summary fromvnew
