#!/usr/bin/env bash
# b2bncu (issue 6, prepared in session 19 for step S2 of docs/perf/delta_rule_b2_wgmma_plan.md; not run
# yet): where B2b (chunk_grads_local_kernel<.., 6>, 0.88 ms of the B8 T4096 H16 K=V=128 backward) and
# B2a on wgmma (chunk_grads_state_wgmma_kernel, 0.54 ms) spend their warps' time, after tools/gpu-check's
# build and package install. ncu of one launch each, with source counters: stall samples and executed
# instructions per segment between block barriers (tools/gpu-extra/kdaprep_ncu_source.py), so the
# static SASS split of the plan ("Where B2b's instructions are") gets its run-time weights.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== b2bncu 1/2: B2b, chunk GDN B8 T4096 H16 K=V=128 (the backward's launch)"
JOB_NCU_SKIP=0 job_ncu b2bncu_local 70 'chunk_grads_local_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
echo "== b2bncu 2/2: B2a on wgmma, same problem"
JOB_NCU_SKIP=0 job_ncu b2bncu_state 50 'chunk_grads_state_wgmma_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary b2bncu
