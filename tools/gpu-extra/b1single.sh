#!/usr/bin/env bash
# b1single (issue 6, lead, session 9): B1 (chunk_state_backward_transposed_kernel) with single-fragment
# products (FLASHGRAD_CHUNKED_B1_PRODUCTS=single: each fp32 operand rounded to T once, as fla's
# backward; half the mmas) against the default hi + lo products.
# 1. The chunked GDN GPU tests with =single (float64 references, the design's bars).
# 2. In one process per shape, split (default) vs single: forward / backward wall, B1's CUDA time per
#    call, and the gradients against the default's (rel RMS). Shapes: B8 T4096 H16 K=V=128 (8-warp
#    blocks), B1 T32768 (4-warp blocks), B8 T4096 K=V=64.
# Prediction (written before any run): B1 0.74 -> 0.40-0.50 ms at B8 T4096, 5.1 -> 3.0-4.0 ms at B1
# T32768; dq / dk / dv move by ~1e-3 rel RMS against the split kernel's. Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
echo "== b1single 1/2: chunked GDN GPU tests with FLASHGRAD_CHUNKED_B1_PRODUCTS=single"
job_tests b1single_tests 40 'DeltaRuleChunkedGpu.*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.PastTwoToThe31Elements' \
  FLASHGRAD_CHUNKED_B1_PRODUCTS=single
for shape in 8,4096,16,128 1,32768,16,128 8,4096,16,64; do
  echo "== b1single 2/2: chunk GDN B,T,H,K = $shape bf16, B1 split / single"
  job_compare "b1single_${shape//,/_}" 32 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_B1_PRODUCTS \
    --variants split=-,single=single --focus state_backward --reps 3,3,1
done
job_summary b1single
