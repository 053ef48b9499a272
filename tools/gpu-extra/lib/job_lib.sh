# Shared by the GPU jobs in tools/gpu-extra: `source tools/gpu-extra/lib/job_lib.sh` from the repo root
# (gpu-check runs tools/gpu-extra/*.sh as jobs, not what is in lib/). Gives:
#   OUT ($OUT/extra made), left / cap (a time budget of JOB_BUDGET_S seconds, default 138: the jobs'
#   150 s cap less a margin), the summary array and the steps the jobs repeat:
#   job_tests, job_compare (tools/gpu-extra/lib/variant_compare.py), job_ncu, job_sanitize, job_summary.
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
job_t0=$(date +%s)
summary=()

left() { echo $(( ${JOB_BUDGET_S:-138} - ($(date +%s) - job_t0) )); }
# cap WANT: WANT seconds, or what is left of the budget if less (never under 5).
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }

# job_tests LOG CAP FILTER [NAME=value ...]: the C++ GPU tests matching FILTER, with those variables
# set, into $OUT/extra/LOG.log; prints failures and the per-test verdicts, adds one summary line
# (passed / failed counts and the worst rel_rms / bar ratio the tests printed).
job_tests() {
  local log=$1 want=$2 filter=$3; shift 3
  local bin rc worst npass nfail
  bin=$(find build-gpu -name flashgrad_gpu_tests -type f 2>/dev/null | head -1)
  if [ -z "$bin" ]; then summary+=("$log: no flashgrad_gpu_tests binary under build-gpu"); return 1; fi
  env "$@" timeout -k 3 "$(cap "$want")" "$bin" --gtest_filter="$filter" > "$OUT/extra/$log.log" 2>&1
  rc=$?
  grep -E "Failure|Expected|Which is|error|illegal|^\[  (PASSED|FAILED|  FAILED  |  SKIPPED )" \
    "$OUT/extra/$log.log" | sed -E 's/ \(bar [^)]*\)//' | cut -c1-300 | tail -30
  worst=$(awk '/rel_rms/ { for (i = 1; i <= NF; ++i) if ($i == "rel_rms") { v = $(i+1); b = $(i+3); sub(/,/, "", b);
       if (b + 0 > 0) { r = v / b; if (r > worst) { worst = r; line = $0 } } } } END { printf "%.3f (%s)", worst, line }' \
    "$OUT/extra/$log.log")
  npass=$(grep -cE "^\[       OK \]" "$OUT/extra/$log.log")
  nfail=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$OUT/extra/$log.log")
  summary+=("tests ${*:-(defaults)} rc=$rc: $npass ok, $nfail failed lines; worst rel_rms/bar $worst")
  return $rc
}

# job_compare LOG CAP VARIANT_COMPARE_ARGS...: tools/gpu-extra/lib/variant_compare.py into
# $OUT/extra/LOG.log; prints its ROW / INFO lines and adds the ROW lines to the summary.
job_compare() {
  local log=$1 want=$2 rc; shift 2
  timeout -k 3 "$(cap "$want")" python3 tools/gpu-extra/lib/variant_compare.py "$@" > "$OUT/extra/$log.log" 2>&1
  rc=$?
  grep -E "^(ROW|INFO)" "$OUT/extra/$log.log" | cut -c1-500
  [ $rc -eq 0 ] || { tail -5 "$OUT/extra/$log.log" | cut -c1-300; summary+=("$log rc=$rc"); }
  while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/$log.log")
  return $rc
}

# job_ncu REPORT CAP KERNEL SOURCE ENV -- PROFILE_ARGS...: ncu of the second launch of the kernel
# whose name matches KERNEL, while bench/profile_delta_rule.py PROFILE_ARGS runs (without its own
# profiler), with ENV ("NAME=value", or - for none) set; REPORT names $OUT/extra/REPORT.{log,txt}.
# JOB_NCU_SKIP (default 1): launches of that kernel skipped first (0: the first, e.g. the forward's
# when the backward runs a kernel of the same name).
# SOURCE=1 also samples stalls by SASS line and prints them per phase (kdaprep_ncu_source.py).
# Prints the headline metrics and adds one summary line. Needs >= 15 s left.
job_ncu() {
  local rep="$OUT/extra/$1" want=$2 kernel=$3 source=$4 envspec=$5; shift 6  # 6: the "--" too
  local ncu_bin metrics src=()
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -z "$ncu_bin" ] || [ "$(left)" -lt 15 ]; then summary+=("ncu $kernel: skipped (no ncu or < 15 s left)"); return 1; fi
  [ "$envspec" = - ] && envspec=JOB_NCU_NO_VARIABLE=1
  [ "$source" = 1 ] && src=(--section SourceCounters)
  metrics='regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct$,regex:smsp__issue_active\.avg\.pct_of_peak_sustained_active$'
  env "$envspec" timeout -k 3 "$(cap "$want")" "$ncu_bin" --clock-control none -k "regex:$kernel" --launch-skip "${JOB_NCU_SKIP:-1}" \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy \
    --section LaunchStats "${src[@]}" --metrics "$metrics" -f -o "$rep" \
    python3 bench/profile_delta_rule.py "$@" --reps 1 --no-profiler > "$rep.log" 2>&1
  echo "ncu $kernel rc=$?"
  [ -f "$rep.ncu-rep" ] || { tail -3 "$rep.log"; return 1; }
  timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" > "$rep.txt" 2>&1
  grep -E "(chunk|kda)_[a-z_]+_kernel|Duration|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Block Limit (Shared|Registers)|Dynamic Shared|stalled_(long|short|wait|barrier|math|mio|lg|no_inst|dispatch|branch|tex|drain|membar|sleep|not_selected|selected).*pct|issue_active" \
    "$rep.txt" | grep -vE " 0(\.0+)?$| 0\.0[0-9]$" | cut -c1-160 | head -34
  while IFS= read -r l; do summary+=("ncu $l"); done < <(awk '/(chunk|kda)_[a-z_]+_kernel/ { match($0, /(chunk|kda)_[a-z_]+_kernel/); k = substr($0, RSTART, RLENGTH) }
       /^ +Duration/ { d = $(NF-1) " " $NF } /Executed Instructions  / { n = $NF } /Achieved Occupancy/ { oc = $NF }
       /issue_active/ { ia = $NF } END { if (k != "") print k ": " d ", instructions " n ", occupancy " oc "%, issue active " ia "%" }' "$rep.txt")
  if [ "$source" = 1 ] && [ "$(left)" -gt 25 ]; then  # where the warps wait, by phase (segments between barriers)
    timeout -k 3 20 "$ncu_bin" --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
    python3 tools/gpu-extra/kdaprep_ncu_source.py "$rep.csv" 2>&1 | head -70
    gzip -f "$rep.csv"
  fi
  rm -f "$rep.ncu-rep"  # the text (and csv) come back
}

# job_sanitize LOG CAP RACE_FILTER MEM_FILTER [NAME=value ...]: compute-sanitizer racecheck on the GPU
# tests matching RACE_FILTER and memcheck on MEM_FILTER (small cases: racecheck is slow), with those
# variables set, into $OUT/extra/LOG_{racecheck,memcheck}.log; one summary line per tool.
job_sanitize() {
  local log=$1 want=$2 race=$3 mem=$4; shift 4
  local san bin tool filt rc l
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  bin=$(find build-gpu -name flashgrad_gpu_tests -type f 2>/dev/null | head -1)
  if [ -z "$san" ] || [ -z "$bin" ]; then summary+=("sanitizer: skipped (no compute-sanitizer or no test binary)"); return 1; fi
  for tool in racecheck memcheck; do
    filt=$race; [ $tool = memcheck ] && filt=$mem
    env "$@" timeout -k 3 "$(cap "$want")" "$san" --tool $tool --error-exitcode 1 "$bin" --gtest_filter="$filt" \
      > "$OUT/extra/${log}_$tool.log" 2>&1
    rc=$?
    l="$tool (${*:-defaults}, $filt) rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/extra/${log}_$tool.log" | tr '\n' ' ')"
    echo "$l"; summary+=("$l")
  done
}

# job_summary NAME: the summary lines, last.
job_summary() {
  echo "== $1 summary (commit ${FLASHGRAD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $(( $(date +%s) - job_t0 )) s)"
  local s
  for s in "${summary[@]}"; do echo "  $s"; done
}
