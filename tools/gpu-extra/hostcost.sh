#!/usr/bin/env bash
# hostcost (issue 6): is part of the chunk GDN forward's 1.20 ms (kernels ~0.95 ms in run 6.4's
# profile) host overhead exposed by the timing? bench/host_overhead_probe.py, flashgrad and fla.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT/extra"
timeout -k 3 "${FLASHGRAD_HOSTCOST_CAP_S:-100}" python3 bench/host_overhead_probe.py > "$OUT/extra/hostcost.log" 2>&1
rc=$?
echo "== hostcost rc=$rc"
grep -E "do_bench" "$OUT/extra/hostcost.log"
