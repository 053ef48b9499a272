#!/usr/bin/env bash
# kdaprep2 (issue 6: chunked KDA stage 1, kda_prepare_compact_kernel, session 13, helper kdaprep2;
# docs/perf/delta_rule.md "KDA stage 1, session 13 (helper kdaprep2)"). Runs on the H200 from the repo
# root after tools/gpu-check's build into build-gpu and the package install (budget 138 s; logs in
# $OUT/extra/). Opt-in stage-1 variants (FLASHGRAD_CHUNKED_KDA_PREPARE): =v2 G scaled by log2 e and
# decays by ex2.approx.ftz, the in-half pairs two units per pass; =v3 v2 + the off-diagonal channel
# loop unrolled by 2 + two v pieces loaded ahead; =v4 v3 + beta's / v's loads converted at their use.
# Run 13.2:
#   1. chunk KDA B4 T4096 H16 K=V=128 bf16 in one process: the default stage 1, =v2, =v3 and =v4,
#      every kda_* kernel's CUDA time per call, the variants' output / gradients against the default's;
#   2. the DeltaRuleChunkedKda* GPU tests with =v4;
#   3. ncu of one launch of the =v4 stage 1 with the source counters: stall samples and executed
#      instructions per phase (kdaprep_ncu_source.py; the csv comes back gzipped);
#   4. compute-sanitizer racecheck / memcheck of small KDA cases with =v4;
#   5. the default stage 1 timed again after =v4 (order effects), v4 vs v3 bitwise.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaprep2 1/5: chunk KDA B4 T4096 H16 K=V=128 bf16, default vs =v2 / =v3 / =v4 stage 1 (one process)"
job_compare kdaprep2_compare 60 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_PREPARE \
  --variants default=-,v2=v2,v3=v3,v4=v4 --focus 'kda_prepare' --note "(run 13.1: default 0.569, v3 0.529 ms)"

echo "== kdaprep2 2/5: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_PREPARE=v4"
job_tests kdaprep2_tests_v4 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_PREPARE=v4

echo "== kdaprep2 3/5: ncu (source counters) of the =v4 stage 1"
job_ncu kdaprep2_ncu_v4 40 'kda_prepare_compact_kernel' 1 FLASHGRAD_CHUNKED_KDA_PREPARE=v4 -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

echo "== kdaprep2 4/5: compute-sanitizer racecheck / memcheck of small KDA cases with =v4"
job_sanitize kdaprep2 25 'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16' \
  'DeltaRuleChunkedKdaGpu.NoStatesNoNormF16:DeltaRuleChunkedKdaGpu.KeyNotValue' FLASHGRAD_CHUNKED_KDA_PREPARE=v4

echo "== kdaprep2 5/5: =v4, =v3 and the default again (order effects; v4 vs v3 should be bitwise equal)"
job_compare kdaprep2_compare2 45 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_PREPARE \
  --variants v4=v4,v3=v3,default=- --focus 'kda_prepare'

job_summary kdaprep2
