#!/usr/bin/env bash
# variants (issue 6, lead, session 10's final run): the chunked GPU tests with the non-default B1
# shapes, which the default tests (small cases: B1 in channel quarters at K = 128) no longer take:
# FLASHGRAD_CHUNKED_B1_KSPLIT=2 (halves) and =0 (no split). Cap 150 s; logs in $OUT/extra/.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=120
source tools/gpu-extra/lib/job_lib.sh
filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*'
job_tests variants_b1_halves 45 "$filter" FLASHGRAD_CHUNKED_B1_KSPLIT=2
job_tests variants_b1_unsplit 45 "$filter" FLASHGRAD_CHUNKED_B1_KSPLIT=0
job_summary variants
