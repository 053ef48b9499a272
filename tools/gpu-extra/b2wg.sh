#!/usr/bin/env bash
# b2wg (issue 6, session 19): B2a on wgmma (chunked_grads_state_wgmma.cuh; FLASHGRAD_CHUNKED_B2_SPLIT=wg,
# read per call; step S1 of docs/perf/delta_rule_b2_wgmma_plan.md) beside the default B2a
# (chunk_grads_state_coalesced_kernel, variant v6), after tools/gpu-check's build into build-gpu:
#   1. the chunked GDN GPU tests of the split B2's shape (H == HV, K = V = 128) with wg, and
#      DeltaRuleGpu.ChunkedB2aWgmma (which sets it itself);
#   2. chunk GDN B8 T4096 H16 K=V=128 bf16 and B1 T32768 H16, one process each: default / wg, forward /
#      backward wall, each chunk_grads* kernel's CUDA time per call, gradients against the default's;
#   3. racecheck and memcheck of ChunkedB2aWgmma's small cases.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== b2wg 1/3: GPU tests (H == HV, K = V = 128) with $V=wg"
job_tests b2wg_tests 40 'DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128:DeltaRuleGpu.ChunkedB2aWgmma' $V=wg

echo "== b2wg 2/3: B2 default (v6) / wg, B8 T4096 and B1 T32768 (one process each)"
job_compare b2wg_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants default=-,wg=wg --focus 'chunk_grads' --note "(run 18.1: B2a 0.61 ms, B2b 0.88)"
job_compare b2wg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants default=-,wg=wg --focus 'chunk_grads' --note "(runs 18.2-18.4: B2a 0.61 ms, B2b 0.88)"

echo "== b2wg 3/3: compute-sanitizer on ChunkedB2aWgmma"
job_sanitize b2wg_san 40 'DeltaRuleGpu.ChunkedB2aWgmma' 'DeltaRuleGpu.ChunkedB2aWgmma'

job_summary b2wg
