#!/usr/bin/env bash
# fp8cmp (issue 7): the FP8 benchmark alone — flashgrad fp8 (default kernels), flashgrad bf16 and
# cuDNN's FP8 SDPA (nvidia-cudnn-frontend, carried in .whl and put on PYTHONPATH by gpu-check), same
# process, B2 H16 S8192 hd 128 / 256 -> $OUT/extra/fp8_bench.md. fp8py.sh runs the same bench beside
# the FP8 pytest and the training parity; this one is for calls with little device time left.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
timeout -k 3 80 python3 bench/attention_fp8_bench.py --out "$OUT/extra/fp8_bench.md" --json "$OUT/extra/fp8_bench.json" \
  > "$OUT/extra/fp8cmp.log" 2>&1
rc=$?
cat "$OUT/extra/fp8_bench.md" 2>/dev/null || tail -30 "$OUT/extra/fp8cmp.log"
exit $rc
