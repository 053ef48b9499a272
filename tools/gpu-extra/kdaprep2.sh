#!/usr/bin/env bash
# kdaprep2 (issue 6: chunked KDA stage 1, kda_prepare_compact_kernel, session 13, helper kdaprep2;
# docs/perf/delta_rule.md "KDA stage 1, session 13 (helper kdaprep2)"). Runs on the H200 from the repo
# root after tools/gpu-check's build into build-gpu and the package install (budget 138 s; logs in
# $OUT/extra/). Opt-in stage-1 variants (FLASHGRAD_CHUNKED_KDA_PREPARE): =v2 G scaled by log2 e and
# decays by ex2.approx.ftz, the in-half pairs two units per pass; =v3 v2 + the off-diagonal channel
# loop unrolled by 2 + two v pieces loaded ahead; =v4 v3 + beta's / v's loads converted at their use.
# Run 13.3 (final; v4, kVar = 4, is the default since 13.3's commit, the session-7 kernel is =s7):
#   1. chunk KDA B4 T4096 H16 K=V=128 bf16 in one process: the default stage 1 and =s7, every kda_*
#      kernel's CUDA time per call, the default's output / gradients against =s7's;
#   2. the DeltaRuleChunkedKda* GPU tests with the default and with =s7.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaprep2 1/3: chunk KDA B4 T4096 H16 K=V=128 bf16, =s7 vs the default stage 1 (one process)"
job_compare kdaprep2_compare 35 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_PREPARE \
  --variants s7=s7,default=- --focus 'kda_prepare' --note "(run 13.2: s7 0.569, v4 0.496 - 0.513 ms)"

echo "== kdaprep2 2/3: DeltaRuleChunkedKda* GPU tests with the default stage 1"
job_tests kdaprep2_tests_default 25 'DeltaRuleChunkedKda*'

echo "== kdaprep2 3/3: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_PREPARE=s7"
job_tests kdaprep2_tests_s7 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_PREPARE=s7

job_summary kdaprep2
