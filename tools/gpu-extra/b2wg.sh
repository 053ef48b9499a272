#!/usr/bin/env bash
# b2wg (issue 6, session 19): B2a on wgmma (chunked_grads_state_wgmma.cuh; the split B2's default "wg"
# since session 19, FLASHGRAD_CHUNKED_B2_SPLIT read per call; step S1 of
# docs/perf/delta_rule_b2_wgmma_plan.md) beside the B2a it replaced (chunk_grads_state_coalesced_kernel,
# variant v6), after tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests and the wgmma probes with the defaults (so that a call may skip
#      the check's own suites), then those of the split B2's shapes with v6 (the retained variant);
#   2. chunk GDN bf16 B8 T4096 H16 K=V=128, B1 T32768 H16 and B8 T4096 H16 K=V=64, one process each: v6 /
#      default, forward / backward wall, each chunk_grads* kernel's CUDA time per call, gradients against
#      v6's (run 20.1 also timed "wge", q / k pairs loaded early: no faster, retired);
#   3. racecheck and memcheck of DeltaRuleGpu.ChunkedB2aWgmma and ChunkedB2aWgmmaK64, one at a time.
# Runs 19.1 - 19.3 (bench/results/session19_runs_h200.md) ran earlier forms of this job (run 19.3's also
# timed the persistent B2a "wgp", since retired: commit 3674c59 has it).
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== b2wg 1/3: chunked delta-rule GPU tests (defaults), then the split B2's shapes with $V=v6"
job_tests b2wg_chunked 100 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleWgmmaProbe.*"
job_tests b2wg_tests_v6 40 "DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128:DeltaRuleGpu.ChunkedDvNewInWRegion" $V=v6

echo "== b2wg 2/3: B2 v6 / default (wg): B8 T4096, B1 T32768, B8 K=V=64 (one process each)"
job_compare b2wg_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 19.3: v6 0.627, wg 0.541 ms)"
job_compare b2wg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 19.3: v6 0.616, wg 0.531 ms)"
job_compare b2wg_k64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 19.2: v6 0.263, wg 0.250 ms)"

echo "== b2wg 3/3: compute-sanitizer on ChunkedB2aWgmma, then ChunkedB2aWgmmaK64"
job_sanitize b2wg_san 90 'DeltaRuleGpu.ChunkedB2aWgmma' 'DeltaRuleGpu.ChunkedB2aWgmma'  # (racecheck: 50 s was short in run 20.1)
job_sanitize b2wg_san64 50 'DeltaRuleGpu.ChunkedB2aWgmmaK64' 'DeltaRuleGpu.ChunkedB2aWgmmaK64'

job_summary b2wg
