#!/usr/bin/env bash
# fp8py (FP8 attention, Python side; docs/fp8.md): on the H200 after tools/gpu-check's build and
# package install (cwd = repo root; $OUT/extra/ collects files; cap 150 s), in order of what it tells:
#   1. the FP8 GPU tests (tests/python/test_fp8*.py -m gpu): CUDA kernels vs the recipe's emulation
#      by the 2x rule, with the relative RMS errors against fp32 printed per case;
#   2. bench/attention_fp8_bench.py: fp8 vs bf16 vs cuDNN FP8 TFLOP/s -> $OUT/extra/fp8_bench.md;
#   3. training parity (python -m flashgrad.demo.fp8_parity): bf16 vs fp8 losses, csv/png/json in
#      $OUT/extra/; where the FP8 kernels are absent, the recipe's emulation stands in (--emulate).
# Prints a compact summary at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
t0=$(date +%s)
left() { echo $(( 146 - ($(date +%s) - t0) )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; [ "$want" -lt 5 ] && want=5; echo "$want"; }
summary=()

echo "== fp8py 1/3: FP8 GPU tests"
timeout -k 3 "$(cap 55)" python3 -m pytest -q -rs -s -m gpu -p no:cacheprovider \
  tests/python/test_fp8.py tests/python/test_fp8_jax.py > "$OUT/extra/fp8py_tests.log" 2>&1
rc=$?
grep -E "rel-rms|fp8 CUDA kernels absent|^(FAILED|ERROR)|Error:|AssertionError|max error" "$OUT/extra/fp8py_tests.log" | cut -c1-400 | head -60
last=$(grep -E "passed|failed|skipped|error" "$OUT/extra/fp8py_tests.log" | tail -1)
grep -E "^SKIPPED" "$OUT/extra/fp8py_tests.log" | cut -c1-300 | sort | uniq -c | head -5
summary+=("tests rc=$rc: $last")

echo "== fp8py 2/3: fp8 bench"
timeout -k 3 "$(cap 50)" python3 bench/attention_fp8_bench.py --out "$OUT/extra/fp8_bench.md" \
  --json "$OUT/extra/fp8_bench.json" > "$OUT/extra/fp8py_bench.log" 2>&1
rc=$?
if [ -f "$OUT/extra/fp8_bench.md" ]; then cat "$OUT/extra/fp8_bench.md"; else tail -20 "$OUT/extra/fp8py_bench.log"; fi
summary+=("bench rc=$rc")

echo "== fp8py 3/3: training parity (bf16 vs fp8)"
timeout -k 3 "$(cap 60)" python3 -m flashgrad.demo.fp8_parity --device cuda --out "$OUT/extra" \
  > "$OUT/extra/fp8py_parity.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && [ "$(left)" -gt 20 ]; then
  echo "(flash_attn_fp8_func cannot run here: the recipe's emulation stands in)"
  grep -E "cannot" "$OUT/extra/fp8py_parity.log" | cut -c1-300
  timeout -k 3 "$(cap 60)" python3 -m flashgrad.demo.fp8_parity --device cuda --emulate --out "$OUT/extra" \
    > "$OUT/extra/fp8py_parity.log" 2>&1
  rc=$?
  summary+=("parity (EMULATED fp8) rc=$rc: $(grep -E '^fp8 vs bf16' "$OUT/extra/fp8py_parity.log" | cut -c1-300)")
else
  summary+=("parity rc=$rc: $(grep -E '^fp8 vs bf16' "$OUT/extra/fp8py_parity.log" | cut -c1-300)")
fi
grep -vE "^\s*$" "$OUT/extra/fp8py_parity.log" | tail -8 | cut -c1-300

echo "== fp8py summary ($(( $(date +%s) - t0 )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
