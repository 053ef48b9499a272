#!/usr/bin/env bash
# gdnb2s (issue 6, session 11, helper gdnb2s: the chunked GDN backward's B2 split kernels,
# chunked_grads_split.cuh + chunked_grads_state_resident.cuh; docs/perf/delta_rule.md "GDN B2,
# session 11 (helper gdnb2s)"). Variants by FLASHGRAD_CHUNKED_B2_SPLIT (read per call): unset / v1 =
# the session-7 slice kernels, resident = B2a with every tile loaded at its start (V == K), v2 = that
# B2a and B2b with three slice stages in pass 1 and lean row copies, v3 = v2 with pass 1 unrolled,
# v4 = the resident B2a and B2b's pass 1 over 32-column slices (two stages, 4 barriers, unrolled),
# v5 = B2a with whole-sector state loads (chunk_grads_state_coalesced_kernel) and B2b v4 with dq's state
# part loaded a phase earlier, v6 = v5 with B2b's row norms after pass 1's first products.
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, budget 138 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with FLASHGRAD_CHUNKED_B2_SPLIT=v6;
#   2. chunk GDN B8 T4096 H16 K=V=128 bf16, one process: default, v5, v6 (and K=V=64: default, v6): forward / backward wall,
#      each chunk_grads* kernel's CUDA time per call, gradients against the default's (rel RMS);
#   3. ncu (with the SASS source page's stalls by phase) of v5's B2a and B2b while time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== gdnb2s 1/3: chunked GDN GPU tests with $V=v6"
job_tests gdnb2s_tests 35 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' $V=v6

echo "== gdnb2s 2/3: chunk GDN B8 T4096 H16 K=V=128 bf16, default vs variants (one process)"
job_compare gdnb2s_compare 45 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants default=-,v5=v5,v6=v6 --focus 'chunk_grads' --note "(fla backward ~2.72 ms)"

job_compare gdnb2s_compare64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants default=-,v6=v6 --focus 'chunk_grads' --reps 5,3,1

echo "== gdnb2s 3/3: ncu of v5's B2a (and B2b if time is left)"
job_ncu gdnb2s_ncu_state 28 'chunk_grads_state_coalesced_kernel' 1 $V=v5 -- \
  --kind gdn --B 8 --T 4096 --H 16 --K 128
job_ncu gdnb2s_ncu_local 28 'chunk_grads_local_kernel' 1 $V=v6 -- \
  --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary gdnb2s
