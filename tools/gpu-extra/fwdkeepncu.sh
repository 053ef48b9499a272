#!/usr/bin/env bash
# fwdkeepncu (issue 6, lead, session 14): what keeping v_new costs the forward's fused state + output
# kernel (chunk GDN B8 T4096 H16 K=V=128 bf16: +0.028 ms in run 14.2 with the staged 16-byte stores,
# +0.036 before): ncu of its launch (the first chunk_state_kernel: the forward's) with v_new kept and
# not (FLASHGRAD_KEEP_V_NEW), same sections, so the two reports' durations, instructions and stalls
# can be set side by side.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=110
source tools/gpu-extra/lib/job_lib.sh
JOB_NCU_SKIP=0 job_ncu fwdkeepncu_off 50 'chunk_state_kernel' 0 FLASHGRAD_KEEP_V_NEW=0 -- --B 8 --T 4096
JOB_NCU_SKIP=0 job_ncu fwdkeepncu_kept 50 'chunk_state_kernel' 0 FLASHGRAD_KEEP_V_NEW=1 -- --B 8 --T 4096
job_summary fwdkeepncu
