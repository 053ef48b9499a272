#!/usr/bin/env bash
# b2wg (issue 6, session 19): B2a on wgmma (chunked_grads_state_wgmma.cuh; the split B2's default "wg"
# since session 19, FLASHGRAD_CHUNKED_B2_SPLIT read per call; step S1 of
# docs/perf/delta_rule_b2_wgmma_plan.md) beside the B2a it replaced (chunk_grads_state_coalesced_kernel,
# variant v6), after tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests with the defaults (so that a call may skip the check's own
#      suites), then those of the split B2's shapes (H == HV, K = V = 128 and 64) with wgp (the
#      persistent B2a, opt-in; run 19.2 ran them with v6, the retained variant);
#   2. chunk GDN bf16 B8 T4096 H16 K=V=128 and B1 T32768 H16, one process each: v6 / default / wgp,
#      forward / backward wall, each chunk_grads* kernel's CUDA time per call, gradients against v6's;
#   3. racecheck and memcheck of ChunkedB2aWgmmaK64 and ChunkedB2aWgmmaPersistent (run 19.1 raced the
#      K = 128 one: clean).
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== b2wg 1/3: the chunked delta-rule GPU tests with the defaults (for a call without the check's own suites), then the split B2's shapes with $V=wgp (run 19.2 ran them with v6)"
job_tests b2wg_chunked 100 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleWgmmaProbe.*"
job_tests b2wg_tests_wgp 30 "DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128:DeltaRuleGpu.ChunkedDvNewInWRegion" $V=wgp

echo "== b2wg 2/3: B2 v6 / default (wg) / wgp, B8 T4096, B1 T32768 (one process each; K = 64: run 19.2)"
job_compare b2wg_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v6=v6,default=-,wgp=wgp --focus 'chunk_grads' --note "(run 19.2: v6 0.625, wg 0.542 ms)"
job_compare b2wg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants v6=v6,default=-,wgp=wgp --focus 'chunk_grads' --note "(run 19.2: v6 0.613, wg 0.526 ms)"

echo "== b2wg 3/3: compute-sanitizer: racecheck ChunkedB2aWgmmaK64 and ChunkedB2aWgmmaPersistent, memcheck the latter"
job_sanitize b2wg_san 50 'DeltaRuleGpu.ChunkedB2aWgmmaK64' 'DeltaRuleGpu.ChunkedB2aWgmmaPersistent'
job_sanitize b2wg_sanp 70 'DeltaRuleGpu.ChunkedB2aWgmmaPersistent' 'DeltaRuleGpu.ChunkedB2aWgmmaK64'

job_summary b2wg
