#!/usr/bin/env bash
# fusedncu (issue 6, lead, session 10): where the B8 T4096 serial kernels wait (chunk GDN bf16 K=V=128,
# 128 chains: one block per SM, 64 chunks each): ncu with source counters of the forward's fused
# state + output kernel (its first launch: the forward's; the backward's stage 2 has the same name) and
# of the 8-warp B1 (cap 150 s; logs in $OUT/extra/).
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=120
source tools/gpu-extra/lib/job_lib.sh
JOB_NCU_SKIP=0 job_ncu fusedncu_fused 50 'chunk_state_kernel' 1 - -- --B 8 --T 4096
job_ncu fusedncu_b1 50 'chunk_state_backward_transposed' 1 - -- --B 8 --T 4096
job_summary fusedncu
