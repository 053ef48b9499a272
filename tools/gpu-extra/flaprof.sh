#!/usr/bin/env bash
# flaprof (issue 6, lead, session 11): fla's per-kernel CUDA times (fla-core, torch.profiler), chunk GDN
# B8 T4096 and B1 T32768, chunk KDA B4 T4096 (H16 K=V=128 bf16, forward + backward), beside which
# flashgrad's stages are compared in docs/perf/delta_rule.md. Runs on the H200 after tools/gpu-check's
# install (fla from the carried wheel; cap 150 s); log $OUT/extra/flaprof.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
JOB_BUDGET_S=140
source tools/gpu-extra/lib/job_lib.sh

echo "== flaprof: fla's kernels (GDN B8 T4096, GDN B1 T32768, KDA B4 T4096; forward + backward)"
if [ "$(left)" -gt 20 ]; then
  # fla's autotune results carried from earlier runs (as deltabench.sh), so it skips the search.
  export TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=/tmp/flashgrad-triton-cache-flaprof
  mkdir -p "$TRITON_CACHE_DIR"; [ -d .triton-autotune ] && cp -r .triton-autotune/. "$TRITON_CACHE_DIR"/
  timeout -k 3 "$(cap 120)" python3 - > "$OUT/extra/flaprof.log" 2>&1 <<'PY'
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
  echo "fla profile rc=$?"; grep -E "^fla |Self CUDA time total|kernel" "$OUT/extra/flaprof.log" | awk '{print substr($0,1,72), $(NF-3), $(NF-1), $NF}' | head -60
fi


job_summary flaprof
