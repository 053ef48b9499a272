#!/usr/bin/env bash
# chainlate (issue 6, lead, session 18): the wgmma chains (B1, stage 2) with the next chunk's copies and the
# state's store to the intermediates issued after the first product's wgmmas (kLate, the default to test)
# against before them (FLASHGRAD_CHUNKED_CHAIN_LATE=0, session 17's order).
#   1. per-kernel times and gradients, late against early: B1 and stage 2 at B1 T32768 H16 (16 columns)
#      and B2 T16384 (32 columns);
#   2. chainlate.py: deltabench's configuration, one process, settings interleaved.
# (The GPU tests and sanitizers of gpu-check run the default, kLate.)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_CHAIN_LATE
job_compare late_t32k 30 --kind gdn --shape 1,32768,16,128 --env $E --variants early=0,late=1 \
  --focus 'state_backward_wgmma|chunk_state_wgmma' --reps 5,3,1 --note "(run 18.2: B1 0.790, stage 2 0.612 ms)"
job_compare late_t16k 25 --kind gdn --shape 2,16384,16,128 --env $E --variants early=0,late=1 \
  --focus 'state_backward_wgmma|chunk_state_wgmma' --reps 5,3,1 --note "(run 18.2: B1 0.574, stage 2 0.457 ms)"
timeout -k 3 "$(cap 60)" python3 tools/gpu-extra/chainlate.py > "$OUT/extra/chainlate_ab.log" 2>&1
grep "^ROW" "$OUT/extra/chainlate_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/chainlate_ab.log")
job_summary chainlate
