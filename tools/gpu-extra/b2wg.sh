#!/usr/bin/env bash
# b2wg (issue 6, session 19): B2a on wgmma (chunked_grads_state_wgmma.cuh; the split B2's default "wg"
# since session 19, FLASHGRAD_CHUNKED_B2_SPLIT read per call; step S1 of
# docs/perf/delta_rule_b2_wgmma_plan.md) beside the B2a it replaced (chunk_grads_state_coalesced_kernel,
# variant v6), after tools/gpu-check's build into build-gpu:
#   1. the GPU tests of the split B2's shapes (H == HV, K = V = 128 and 64) with v6 (the retained
#      variant), and DeltaRuleGpu.ChunkedB2aWgmma (which sets wg itself);
#   2. chunk GDN bf16 B8 T4096 H16 K=V=128, B1 T32768 H16 and B8 T4096 H16 K=V=64, one process each: v6 /
#      default, forward / backward wall, each chunk_grads* kernel's CUDA time per call, gradients
#      against v6's;
#   3. racecheck of ChunkedB2aWgmmaK64 (run 19.1 raced the K = 128 one: clean), memcheck of both.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== b2wg 1/3: GPU tests (H == HV, K = V) with $V=v6, and ChunkedB2aWgmma"
job_tests b2wg_tests 40 "DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128:DeltaRuleGpu.ChunkedDvNewInWRegion:DeltaRuleGpu.ChunkedB2aWgmma*" $V=v6

echo "== b2wg 2/3: B2 v6 / default (wg), B8 T4096, B1 T32768, B8 K=V=64 (one process each)"
job_compare b2wg_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 18.1: B2a 0.61 ms, B2b 0.88)"
job_compare b2wg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(runs 18.2-18.4: B2a 0.61 ms, B2b 0.88)"
job_compare b2wg_k64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(K = V = 64)"

echo "== b2wg 3/3: compute-sanitizer on ChunkedB2aWgmma"
job_sanitize b2wg_san 60 'DeltaRuleGpu.ChunkedB2aWgmmaK64' 'DeltaRuleGpu.ChunkedB2aWgmma*'

job_summary b2wg
