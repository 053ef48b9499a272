#!/usr/bin/env bash
# ncu (lead, issues 5 and 7): where the time of the wgmma attention backward (bf16) and the FP8
# wgmma forward goes on the H200, after tools/gpu-check's build into build-gpu (cap 150 s unless
# FLASHGRAD_EXTRA_CAP_S says more). For each kernel: one ncu report (speed of light, pipes,
# warp-state stalls, instruction mix, per-SASS-line stall samples), exported as the
# text and the SASS source page (csv, the report itself is dropped: too large to bring back).
#   rows (bench/attention/attention_bench.cu, profile mode): 4 = B4 H16 S4096 d64 non-causal,
#   5 = the same causal, 2 = B2 H16 S8192 d128 non-causal, 6 = B2 H16 S8192 d256; the FP8 backward
#   (bench/attention/fp8_bench.cu: its first call, hd128 non-causal) and forward hd128 B2 H16 S8192;
#   gdn_prepare / gdn_state / gdn_b1: chunked GDN stages through bench/profile_delta_rule.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra/ncu"
t0=$(date +%s)
cap=${FLASHGRAD_EXTRA_CAP_S:-150}
left() { echo $((cap - 5 - ($(date +%s) - t0))); }
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "ncu: no libflashgrad.a"; exit 1; }
[ -n "$ncu_bin" ] || { echo "ncu: no ncu binary"; exit 1; }
flags="-O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude"
metrics='regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
profile() {  # profile NAME KERNEL_REGEX CMD...
  local name=$1 kre=$2; shift 2
  [ "$(left)" -gt 30 ] || { echo "ncu $name: skipped (time)"; return; }
  echo "== ncu $name"
  timeout -k 3 $(( $(left) > 70 ? 60 : $(left) - 8 )) "$ncu_bin" --clock-control none -k "regex:$kre" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters \
    --section Occupancy --section LaunchStats --metrics "$metrics" --import-source no \
    -o "$OUT/extra/ncu/$name" -f "$@" > "$OUT/extra/ncu/$name.run.log" 2>&1
  echo "rc=$?"
  if [ -f "$OUT/extra/ncu/$name.ncu-rep" ]; then
    "$ncu_bin" -i "$OUT/extra/ncu/$name.ncu-rep" --page details > "$OUT/extra/ncu/$name.txt" 2>&1
    "$ncu_bin" -i "$OUT/extra/ncu/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/extra/ncu/$name.sass.csv" 2>&1
    gzip -f "$OUT/extra/ncu/$name.sass.csv"
    rm -f "$OUT/extra/ncu/$name.ncu-rep"  # the text and csv come back; the report may be too large
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|pipe_|issue_stalled|issue_active|highest-utilized|bound" \
      "$OUT/extra/ncu/$name.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -60
  else
    tail -5 "$OUT/extra/ncu/$name.run.log"
  fi
}
# FLASHGRAD_NCU_SET picks the kernels (default: all below, in this order).
set_=${FLASHGRAD_NCU_SET:-"bwd_d64_causal bwd_d64 bwd_d256 bwd_d128 fwd_d128 fp8_bwd_d128 fp8_fwd_d128"}
# Only the drivers the set needs are built (the delta-rule targets run through Python: none).
: > "$OUT/extra/ncu/build.log"
[[ " $set_ " == *" bwd_"* || " $set_ " == *" fwd_"* ]] && \
  nvcc $flags bench/attention/attention_bench.cu "$lib" -lcuda -o /tmp/ncu_attn_bench >> "$OUT/extra/ncu/build.log" 2>&1 &
[[ " $set_ " == *" fp8_fwd"* ]] && \
  nvcc $flags bench/attention/fp8_wgmma_bench.cu "$lib" -lcuda -o /tmp/ncu_fp8_bench >> "$OUT/extra/ncu/build.log" 2>&1 &
[[ " $set_ " == *" fp8_bwd"* ]] && \
  nvcc $flags bench/attention/fp8_bench.cu "$lib" -lcuda -o /tmp/ncu_fp8_fb_bench >> "$OUT/extra/ncu/build.log" 2>&1 &
wait
for k in $set_; do
  case $k in
    bwd_d64) FLASHGRAD_PROFILE_ROW=4 profile $k attention_backward_wgmma /tmp/ncu_attn_bench /tmp profile ;;
    bwd_d64_causal) FLASHGRAD_PROFILE_ROW=5 profile $k attention_backward_wgmma /tmp/ncu_attn_bench /tmp profile ;;
    bwd_d128) FLASHGRAD_PROFILE_ROW=2 profile $k attention_backward_wgmma /tmp/ncu_attn_bench /tmp profile ;;
    bwd_d256) FLASHGRAD_PROFILE_ROW=6 profile $k attention_backward_wgmma /tmp/ncu_attn_bench /tmp profile ;;
    fwd_d128) FLASHGRAD_PROFILE_ROW=2 profile $k attention_forward_wgmma /tmp/ncu_attn_bench /tmp profile ;;
    fp8_bwd_d128) profile $k fp8_attention_backward_wgmma /tmp/ncu_fp8_fb_bench 2 16 8192 ;;
    fp8_fwd_d128) profile $k fp8_attention_forward_wgmma /tmp/ncu_fp8_bench 2 16 8192 w d128 none ;;
    # chunked GDN B8 T4096 H16 K=V=128 (issue 6): stage 1, the fused stage 2+3 (the forward's first
    # chunk_state_kernel launch), B1 (the kernels' first launches in the step)
    gdn_prepare) profile $k chunk_prepare_compact_kernel python3 bench/profile_delta_rule.py --no-profiler --reps 1 ;;
    gdn_state) profile $k chunk_state_kernel python3 bench/profile_delta_rule.py --no-profiler --reps 1 ;;
    gdn_b1) profile $k chunk_state_backward python3 bench/profile_delta_rule.py --no-profiler --reps 1 ;;
  esac
done
echo "== ncu done ($(( $(date +%s) - t0 )) s)"
