#!/usr/bin/env bash
# kdab2s (issue 6: the chunked KDA backward's B2 state kernel, session 11, helper kdab2s:
# kda_grads_state_kernel in its staged form, the default since session 11 (FLASHGRAD_CHUNKED_KDA_B2=split:
# the session-10 form), chunked_kda_grads_state.cuh +
# chunked_kda_grads_state_product.cuh; docs/perf/delta_rule.md "KDA B2 state kernel, session 11
# (helper kdab2s)"). Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu
# and the package install (cap 150 s, budget 138 s; logs in $OUT/extra/):
#   1. the DeltaRuleChunkedKda* GPU tests with the default B2 (staged) and with =split (every stage
#      against the CPU chunked reference, end to end against the CPU recurrence);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16, one process: =split (session 10), the default (staged,
#      without L2 prefetches since session 12) and =staged_prefetch (with the next slice's states
#      prefetched into L2, the default of session 11):
#      forward / backward wall, every kda_* kernel's CUDA time per call, and the gradients against
#      split's (rel RMS);
#   2b. compute-sanitizer racecheck and memcheck of small KDA GPU cases with the default;
#   3. ncu of one launch of the (staged) state kernel (occupancy, issue active, stalls, and the
#      warp-stall samples per phase from the SASS source page; the csv comes back gzipped) while
#      time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdab2s 1/3: DeltaRuleChunkedKda* GPU tests with the default B2 (staged) and with =split"
job_tests kdab2s_tests 30 'DeltaRuleChunkedKda*'
job_tests kdab2s_tests_split 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_B2=split

echo "== kdab2s 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, default vs staged B2 (one process)"
job_compare kdab2s_compare 50 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_B2 \
  --variants split=split,staged=-,staged_pf=staged_prefetch --focus 'kda_grads' --note "(fla backward ~4.2 ms)"

echo "== kdab2s 2b: compute-sanitizer racecheck / memcheck of small KDA cases with the default (staged)"
job_sanitize kdab2s 25 'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16' \
  'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16:DeltaRuleChunkedKdaGpu.KeyNotValue'

echo "== kdab2s 3/3: ncu of the (staged) state kernel"
job_ncu kdab2s_ncu_state 40 'kda_grads_state_kernel' 1 - -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

job_summary kdab2s
