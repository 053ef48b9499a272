#!/usr/bin/env bash
# recurrent (issue 6: the fused recurrent backward <= 3x its forward; docs/perf/delta_rule.md
# "Recurrent kernels: hoisted per-token addresses (session 7)"). After gpu-check's build and install:
#   1. the recurrent GPU tests (DeltaRuleGpu.*: every gradient against the CPU fp32 recurrence),
#   2. the recurrent GDN row of bench/delta_rule_vs_fla.py (B4 T4096 H16 K=V=128, fla's fused
#      recurrent forward in the same process),
#   3. per-kernel CUDA times of that row (bench/profile_delta_rule.py --recurrent).
# Prints a compact summary last; logs under $OUT/extra/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
tests=$(find build-gpu -name flashgrad_gpu_tests -type f | head -1)
summary=()
if [ -n "$tests" ]; then
  timeout -k 3 60 "$tests" --gtest_filter='DeltaRuleGpu*' > "$OUT/extra/recurrent_tests.log" 2>&1
  summary+=("tests rc=$?: $(grep -cE '^\[       OK \]' "$OUT/extra/recurrent_tests.log") ok, $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/extra/recurrent_tests.log") failed")
fi
timeout -k 3 70 python3 bench/delta_rule_vs_fla.py --cases recurrent --out "$OUT/extra/recurrent.md" \
  > "$OUT/extra/recurrent_bench.log" 2>&1
summary+=("bench rc=$?: $(grep -E '^\| recurrent' "$OUT/extra/recurrent.md" 2>/dev/null)")
timeout -k 3 40 python3 bench/profile_delta_rule.py --B 4 --T 4096 --recurrent --reps 2 > "$OUT/extra/recurrent_profile.log" 2>&1
summary+=("profile rc=$?:")
while read -r line; do summary+=("  $line"); done < <(grep -E "recurrent_|finish_kernel|Memset" "$OUT/extra/recurrent_profile.log" | \
  sed -E 's/^ *void flashgrad::cuda_detail::delta_rule:://; s/  +/ /g' | cut -c1-140 | head -8)
echo "== recurrent summary"
printf '%s\n' "${summary[@]}"
