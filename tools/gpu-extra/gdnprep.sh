#!/usr/bin/env bash
# gdnprep (issue 6: the chunked GDN stage 1, chunked_prepare_compact.cuh; docs/perf/delta_rule.md
# "GDN stage 1 (session 8)"). Runs on the H200 from the repo root after tools/gpu-check's build into
# build-gpu and the package install (cap 150 s, aims at <= 140 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests (and the past-2^31-elements test) with the compact stage 1
#      (FLASHGRAD_CHUNKED_PREPARE=compact; opt-in: the default stays the session-6 kernel until a GPU
#      run has measured the compact one);
#   2. one python process, chunk GDN B8 T4096 H16 K=V=128 bf16 (L2 norm in kernel) through
#      flashgrad.chunk_gated_delta_rule: the old stage 1 (FLASHGRAD_CHUNKED_PREPARE=old = unset: the
#      default; read per call), the compact one with the CUDA-core inverse (=fma), then the compact one
#      with the tensor-core inverse (=compact): forward and backward wall, the stage-1 kernel's CUDA time
#      per call and calls per step (torch.profiler), and the fma / compact outputs and gradients
#      against the old ones (rel RMS);
#   3. if >= 35 s are left: ncu of one launch of the compact stage 1 (occupancy, issue, stalls) with its
#      warp-stall samples per phase (segments between barriers: kdaprep_ncu_source.py), then the old
#      one's headline numbers if time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== gdnprep 1/3: chunked GDN GPU tests, compact stage 1 (FLASHGRAD_CHUNKED_PREPARE=compact)"
# PastTwoToThe31Elements: int64 offsets past 2^31 elements (v of 2.2e9) through the chunked path too.
job_tests gdnprep_tests 50 'DeltaRuleChunkedGpu*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.PastTwoToThe31Elements' \
  FLASHGRAD_CHUNKED_PREPARE=compact

echo "== gdnprep 2/3: chunk GDN B8 T4096 H16 K=V=128 bf16, old vs fma vs compact stage 1 (one process)"
job_compare gdnprep_compare 50 --kind gdn --shape 8,4096,16,128 --env FLASHGRAD_CHUNKED_PREPARE \
  --variants old=-,fma=fma,compact=compact --focus prepare --note "fla kkt+solve+wu 0.35" --reps 10,5,3

echo "== gdnprep 3/3: ncu of one launch of the compact (then the old) stage 1, if time is left"
if [ "$(left)" -gt 35 ]; then
  job_ncu gdnprep_ncu_compact $(( $(left) * 2 / 3 )) chunk_prepare_compact_kernel 1 FLASHGRAD_CHUNKED_PREPARE=compact \
    -- --B 8 --T 4096 --H 16 --K 128
  job_ncu gdnprep_ncu_old $(( $(left) - 2 )) chunk_prepare_kernel 0 - -- --B 8 --T 4096 --H 16 --K 128
else
  summary+=("ncu: skipped (< 35 s left)")
fi
job_summary gdnprep
