#!/usr/bin/env bash
# kdab1 (helper kdab1, session 9): KDA backward stage B1, the transposed, pipelined kernel
# (kda_state_backward_transposed_kernel, chunked_kda_state_backward_transposed.cuh; opt-in:
# FLASHGRAD_CHUNKED_KDA_B1=transposed) against the session-6 kernel (kda_state_backward_kernel, the
# default: 2.2 ms per call, ~34 us per chunk).
# 1. The KDA GPU tests with =transposed (float64 references, the design's bars).
# 2. In one process, old vs transposed at B4 T4096 H16 K=V=128 bf16: forward / backward wall, B1's
#    CUDA time per call, gradients against the default's.
# 3. ncu of one launch of the transposed kernel (stalls, issue activity), if more than 30 s are left.
# Prediction (written before any run): B1 2.2 -> 0.45-0.60 ms per call, most likely ~0.52 (7-9 us per
# chunk: 2 barriers, 106 HMMA per warp and chunk, 128 blocks of 8 warps on 132 SMs; ~2000 SASS
# instructions per warp and chunk against the transposed stage 2's ~1160 at 5.1 us per chunk and 26%
# issue-active, which it resembles; ~200 KB of unique traffic per chain and chunk puts a memory floor
# near 0.25 ms); backward wall down by ~1.6 ms; gradients within ~2e-3 rel RMS of the old kernel's (qg
# and kd rounded to T once, as fla; host emulation: dv_new 2.2e-3, dh0 2.0e-3 rel RMS against float64
# where the old kernel has 4e-6 / 4e-5). Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
echo "== kdab1 1/3: KDA GPU tests with FLASHGRAD_CHUNKED_KDA_B1=transposed"
job_tests kdab1_tests 45 'DeltaRuleChunkedKdaGpu.*:DeltaRuleGpu.Kda*:DeltaRuleGpu.ChunkedAlgorithmMatches' \
  FLASHGRAD_CHUNKED_KDA_B1=transposed
echo "== kdab1 2/3: KDA B,T,H,K = 4,4096,16,128 bf16, B1 old / transposed"
job_compare kdab1_compare 60 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_B1 \
  --variants old=-,transposed=transposed --focus state_backward --reps 3,3,1
echo "== kdab1 3/3: ncu of one launch of the transposed B1, if time is left"
if [ "$(left)" -gt 30 ]; then
  job_ncu kdab1_ncu $(( $(left) - 4 )) kda_state_backward_transposed_kernel 0 FLASHGRAD_CHUNKED_KDA_B1=transposed \
    -- --kind kda --B 4 --T 4096 --H 16 --K 128
else
  summary+=("ncu: skipped (< 30 s left)")
fi
job_summary kdab1
