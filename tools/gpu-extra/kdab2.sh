#!/usr/bin/env bash
# kdab2 (issue 6: the chunked KDA backward's B2 split into two kernels, session 10, helper kdab2:
# chunked_kda_grads_state.cuh + chunked_kda_grads_local.cuh, opt-in FLASHGRAD_CHUNKED_KDA_B2=split;
# docs/perf/delta_rule.md "KDA B2 split (session 10, helper kdab2)"). Runs on the H200 from the repo
# root after tools/gpu-check's build into build-gpu and the package install (cap 150 s, budget 138 s;
# logs in $OUT/extra/):
#   1. the DeltaRuleChunkedKda* GPU tests (every stage against the CPU chunked reference, end to end
#      against the CPU recurrence) with the default B2 (the split kernels, since session 10) and with
#      FLASHGRAD_CHUNKED_KDA_B2=fused (kda_grads_kernel);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16, one process: =fused, then the default split B2 (fp32
#      operands rounded to T), then =split_exact (hi + lo): forward / backward wall, every kda_*
#      kernel's CUDA time per call, and the splits' gradients against the fused kernel's (rel RMS);
#   3. ncu of one launch of each split kernel (occupancy, issue active, stalls, and the warp-stall
#      samples per phase from the SASS source page: kdaprep_ncu_source.py; the csv comes back gzipped)
#      while time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdab2 1/3: DeltaRuleChunkedKda* GPU tests with the default B2 (split) and with =fused"
job_tests kdab2_tests 45 'DeltaRuleChunkedKda*'
job_tests kdab2_tests_fused 30 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_B2=fused

echo "== kdab2 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, default vs split B2 (one process)"
job_compare kdab2_compare 55 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_B2 \
  --variants fused=fused,split=-,split_exact=split_exact --focus 'kda_grads' --note "(fla backward ~4.2 ms)"

echo "== kdab2 3/3: ncu of the split kernels"
job_ncu kdab2_ncu_state 35 'kda_grads_state_kernel' 1 - -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128
job_ncu kdab2_ncu_local 35 'kda_grads_local_kernel' 1 - -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

job_summary kdab2
