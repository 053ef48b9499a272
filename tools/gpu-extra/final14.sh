#!/usr/bin/env bash
# final14 (issue 6, lead, session 14): the stmatrix-staged stores (stage_acc_tiles_transposed,
# chunked_stage_store.cuh) in the fused forward's kept v_new and the rebuild's h_c, and the rebuild's
# single-fragment products as the default:
#   1. the kept-path GPU tests with hi + lo forced (FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=split, the
#      opt-in now), so both product forms ran with the new stores;
#   2. per-kernel times at B1 T32768 (the rebuild's two passes: run 14.3 read 0.293 ms per pass with
#      single products and 2-byte staging) and B8 T4096 (0.329), single against split, one process.
# keepab.sh and fwdkeepncu.sh (run beside it) give the forward's kept cost.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=75
source tools/gpu-extra/lib/job_lib.sh
job_tests final14_split 25 'DeltaRuleGpu.ChunkedKeptVNew*' FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=split
job_compare final14_t32k 25 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS \
  --variants single=-,split=split --focus 'chunk_state' --reps 3,3,1 --note "(run 14.3: single 0.293 per pass)"
job_compare final14_b8 25 --kind gdn --shape 8,4096,16,128 --env FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS \
  --variants single=-,split=split --focus 'chunk_state' --reps 3,3,1 --note "(run 14.3: single 0.329)"
job_summary final14
