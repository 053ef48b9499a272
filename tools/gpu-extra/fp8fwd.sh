#!/usr/bin/env bash
# fp8fwd (issue 7, session 12): the FP8 (e4m3) attention forward at head dim 128, where it runs at
# ~835 TFLOP/s against the 1.0 PFLOP/s target. In order of importance:
#   1. the FP8 GPU tests (AttentionFp8Gpu.* less the mma.sync / deterministic / refusal ones, as
#      fp8w.sh's variant runs) with FLASHGRAD_ATTN_FP8_WGMMA_SPEC_MAX=1 (the kernel's kSpecMax: the
#      full tiles' exponentials issued before the block's row max is known; same numerics);
#   2. same-process timing (tools/gpu-extra/fp8fwd_time.py: the env-var variants in interleaved rounds
#      on the same inputs), B2 H16 S8192, non-causal and causal: w (the defaults: kEarlyS + staggered
#      start at hd 64 / 128, serial + pipelined P V at hd 256), spec (w with SPEC_MAX=1; only if its
#      tests passed), st (EARLY_S=0: the hd 128 default before session 7), at hd 128;
#   3. ncu of the hd 128 default with source counters (per-instruction warp-stall samples, summarized
#      per opcode by tools/gpu-extra/fp8w_ncu_source.py); then w vs spec at hd 64 / 256, and spec's ncu,
#      with the time left.
source "$(dirname "$0")/lib/job_lib.sh"
cd "$(dirname "$0")/../.."
V=FLASHGRAD_ATTN_FP8_WGMMA

sub_filter='AttentionFp8Gpu.*-AttentionFp8Gpu.Deterministic*:AttentionFp8Gpu.Mma*:AttentionFp8Gpu.Permuted*:AttentionFp8Gpu.Unaligned*'
echo "== fp8fwd: AttentionFp8Gpu.* with ${V}_SPEC_MAX=1"
spec=""
job_tests fp8fwd_spec_tests 30 "$sub_filter" FLASHGRAD_ATTN_FP8_FORWARD=wgmma ${V}_SPEC_MAX=1 && spec="spec=${V}_SPEC_MAX=1"

echo "== fp8fwd: hd 128 forward, w (defaults) ${spec:+vs spec (SPEC_MAX=1) }vs st (EARLY_S=0), B2 H16 S8192, one process"
timeout -k 3 "$(cap 40)" python3 tools/gpu-extra/fp8fwd_time.py --dims 128 --masks none,causal --rounds 3 --reps 10 \
  w=- $spec st=${V}_EARLY_S=0 > "$OUT/extra/fp8fwd_time.log" 2>&1
rc=$?
grep -E "^(ROW|DIFF)" "$OUT/extra/fp8fwd_time.log"
[ $rc -eq 0 ] || tail -5 "$OUT/extra/fp8fwd_time.log"
summary+=("timing hd 128 rc=$rc")
while IFS= read -r l; do summary+=("$l"); done < <(grep "^ROW" "$OUT/extra/fp8fwd_time.log")
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run_ncu() {
  local variant=$1 rep envs rc
  rep="$OUT/extra/fp8fwd_src_d128_$variant"
  envs=(FP8FWD_NCU=1)
  [ "$variant" = spec ] && envs=(${V}_SPEC_MAX=1)
  if [ -z "$ncu_bin" ] || [ "$(left)" -lt 40 ]; then
    summary+=("ncu $variant not run (no ncu or $(left) s left)")
    return
  fi
  echo "== fp8fwd: ncu source-level stall samples, hd 128 non-causal, $variant (2nd launch)"
  # Launch 1 is the warm-up call, launch 2 the one timed call (--rounds 1 --reps 1).
  env "${envs[@]}" timeout -k 3 "$(cap 50)" "$ncu_bin" --clock-control none -k regex:fp8_attention_forward_wgmma \
    --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$' \
    -f -o "$rep" python3 tools/gpu-extra/fp8fwd_time.py --dims 128 --masks none --rounds 1 --reps 1 x=- \
    > "$rep.log" 2>&1
  rc=$?
  summary+=("ncu source hd 128 $variant rc=$rc")
  if [ -f "$rep.ncu-rep" ]; then
    timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|pipe_|issue_active" \
      "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -50
    while IFS= read -r l; do summary+=("ncu $variant: $l"); done < <(grep -E "^ +Duration" "$rep.txt" | head -1)
    timeout -k 3 25 "$ncu_bin" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
    python3 tools/gpu-extra/fp8w_ncu_source.py "$rep.csv" 2>&1 | head -120
    gzip -f "$rep.csv"
    rm -f "$rep.ncu-rep"
  else
    tail -5 "$rep.log"
  fi
}
run_ncu w
if [ -n "$spec" ] && [ "$(left)" -gt 30 ]; then
  echo "== fp8fwd: hd 64 / 256 forward, w vs spec"
  timeout -k 3 "$(cap 25)" python3 tools/gpu-extra/fp8fwd_time.py --dims 64,256 --masks none,causal --rounds 2 --reps 8 \
    w=- $spec > "$OUT/extra/fp8fwd_time_d64_256.log" 2>&1
  rc=$?
  grep -E "^(ROW|DIFF)" "$OUT/extra/fp8fwd_time_d64_256.log"
  [ $rc -eq 0 ] || tail -5 "$OUT/extra/fp8fwd_time_d64_256.log"
  while IFS= read -r l; do summary+=("$l"); done < <(grep "^ROW" "$OUT/extra/fp8fwd_time_d64_256.log")
fi

[ -n "$spec" ] && run_ncu spec
job_summary fp8fwd
exit 0
