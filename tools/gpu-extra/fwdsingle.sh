#!/usr/bin/env bash
# fwdsingle (issue 6, session 7): the chunked GDN forward's fused state + output kernel with single-
# fragment products (chunk_state_kernel kSingle, the default) against the hi + lo kernel of session 6
# (FLASHGRAD_CHUNKED_FWD_SPLIT=1), in one process; docs/perf/delta_rule.md "Forward state kernel:
# single-fragment products (session 7)". After gpu-check's build and install:
#   1. DeltaRuleChunked* and DeltaRuleGpu.Chunked* GPU tests with the hi + lo kernel (the default's
#      run in gpu-check's own test step);
#   2. chunk GDN B8 T4096 H16, K=V=128 and K=V=64, bf16: forward wall (do_bench), the state kernel's
#      time per call (torch.profiler), o of the two kernels against each other and against an fp32
#      recurrence is not recomputed here (the tests do that).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
summary=()
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  FLASHGRAD_CHUNKED_FWD_SPLIT=1 timeout -k 3 60 "$tests" --gtest_filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*' \
    > "$OUT/extra/fwdsingle_tests_split.log" 2>&1
  summary+=("tests with FWD_SPLIT=1 rc=$?: $(grep -cE '^\[       OK \]' "$OUT/extra/fwdsingle_tests_split.log") ok, $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/extra/fwdsingle_tests_split.log") failed")
fi
timeout -k 3 70 python3 - > "$OUT/extra/fwdsingle.log" 2>&1 <<'PY'
import os
import torch, torch.nn.functional as F
from triton.testing import do_bench
import flashgrad

def inputs(K, B=8, T=4096, H=16):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dt)
    v = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda")) / 4
    beta = torch.rand(B, T, H, device="cuda").sigmoid().to(dt)
    h0 = torch.randn(B, H, K, K, device="cuda") * 0.1
    return q, k, v, g, beta, h0

for K in (128, 64):
    q, k, v, g, beta, h0 = inputs(K)
    call = lambda: flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                    output_final_state=True)
    res = {}
    for mode in ("1", "0"):  # split (session 6), single (default)
        os.environ["FLASHGRAD_CHUNKED_FWD_SPLIT"] = mode
        o, ht = call(); torch.cuda.synchronize()
        ms = do_bench(call, warmup=10, rep=50, return_mode="median")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        st = [e for e in prof.key_averages() if "chunk_state_kernel" in e.key]
        st_ms = sum(e.self_device_time_total for e in st) / 3 / 1e3
        res[mode] = (o.float(), ht.float())
        print(f"K=V={K} {'split ' if mode == '1' else 'single'}: forward {ms:.3f} ms, state+output kernel {st_ms:.3f} ms", flush=True)
    rel = lambda a, b: ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
    print(f"K=V={K} single vs split: o rel RMS {rel(res['0'][0], res['1'][0]):.2e}, ht rel RMS {rel(res['0'][1], res['1'][1]):.2e}", flush=True)
PY
summary+=("bench rc=$?:")
while read -r line; do summary+=("  $line"); done < <(grep -E "^K=V=" "$OUT/extra/fwdsingle.log")
echo "== fwdsingle summary"
printf '%s\n' "${summary[@]}"
