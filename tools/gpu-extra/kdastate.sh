#!/usr/bin/env bash
# kdastate (issue 6: chunked KDA stage 2, docs/perf/delta_rule.md "KDA stage 2 (session 8)").
# Runs on the H200 from the repo root after tools/gpu-check's build into build-gpu and the package
# install (cap 150 s, aims at <= 140 s; $OUT/extra/ collects the logs):
#   1. the DeltaRuleChunkedKda* GPU tests, DeltaRuleGpu.ChunkedAlgorithmMatches (its KDA cases) and
#      DeltaRuleGpu.Kda* with FLASHGRAD_CHUNKED_KDA_STATE=transposed (the session-8 kernel, single-
#      fragment products; opt-in: the default is still session 6's kda_state_kernel); the
#      DeltaRuleChunkedKda* ones again with =split (the session-8 kernel with hi + lo operands);
#   2. chunk KDA B4 T4096 H16 K=V=128 bf16 through flashgrad.chunk_kda, in one process: the old
#      stage 2 (the default, "old"), =split, then =transposed ("new"): forward and backward wall,
#      every kda_* kernel's CUDA time per call (torch.profiler), and the output / final state /
#      gradients of split and new against the old ones (rel RMS);
#   3. if >= 30 s are left: ncu of one launch of the new stage 2.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 138 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== kdastate 1/3: KDA GPU tests with FLASHGRAD_CHUNKED_KDA_STATE=transposed (and =split)"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  FLASHGRAD_CHUNKED_KDA_STATE=transposed timeout -k 3 "$(cap 45)" "$tests" --gtest_filter='DeltaRuleChunkedKda*:DeltaRuleGpu.ChunkedAlgorithmMatches:DeltaRuleGpu.Kda*' \
    > "$OUT/extra/kdastate_tests.log" 2>&1
  rc=$?
  grep -E "kda.*(vs CPU|rel_rms)|Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/kdastate_tests.log" | sed -E 's/ \(bar [^)]*\)//' | cut -c1-260 | tail -30
  worst=$(awk '/rel_rms/ { for (i = 1; i <= NF; ++i) if ($i == "rel_rms") { v = $(i+1); b = $(i+3); sub(/,/, "", b);
       if (b + 0 > 0) { r = v / b; if (r > worst) { worst = r; line = $0 } } } } END { printf "%.3f (%s)", worst, line }' \
    "$OUT/extra/kdastate_tests.log")
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/kdastate_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/kdastate_tests.log")
  summary+=("tests with =transposed rc=$rc: $npass ok, $nfail failed; worst rel_rms/bar $worst")
  FLASHGRAD_CHUNKED_KDA_STATE=split timeout -k 3 "$(cap 25)" "$tests" --gtest_filter='DeltaRuleChunkedKda*' \
    > "$OUT/extra/kdastate_tests_split.log" 2>&1
  rc=$?
  summary+=("tests with =split rc=$rc: $(grep -cE '^\[       OK \]' "$OUT/extra/kdastate_tests_split.log") ok, $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/extra/kdastate_tests_split.log") failed")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== kdastate 2/3: chunk KDA B4 T4096 H16 K=V=128 bf16, old vs new stage 2 (one process)"
timeout -k 3 "$(cap 70)" python3 - > "$OUT/extra/kdastate_compare.log" 2>&1 <<'EOF'
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
        m = re.search(r"(kda_\w+?_kernel)", e.key)
        if not m: continue
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        out[m.group(1)] = (t / 1000.0 / max(e.count, 1), e.count // steps)
    return out

res = {}
for mode in ("old", "split", "new"):
    # read by the stage-2 launcher at every call: unset / "old" -> session 6's kernel
    os.environ["FLASHGRAD_CHUNKED_KDA_STATE"] = {"old": "old", "split": "split", "new": "transposed"}[mode]
    o, ht = fwd()
    do, dht = torch.ones_like(o), torch.ones_like(ht)
    gs = torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
    tf = timed(lambda: fwd(), 5)
    tb = timed(lambda: torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True), 3)
    ks = kernel_ms(2)
    res[mode] = ((o.detach(), ht.detach()) + tuple(gs), tf, tb, ks)
    st = {n: ms for n, (ms, c) in ks.items() if n.startswith("kda_state") and "backward" not in n}
    print(f"ROW {mode}: forward {tf:.3f} ms, backward {tb:.3f} ms; stage 2 " +
          ", ".join(f"{n} {ms:.3f} ms" for n, ms in sorted(st.items())) + " (fla fwd 0.95 / bwd 4.17)")
    print(f"INFO {mode} per call: " + ", ".join(f"{n.replace('_kernel', '')} {ms:.3f} ms x{c}" for n, (ms, c) in sorted(ks.items())))

rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt().clamp_min(1e-30))
names = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
go = res["old"][0]
for mode in ("split", "new"):
    gn = res[mode][0]
    print(f"ROW {mode} vs old rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, go))
          + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gn)))
EOF
rc=$?
grep -E "^(ROW|INFO)" "$OUT/extra/kdastate_compare.log" | cut -c1-400
[ $rc -eq 0 ] || { tail -5 "$OUT/extra/kdastate_compare.log" | cut -c1-300; summary+=("compare rc=$rc"); }
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/kdastate_compare.log")

echo "== kdastate 3/3: ncu of one launch of the new stage 2, if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 30 ]; then
  metrics='regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  rep="$OUT/extra/kdastate_ncu_new"
  FLASHGRAD_CHUNKED_KDA_STATE=transposed timeout -k 3 "$(( $(left) - 4 ))" "$ncu_bin" --clock-control none \
    -k "regex:kda_state_transposed_kernel" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section InstructionStats --section Occupancy --section LaunchStats --metrics "$metrics" -f -o "$rep" \
    python3 bench/profile_delta_rule.py --kind kda --B 4 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$rep.log" 2>&1
  echo "ncu rc=$?"
  if [ -f "$rep.ncu-rep" ]; then
    timeout -k 3 15 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    grep -E "kda_[a-z_]+_kernel|Duration|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Block Limit (Shared|Registers)|Dynamic Shared|stalled_(long|short|wait|barrier|math|mio|lg|no_inst|dispatch|branch|tex|drain|membar|sleep|not_selected|selected).*pct|issue_active" \
      "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | cut -c1-160 | head -34
    while IFS= read -r l; do summary+=("ncu new $l"); done < <(awk '/kda_[a-z_]+_kernel/ { match($0, /kda_[a-z_]+_kernel/); k = substr($0, RSTART, RLENGTH) }
         /^ +Duration/ { d = $(NF-1) " " $NF } /Executed Instructions  / { n = $NF } /Achieved Occupancy/ { oc = $NF }
         /issue_active/ { ia = $NF } END { if (k != "") print k ": " d ", instructions " n ", occupancy " oc "%, issue active " ia "%" }' "$rep.txt")
  else
    tail -3 "$rep.log"
  fi
else
  summary+=("ncu: skipped (no ncu or < 30 s left)")
fi

echo "== kdastate summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
