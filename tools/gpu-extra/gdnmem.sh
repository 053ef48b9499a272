#!/usr/bin/env bash
# gdnmem (issue 6: peak extra memory and backward time of the chunked GDN path; docs/perf/delta_rule.md
# "Chunked GDN memory (session 6)"). Runs on the H200 from the repo root after tools/gpu-check's build
# into build-gpu and the package install (cap 150 s; budget 88 s, the lead's limit for this run; $OUT/extra/ collects the logs):
#   1. the chunked GPU tests (DeltaRuleChunked*, DeltaRuleGpu.Chunked*) in the new default mode (h, dh,
#      dv_new in 16 bits, B2 writing the gradients itself; FLASHGRAD_CHUNKED_STATE16 unset);
#   2. chunk GDN B8 T4096 and B1 T32768, H16 K=V=128 bf16, in one process: forward and backward wall
#      time and torch peak extra memory (as bench/delta_rule_vs_fla.py measures it) with the session-5
#      backward (FLASHGRAD_CHUNKED_STATE16=0) and the new one, and the new gradients against the old
#      (rel RMS); then the same at B2 T4096 H8 HV16 (GVA: dq / dk still through fp32 accumulators).
#      At B8 T4096 also two experiments on the new mode: stage 2 in 8-warp blocks
#      (FLASHGRAD_CHUNKED_STATE_WARPS=8) and dv_new in w's region (FLASHGRAD_CHUNKED_DVNEW_IN_W=1).
#   3. bench/profile_delta_rule.py per-kernel times, new and old (as time allows); 4. ncu of one new B2 launch if >= 40 s
#      of the cap are left. Prints a compact table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 88 - ($(date +%s) - t0) )); }  # the lead asks for < ~90 s per script
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== gdnmem 1/4: chunked GPU tests, 16-bit backward intermediates (default)"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  env -u FLASHGRAD_CHUNKED_STATE16 timeout -k 3 "$(cap 50)" "$tests" \
    --gtest_filter='DeltaRuleChunked*:DeltaRuleGpu.Chunked*' > "$OUT/extra/gdnmem_tests.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/gdnmem_tests.log" | cut -c1-300 | tail -40
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/gdnmem_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/gdnmem_tests.log")
  summary+=("tests (16-bit mode) rc=$rc: $npass ok, $nfail failed lines")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== gdnmem 2/4: old (FLASHGRAD_CHUNKED_STATE16=0) vs new: fwd / bwd ms, peak extra MiB, grads rel RMS"
timeout -k 3 "$(cap 80)" python3 - > "$OUT/extra/gdnmem_compare.log" 2>&1 <<'EOF'
import os, torch, torch.nn.functional as F
import flashgrad

def ms(fn, reps):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps

def case(B, T, H=16, HV=16, K=128, reps=5, w8=False):
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=dt).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, HV, K, device=dev, dtype=dt).requires_grad_()
    g = (F.logsigmoid(torch.randn(B, T, HV, device=dev)) / 4).requires_grad_()
    beta = torch.rand(B, T, HV, device=dev).sigmoid().to(dt).requires_grad_()
    h0 = (torch.randn(B, HV, K, K, device=dev) * 0.1).requires_grad_()
    ins = (q, k, v, g, beta, h0)
    fn = lambda: flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, ht = fn()
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    res = {}
    # "1": the default (anything but "0"); experiments on top of it (off by default): "w8" the
    # backward's stage 2 in 8-warp blocks (FLASHGRAD_CHUNKED_STATE_WARPS=8), "dw" dv_new in w's
    # region (FLASHGRAD_CHUNKED_DVNEW_IN_W=1; its gradients must equal the default's exactly)
    for mode in ("0", "1") + (("w8", "dw") if w8 else ()):
        os.environ["FLASHGRAD_CHUNKED_STATE16"] = "0" if mode == "0" else "1"  # read at every call
        os.environ["FLASHGRAD_CHUNKED_STATE_WARPS"] = "8" if mode == "w8" else ""
        os.environ["FLASHGRAD_CHUNKED_DVNEW_IN_W"] = "1" if mode == "dw" else ""
        def both():
            o, ht = fn()
            return torch.autograd.grad((o, ht), ins, (do, dht))
        gs = both(); torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        both(); torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        f = ms(fn, reps)
        fb = ms(both, reps)
        res[mode] = (gs, f, fb - f, peak)
    rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt())
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    tag = f"B{B} T{T} H{H} HV{HV} K=V={K}"
    for mode, label in (("0", "old"), ("1", "new"), ("w8", "new, stage 2 8 warps"), ("dw", "new, dv_new in w")):
        if mode not in res: continue
        _, f, b, p = res[mode]
        print(f"ROW {tag} {label}: fwd {f:.3f} ms, bwd {b:.3f} ms, peak extra {p:.0f} MiB")
    gn, go = res["1"][0], res["0"][0]
    print(f"ROW {tag} new vs old rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, go))
          + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gn)))
    for m in ("w8", "dw"):
        if m in res:
            print(f"ROW {tag} {m} vs new rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, res[m][0], gn)))
    os.environ["FLASHGRAD_CHUNKED_STATE_WARPS"] = ""
    os.environ["FLASHGRAD_CHUNKED_DVNEW_IN_W"] = ""
    del res, gn, go
    torch.cuda.empty_cache()

case(8, 4096, w8=True)
case(1, 32768)
case(2, 4096, H=8, HV=16, reps=3)   # GVA
EOF
rc=$?
tail -12 "$OUT/extra/gdnmem_compare.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/gdnmem_compare.log")
[ $rc -eq 0 ] || summary+=("compare rc=$rc")

echo "== gdnmem 3/4: bench/profile_delta_rule.py (B8 T4096 H16 K=128), per-kernel times, new then old"
for mode in new old; do
  s16=1; [ "$mode" = old ] && s16=0
  w=""; [ "$mode" = w8 ] && w=8
  FLASHGRAD_CHUNKED_STATE16=$s16 FLASHGRAD_CHUNKED_STATE_WARPS=$w timeout -k 3 "$(cap 30)" python3 bench/profile_delta_rule.py \
    --B 8 --T 4096 --H 16 --K 128 --reps 2 > "$OUT/extra/gdnmem_profile_$mode.log" 2>&1
  echo "-- $mode (rc=$?)"
  grep -E "delta_rule::|Memset|elementwise|Self CUDA time total" "$OUT/extra/gdnmem_profile_$mode.log" | cut -c1-170 | head -16
  while IFS= read -r l; do summary+=("$mode: $l"); done < <(
    python3 tools/gpu-extra/gdnbwd_profile_ms.py "$OUT/extra/gdnmem_profile_$mode.log" 2)
done

echo "== gdnmem 4/4: ncu of one 16-bit chunk_grads_mma_kernel launch (B8 T4096 H16 K=V=128), if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  metrics='regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  timeout -k 3 "$(( $(left) - 5 ))" "$ncu_bin" --clock-control none \
    -k regex:chunk_grads_mma --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --metrics "$metrics" \
    python3 bench/profile_delta_rule.py --B 8 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$OUT/extra/gdnmem_ncu_b2.txt" 2>&1
  echo "rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|pipe_|issue_stalled|issue_active" \
    "$OUT/extra/gdnmem_ncu_b2.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -40
  d=$(grep -E "^ +Duration" "$OUT/extra/gdnmem_ncu_b2.txt" | head -1 | awk '{print $(NF-1), $NF}')
  summary+=("ncu 16-bit chunk_grads_mma_kernel: duration ${d:-?} (details: extra/gdnmem_ncu_b2.txt)")
else
  summary+=("ncu: skipped (no ncu or < 40 s left)")
fi

echo "== gdnmem summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
