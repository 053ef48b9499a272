#!/usr/bin/env bash
# profile32k (issue 6, lead): per-kernel CUDA times (torch.profiler, bench/profile_delta_rule.py) of the
# chunk GDN rows whose ratio to fla is worst: B1 T32768 H16 (16 chains: the sequence-serial stages
# dominate) and, for comparison in the same process kind, B8 T4096 H16 (K = V = 128, bf16).
# Output: $OUT/extra/profile32k.log; prints each profile's kernel table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
for args in "--B 1 --T 32768" "--B 8 --T 4096"; do
  echo "== chunk GDN $args H16 K=V=128 bf16"
  timeout -k 3 70 python3 bench/profile_delta_rule.py $args --reps 2 2>&1 | tee -a "$OUT/extra/profile32k.log" | tail -30
done
