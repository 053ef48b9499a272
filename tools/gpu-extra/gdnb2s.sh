#!/usr/bin/env bash
# gdnb2s (issue 6, session 11, helper gdnb2s: the chunked GDN backward's B2 split kernels,
# chunked_grads_split.cuh + chunked_grads_state_coalesced.cuh, the variant table in
# chunked_grads_split_variants.cuh; docs/perf/delta_rule.md "GDN B2, session 11 (helper gdnb2s)").
# Variants by FLASHGRAD_CHUNKED_B2_SPLIT (read per call; V == K): unset = the default, v5 since run
# 11.3 (B2a chunk_grads_state_coalesced_kernel, B2b chunk_grads_local_kernel<.., 5>); v1 = the
# session-7 kernels; v6 = v5 with B2b's row norms after pass 1's first products; v7 = v6 without the
# early dq-state load (B2b v4 + the moved norms).
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, budget 138 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with the default (v5) and with v1;
#   2. chunk GDN B8 T4096 H16 bf16, one process: K=V=128 v1 / default / v6 / v7, K=V=64 v1 / default:
#      forward / backward wall, each chunk_grads* kernel's CUDA time per call, gradients against v1's;
#   3. ncu of the default's B2b while time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT
F='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'

echo "== gdnb2s 1/3: chunked GDN GPU tests with the default B2 (v5) and with $V=v1"
job_tests gdnb2s_tests 30 "$F"
job_tests gdnb2s_tests_v1 25 "$F" $V=v1

echo "== gdnb2s 2/3: chunk GDN B8 T4096 H16 bf16, v1 vs the default and the experiments (one process)"
job_compare gdnb2s_compare 45 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v1=v1,default=-,v6=v6,v7=v7 --focus 'chunk_grads' --note "(fla backward ~2.72 ms)"
job_compare gdnb2s_compare64 22 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v1=v1,default=- --focus 'chunk_grads' --reps 5,3,1

echo "== gdnb2s 3/3: ncu of the default's B2b"
job_ncu gdnb2s_ncu_local 25 'chunk_grads_local_kernel' 1 - -- \
  --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary gdnb2s
