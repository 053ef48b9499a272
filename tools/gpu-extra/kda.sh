#!/usr/bin/env bash
# kda (issue 6: speed of the chunked KDA stages; docs/perf/delta_rule.md "KDA stages (session 6)").
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, aims at < 90 s; $OUT/extra/ collects the logs):
#   1. the DeltaRuleChunkedKda* GPU tests (every stage against the CPU chunked reference, end to end
#      against the CPU recurrence; tests/cpp/delta_rule_chunked_kda_gpu_test.cu) with the default
#      (session-6) kernels;
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16 through flashgrad.chunk_kda, in one process: legacy
#      (FLASHGRAD_CHUNKED_KDA=legacy: the session-5 kernels of the rewritten stages) then new:
#      forward and backward wall, every kda_* kernel's CUDA time per call (torch.profiler), and the
#      new gradients against the legacy ones (rel RMS);
#   3. if >= 40 s are left: ncu of one launch each of the new kda_prepare (the backward's),
#      kda_state_backward and kda_grads kernels. Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 146 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== kda 1/3: DeltaRuleChunkedKda* GPU tests (new kernels)"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  timeout -k 3 "$(cap 40)" "$tests" --gtest_filter='DeltaRuleChunkedKda*' > "$OUT/extra/kda_tests.log" 2>&1
  rc=$?
  grep -E "vs CPU|Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/kda_tests.log" | sed -E 's/ \(bar [^)]*\)//' | cut -c1-260 | tail -40
  worst=$(awk '/rel_rms/ { for (i = 1; i <= NF; ++i) if ($i == "rel_rms") { v = $(i+1); b = $(i+3); sub(/,/, "", b);
       if (b + 0 > 0) { r = v / b; if (r > worst) { worst = r; line = $0 } } } } END { printf "%.3f (%s)", worst, line }' \
    "$OUT/extra/kda_tests.log")
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/kda_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/kda_tests.log")
  summary+=("tests rc=$rc: $npass ok, $nfail failed; worst rel_rms/bar $worst")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== kda 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, legacy vs new kernels (one process)"
timeout -k 3 "$(cap 60)" python3 - > "$OUT/extra/kda_compare.log" 2>&1 <<'EOF'
import os, re, torch, torch.nn.functional as F
import flashgrad

torch.manual_seed(0)
B, T, H, K = 4, 4096, 16, 128
dt, dev = torch.bfloat16, "cuda"
q = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
v = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
g = (F.logsigmoid(torch.randn(B, T, H, K, device=dev)) / 4).requires_grad_()
beta = torch.rand(B, T, H, device=dev).sigmoid().to(dt).requires_grad_()
h0 = (torch.randn(B, H, K, K, device=dev) * 0.1).requires_grad_()
ins = (q, k, v, g, beta, h0)

def fwd():
    return flashgrad.chunk_kda(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)

def timed(f, reps):
    f(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): f()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps

def kernel_ms(steps):
    """CUDA time per call of every kda_* kernel over `steps` forward + backward steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            o, ht = fwd()
            torch.autograd.backward((o, ht), (torch.ones_like(o), torch.ones_like(ht)))
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "kda_" not in e.key: continue
        m = re.search(r"(kda_\w+?_kernel)", e.key)
        if not m: continue
        name = m.group(1)
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        out[name] = (t / 1000.0 / max(e.count, 1), e.count // steps)
    return out

res = {}
for mode in ("legacy", "new"):
    os.environ["FLASHGRAD_CHUNKED_KDA"] = mode  # read by the launchers at every call
    o, ht = fwd()
    do, dht = torch.ones_like(o), torch.ones_like(ht)
    gs = torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
    tf = timed(lambda: fwd(), 3)
    tb = timed(lambda: torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True), 3)
    ks = kernel_ms(2)
    res[mode] = (gs, tf, tb, ks)
    print(f"ROW {mode}: forward {tf:.3f} ms, backward (incl. recomputed stages) {tb:.3f} ms (fla 0.939 / 3.947)")
    print(f"ROW {mode} per call: " + ", ".join(f"{n.replace('_kernel', '')} {ms:.3f} ms x{c}" for n, (ms, c) in sorted(ks.items())))

rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt().clamp_min(1e-30))
names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
gn, gl = res["new"][0], res["legacy"][0]
print("ROW new vs legacy rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, gl))
      + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gn)))
EOF
rc=$?
tail -8 "$OUT/extra/kda_compare.log" | cut -c1-400
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/kda_compare.log")
[ $rc -eq 0 ] || summary+=("compare rc=$rc")

echo "== kda 3/3: ncu of one launch each of kda_prepare (backward's), kda_state_backward, kda_grads (new), if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  metrics='regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  # Launch order of a step: prepare, state, output (forward), prepare, state, state_backward, grads.
  FLASHGRAD_CHUNKED_KDA=new timeout -k 3 "$(( $(left) - 5 ))" "$ncu_bin" --clock-control none \
    -k 'regex:kda_(prepare|state_backward|grads)_kernel' --launch-skip 1 --launch-count 3 --section SpeedOfLight \
    --section WarpStateStats --section InstructionStats --section Occupancy --metrics "$metrics" \
    python3 bench/profile_delta_rule.py --kind kda --B 4 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$OUT/extra/kda_ncu.txt" 2>&1
  echo "rc=$?"
  grep -E "kda_[a-z_]+_kernel|Duration|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  |pipe_(tensor|alu|fma|fp64|lsu|xu).*pct|stalled_(long|short|wait|barrier|math|mio|lg|no_inst|dispatch|branch).*pct|issue_active" \
    "$OUT/extra/kda_ncu.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | cut -c1-160 | head -90
  while IFS= read -r l; do summary+=("ncu $l"); done < <(awk '/kda_[a-z_]+_kernel/ { match($0, /kda_[a-z_]+_kernel/); k = substr($0, RSTART, RLENGTH) }
       /^ +Duration/ { print k ": " $(NF-1) " " $NF }' "$OUT/extra/kda_ncu.txt")
else
  summary+=("ncu: skipped (no ncu or < 40 s left)")
fi

echo "== kda summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
