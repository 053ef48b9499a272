#!/usr/bin/env bash
# fp8fwd (issue 7): the FP8 (e4m3) attention forward at head dim 128 (870 TFLOP/s against the 1.0 PFLOP/s
# target). Session 12: kSpecMax (SPEC_MAX=1, slower), kEarlyTest (the default since run 12.3), kExpTurn
# (EXP_TURN=1, slower). Session 13 (helper fp8fwd2): kIntMax (INT_MAX=1, opt-in): the full tiles' row
# max from the scores' bit patterns with 3-input integer maxima (VIMNMX3), same numerics (the output
# should be bitwise the default's). Run 13.1 (de7854a: a vote and a branch per row for the float
# fallback) passed the tests and was 8 % slower at hd 128; now one vote per block before the softmax
# (hot path 472 -> 442 instructions per consumer warp and block at hd 128). Here (~110 s):
#   1. same-process timing (tools/gpu-extra/fp8fwd_time.py: env-var variants in interleaved rounds on the
#      same inputs), B2 H16 S8192, non-causal and causal, hd 128 and 64: w (the defaults), im (INT_MAX=1),
#      w2 (the defaults again: the spread inside one process);
#   2. the FP8 GPU tests (AttentionFp8Gpu.* less the mma.sync / deterministic / refusal ones, as fp8w.sh's
#      variant runs) with INT_MAX=1;
#   3. ncu of im's hd 128 kernel with source counters (per-instruction warp-stall samples, summarized per
#      opcode by tools/gpu-extra/fp8w_ncu_source.py): what the VIMNMX3 tree costs per instruction;
#   4. hd 256 (kSerialPvPipe, which gets kIntMax too): w vs im, same process.
source "$(dirname "$0")/lib/job_lib.sh"
cd "$(dirname "$0")/../.."
V=FLASHGRAD_ATTN_FP8_WGMMA

sub_filter='AttentionFp8Gpu.*-AttentionFp8Gpu.Deterministic*:AttentionFp8Gpu.Mma*:AttentionFp8Gpu.Permuted*:AttentionFp8Gpu.Unaligned*'
timing() {  # timing LOG CAP DIMS VARIANTS...
  local log=$1 want=$2 dims=$3 rc; shift 3
  timeout -k 3 "$(cap "$want")" python3 tools/gpu-extra/fp8fwd_time.py --dims "$dims" --masks none,causal --rounds 3 \
    --reps 10 "$@" > "$OUT/extra/$log.log" 2>&1
  rc=$?
  grep -E "^(ROW|DIFF)" "$OUT/extra/$log.log"
  [ $rc -eq 0 ] || tail -5 "$OUT/extra/$log.log"
  summary+=("$log rc=$rc")
  while IFS= read -r l; do summary+=("$l"); done < <(grep -E "^(ROW|DIFF)" "$OUT/extra/$log.log")
}
echo "== fp8fwd: hd 128 / 64 forward, w (defaults) vs im (INT_MAX=1) vs w2, B2 H16 S8192, one process"
timing fp8fwd_time 40 128,64 w=- im=${V}_INT_MAX=1 w2=-

echo "== fp8fwd: AttentionFp8Gpu.* with ${V}_INT_MAX=1"
job_tests fp8fwd_im_tests 30 "$sub_filter" FLASHGRAD_ATTN_FP8_FORWARD=wgmma ${V}_INT_MAX=1

ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run_ncu() {  # run_ncu LABEL [NAME=value ...]
  local label=$1 rep rc; shift
  rep="$OUT/extra/fp8fwd_src_d128_$label"
  if [ -z "$ncu_bin" ] || [ "$(left)" -lt 45 ]; then
    summary+=("ncu $label not run (no ncu or $(left) s left)")
    return
  fi
  echo "== fp8fwd: ncu source-level stall samples, hd 128 non-causal, $label (2nd launch)"
  # Launch 1 is the warm-up call, launch 2 the one timed call (--rounds 1 --reps 1).
  env FP8FWD_NCU=1 "$@" timeout -k 3 "$(cap 50)" "$ncu_bin" --clock-control none -k regex:fp8_attention_forward_wgmma \
    --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$' \
    -f -o "$rep" python3 tools/gpu-extra/fp8fwd_time.py --dims 128 --masks none --rounds 1 --reps 1 x=- \
    > "$rep.log" 2>&1
  rc=$?
  summary+=("ncu source hd 128 $label rc=$rc")
  if [ -f "$rep.ncu-rep" ]; then
    timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|pipe_|issue_active" \
      "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -50
    while IFS= read -r l; do summary+=("ncu $label: $l"); done < <(grep -E "^ +Duration" "$rep.txt" | head -1)
    timeout -k 3 25 "$ncu_bin" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
    python3 tools/gpu-extra/fp8w_ncu_source.py "$rep.csv" 2>&1 | head -120
    gzip -f "$rep.csv"
    rm -f "$rep.ncu-rep"
  else
    tail -5 "$rep.log"
  fi
}
run_ncu im ${V}_INT_MAX=1

if [ "$(left)" -gt 20 ]; then
  echo "== fp8fwd: hd 256 forward, w vs im (INT_MAX=1), one process"
  timing fp8fwd_time_256 25 256 w=- im=${V}_INT_MAX=1
fi

job_summary fp8fwd
exit 0
