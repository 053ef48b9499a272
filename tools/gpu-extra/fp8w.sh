#!/usr/bin/env bash
# fp8w (FP8 forward on wgmma, issue 7): runs from the repo root after tools/gpu-check's build into
# build-gpu (cap 150 s), in order of what it tells:
#   1. Fp8WgmmaProbe.*: the e4m3 wgmma layouts on the hardware (shared-memory descriptors of 8-bit
#      K-major operands, the 8-bit A-register fragment, P's key permutation against vt), so a
#      failure below points at its cause;
#   2. AttentionFp8* with FLASHGRAD_ATTN_FP8_FORWARD=wgmma: the FP8 GPU tests (2x rule against the
#      recipe's emulation) with the forward on the wgmma kernel (hd 64 too, by default since session 6);
#   3. AttentionFp8Gpu.* again for each variant (s: FLASHGRAD_ATTN_FP8_WGMMA_SERIAL=1, spp: with
#      FLASHGRAD_ATTN_FP8_WGMMA_PINGPONG=1 too, o: FLASHGRAD_ATTN_FP8_WGMMA_ONE_LEVEL=1 (P V
#      accumulated in the tensor cores: what the two-level accumulation costs); e, the polynomial exp2
#      (POLY_EXP), was retired in session 20);
#   4. bench/attention/fp8_wgmma_bench.cu (built here against build-gpu's libflashgrad.a): forward
#      TFLOP/s of the mma.sync FP8 kernel, the wgmma FP8 kernel and bf16, B2 H16 S8192, hd 128 / 256 / 64,
#      causal and not, in one process (the switch is read per call), plus the two FP8 kernels'
#      output difference on the timed inputs (the variants whose tests passed in 3); first the
#      defaults (w: since session 6 serial + pipelined P V at hd 256, overlapped with the staggered
#      start at hd 64 / 128) beside ov (the defaults before session 6: overlapped everywhere, in step),
#      in one process;
#   5. with the time left: ncu of one default-variant forward per head dim (pipes, stalls, issue).
# A compact summary comes last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $((145 - ($(date +%s) - t0))); }
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
lib=$(find build-gpu -name libflashgrad.a -type f | head -1)
status=()
show() { grep -E "^\s+case |rel RMS|max\||Failure|Expected|Which is|error|trap|^\[  (PASSED|FAILED|  OK  |  FAILED  |  SKIPPED )" "$1" | tail -${2:-80}; }

# The benches build in the background while the tests run.
rm -f /tmp/fp8w_bench_built /tmp/fp8w_fp8_bench_built
if [ -n "$lib" ]; then
  (nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude bench/attention/fp8_wgmma_bench.cu "$lib" \
     -lcudart -o /tmp/fp8w_bench > /tmp/fp8w_bench_build.log 2>&1 && echo ok > /tmp/fp8w_bench_built;
   true) &
  build_pid=$!
fi
if [ -n "$tests" ]; then
  echo "== fp8w: Fp8WgmmaProbe.* (layouts on the hardware)"
  FLASHGRAD_TEST_FP8W_PROBES=1 timeout -k 3 20 "$tests" --gtest_filter='Fp8WgmmaProbe.*' \
    > "$OUT/extra/fp8w_probe.log" 2>&1
  rc=$?
  show "$OUT/extra/fp8w_probe.log" 40
  status+=("Fp8WgmmaProbe.* rc=$rc ($(grep -c '^\[       OK' "$OUT/extra/fp8w_probe.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/extra/fp8w_probe.log") failed)")
  echo "== fp8w: AttentionFp8* with FLASHGRAD_ATTN_FP8_FORWARD=wgmma"
  FLASHGRAD_ATTN_FP8_FORWARD=wgmma timeout -k 3 60 "$tests" --gtest_filter='AttentionFp8*' \
    > "$OUT/extra/fp8w_tests.log" 2>&1
  rc=$?
  show "$OUT/extra/fp8w_tests.log" 120
  status+=("AttentionFp8* (wgmma fwd) rc=$rc ($(grep -c '^\[       OK' "$OUT/extra/fp8w_tests.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/extra/fp8w_tests.log") failed)")
else
  status+=("no flashgrad_gpu_tests binary under build-gpu")
fi

table=""
bench_ready() {  # waits for the background build once; true when the forward bench built
  if [ -n "${build_pid:-}" ]; then wait "$build_pid"; build_pid=""; fi
  [ -f /tmp/fp8w_bench_built ]
}
# The default variant's numbers first (the variants below could trap and end a bench process).
if [ -n "$lib" ] && bench_ready && [ "$(left)" -gt 30 ]; then
  echo "== fp8w: forward bench (bf16, mma.sync, wgmma defaults w, pre-session-6 defaults ov)"
  timeout -k 3 40 /tmp/fp8w_bench w ov d128 d256 d64 > "$OUT/extra/fp8w_bench_default.log" 2>&1
  status+=("fp8_wgmma_bench w ov rc=$?")
  cat "$OUT/extra/fp8w_bench_default.log"
  table=$(cat "$OUT/extra/fp8w_bench_default.log")
elif [ -n "$lib" ]; then
  status+=("fp8_wgmma_bench not run (build: $(tail -3 /tmp/fp8w_bench_build.log | tr '\n' ' '); left $(left) s)")
fi

# The variants, each in a process of its own (a turn-taking bug traps): bench only those that pass.
sub_filter='AttentionFp8Gpu.*-AttentionFp8Gpu.Deterministic*:AttentionFp8Gpu.Mma*:AttentionFp8Gpu.Permuted*:AttentionFp8Gpu.Unaligned*'
bench_variants="w"
# Run 6.1 timed s, spv, pv, ov, w4, wspin (pp, o, e in session 5): the defaults follow it (w = spv at
# hd 256, s at hd 64, ov at hd 128). ov: the pre-session-6 defaults (overlapped everywhere).
# Session 6, run 6.3 timed pp, st, ppst, es, esppst: the staggered start (st) is the default at hd 64 /
# 128 since. Now: esst (kEarlyS, FLASHGRAD_ATTN_FP8_WGMMA_EARLY_S=1, with the stagger: es alone lost
# because both warpgroups' S queued first), wst (the defaults with the stagger at hd 256 too: serial +
# pipelined P V). ov (pre-session-6 defaults) and s (serial: hd 64's default before run 6.3) passed
# before and are benched without testing them again.
for v in esst wst; do
  [ -n "$tests" ] && [ "$(left)" -gt 60 ] || break
  pp=0; serial=0; one=0; pvpipe=0; stagger=0; early=0
  case $v in pp) pp=1 ;; s) serial=1 ;; spp) pp=1; serial=1 ;; o) one=1 ;; opp) pp=1; one=1 ;; pv) pvpipe=1 ;;
    spv) serial=1; pvpipe=1 ;; st) stagger=1 ;; ppst) pp=1; stagger=1 ;; es) early=1 ;; esppst) early=1; pp=1; stagger=1 ;;
    esst) early=1; stagger=1 ;; wst) serial=-; pvpipe=-; stagger=1 ;; esac
  # "-": the library's default for that switch (unset)
  envs=()
  for kv in PINGPONG=$pp SERIAL=$serial ONE_LEVEL=$one PV_PIPE=$pvpipe STAGGER=$stagger EARLY_S=$early; do
    [ "${kv#*=}" = "-" ] || envs+=("FLASHGRAD_ATTN_FP8_WGMMA_$kv")
  done
  echo "== fp8w: AttentionFp8Gpu.* with variant $v (PINGPONG=$pp SERIAL=$serial ONE_LEVEL=$one PV_PIPE=$pvpipe STAGGER=$stagger EARLY_S=$early)"
  env FLASHGRAD_ATTN_FP8_FORWARD=wgmma "${envs[@]}" \
    timeout -k 3 15 "$tests" --gtest_filter="$sub_filter" \
    > "$OUT/extra/fp8w_${v}_tests.log" 2>&1
  rc=$?
  show "$OUT/extra/fp8w_${v}_tests.log" 12
  status+=("AttentionFp8Gpu.* (wgmma fwd, variant $v) rc=$rc ($(grep -c '^\[       OK' "$OUT/extra/fp8w_${v}_tests.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/extra/fp8w_${v}_tests.log") failed)")
  [ $rc = 0 ] && bench_variants="$bench_variants $v"
done
bench_variants="$bench_variants ov s"

if [ -n "$lib" ]; then
  if [ "$bench_variants" != "w" ] && bench_ready && [ "$(left)" -gt 25 ]; then
    echo "== fp8w: forward bench (bf16, mma.sync, wgmma variants: $bench_variants)"
    timeout -k 3 $(( $(left) > 50 ? 45 : $(left) - 5 )) /tmp/fp8w_bench $bench_variants > "$OUT/extra/fp8w_bench.log" 2>&1
    status+=("fp8_wgmma_bench $bench_variants rc=$?")
    cat "$OUT/extra/fp8w_bench.log"
    table=$(cat "$OUT/extra/fp8w_bench.log")
  fi
  # ncu of one default-variant call per head dim (hd 128 first): which pipe and which stall bound it.
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -n "$ncu_bin" ] && bench_ready && [ "$(left)" -gt 40 ]; then
    # Per-instruction warp-stall samples of the hd 128 default (where in the consumer loop the time
    # goes: which waits, which dependency chains), summarized by tools/gpu-extra/fp8w_ncu_source.py.
    echo "== fp8w: ncu source-level (SASS) stall samples, wgmma FP8 forward hd 128 non-causal (4th call)"
    timeout -k 3 $(( $(left) > 60 ? 40 : $(left) - 10 )) "$ncu_bin" --clock-control none -k regex:fp8_attention_forward_wgmma \
      --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats -f -o "$OUT/extra/fp8w_src_d128" \
      /tmp/fp8w_bench 2 16 8192 w d128 none > "$OUT/extra/fp8w_src_d128.log" 2>&1
    rc=$?
    if [ -f "$OUT/extra/fp8w_src_d128.ncu-rep" ]; then
      timeout -k 3 30 "$ncu_bin" --import "$OUT/extra/fp8w_src_d128.ncu-rep" --page source --print-source sass --csv \
        > "$OUT/extra/fp8w_src_d128.csv" 2>> "$OUT/extra/fp8w_src_d128.log"
      python3 tools/gpu-extra/fp8w_ncu_source.py "$OUT/extra/fp8w_src_d128.csv" 2>&1 | head -120
      gzip -f "$OUT/extra/fp8w_src_d128.csv"
    fi
    status+=("ncu source hd 128 rc=$rc (extra/fp8w_src_d128.*)")
    tail -5 "$OUT/extra/fp8w_src_d128.log"
  fi
  if [ -n "$ncu_bin" ] && bench_ready; then
    for d in 128; do  # hd 256 (at the target since session 6's defaults) profiled in run 6.1
      [ "$(left)" -gt 35 ] || break
      echo "== fp8w: ncu, wgmma FP8 forward hd $d B2 H16 S8192 non-causal (4th call)"
      # --clock-control none: the clocks stay as the machine sets them (the device notes ask it).
      timeout -k 3 $(( $(left) > 60 ? 50 : $(left) - 8 )) "$ncu_bin" --clock-control none -k regex:fp8_attention_forward_wgmma \
        --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active$,regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$' \
        /tmp/fp8w_bench 2 16 8192 w d$d none > "$OUT/extra/fp8w_ncu_d$d.log" 2>&1
      rc=$?
      status+=("ncu hd $d rc=$rc (log extra/fp8w_ncu_d$d.log)")
      grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|pipe_|issue_stalled|issue_active|highest-utilized|is the|bound|==PROF==|Error|error" \
        "$OUT/extra/fp8w_ncu_d$d.log" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | head -70
    done
  else
    status+=("ncu not run (no ncu, or no bench)")
  fi
else
  status+=("no libflashgrad.a under build-gpu")
fi

echo "== fp8w summary ($(( $(date +%s) - t0 )) s)"
for s in "${status[@]}"; do echo "  $s"; done
[ -n "$table" ] && echo "$table"
exit 0
