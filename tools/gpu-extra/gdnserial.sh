#!/usr/bin/env bash
# gdnserial (issue 6, lead, session 10): where the chunk GDN serial stages (B1, stage 2) and B2 still
# wait, after run 10.1's changes (B1 reads the chunk plan two chunks ahead since 9bd2600). Runs on the
# H200 from the repo root after tools/gpu-check's build into build-gpu (cap 150 s; logs in $OUT/extra/):
#   1. chunk GDN bf16 K=V=128 B1 T32768 H16 in one process: B1 split off / on (FLASHGRAD_CHUNKED_B1_KSPLIT),
#      per-kernel times and wall ms;
#   2. ncu with source counters (stall samples per phase) of the default B1 and of stage 2 at B1 T32768;
#   3. ncu with source counters of B2's two kernels at B8 T4096, while time is left.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== gdnserial 1/3: B1 T32768, split off / on"
job_compare gdnserial_32k 40 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_B1_KSPLIT \
  --variants off=0,on=1 --focus 'state_backward|chunk_state_kernel' --reps 5,5,2

echo "== gdnserial 2/3: ncu (source) of B1 and stage 2 at B1 T32768"
job_ncu gdnserial_ncu_b1 30 'chunk_state_backward_transposed' 1 - -- --B 1 --T 32768
job_ncu gdnserial_ncu_state 30 'chunk_state_kernel' 1 - -- --B 1 --T 32768

echo "== gdnserial 3/3: ncu (source) of B2 at B8 T4096"
job_ncu gdnserial_ncu_b2b 25 'chunk_grads_local_kernel' 1 - -- --B 8 --T 4096
job_ncu gdnserial_ncu_b2a 25 'chunk_grads_state_kernel' 1 - -- --B 8 --T 4096

job_summary gdnserial
