#!/usr/bin/env bash
# gdnprep (issue 6: the chunked GDN stage 1, chunked_prepare_compact.cuh; docs/perf/delta_rule.md
# "GDN stage 1 (session 8)"). Runs on the H200 from the repo root after tools/gpu-check's build into
# build-gpu and the package install (cap 150 s, aims at <= 140 s; logs in $OUT/extra/):
#   1. the chunked GDN GPU tests (and the past-2^31-elements test) with the compact stage 1
#      (FLASHGRAD_CHUNKED_PREPARE=compact; opt-in: the default stays the session-6 kernel until a GPU
#      run has measured the compact one);
#   2. one python process, chunk GDN B8 T4096 H16 K=V=128 bf16 (L2 norm in kernel) through
#      flashgrad.chunk_gated_delta_rule: the old stage 1 (FLASHGRAD_CHUNKED_PREPARE=old = unset: the
#      default; read per call), the compact one with the CUDA-core inverse (=fma), then the compact one
#      with the tensor-core inverse (=compact): forward and backward wall, the stage-1 kernel's CUDA time
#      per call and calls per step (torch.profiler), and the fma / compact outputs and gradients
#      against the old ones (rel RMS);
#   3. if >= 35 s are left: ncu of one launch of the compact stage 1 (occupancy, issue, stalls) with its
#      warp-stall samples per phase (segments between barriers: kdaprep_ncu_source.py), then the old
#      one's headline numbers if time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 138 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== gdnprep 1/3: chunked GDN GPU tests, compact stage 1 (FLASHGRAD_CHUNKED_PREPARE=compact)"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
if [ -n "$tests" ]; then
  # PastTwoToThe31Elements: int64 offsets past 2^31 elements (v of 2.2e9) through the chunked path too.
  FLASHGRAD_CHUNKED_PREPARE=compact timeout -k 3 "$(cap 50)" "$tests" \
    --gtest_filter='DeltaRuleChunkedGpu*:DeltaRuleGpu.Chunked*:DeltaRuleGpu.PastTwoToThe31Elements' \
    > "$OUT/extra/gdnprep_tests.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/gdnprep_tests.log" | cut -c1-300 | tail -30
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/gdnprep_tests.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/gdnprep_tests.log")
  summary+=("tests (FLASHGRAD_CHUNKED_PREPARE=compact) rc=$rc: $npass ok, $nfail failed lines")
else
  summary+=("tests: no flashgrad_gpu_tests binary under build-gpu")
fi

echo "== gdnprep 2/3: chunk GDN B8 T4096 H16 K=V=128 bf16, old vs fma vs compact stage 1 (one process)"
timeout -k 3 "$(cap 50)" python3 - > "$OUT/extra/gdnprep_compare.log" 2>&1 <<'EOF'
import os, re, torch, torch.nn.functional as F
import flashgrad

torch.manual_seed(0)
B, T, H, K = 8, 4096, 16, 128
dt, dev = torch.bfloat16, "cuda"
q = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt).requires_grad_()
v = torch.randn(B, T, H, K, device=dev, dtype=dt, requires_grad=True)
g = (F.logsigmoid(torch.randn(B, T, H, device=dev)) / 4).requires_grad_()
beta = torch.rand(B, T, H, device=dev).sigmoid().to(dt).requires_grad_()
h0 = (torch.randn(B, H, K, K, device=dev) * 0.1).requires_grad_()
ins = (q, k, v, g, beta, h0)

def fwd():
    return flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)

def timed(f, reps):
    f(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): f()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps

def kernel_ms(steps):
    """CUDA time per call and calls per step of every chunk_* kernel over `steps` forward + backward steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            o, ht = fwd()
            torch.autograd.backward((o, ht), (torch.ones_like(o), torch.ones_like(ht)))
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        m = re.search(r"(chunk_\w+?_kernel)", e.key)
        if not m: continue
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        ms, c = out.get(m.group(1), (0.0, 0))
        out[m.group(1)] = (ms + t / 1000.0, c + e.count)
    return {n: (ms / max(c, 1), c // steps) for n, (ms, c) in out.items()}

res = {}
for mode in ("old", "fma", "compact"):
    os.environ["FLASHGRAD_CHUNKED_PREPARE"] = mode  # read by the stage-1 launcher at every call
    o, ht = fwd()
    do, dht = torch.ones_like(o), torch.ones_like(ht)
    gs = torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True)
    tf = timed(lambda: fwd(), 10)
    tb = timed(lambda: torch.autograd.grad((o, ht), ins, (do, dht), retain_graph=True), 5)
    ks = kernel_ms(3)
    res[mode] = ((o.detach(), ht.detach()) + tuple(gs), tf, tb, ks)
    prep = {n: v for n, v in ks.items() if "prepare" in n}
    print(f"ROW {mode}: forward {tf:.3f} ms, backward {tb:.3f} ms; stage 1 " +
          ", ".join(f"{n} {ms:.3f} ms x{c}/step" for n, (ms, c) in sorted(prep.items())) + " (fla kkt+solve+wu 0.35)")
    print(f"INFO {mode} per call: " + ", ".join(f"{n.replace('_kernel', '')} {ms:.3f} ms x{c}" for n, (ms, c) in sorted(ks.items())))

rel = lambda x, r: float((x.float() - r.float()).pow(2).mean().sqrt() / r.float().pow(2).mean().sqrt().clamp_min(1e-30))
names = ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
go = res["old"][0]
for mode in ("fma", "compact"):
    gn = res[mode][0]
    print(f"ROW {mode} vs old rel RMS: " + " ".join("%s %.2e" % (n, rel(a, b)) for n, a, b in zip(names, gn, go))
          + " | finite " + str(all(bool(torch.isfinite(x).all()) for x in gn)))
EOF
rc=$?
grep -E "^(ROW|INFO)" "$OUT/extra/gdnprep_compare.log" | cut -c1-500
[ $rc -eq 0 ] || { tail -5 "$OUT/extra/gdnprep_compare.log" | cut -c1-300; summary+=("compare rc=$rc"); }
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/gdnprep_compare.log")

echo "== gdnprep 3/3: ncu of one launch of the compact (then the old) stage 1, if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 35 ]; then
  metrics='regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  for mode in compact old; do
    [ "$(left)" -gt 15 ] || break
    if [ $mode = compact ]; then kname=chunk_prepare_compact_kernel; lim=$(( $(left) * 2 / 3 )); src="--section SourceCounters"
    else kname=chunk_prepare_kernel; lim=$(( $(left) - 2 )); src=""; fi
    rep="$OUT/extra/gdnprep_ncu_$mode"
    FLASHGRAD_CHUNKED_PREPARE=$mode timeout -k 3 "$lim" "$ncu_bin" --clock-control none \
      -k "regex:$kname" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section InstructionStats --section Occupancy --section LaunchStats $src --metrics "$metrics" -f -o "$rep" \
      python3 bench/profile_delta_rule.py --B 8 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
      > "$rep.log" 2>&1
    echo "ncu $mode rc=$?"
    [ -f "$rep.ncu-rep" ] || { tail -3 "$rep.log"; continue; }
    timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    grep -E "chunk_[a-z_]+_kernel|Duration|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Block Limit (Shared|Registers)|Dynamic Shared|stalled_(long|short|wait|barrier|math|mio|lg|no_inst|dispatch|branch).*pct|issue_active" \
      "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | cut -c1-160 | head -30
    while IFS= read -r l; do summary+=("ncu $mode $l"); done < <(awk '/chunk_[a-z_]+_kernel/ { match($0, /chunk_[a-z_]+_kernel/); k = substr($0, RSTART, RLENGTH) }
         /^ +Duration/ { d = $(NF-1) " " $NF } /Executed Instructions  / { n = $NF } /Achieved Occupancy/ { oc = $NF }
         /issue_active/ { ia = $NF } END { if (k != "") print k ": " d ", instructions " n ", occupancy " oc "%, issue active " ia "%" }' "$rep.txt")
    if [ $mode = compact ] && [ "$(left)" -gt 25 ]; then  # where the compact kernel's warps wait, by phase (segments between barriers)
      timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
      python3 tools/gpu-extra/kdaprep_ncu_source.py "$rep.csv" 2>&1 | head -70
      gzip -f "$rep.csv"
    fi
    rm -f "$rep.ncu-rep"  # the text and csv come back
  done
else
  summary+=("ncu: skipped (no ncu or < 35 s left)")
fi

echo "== gdnprep summary (commit $(git rev-parse --short HEAD 2>/dev/null), $(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
