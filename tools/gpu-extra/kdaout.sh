#!/usr/bin/env bash
# kdaout (issue 6, lead, session 11): the KDA output kernel with single-fragment products
# (chunked_kda_output.cuh kSingle; the default since run 11.3, FLASHGRAD_CHUNKED_KDA_OUTPUT=split keeps
# hi + lo). Runs on the H200
# from the repo root after tools/gpu-check's build into build-gpu (cap 150 s; logs in $OUT/extra/):
#   1. the DeltaRuleChunkedKda* GPU tests with hi + lo (=split; the default is tested by the GPU check);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16, one process: hi + lo (default) / single: forward and
#      backward wall ms, every kda_* kernel per call, o and the gradients of single against the default.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaout 1/2: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_OUTPUT=split"
job_tests kdaout_tests 45 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_OUTPUT=split

echo "== kdaout 2/2: chunk KDA B4 T4096 H16 K=V=128 bf16, hi + lo / single output (one process)"
job_compare kdaout_compare 50 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_OUTPUT \
  --variants hilo=split,single=- --focus 'kda_output' --note "(fla's chunk_gla_fwd_kernel_o 0.127 ms in run 11.2)"

job_summary kdaout
