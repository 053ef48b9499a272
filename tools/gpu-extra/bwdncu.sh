#!/usr/bin/env bash
# bwdncu (issue 6, prepared in session 20; not run yet): where the chunked GDN's other large kernels
# spend their warps' time, as b2bncu.sh did for B2 (run 20.1 found B2b's prologue latencies that way:
# docs/perf/delta_rule.md "Session 20"). After tools/gpu-check's build and package install, ncu of one
# launch each at chunk GDN B8 T4096 H16 K=V=128 bf16 (the issue's first row), with source counters: stall
# samples and executed instructions per segment between block barriers (kdaprep_ncu_source.py).
#   1. B1, the backward's serial chain (chunk_state_backward_transposed_kernel, 0.53 ms per call);
#   2. stage 1 (chunk_prepare_compact_kernel, 0.275 ms, run twice per step: forward and the backward's
#      rerun; the second launch, the backward's, is profiled);
#   3. the state rebuild from v_new (chunk_state_from_vnew_wide_kernel, 0.215 ms);
#   4. the forward's fused state + output chain (chunk_state_kernel, 0.62 ms; the first launch).
# ~25 s each.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
P=(--kind gdn --B 8 --T 4096 --H 16 --K 128)

echo "== bwdncu 1/4: B1 (chunk_state_backward_transposed_kernel)"
JOB_NCU_SKIP=0 job_ncu bwdncu_b1 45 'chunk_state_backward_transposed_kernel' 1 - -- "${P[@]}"
echo "== bwdncu 2/4: stage 1, the backward's rerun (chunk_prepare_compact_kernel, second launch)"
JOB_NCU_SKIP=1 job_ncu bwdncu_prep 45 'chunk_prepare_compact_kernel' 1 - -- "${P[@]}"
echo "== bwdncu 3/4: the state rebuild (chunk_state_from_vnew_wide_kernel)"
JOB_NCU_SKIP=0 job_ncu bwdncu_rebuild 45 'chunk_state_from_vnew_wide_kernel' 1 - -- "${P[@]}"
echo "== bwdncu 4/4: the forward chain with output (chunk_state_kernel, first launch)"
JOB_NCU_SKIP=0 job_ncu bwdncu_fwd 45 'chunk_state_kernel' 1 - -- "${P[@]}"

job_summary bwdncu
