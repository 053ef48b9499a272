#!/usr/bin/env bash
# deltabench (issue 6): bench/delta_rule_vs_fla.py as an extra job, so that on a 2-GPU machine it
# runs on the second GPU beside the attention work (fla's Triton autotuning makes it ~4 min). Same
# output as gpu-check's own step: $OUT/extra/delta_rule.{md,json}. Give it FLASHGRAD_EXTRA_CAP_S=260.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
# FLASHGRAD_DELTABENCH_CASES="KDA,recurrent": only those rows (all five need ~5 min with fla's autotuning).
timeout -k 5 "${FLASHGRAD_DELTABENCH_CAP_S:-250}" python3 bench/delta_rule_vs_fla.py --out "$OUT/extra/delta_rule.md" \
  --json "$OUT/extra/delta_rule.json" --cases "${FLASHGRAD_DELTABENCH_CASES:-}" > "$OUT/extra/deltabench.log" 2>&1
rc=$?
cat "$OUT/extra/delta_rule.md" 2>/dev/null || tail -30 "$OUT/extra/deltabench.log"
exit $rc
