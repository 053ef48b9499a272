#!/usr/bin/env bash
# b1warps (issue 6, lead, session 8): the transposed B1's block shape for few long sequences.
# chunk GDN B1 T32768 H16 K=V=128 bf16 (16 chains: the rule picks 2 warps, 64 blocks) and, as a
# control, B8 T4096 H16 (the rule picks 8): in one process each, FLASHGRAD_CHUNKED_B1_WARPS=2 / 4 / 8
# (read per call) against the rule: forward / backward wall, the B1 kernel's CUDA time per call
# (torch.profiler), and the gradients against the rule's choice (rel RMS; the shapes compute the same
# sums per column, so they should agree to rounding). Prints a summary last. Cap 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
for shape in 1,32768,16,128 8,4096,16,128; do
  echo "== b1warps: chunk GDN B,T,H,K = $shape bf16, B1 warps by the rule / 2 / 4 / 8"
  job_compare "b1warps_${shape%%,*}" 65 --kind gdn --shape "$shape" --env FLASHGRAD_CHUNKED_B1_WARPS \
    --variants rule=-,w2=2,w4=4,w8=8 --focus state_backward --reps 3,3,1
done
job_summary b1warps
