#!/usr/bin/env bash
# gdnb2s (issue 6; sessions 11 / 12, helpers gdnb2s / b2retire: the chunked GDN backward's B2 split
# kernels, chunked_grads_split.cuh + chunked_grads_state_coalesced.cuh, the variant table in
# chunked_grads_split_variants.cuh; docs/perf/delta_rule.md "GDN B2, session 11 (helper gdnb2s)").
# Variants by FLASHGRAD_CHUNKED_B2_SPLIT (read per call; V == K): unset = the default, v6 since
# session 12 (B2a chunk_grads_state_coalesced_kernel, B2b chunk_grads_local_kernel<.., 6>); v5 = the
# default from run 11.3 (B2b without the late row norms); v1 = the session-7 kernels (every V != K
# case runs them too). Session 12 retired resident / v2 / v3 / v4 / v7 (slower than v5, or no faster).
# Final run 12.3 (after tools/gpu-check's build into build-gpu and the package install; ~60 s of the
# 138 s budget; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with the default (v6) and with v1;
#   2. chunk GDN B8 T4096 H16 bf16 K=V=128, one process: v1 / default / v5: forward / backward wall,
#      each chunk_grads* kernel's CUDA time per call, gradients against v1's.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT
F='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'

echo "== gdnb2s 1/2: chunked GDN GPU tests with the default B2 (v6) and with $V=v1"
job_tests gdnb2s_tests 20 "$F"
job_tests gdnb2s_tests_v1 15 "$F" $V=v1

echo "== gdnb2s 2/2: chunk GDN B8 T4096 H16 K=V=128 bf16, v1 / default (v6) / v5 (one process)"
job_compare gdnb2s_compare 28 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v1=v1,default=-,v5=v5 --focus 'chunk_grads' --note "(fla backward ~2.72 ms)"

job_summary gdnb2s
