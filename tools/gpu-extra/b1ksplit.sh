#!/usr/bin/env bash
# b1ksplit (issue 6, lead, session 10): the local B1 with its key channels split over warp pairs
# (chunk_state_backward_transposed_kernel's KSPLIT = 2; state_backward_ksplit_wanted, chunked_stages.h),
# and the serial stages' hoisted row copies / stores (stepped_rows_async, store_acc_rows,
# chunked_tiles.cuh). Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu
# (cap 150 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests with FLASHGRAD_CHUNKED_B1_KSPLIT=0 (the default run of gpu-check already
#      tests the split, the default for few chains);
#   2. one process each, chunk GDN bf16 K=V=128, B1 T32768 H16 and B2 T16384 H16: KSPLIT off / on,
#      wall ms, per-kernel times, gradients of "on" against "off";
#   3. ncu (with source counters) of the split B1 at B1 T32768 if >= 40 s are left.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== b1ksplit 1/3: chunked GDN GPU tests with FLASHGRAD_CHUNKED_B1_KSPLIT=0"
job_tests b1ksplit_tests_off 45 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_B1_KSPLIT=0

echo "== b1ksplit 2/3: KSPLIT off / on, one process per shape"
for shape in 1,32768,16,128 2,16384,16,128; do
  job_compare "b1ksplit_${shape//,/_}" 40 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_B1_KSPLIT \
    --variants off=0,on=1 --focus 'state_backward|dv_local|chunk_state_kernel' --reps 5,5,2
done

echo "== b1ksplit 3/3: ncu of the split B1 (B1 T32768)"
[ "$(left)" -ge 40 ] && job_ncu b1ksplit_ncu 35 'chunk_state_backward_transposed' 1 FLASHGRAD_CHUNKED_B1_KSPLIT=1 -- \
  --B 1 --T 32768

job_summary b1ksplit
