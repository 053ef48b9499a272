#!/usr/bin/env bash
# fvncu (issue 6, lead): ncu with source counters of the states-from-v_new kernel
# (chunked_state_from_vnew.cuh). Session 13's pipelined kernel in 64-column blocks runs ~2.7 us per
# chunk and block of 16 warps (run 13.2: 0.345 ms per pass at B1 T32768 in 4 segments, 0.41 ms at B8
# T4096), ~40% of the issue rate its instructions would allow: where do its warps wait?
# Profiles pass 2 (the second launch of the name: pass 1 comes first) at B1 T32768 H16 K=V=128, with the
# backward reading the forward's kept v_new (FLASHGRAD_KEEP_V_NEW=1), then the one pass at B8 T4096.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
export FLASHGRAD_KEEP_V_NEW=1
JOB_NCU_SKIP=1 job_ncu fvncu_t32k 60 'chunk_state_from_vnew_seg_kernel' 1 - -- --kind gdn --B 1 --T 32768 --H 16 --K 128
JOB_NCU_SKIP=0 job_ncu fvncu_b8 60 'chunk_state_from_vnew_seg_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
job_summary fvncu
