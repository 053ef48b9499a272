#!/usr/bin/env bash
# b2rows (issue 6, session 21): B2b's row-role sums (dG row / column terms, dbeta) flushed into their
# shared slots at mid's end and added to at S6's end, instead of held in 12 registers from pass 1 to the
# end (chunked_grads_split.cuh, flush_row_sums): v6 K = 128 spills 8 -> 0 bytes (v5 12 -> 0), 128
# registers. After tools/gpu-check's build into build-gpu:
#   1. the chunked delta-rule GPU tests with the defaults, then the split B2's shapes with v6;
#   2. the per-call times of prologue.sh's three shapes (B8 T4096, B1 T32768, B8 K=V=64), one process each;
#   3. racecheck and memcheck of DeltaRuleGpu.ChunkedB2aWgmmaK64 (the split B2, B2b included, at K = 64).
# Prediction and outcome: docs/perf/delta_rule.md "Session 21".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== b2rows 1/3: chunked delta-rule GPU tests (defaults), then the split B2's shapes with $V=v6"
job_tests b2rows_chunked 100 "DeltaRuleGpu.Chunked*:DeltaRuleChunked*:DeltaRuleGpu.PastTwoToThe31Elements"
job_tests b2rows_tests_v6 40 "DeltaRuleGpu.ChunkedHeadsEqualValueHeadsK128:DeltaRuleGpu.ChunkedDvNewInWRegion" $V=v6

echo "== b2rows 2/3: B2 v6 / default: B8 T4096, B1 T32768, B8 K=V=64 (one process each)"
job_compare b2rows_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.4: B2b 0.836, B2a wg 0.537, v6 0.626)"
job_compare b2rows_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.4: B2b 0.836, B2a wg 0.525, v6 0.615)"
job_compare b2rows_k64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.4: B2b 0.526, B2a wg 0.247, v6 0.265)"

echo "== b2rows 3/3: compute-sanitizer on ChunkedB2aWgmmaK64"
job_sanitize b2rows_san64 50 'DeltaRuleGpu.ChunkedB2aWgmmaK64' 'DeltaRuleGpu.ChunkedB2aWgmmaK64'

job_summary b2rows
