#!/usr/bin/env bash
# st2b8 (issue 6, session 12, lead): where the chunked GDN stage 2 spends its time at many chains
# (B8 T4096 H16 K=V=128 bf16: 128 chains, stage 2's 4-warp blocks two per SM): ncu with source
# counters (warp-stall samples per phase, tools/gpu-extra/kdaprep_ncu_source.py) of
#   1. the backward's recomputation (chunk_state_kernel unfused, 0.38 ms per call in run 11.4; fla's
#      h recurrence 0.219 ms), the second chunk_state_kernel launch of the first step;
#   2. the forward's fused state + output kernel (0.56 ms; fla's h + o 0.219 + 0.252), the first.
# Runs on the H200 from the repo root after tools/gpu-check's build (cap 150 s, budget 138 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== st2b8 1/2: ncu of the backward's stage-2 recomputation, B8 T4096 H16 K=V=128"
JOB_NCU_SKIP=1 job_ncu st2b8_ncu_bwd 60 'chunk_state_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128
echo "== st2b8 2/2: ncu of the forward's fused state + output kernel"
JOB_NCU_SKIP=0 job_ncu st2b8_ncu_fwd 60 'chunk_state_kernel' 1 - -- --kind gdn --B 8 --T 4096 --H 16 --K 128

job_summary st2b8
