#!/usr/bin/env bash
# b1local (issue 6, lead, session 9): B1 without P on its serial chain. FLASHGRAD_CHUNKED_B1_LOCAL=4 / 2:
# the chunk-parallel B0 (chunk_dv_local_kernel, chunked_dv_local.cuh) forms dv_local = do^T scale P for
# every chunk into dv_new's buffer, then B1 (kLocal) runs in blocks of 4 / 2 warps and only adds it.
# Applies where dv_new has its own buffer (few chains at V = 128: B1 T32768, B2 T16384), not where the
# 8-warp B1 puts dv_new in w's region (B8 T4096; V = 64).
# 1. The chunked GDN GPU tests with =2 and =4 (float64 references).
# 2. In one process per shape, the default vs =4 vs =2: forward / backward wall, B0 + B1 CUDA time,
#    gradients against the default's.
# Prediction (before any run; ncu of run 9.2 puts ~58% of B1's stall samples in its dh-independent
# part): B1 T32768 H16 K=V=128: B1 4.48 ms -> 2.6-3.2 ms with =4 (32 blocks), 2.0-2.8 ms with =2
# (64 blocks), plus B0 ~0.25-0.35 ms (64 x 16 chunk items, like the unfused output stage's 0.43 ms
# without its q h product); backward 8.8 -> 7.0-7.8 ms. Gradients: dv_new gains one rounding of
# dv_local to bf16 (~1e-3 rel RMS against the default). Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
echo "== b1local 1/2: chunked GDN GPU tests with FLASHGRAD_CHUNKED_B1_LOCAL=2 and =4"
job_tests b1local_tests2 30 'DeltaRuleChunkedGpu.*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.Gdn*' FLASHGRAD_CHUNKED_B1_LOCAL=2
job_tests b1local_tests4 30 'DeltaRuleChunkedGpu.*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.Gdn*' FLASHGRAD_CHUNKED_B1_LOCAL=4
for shape in 1,32768,16,128 2,16384,16,128; do
  echo "== b1local 2/2: chunk GDN B,T,H,K = $shape bf16, B1 default / local 4 warps / local 2 warps"
  job_compare "b1local_${shape//,/_}" 40 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_B1_LOCAL \
    --variants default=-,local4=4,local2=2 --focus 'state_backward|dv_local' --reps 3,3,1
done
job_summary b1local
