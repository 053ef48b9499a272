#!/usr/bin/env bash
# prologue (issue 6, session 20): the per-item kernels' prologues after run 20.1's ncu of B2b / B2a
# (tools/gpu-extra/b2bncu.sh): chunk entries computed for uniform batches (chunk_info), B2b's global
# loads issued before its copies (one of G / beta / dG per thread), B2a's entry read once for both of
# its steps. After tools/gpu-check's build into build-gpu, one process per shape, every chunk_* kernel's
# CUDA time per call, B2a v6 (mma.sync) and the default (wgmma), both with the new B2b, to set beside
# run 20.1's rows of b2wg.sh (commit 2794fbd, the same shapes and script):
#   B8 T4096 K=V=128: B2b 0.883 / 0.883 / 0.886, B2a wg 0.542, v6 0.627 ms;
#   B1 T32768:        B2b 0.880 / 0.882,         B2a wg 0.530, v6 0.616;
#   B8 T4096 K=V=64:  B2b 0.577 / 0.578,         B2a wg 0.251, v6 0.265.
# Predictions and outcomes: docs/perf/delta_rule.md "Session 20" (run 20.2: the first step; 20.3: the
# second, B2b only). First step's prediction: B2b 0.883 -> 0.80-0.85 ms at B8, B2a 0.542 ->
# 0.51-0.53, the other per-item kernels (stage 1, stage 3, dv_local) -0-2 %.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
V=FLASHGRAD_CHUNKED_B2_SPLIT

echo "== prologue 1/1: B2 v6 / default: B8 T4096, B1 T32768, B8 K=V=64 (one process each)"
job_compare prologue_b8 30 --kind gdn --shape 8,4096,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.1: B2b 0.883, B2a wg 0.542, v6 0.627; 20.2: B2b 0.836)"
job_compare prologue_t32k 30 --kind gdn --shape 1,32768,16,128 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.1: B2b 0.882, B2a wg 0.530, v6 0.616; 20.2: B2b 0.838)"
job_compare prologue_k64 25 --kind gdn --shape 8,4096,16,64 --env $V \
  --variants v6=v6,default=- --focus 'chunk_grads' --note "(run 20.1: B2b 0.578, B2a wg 0.251, v6 0.265; 20.2: B2b 0.526)"

job_summary prologue
