#!/usr/bin/env bash
# chains (issue 6, lead, session 11): the backward's stage-2 recomputation beside B1 in one launch
# (chunked_state_chains.cuh, FLASHGRAD_CHUNKED_STATE_CHAINS=1; state_chains_wanted in chunked_stages.h).
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu (cap 150 s; logs in
# $OUT/extra/):
#   1. the chunked GDN GPU tests with the chains launch's single-fragment stage 2 (=single; the chains
#      launch itself is the default since run 11.1 where K = 128 and the blocks fit one wave);
#   2. chunk GDN bf16 K=V=128 B1 T32768 H16 (off / on / single) and B1 T8192 H16 (off / on), per-kernel
#      times, wall ms, gradients of on against off;
#   3. ncu of the chains kernel at B1 T32768 (occupancy, issue active, stalls);
#   4. fla's per-kernel CUDA times (chunk GDN B8 T4096 and B1 T32768, chunk KDA B4 T4096; H16 K=V=128),
#      for comparison with flashgrad's stages.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== chains 1/4: chunked GDN GPU tests, FLASHGRAD_CHUNKED_STATE_CHAINS=single (=1 is the default since run 11.1)"
job_tests chains_tests 40 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_STATE_CHAINS=single

echo "== chains 2/4: off / on at B1 T32768 and B1 T8192"
job_compare chains_32k 30 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_STATE_CHAINS \
  --variants off=0,on=1,single=single --focus 'state_chains|state_backward|chunk_state_kernel|dv_local' --reps 5,5,2
job_compare chains_8k 20 --kind gdn --shape 1,8192,16,128 --env FLASHGRAD_CHUNKED_STATE_CHAINS \
  --variants off=0,on=1 --focus 'state_chains|state_backward|chunk_state_kernel|dv_local' --reps 5,5,2

echo "== chains 3/4: ncu of the chains kernel at B1 T32768"
FLASHGRAD_CHUNKED_STATE_CHAINS=1 JOB_NCU_SKIP=0 job_ncu chains_ncu 25 'chunk_state_chains' 0 FLASHGRAD_CHUNKED_STATE_CHAINS=1 -- \
  --B 1 --T 32768

echo "== chains 4/4: fla's kernels (GDN B8 T4096, GDN B1 T32768, KDA B4 T4096; forward + backward)"
if [ "$(left)" -gt 20 ]; then
  # fla's autotune results carried from earlier runs (as deltabench.sh), so it skips the search.
  export TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=/tmp/flashgrad-triton-cache-chains
  mkdir -p "$TRITON_CACHE_DIR"; [ -d .triton-autotune ] && cp -r .triton-autotune/. "$TRITON_CACHE_DIR"/
  timeout -k 3 "$(cap 45)" python3 - > "$OUT/extra/chains_fla_profile.log" 2>&1 <<'PY'
import torch, torch.nn.functional as F
import fla.ops.common.chunk_o as chunk_o
chunk_o.TRITON_ABOVE_3_4_0 = False  # timing only (as bench/delta_rule_vs_fla.py)
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from fla.ops.kda import chunk_kda
dev = "cuda"
def profile(name, f, B, T, H, K, kda):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
    g = (F.logsigmoid(torch.randn((B, T, H, K) if kda else (B, T, H), device=dev)) / 4).requires_grad_()
    beta = torch.rand(B, T, H, device=dev).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(B, H, K, K, device=dev) * 0.1).requires_grad_()
    def step():
        o, ht = f(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)
        torch.autograd.backward((o, ht), (torch.ones_like(o), torch.ones_like(ht)))
    for _ in range(3): step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2): step()
        torch.cuda.synchronize()
    print(f"fla {name} B{B} T{T} H{H} K=V={K}: per-kernel CUDA time, 2 forward+backward steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
profile("chunk GDN", chunk_gated_delta_rule, 8, 4096, 16, 128, False)
profile("chunk GDN", chunk_gated_delta_rule, 1, 32768, 16, 128, False)
profile("chunk KDA", chunk_kda, 4, 4096, 16, 128, True)
PY
  echo "fla profile rc=$?"; grep -E "^fla |Self CUDA time total|kernel" "$OUT/extra/chains_fla_profile.log" | awk '{print substr($0,1,72), $(NF-3), $(NF-1), $NF}' | head -60
fi

job_summary chains
