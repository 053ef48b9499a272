#!/usr/bin/env bash
# fp8fwd (issue 7, session 12): the FP8 (e4m3) attention forward at head dim 128, where it runs at
# ~835 TFLOP/s against the 1.0 PFLOP/s target. In order of importance:
#   1. same-process timing (tools/gpu-extra/fp8fwd_time.py: the env-var variants in interleaved rounds
#      on the same inputs) of the default hd 128 forward (w: kEarlyS + staggered start since session 7)
#      beside st (FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S=0: the overlapped schedule with the stagger, the
#      default before session 7), B2 H16 S8192, non-causal and causal;
#   2. ncu of the default's hd 128 kernel with source counters (per-instruction warp-stall samples,
#      summarized per opcode by tools/gpu-extra/fp8w_ncu_source.py): where its time goes today;
#   3. with the time left, ncu's pipe utilizations and stall totals of the same launch.
source "$(dirname "$0")/lib/job_lib.sh"
cd "$(dirname "$0")/../.."
V=FLASHGRAD_ATTN_FP8_WGMMA

echo "== fp8fwd: hd 128 forward, w (defaults) vs st (EARLY_S=0), B2 H16 S8192, one process"
timeout -k 3 "$(cap 45)" python3 tools/gpu-extra/fp8fwd_time.py --dims 128 --masks none,causal --rounds 3 --reps 10 \
  w=- st=${V}_EARLY_S=0 > "$OUT/extra/fp8fwd_time.log" 2>&1
rc=$?
grep -E "^(ROW|DIFF)" "$OUT/extra/fp8fwd_time.log"
[ $rc -eq 0 ] || tail -5 "$OUT/extra/fp8fwd_time.log"
summary+=("timing rc=$rc")
while IFS= read -r l; do summary+=("$l"); done < <(grep "^ROW" "$OUT/extra/fp8fwd_time.log")

ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
rep="$OUT/extra/fp8fwd_src_d128"
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  echo "== fp8fwd: ncu source-level stall samples, hd 128 non-causal default (2nd launch)"
  # Launch 1 is the warm-up call, launch 2 the one timed call (--rounds 1 --reps 1).
  timeout -k 3 "$(cap 50)" "$ncu_bin" --clock-control none -k regex:fp8_attention_forward_wgmma \
    --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$' \
    -f -o "$rep" python3 tools/gpu-extra/fp8fwd_time.py --dims 128 --masks none --rounds 1 --reps 1 w=- \
    > "$rep.log" 2>&1
  rc=$?
  summary+=("ncu source hd 128 rc=$rc")
  if [ -f "$rep.ncu-rep" ]; then
    timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|pipe_|issue_active" \
      "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -50
    timeout -k 3 25 "$ncu_bin" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
    python3 tools/gpu-extra/fp8w_ncu_source.py "$rep.csv" 2>&1 | head -120
    gzip -f "$rep.csv"
    rm -f "$rep.ncu-rep"
  else
    tail -5 "$rep.log"
  fi
else
  summary+=("ncu not run (no ncu or $(left) s left)")
fi
job_summary fp8fwd
exit 0
