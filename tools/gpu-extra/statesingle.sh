#!/usr/bin/env bash
# statesingle (issue 6, lead, session 9): the unfused stage 2 (chunk_state_kernel without kOutput: the
# forward on few long sequences, the backward's recomputation of h) with single-fragment products
# (FLASHGRAD_CHUNKED_STATE_PRODUCTS=single, as the fused forward since session 7) against hi + lo.
# 1. The chunked GDN GPU tests with =single (float64 references, the design's bars).
# 2. In one process per shape, split (default) vs single: forward / backward wall, stage 2's CUDA time
#    per call, gradients against the default's. B1 T32768 H16 K=V=128 (channel-split 2-warp blocks,
#    the forward runs it too), B8 T4096 (the backward's recomputation: 4-warp blocks).
# Prediction (before any run): chunk_state 1.51 -> 0.9-1.2 ms per call at B1 T32768 (forward 2.39 ->
# 1.8-2.1 ms), 0.42 -> 0.30-0.36 ms at B8 T4096 (its HMMA count halves: 256 -> 128 per chunk and warp,
# 4370 -> 4218 SASS instructions for the channel-split kernel; the rest is address and load work).
# Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
echo "== statesingle 1/2: chunked GDN GPU tests with FLASHGRAD_CHUNKED_STATE_PRODUCTS=single"
job_tests statesingle_tests 40 'DeltaRuleChunkedGpu.*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.PastTwoToThe31Elements' \
  FLASHGRAD_CHUNKED_STATE_PRODUCTS=single
for shape in 1,32768,16,128 8,4096,16,128; do
  echo "== statesingle 2/2: chunk GDN B,T,H,K = $shape bf16, unfused stage 2 split / single"
  job_compare "statesingle_${shape//,/_}" 45 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_STATE_PRODUCTS \
    --variants split=-,single=single --focus 'chunk_state' --reps 3,3,1
done
job_summary statesingle
