#!/usr/bin/env bash
# gdnb2s (issue 6; sessions 11 / 12, helpers gdnb2s / b2retire: the chunked GDN backward's B2 split
# kernels, chunked_grads_split.cuh + chunked_grads_state_coalesced.cuh, the variant table in
# chunked_grads_split_variants.cuh; docs/perf/delta_rule.md "GDN B2, session 11 (helper gdnb2s)").
# Variants by FLASHGRAD_CHUNKED_B2_SPLIT (read per call; V == K): unset = the default, v5 since run
# 11.3 (B2a chunk_grads_state_coalesced_kernel, B2b chunk_grads_local_kernel<.., 5>); v1 = the
# session-7 kernels (every V != K case runs them too); v6 = v5 with B2b's row norms after pass 1's
# first products (run 12.0: B2b 0.893 -> 0.879 ms; the candidate default once its GPU tests pass).
# Session 12 retired resident / v2 / v3 / v4 / v7 (slower than v5, or no faster).
# Run 12.2 (after tools/gpu-check's build into build-gpu and the package install; cap 150 s, budget
# 138 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with v6 (the default v5 and v1 passed them in run 12.0);
#   2. chunk GDN B8 T4096 H16 bf16, one process: K=V=128 and 64, v1 / default / v6: forward /
#      backward wall, each chunk_grads* kernel's CUDA time per call, gradients against v1's;
#   3. ncu of v6's B2b while time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT
F='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'

echo "== gdnb2s 1/3: chunked GDN GPU tests with $V=v6 (the candidate default)"
job_tests gdnb2s_tests_v6 30 "$F" $V=v6

echo "== gdnb2s 2/3: chunk GDN B8 T4096 H16 bf16, v1 / default (v5) / v6 (one process each K)"
job_compare gdnb2s_compare 42 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v1=v1,default=-,v6=v6 --focus 'chunk_grads' --note "(fla backward ~2.72 ms)"
job_compare gdnb2s_compare64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v1=v1,default=-,v6=v6 --focus 'chunk_grads' --reps 5,3,1

echo "== gdnb2s 3/3: ncu of v6's B2b"
job_ncu gdnb2s_ncu_local_v6 25 'chunk_grads_local_kernel' 1 $V=v6 -- \
  --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary gdnb2s
