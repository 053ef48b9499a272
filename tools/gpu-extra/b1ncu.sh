#!/usr/bin/env bash
# b1ncu (issue 6, lead, session 9; meant for GPU 1 beside the other jobs): ncu of one launch of B1
# (chunk_state_backward_transposed_kernel) at B8 T4096 H16 K=V=128 bf16 (8-warp blocks), hi + lo
# products (the default) and single-fragment (FLASHGRAD_CHUNKED_B1_PRODUCTS=single), with source
# counters (the csv comes back: instructions executed and stalls per SASS line). Why: B1's SASS is
# ~7.3k-7.9k instructions of which only 244 / 456 are HMMA and ~3.5k integer address math (IMAD,
# LEA, IADD3); whether the kernel is issue-bound on that or on the tensor pipe decides the next
# change. Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
job_ncu b1ncu_split 70 chunk_state_backward_transposed_kernel 1 - -- --B 8 --T 4096 --H 16 --K 128
job_ncu b1ncu_single $(( $(left) - 2 )) chunk_state_backward_transposed_kernel 1 FLASHGRAD_CHUNKED_B1_PRODUCTS=single \
  -- --B 8 --T 4096 --H 16 --K 128
job_summary b1ncu
