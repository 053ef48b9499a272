#!/usr/bin/env bash
# fvncu (issue 6, session 12, lead): ncu with source counters of the states-from-v_new kernel
# (chunked_state_from_vnew.cuh, 4 chunks in flight) at B1 T32768 H16 K=V=128, where run 12.2 timed it at
# 0.79 ms (~1.5 us per chunk for ~450 instructions per warp): whether the warps wait on their own
# instruction latencies (one warp per scheduler) or on memory.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
export FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1
JOB_NCU_SKIP=0 job_ncu fvncu_t32k 90 'chunk_state_from_vnew_kernel' 1 - -- --kind gdn --B 1 --T 32768 --H 16 --K 128
job_summary fvncu
