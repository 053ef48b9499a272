#!/usr/bin/env bash
# kdaloc (issue 6: the chunked KDA backward's B2 local kernel, session 12, helper kdaloc:
# kda_grads_local_kernel, chunked_kda_grads_local.cuh, and its session-12 form kda_grads_local2_kernel,
# chunked_kda_grads_local2.cuh, the default since run 12.3 (FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old: session 10); docs/perf/delta_rule.md
# "KDA B2 local kernel, session 12 (helper kdaloc)"). Runs on the H200 from the repo root after
# tools/gpu-check's build into build-gpu and the package install (cap 150 s, budget 138 s; logs in
# $OUT/extra/):
#   1. the DeltaRuleChunkedKda* GPU tests with =new (the default since 12.3; =new still names it);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16, one process: =old (session 10) and the default (session 12),
#      per-kernel CUDA times and the gradients of the default against =old's (rel RMS);
#   3. compute-sanitizer racecheck and memcheck of small KDA cases with =new (cp.async staging,
#      swizzled tiles, new barriers);
#   4. ncu of one launch of the new local kernel with the source counters: stall samples per phase
#      (kdaprep_ncu_source.py; the csv, with per-instruction shared-wavefront counts, comes back gzipped);
#   5. the DeltaRuleChunkedKda* GPU tests with =old.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaloc 1/5: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_B2_LOCAL=new"
job_tests kdaloc_tests_new 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_B2_LOCAL=new

echo "== kdaloc 2/5: chunk KDA B4 T4096 H16 K=V=128 bf16, =old vs the default local kernel (one process)"
job_compare kdaloc_compare 45 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_B2_LOCAL \
  --variants old=old,default=- --focus 'kda_grads' --note "(local kernel 1.68 ms in run 11.4; fla bwd_intra 1.855 ms)"

echo "== kdaloc 3/5: compute-sanitizer racecheck / memcheck of small KDA cases with =new"
job_sanitize kdaloc 30 'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16' \
  'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16:DeltaRuleChunkedKdaGpu.KeyNotValue' FLASHGRAD_CHUNKED_KDA_B2_LOCAL=new

echo "== kdaloc 4/5: ncu (source counters) of the new local kernel"
job_ncu kdaloc_ncu_new 45 'kda_grads_local2_kernel' 1 FLASHGRAD_CHUNKED_KDA_B2_LOCAL=new -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

echo "== kdaloc 5/5: DeltaRuleChunkedKda* GPU tests with the session-10 local kernel (=old)"
job_tests kdaloc_tests_old 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_B2_LOCAL=old

job_summary kdaloc
